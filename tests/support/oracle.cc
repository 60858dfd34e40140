// The fp64 dense oracle. Every row is computed from scratch from its list of visible keys, and
// the sink is folded in as extra logits whose value rows are zero, so lse, out and dsink all
// fall out of one plain softmax over (keys ∪ sink) without a separate merge rule to get wrong.
// Nothing is tiled or fused: each quantity is its textbook definition evaluated in double.
// Non-finite inputs follow docs/numerics.md by definition: a row that reads a NaN or inf
// (its q, the k or v of a key it sees, a NaN or +inf sink logit) has out and lse NaN, and so
// does a row whose result is not finite; a poisoned row's cells give NaN gradients.
#include "oracle.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "magi/numeric.h"

namespace magi::oracle {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Visible keys of row q, found cell by cell inside every slice that covers the row.
std::vector<std::int64_t> keys_of_row(const Mask& mask, std::int64_t q) {
  std::vector<std::int64_t> keys;
  for (const Slice& s : mask.slices()) {
    if (!s.q_range.contains(q)) continue;
    for (std::int64_t k = s.k_range.start; k < s.k_range.end; ++k)
      if (visible(s, q, k)) keys.push_back(k);
  }
  return keys;
}

bool all_finite(const double* a, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(a[i])) return false;
  return true;
}

double dot(const double* a, const double* b, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

struct Ctx {
  const Problem& p;
  double scale;
  std::int64_t group;  // query heads per kv head

  const double* q(std::int64_t i, std::int64_t h) const {
    return &p.q[(i * p.heads_q + h) * p.head_dim];
  }
  const double* k(std::int64_t j, std::int64_t h) const {
    return &p.k[(j * p.heads_kv + h / group) * p.head_dim];
  }
  const double* v(std::int64_t j, std::int64_t h) const {
    return &p.v[(j * p.heads_kv + h / group) * p.head_dim];
  }
  const double* dout(std::int64_t i, std::int64_t h) const {
    return &p.dout[(i * p.heads_q + h) * p.head_dim];
  }
  std::int64_t sink_idx(std::int64_t i, std::int64_t t, std::int64_t h) const {
    return p.sink_layout == SinkLayout::kSH ? t * p.heads_q + h
                                            : (i * p.sink_len + t) * p.heads_q + h;
  }
  // Pre-softcap score s = scale * q.k and the logit x fed to the softmax.
  double score(std::int64_t i, std::int64_t j, std::int64_t h) const {
    return scale * dot(q(i, h), k(j, h), p.head_dim);
  }
  double logit(double s) const { return p.softcap > 0 ? p.softcap * std::tanh(s / p.softcap) : s; }
};

// Thread start-up costs more than a tiny problem (the finite-difference tests run thousands).
bool worth_threads(const Problem& p) {
  return double(p.num_q) * double(p.num_k) * double(p.heads_q * p.head_dim) > 1e6;
}

Ctx make_ctx(const Problem& p) {
  return Ctx{p, p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(p.head_dim)),
             p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1};
}

// Whether row i of head h reads a NaN or inf through its logits (q or a visible key's k).
bool logits_poisoned(const Ctx& c, std::int64_t i, std::int64_t h,
                     const std::vector<std::int64_t>& keys) {
  if (keys.empty()) return false;
  if (!all_finite(c.q(i, h), c.p.head_dim)) return true;
  for (std::int64_t j : keys)
    if (!all_finite(c.k(j, h), c.p.head_dim)) return true;
  return false;
}

bool row_poisoned(const Ctx& c, std::int64_t i, std::int64_t h,
                  const std::vector<std::int64_t>& keys) {
  if (logits_poisoned(c, i, h, keys)) return true;
  for (std::int64_t j : keys)
    if (!all_finite(c.v(j, h), c.p.head_dim)) return true;
  for (std::int64_t t = 0; t < c.p.sink_len; ++t) {
    const double x = c.p.sink[c.sink_idx(i, t, h)];
    if (std::isnan(x) || x == -kNegInf) return true;
  }
  return false;
}

// One (row, head): lse over keys and sink, and out = sum_j exp(x_j - lse) v_j.
double row_forward(const Ctx& c, std::int64_t i, std::int64_t h,
                   const std::vector<std::int64_t>& keys, double* out) {
  const Problem& p = c.p;
  if (row_poisoned(c, i, h, keys)) {
    std::fill(out, out + p.head_dim, std::numeric_limits<double>::quiet_NaN());
    return std::numeric_limits<double>::quiet_NaN();
  }
  std::vector<double> x(keys.size());
  double m = kNegInf;
  for (std::size_t n = 0; n < keys.size(); ++n) {
    x[n] = c.logit(c.score(i, keys[n], h));
    m = std::max(m, x[n]);
  }
  for (std::int64_t t = 0; t < p.sink_len; ++t) m = std::max(m, p.sink[c.sink_idx(i, t, h)]);
  std::fill(out, out + p.head_dim, 0.0);
  if (m == kNegInf) return kNegInf;
  double l = 0;
  for (double xn : x) l += std::exp(xn - m);
  for (std::int64_t t = 0; t < p.sink_len; ++t) l += std::exp(p.sink[c.sink_idx(i, t, h)] - m);
  const double lse = m + std::log(l);
  for (std::size_t n = 0; n < keys.size(); ++n) {
    const double w = std::exp(x[n] - lse);
    const double* vj = c.v(keys[n], h);
    for (std::int64_t d = 0; d < p.head_dim; ++d) out[d] += w * vj[d];
  }
  if (!std::isfinite(lse) || !all_finite(out, p.head_dim)) {
    std::fill(out, out + p.head_dim, std::numeric_limits<double>::quiet_NaN());
    return std::numeric_limits<double>::quiet_NaN();
  }
  return lse;
}

double delta_of(const Ctx& c, std::int64_t i, std::int64_t h, const double* out) {
  return dot(out, c.dout(i, h), c.p.head_dim);
}

// dS for cell (i, j) with the softcap chain rule applied, and P itself (for dv).
struct CellGrad {
  double p, ds_raw;
};
CellGrad cell_grad(const Ctx& c, std::int64_t i, std::int64_t j, std::int64_t h, double lse,
                   double delta) {
  if (std::isnan(lse) || !std::isfinite(delta))  // a poisoned row (or its dout): NaN
    return {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
  const double s = c.score(i, j, h);
  const double prob = std::exp(c.logit(s) - lse);
  const double dp = dot(c.dout(i, h), c.v(j, h), c.p.head_dim);
  double ds = prob * (dp - delta);
  if (c.p.softcap > 0) {
    const double t = std::tanh(s / c.p.softcap);
    ds *= 1 - t * t;
  }
  return {prob, ds};
}

}  // namespace

FwdResult forward(const Mask& mask, const Problem& p) {
  const Ctx c = make_ctx(p);
  const std::int64_t hq = p.heads_q, d = p.head_dim;
  FwdResult r;
  r.out.assign(p.num_q * hq * d, 0.0);
  r.lse.assign(p.num_q * hq, kNegInf);
  std::vector<double> row_max(p.num_q * hq, kNegInf);
#pragma omp parallel for schedule(dynamic) if (worth_threads(p))
  for (std::int64_t i = 0; i < p.num_q; ++i) {
    const auto keys = keys_of_row(mask, i);
    for (std::int64_t h = 0; h < hq; ++h) {
      r.lse[i * hq + h] = row_forward(c, i, h, keys, &r.out[(i * hq + h) * d]);
      double& m = row_max[i * hq + h];
      for (std::int64_t j : keys) m = std::max(m, c.score(i, j, h));
      if (std::isnan(r.lse[i * hq + h])) m = r.lse[i * hq + h];  // a NaN row: its head's is NaN
    }
  }
  r.max_logits.assign(hq, kNegInf);
  for (std::int64_t i = 0; i < p.num_q; ++i)
    for (std::int64_t h = 0; h < hq; ++h)
      r.max_logits[h] = nan_max(r.max_logits[h], row_max[i * hq + h]);
  return r;
}

BwdResult backward(const Mask& mask, const Problem& p) {
  const Ctx c = make_ctx(p);
  const std::int64_t hq = p.heads_q, d = p.head_dim;
  BwdResult r;
  r.dq.assign(p.q.size(), 0.0);
  r.dk.assign(p.k.size(), 0.0);
  r.dv.assign(p.v.size(), 0.0);
  r.dsink.assign(p.sink.size(), 0.0);
  // Each kv head owns its dk/dv rows and the dq/dsink of its query heads: no shared writes.
#pragma omp parallel for schedule(dynamic) if (worth_threads(p))
  for (std::int64_t g = 0; g < p.heads_kv; ++g) {
    std::vector<double> out(d);
    for (std::int64_t i = 0; i < p.num_q; ++i) {
      const auto keys = keys_of_row(mask, i);
      for (std::int64_t h = g * c.group; h < (g + 1) * c.group; ++h) {
        const double lse = row_forward(c, i, h, keys, out.data());
        const double delta = delta_of(c, i, h, out.data());
        double* dq = &r.dq[(i * hq + h) * d];
        for (std::int64_t j : keys) {
          const CellGrad cg = cell_grad(c, i, j, h, lse, delta);
          const std::int64_t kv = (j * p.heads_kv + g) * d;
          for (std::int64_t e = 0; e < d; ++e) {
            dq[e] += c.scale * cg.ds_raw * c.k(j, h)[e];
            r.dk[kv + e] += c.scale * cg.ds_raw * c.q(i, h)[e];
            r.dv[kv + e] += cg.p * c.dout(i, h)[e];
          }
        }
        // A sink logit has no value row, so dP = 0 and dS = P * (0 - Delta).
        for (std::int64_t t = 0; t < p.sink_len; ++t) {
          const std::int64_t si = c.sink_idx(i, t, h);
          if (lse != kNegInf) r.dsink[si] -= std::exp(p.sink[si] - lse) * delta;
        }
      }
    }
  }
  return r;
}

RowResult sampled(const Mask& mask, const Problem& p, const std::vector<std::int64_t>& q_rows,
                  const std::vector<std::int64_t>& k_rows) {
  const Ctx c = make_ctx(p);
  const std::int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim;
  RowResult r;
  r.q_rows = q_rows;
  r.k_rows = k_rows;
  r.out.assign(q_rows.size() * hq * d, 0.0);
  r.lse.assign(q_rows.size() * hq, kNegInf);
  r.dq.assign(q_rows.size() * hq * d, 0.0);
  r.dk.assign(k_rows.size() * hkv * d, 0.0);
  r.dv.assign(k_rows.size() * hkv * d, 0.0);

  const auto nq_rows = std::int64_t(q_rows.size());
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t n = 0; n < nq_rows; ++n) {
    const std::int64_t i = q_rows[n];
    const auto keys = keys_of_row(mask, i);
    for (std::int64_t h = 0; h < hq; ++h) {
      double* out = &r.out[(n * hq + h) * d];
      const double lse = r.lse[n * hq + h] = row_forward(c, i, h, keys, out);
      const double delta = delta_of(c, i, h, out);
      double* dq = &r.dq[(n * hq + h) * d];
      for (std::int64_t j : keys) {
        const CellGrad g = cell_grad(c, i, j, h, lse, delta);
        for (std::int64_t e = 0; e < d; ++e) dq[e] += c.scale * g.ds_raw * c.k(j, h)[e];
      }
    }
  }
  if (k_rows.empty()) return r;

  // dk/dv of a key need lse and Delta of every row that sees it: compute those rows only.
  std::vector<char> needed(p.num_q, 0);
#pragma omp parallel for schedule(dynamic, 64)
  for (std::int64_t i = 0; i < p.num_q; ++i)
    for (std::int64_t j : k_rows)
      if (mask.visible(i, j)) needed[i] = 1;
  std::vector<double> lse(p.num_q * hq, kNegInf), delta(p.num_q * hq, 0.0);
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t i = 0; i < p.num_q; ++i) {
    if (!needed[i]) continue;
    const auto keys = keys_of_row(mask, i);
    std::vector<double> out(d);
    for (std::int64_t h = 0; h < hq; ++h) {
      lse[i * hq + h] = row_forward(c, i, h, keys, out.data());
      delta[i * hq + h] = delta_of(c, i, h, out.data());
    }
  }
  const auto nk_rows = std::int64_t(k_rows.size());
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t n = 0; n < nk_rows; ++n) {
    const std::int64_t j = k_rows[n];
    for (std::int64_t i = 0; i < p.num_q; ++i) {
      if (!needed[i] || !mask.visible(i, j)) continue;
      for (std::int64_t h = 0; h < hq; ++h) {
        const CellGrad g = cell_grad(c, i, j, h, lse[i * hq + h], delta[i * hq + h]);
        const std::int64_t kv = (n * hkv + h / c.group) * d;
        for (std::int64_t e = 0; e < d; ++e) {
          r.dk[kv + e] += c.scale * g.ds_raw * c.q(i, h)[e];
          r.dv[kv + e] += g.p * c.dout(i, h)[e];
        }
      }
    }
  }
  return r;
}

double rel_error(const double* a, const double* b, std::size_t n) {
  double max_diff = 0, max_ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

}  // namespace magi::oracle
