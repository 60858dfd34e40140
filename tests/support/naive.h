// The same-precision naive reference of docs/semantics.md §5's rule for 16-bit kernels (the
// sm90 kernels, and the CPU backend's AMX path): a kernel's error against the fp64 oracle may be
// at most twice that of a naive implementation in the same precision.
//
// Every case draws N(0, 1) inputs rounded to bf16/fp16 (testing::random_problem), so the fp64
// oracle (oracle::forward) sees exactly the values the kernel reads. Next to it, naive_forward()
// is the same-precision naive reference, computed on the host row by row over the dense
// mask (masks::to_dense): s = scale * q.k in fp32 (softcap applied if set), m = max s,
// p = exp(s - m) in fp32 and rounded to the 16-bit input dtype before it multiplies V (as the
// kernels' P operand is), O = sum p v in fp32, l = sum of the unrounded p in fp32,
// lse = m + log l, out = O / l; a sink is then folded in as docs/semantics.md §2 says
// (lse' = logaddexp(lse, logsumexp sink), out' = out * exp(lse - lse')), and out is rounded to
// the out dtype.
//
// Error measures (NaN/inf positions must match first, else the error is +inf):
//   out:        oracle::rel_error, i.e. max|a - b| / max|b| over the whole tensor;
//               required: err(kernel) <= 2 * err(naive) + 1e-6.
//   lse:        max absolute error over the finite entries (-inf rows must be -inf exactly);
//               required: err(kernel) <= 2 * err(naive) + 1e-5.
//   max_logits: max|a - b| / max(max|b|, 1) against the oracle (fp32 from exact 16-bit
//               products); required <= 1e-5.
// Rows that see nothing must give out exactly 0 and lse exactly -inf (lse_sink with a sink).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn_case.h"
#include "magi/mask.h"

namespace magi::testing {

oracle::FwdResult naive_forward(const Mask& mask, const oracle::Problem& p, DType in,
                                DType out_dtype);
// The backward's same-precision naive reference: naive_forward's out (rounded to `in`) and
// lse, then per visible cell in fp32 Delta = out . dout, P = exp(l - lse), dP = dout . v,
// dS = P (dP - Delta) (times 1 - tanh^2 under softcap), P and dS rounded to `in` as the
// kernel's P and dS operands are, dq = scale sum dS k, dk = scale sum dS q, dv = sum P dout
// accumulated in fp32 and rounded to `grad` (the gradients' dtype); dsink = -sum exp(sink -
// lse) Delta in fp32.
oracle::BwdResult naive_backward(const Mask& mask, const oracle::Problem& p, DType in,
                                 DType grad);

// ---------------------------------------------------------------------------------------------
// Comparison

// max|a - b| over finite entries; +inf when NaN/inf positions (or values) differ.
double abs_err(const std::vector<double>& a, const std::vector<double>& b);

struct Verdict {
  double out, out_naive, lse, lse_naive, max_logits;
};

// docs/semantics.md §5: got vs oracle within twice naive vs oracle; empty rows exactly 0 / -inf.
// Prints one line, "  [tag] what: out ... (naive ...), lse ... (naive ...)".
Verdict expect_close(const oracle::FwdResult& got, const oracle::FwdResult& want,
                     const oracle::FwdResult& naive, std::int64_t d, bool check_max_logits,
                     const std::string& what, const std::string& tag = "sm90");

}  // namespace magi::testing
