// The fp64 dense oracle (docs/semantics.md §5): materialise visible(q, k) from the mask cell by
// cell and compute attention in double, row by row. Short enough to be obviously right; it is the
// yardstick for the CPU backend, the GPU kernels and the distributed runtime.
#pragma once

#include <cstdint>
#include <vector>

#include "magi/attention.h"
#include "magi/mask.h"

namespace magi::oracle {

// All arrays contiguous row-major fp64: q [nq, hq, d], k and v [nk, hkv, d], dout like q,
// sink [s, hq] ("sh") or [nq, s, hq] ("ssh"), empty when absent.
struct Problem {
  std::int64_t num_q = 0, num_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  std::vector<double> q, k, v, dout, sink;
  std::int64_t sink_len = 0;
  SinkLayout sink_layout = SinkLayout::kSH;
  double scale = 0;    // 0: 1/sqrt(d)
  double softcap = 0;  // 0: off
};

struct FwdResult {
  std::vector<double> out;         // [nq, hq, d]
  std::vector<double> lse;         // [nq, hq]; -inf for empty rows without sink
  std::vector<double> max_logits;  // [hq]; max of scale*q.k over visible cells (pre-softcap),
                                   // NaN if a row of the head is NaN
};

struct BwdResult {
  std::vector<double> dq, dk, dv, dsink;  // shapes of q, k, v, sink
};

FwdResult forward(const Mask& mask, const Problem& p);
BwdResult backward(const Mask& mask, const Problem& p);

// Sampled checks for large problems: forward out/lse and dq for the given query rows only,
// and dk/dv for the given key rows only (computing lse just for the rows that see them).
struct RowResult {
  std::vector<std::int64_t> q_rows, k_rows;
  std::vector<double> out, lse, dq;  // [q_rows, hq, d] / [q_rows, hq] / [q_rows, hq, d]
  std::vector<double> dk, dv;        // [k_rows, hkv, d]
};
RowResult sampled(const Mask& mask, const Problem& p, const std::vector<std::int64_t>& q_rows,
                  const std::vector<std::int64_t>& k_rows);

// Relative error max|a - b| / max(max|b|, tiny), with NaN/inf positions required to match
// (a mismatch returns +inf).
double rel_error(const double* a, const double* b, std::size_t n);

}  // namespace magi::oracle
