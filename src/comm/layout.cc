// Split lists -> per-peer row ranges, validated once here (the public boundary of every
// backend), plus packing and the combine loops. Combining runs peer by peer in ascending rank,
// so every output row sees its contributions in ascending source-rank order: deterministic.
#include "layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "magi/error.h"
#include "magi/numeric.h"

namespace magi::comm {
namespace {

void check_splits(const char* op, const char* side, std::span<const std::int64_t> sizes,
                  std::size_t num_peer_lists, const char* peer_list, std::int64_t buffer_rows) {
  MAGI_CHECK(sizes.size() == num_peer_lists, op, ": ", sizes.size(), " ", side,
             " split sizes but ", num_peer_lists, " ", peer_list, " entries");
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    MAGI_CHECK(sizes[i] >= 0, op, ": ", side, " split ", i, " has negative size ", sizes[i]);
    sum += sizes[i];
  }
  MAGI_CHECK(sum <= buffer_rows, op, ": ", side, " splits sum to ", sum, " rows but the ", side,
             " buffer has ", buffer_rows);
}

void check_rank(const char* op, const char* what, std::size_t split, std::int32_t r, int size) {
  MAGI_CHECK(r >= 0 && r < size, op, ": ", what, " of split ", split, " is rank ", r,
             ", outside [0, ", size, ")");
}

// One rank list per split (cast destinations or reduce sources): in range, no repeats.
void check_rank_set(const char* op, const char* what, std::size_t split,
                    const std::vector<std::int32_t>& ranks, int size) {
  std::vector<bool> seen(std::size_t(size), false);
  for (std::int32_t r : ranks) {
    check_rank(op, what, split, r, size);
    MAGI_CHECK(!seen[std::size_t(r)], op, ": ", what, " of split ", split, " lists rank ", r,
               " twice");
    seen[std::size_t(r)] = true;
  }
}

ExchangeLayout cast_layout(const char* kOp, int size, std::int64_t input_rows,
                           std::span<const std::int64_t> input_split_sizes,
                           std::span<const std::vector<std::int32_t>> dst_ranks,
                           std::int64_t output_rows,
                           std::span<const std::int64_t> output_split_sizes,
                           std::span<const std::int32_t> src_rank) {
  check_splits(kOp, "input", input_split_sizes, dst_ranks.size(), "dst_ranks", input_rows);
  check_splits(kOp, "output", output_split_sizes, src_rank.size(), "src_rank", output_rows);
  ExchangeLayout layout{std::vector<std::vector<RowRange>>(std::size_t(size)),
                        std::vector<std::vector<RowRange>>(std::size_t(size))};
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < input_split_sizes.size(); ++i) {
    check_rank_set(kOp, "destination", i, dst_ranks[i], size);
    if (input_split_sizes[i] > 0)
      for (std::int32_t r : dst_ranks[i])
        layout.send[std::size_t(r)].push_back({offset, input_split_sizes[i]});
    offset += input_split_sizes[i];
  }
  offset = 0;
  for (std::size_t j = 0; j < output_split_sizes.size(); ++j) {
    check_rank(kOp, "source", j, src_rank[j], size);
    if (output_split_sizes[j] > 0)
      layout.recv[std::size_t(src_rank[j])].push_back({offset, output_split_sizes[j]});
    offset += output_split_sizes[j];
  }
  return layout;
}

ExchangeLayout reduce_layout(const char* kOp, int size, std::int64_t input_rows,
                             std::span<const std::int64_t> input_split_sizes,
                             std::span<const std::int32_t> dst_rank, std::int64_t output_rows,
                             std::span<const std::int64_t> output_split_sizes,
                             std::span<const std::vector<std::int32_t>> src_ranks, ReduceOp op) {
  check_splits(kOp, "input", input_split_sizes, dst_rank.size(), "dst_rank", input_rows);
  check_splits(kOp, "output", output_split_sizes, src_ranks.size(), "src_ranks", output_rows);
  ExchangeLayout layout{std::vector<std::vector<RowRange>>(std::size_t(size)),
                        std::vector<std::vector<RowRange>>(std::size_t(size))};
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < input_split_sizes.size(); ++i) {
    check_rank(kOp, "destination", i, dst_rank[i], size);
    if (input_split_sizes[i] > 0)
      layout.send[std::size_t(dst_rank[i])].push_back({offset, input_split_sizes[i]});
    offset += input_split_sizes[i];
  }
  offset = 0;
  for (std::size_t j = 0; j < output_split_sizes.size(); ++j) {
    check_rank_set(kOp, "source", j, src_ranks[j], size);
    const double scale = op == ReduceOp::kAvg && !src_ranks[j].empty()
                             ? 1.0 / double(src_ranks[j].size())
                             : 1.0;
    if (output_split_sizes[j] > 0)
      for (std::int32_t r : src_ranks[j])
        layout.recv[std::size_t(r)].push_back({offset, output_split_sizes[j], scale});
    offset += output_split_sizes[j];
  }
  return layout;
}

// Columns must share num_rows; reductions need fp32/fp64 (lse: out and lse the same dtype).
void check_columns(std::span<const Rows> columns, const char* what, bool reduce) {
  for (const Rows& c : columns) {
    MAGI_CHECK(c.num_rows >= 0 && c.row_elems >= 0, what, ": negative buffer shape [",
               c.num_rows, ", ", c.row_elems, "]");
    MAGI_CHECK(c.data != nullptr || c.num_bytes() == 0, what, ": null buffer of ", c.num_rows,
               " rows");
    MAGI_CHECK(c.num_rows == columns[0].num_rows, what, ": buffers have ", columns[0].num_rows,
               " and ", c.num_rows, " rows");
    MAGI_CHECK(!reduce || c.dtype == DType::kF32 || c.dtype == DType::kF64, what,
               ": reductions need fp32 or fp64, got ", dtype_name(c.dtype));
    MAGI_CHECK(c.dtype == columns[0].dtype || !reduce, what, ": out is ",
               dtype_name(columns[0].dtype), " but lse is ", dtype_name(c.dtype));
  }
}

void check_same_rows(const char* op, const Rows& in, const Rows& out) {
  MAGI_CHECK(in.dtype == out.dtype && in.row_elems == out.row_elems, op, ": input rows are ",
             in.row_elems, " x ", dtype_name(in.dtype), " but output rows are ", out.row_elems,
             " x ", dtype_name(out.dtype));
}

void check_counts(const char* op, int size, std::span<const std::int64_t> counts) {
  MAGI_CHECK(std::int64_t(counts.size()) == size, op, ": ", counts.size(), " counts for ", size,
             " ranks");
}

std::vector<std::int32_t> every_rank(int size) {
  std::vector<std::int32_t> r(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) r[std::size_t(i)] = i;
  return r;
}

}  // namespace

ExchangeLayout group_cast_layout(const char* op, int rank, int size, const Rows& input,
                                 std::span<const std::int64_t> input_split_sizes,
                                 std::span<const std::vector<std::int32_t>> dst_ranks,
                                 const Rows& output,
                                 std::span<const std::int64_t> output_split_sizes,
                                 std::span<const std::int32_t> src_rank) {
  (void)rank;
  check_columns({&input, 1}, (std::string(op) + " input").c_str(), false);
  check_columns({&output, 1}, (std::string(op) + " output").c_str(), false);
  MAGI_CHECK(input.row_bytes() == output.row_bytes(), op, ": input rows are ", input.row_bytes(),
             " bytes but output rows are ", output.row_bytes());
  return cast_layout(op, size, input.num_rows, input_split_sizes, dst_ranks, output.num_rows,
                     output_split_sizes, src_rank);
}

ExchangeLayout group_reduce_layout(int rank, int size, const Rows& input,
                                   std::span<const std::int64_t> input_split_sizes,
                                   std::span<const std::int32_t> dst_rank, const Rows& output,
                                   std::span<const std::int64_t> output_split_sizes,
                                   std::span<const std::vector<std::int32_t>> src_ranks,
                                   ReduceOp op) {
  (void)rank;
  MAGI_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, "group_reduce: op ",
             reduce_op_name(op), " is not sum or avg (use group_reduce_lse for lse)");
  check_columns({&input, 1}, "group_reduce input", true);
  check_columns({&output, 1}, "group_reduce output", true);
  check_same_rows("group_reduce", input, output);
  return reduce_layout("group_reduce", size, input.num_rows, input_split_sizes, dst_rank,
                       output.num_rows, output_split_sizes, src_ranks, op);
}

ExchangeLayout group_reduce_lse_layout(int rank, int size, std::span<const Rows, 2> in,
                                       std::span<const std::int64_t> input_split_sizes,
                                       std::span<const std::int32_t> dst_rank,
                                       std::span<const Rows, 2> out,
                                       std::span<const std::int64_t> output_split_sizes,
                                       std::span<const std::vector<std::int32_t>> src_ranks) {
  (void)rank;
  check_columns(in, "group_reduce_lse input", true);
  check_columns(out, "group_reduce_lse output", true);
  MAGI_CHECK(in[0].dtype == out[0].dtype && in[0].row_elems == out[0].row_elems &&
                 in[1].row_elems == out[1].row_elems,
             "group_reduce_lse: input and output rows differ in shape or dtype");
  MAGI_CHECK(out[1].row_elems > 0 && out[0].row_elems % out[1].row_elems == 0,
             "group_reduce_lse: out rows of ", out[0].row_elems,
             " elements are not heads x d for ", out[1].row_elems, " lse heads");
  return reduce_layout("group_reduce_lse", size, in[0].num_rows, input_split_sizes, dst_rank,
                       out[0].num_rows, output_split_sizes, src_ranks, ReduceOp::kLseMerge);
}

ExchangeLayout all_gather_v_layout(int rank, int size, const Rows& input, const Rows& output,
                                   std::span<const std::int64_t> counts) {
  check_counts("all_gather_v", size, counts);
  const std::vector<std::int32_t> everyone = every_rank(size);
  const std::int64_t mine = counts[std::size_t(rank)];
  const std::vector<std::vector<std::int32_t>> dst{everyone};
  return group_cast_layout("all_gather_v", rank, size, input, std::span(&mine, 1), dst, output,
                           counts, everyone);
}

ExchangeLayout reduce_scatter_layout(int rank, int size, const Rows& input, const Rows& output,
                                     std::span<const std::int64_t> counts) {
  check_counts("reduce_scatter", size, counts);
  check_columns({&input, 1}, "reduce_scatter input", true);
  check_columns({&output, 1}, "reduce_scatter output", true);
  check_same_rows("reduce_scatter", input, output);
  const std::int64_t mine = counts[std::size_t(rank)];
  MAGI_CHECK(output.num_rows >= mine, "reduce_scatter: output has ", output.num_rows,
             " rows but rank ", rank, " owns ", mine);
  const std::vector<std::int32_t> owner = every_rank(size);
  const std::vector<std::vector<std::int32_t>> src{owner};
  return reduce_layout("reduce_scatter", size, input.num_rows, counts, owner, output.num_rows,
                       std::span(&mine, 1), src, ReduceOp::kSum);
}

void check_all_reduce(const Rows& data, ReduceOp op) {
  MAGI_CHECK(op == ReduceOp::kSum || op == ReduceOp::kMax, "all_reduce: op ",
             reduce_op_name(op), " is not sum or max");
  check_columns({&data, 1}, "all_reduce", true);
}

std::int64_t total_rows(std::span<const RowRange> ranges) {
  std::int64_t n = 0;
  for (const RowRange& r : ranges) n += r.count;
  return n;
}

std::int64_t message_row_bytes(std::span<const Rows> columns) {
  std::int64_t n = 0;
  for (const Rows& c : columns) n += c.row_bytes();
  return n;
}

std::vector<std::byte> pack(std::span<const Rows> columns, std::span<const RowRange> ranges) {
  const std::int64_t row_bytes = message_row_bytes(columns);
  std::vector<std::byte> out(std::size_t(total_rows(ranges) * row_bytes));
  std::byte* dst = out.data();
  for (const RowRange& r : ranges)
    for (std::int64_t row = r.begin; row < r.begin + r.count; ++row)
      for (const Rows& c : columns) {
        const auto n = std::size_t(c.row_bytes());
        std::memcpy(dst, static_cast<const std::byte*>(c.data) + std::size_t(row) * n, n);
        dst += n;
      }
  return out;
}

namespace {

// Pairwise lse merge of one head: acc (o, l) with contribution (oc, lc) of d elements.
// Pairwise in ascending rank equals the closed form up to rounding, and never forms inf - inf.
template <typename T>
void lse_merge(T* o, T& l, const T* oc, T lc, std::int64_t d) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (lc == kNegInf) return;
  if (l == kNegInf) {
    std::copy(oc, oc + d, o);
    l = lc;
    return;
  }
  const T m = std::max(l, lc);
  const T merged = m + std::log1p(std::exp(-std::abs(l - lc)));
  const T wa = std::exp(l - merged), wc = std::exp(lc - merged);
  for (std::int64_t e = 0; e < d; ++e) o[e] = wa * o[e] + wc * oc[e];
  l = merged;
}

template <typename T>
void combine_typed(std::span<const Rows> columns, const std::byte* src,
                   std::span<const RowRange> ranges, Combine how) {
  for (const RowRange& r : ranges)
    for (std::int64_t row = r.begin; row < r.begin + r.count; ++row) {
      if (how == Combine::kLseMerge) {
        const Rows& out = columns[0];
        const Rows& lse = columns[1];
        const std::int64_t heads = lse.row_elems;
        const std::int64_t d = heads > 0 ? out.row_elems / heads : 0;
        T* o = static_cast<T*>(out.data) + row * out.row_elems;
        T* l = static_cast<T*>(lse.data) + row * heads;
        const T* oc = reinterpret_cast<const T*>(src);
        const T* lc = oc + out.row_elems;
        for (std::int64_t h = 0; h < heads; ++h) lse_merge(o + h * d, l[h], oc + h * d, lc[h], d);
        src += message_row_bytes(columns);
        continue;
      }
      for (const Rows& c : columns) {
        T* dst = static_cast<T*>(c.data) + row * c.row_elems;
        const T* in = reinterpret_cast<const T*>(src);
        const T scale = T(r.scale);
        for (std::int64_t e = 0; e < c.row_elems; ++e) {
          if (how == Combine::kMax)  // a NaN from any rank stays NaN
            dst[e] = nan_max(dst[e], in[e]);
          else
            dst[e] += scale == T(1) ? in[e] : in[e] * scale;
        }
        src += c.row_bytes();
      }
    }
}

}  // namespace

void combine(std::span<const Rows> columns, std::span<const std::byte> message,
             std::span<const RowRange> ranges, Combine how) {
  MAGI_DCHECK(std::int64_t(message.size()) == total_rows(ranges) * message_row_bytes(columns),
              "message of ", message.size(), " bytes does not match its ranges");
  if (how == Combine::kCopy) {
    const std::byte* src = message.data();
    for (const RowRange& r : ranges)
      for (std::int64_t row = r.begin; row < r.begin + r.count; ++row)
        for (const Rows& c : columns) {
          const auto n = std::size_t(c.row_bytes());
          std::memcpy(static_cast<std::byte*>(c.data) + std::size_t(row) * n, src, n);
          src += n;
        }
    return;
  }
  if (columns[0].dtype == DType::kF64)
    combine_typed<double>(columns, message.data(), ranges, how);
  else
    combine_typed<float>(columns, message.data(), ranges, how);
}

std::string reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kLseMerge: return "lse";
  }
  return "unknown";
}

}  // namespace magi::comm
