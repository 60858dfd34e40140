// Backend-neutral bookkeeping of the group collectives: which rows go to / come from each peer,
// packing rows into one contiguous message per peer, and the ascending-rank combine. A backend
// only moves one byte buffer per peer (magi_notes §5.6, the all-to-all-v form); everything that
// decides bits lives here, so every backend produces identical results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "magi/comm.h"

namespace magi::comm {

// `count` rows starting at row `begin` of a buffer; `scale` multiplies a reduced contribution
// (1 / number of sources for kAvg).
struct RowRange {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  double scale = 1.0;
};

// Per peer (self included), in message order: the input rows packed into the message to it and
// the output rows its message lands in.
struct ExchangeLayout {
  std::vector<std::vector<RowRange>> send;  // [peer]
  std::vector<std::vector<RowRange>> recv;  // [peer]
};

ExchangeLayout cast_layout(int rank, int size, std::int64_t input_rows,
                           std::span<const std::int64_t> input_split_sizes,
                           std::span<const std::vector<std::int32_t>> dst_ranks,
                           std::int64_t output_rows,
                           std::span<const std::int64_t> output_split_sizes,
                           std::span<const std::int32_t> src_rank);

ExchangeLayout reduce_layout(int rank, int size, std::int64_t input_rows,
                             std::span<const std::int64_t> input_split_sizes,
                             std::span<const std::int32_t> dst_rank, std::int64_t output_rows,
                             std::span<const std::int64_t> output_split_sizes,
                             std::span<const std::vector<std::int32_t>> src_ranks, ReduceOp op);

std::int64_t total_rows(std::span<const RowRange> ranges);

// A message row is the concatenation of one row of every column (out then lse for kLseMerge).
std::int64_t message_row_bytes(std::span<const Rows> columns);
std::vector<std::byte> pack(std::span<const Rows> columns, std::span<const RowRange> ranges);
// Writes (kSum/kAvg: adds, kMax: maxes, kLseMerge: merges, else copies) a message into columns.
enum class Combine : std::uint8_t { kCopy, kSum, kMax, kLseMerge };
void combine(std::span<const Rows> columns, std::span<const std::byte> message,
             std::span<const RowRange> ranges, Combine how);

// Columns must share num_rows; reductions need fp32/fp64 (lse: out and lse the same dtype).
void check_columns(std::span<const Rows> columns, const char* what, bool reduce);

}  // namespace magi::comm
