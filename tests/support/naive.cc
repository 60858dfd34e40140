// The same-precision naive reference and the comparison by the 16-bit rule (naive.h).
#include "naive.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>

#include "magi/mask_builders.h"

namespace magi::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
float round16(DType t, float x) { return float(round_to(t, x)); }

}  // namespace

oracle::FwdResult naive_forward(const Mask& mask, const oracle::Problem& p, DType in,
                                DType out_dtype) {
  const std::int64_t nq = p.num_q, nk = p.num_k, hq = p.heads_q, d = p.head_dim;
  const std::int64_t group = p.heads_q / p.heads_kv;
  const std::vector<std::uint8_t> dense = masks::to_dense(mask);
  const float scale = float(p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(d)));
  const float cap = float(p.softcap);
  const std::vector<float> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()),
      v(p.v.begin(), p.v.end());
  oracle::FwdResult r;
  r.out.assign(std::size_t(nq * hq * d), 0.0);
  r.lse.assign(std::size_t(nq * hq), -kInf);
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t i = 0; i < nq; ++i) {
    std::vector<std::int64_t> keys;
    for (std::int64_t j = 0; j < nk; ++j)
      if (dense[std::size_t(i * nk + j)]) keys.push_back(j);
    std::vector<float> s(keys.size()), o(static_cast<std::size_t>(d));
    for (std::int64_t h = 0; h < hq; ++h) {
      const float* qi = &q[std::size_t((i * hq + h) * d)];
      const std::int64_t hk = h / group;
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const float* kj = &k[std::size_t((keys[n] * p.heads_kv + hk) * d)];
        float dot = 0.f;
        for (std::int64_t e = 0; e < d; ++e) dot += qi[e] * kj[e];
        float x = scale * dot;
        if (cap > 0.f) x = cap * std::tanh(x / cap);
        s[n] = x;
        m = std::max(m, x);
      }
      std::fill(o.begin(), o.end(), 0.f);
      float l = 0.f;
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const float pn = std::exp(s[n] - m);
        l += pn;
        const float pr = round16(in, pn);
        const float* vj = &v[std::size_t((keys[n] * p.heads_kv + hk) * d)];
        for (std::int64_t e = 0; e < d; ++e) o[std::size_t(e)] += pr * vj[e];
      }
      float lse = keys.empty() ? -std::numeric_limits<float>::infinity() : m + std::log(l);
      float w = keys.empty() ? 0.f : 1.f / l;
      if (p.sink_len > 0) {
        float smax = -std::numeric_limits<float>::infinity();
        std::vector<float> sk(std::size_t(p.sink_len));
        for (std::int64_t t = 0; t < p.sink_len; ++t) {
          const std::int64_t idx =
              p.sink_layout == SinkLayout::kSH ? t * hq + h : (i * p.sink_len + t) * hq + h;
          sk[std::size_t(t)] = float(p.sink[std::size_t(idx)]);
          smax = std::max(smax, sk[std::size_t(t)]);
        }
        float ssum = 0.f;
        for (float x : sk) ssum += std::exp(x - smax);
        const float lse_sink = smax + std::log(ssum);
        const float hi = std::max(lse, lse_sink), lo = std::min(lse, lse_sink);
        const float merged =
            lo == -std::numeric_limits<float>::infinity() ? hi : hi + std::log1p(std::exp(lo - hi));
        if (!keys.empty()) w *= std::exp(lse - merged);
        lse = merged;
      }
      r.lse[std::size_t(i * hq + h)] = lse;
      for (std::int64_t e = 0; e < d; ++e)
        r.out[std::size_t((i * hq + h) * d + e)] =
            round_to(out_dtype, double(o[std::size_t(e)] * w));
    }
  }
  return r;
}

oracle::BwdResult naive_backward(const Mask& mask, const oracle::Problem& p, DType in,
                                 DType grad) {
  const oracle::FwdResult fwd = naive_forward(mask, p, in, in);
  const std::int64_t nq = p.num_q, nk = p.num_k, hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim;
  const std::int64_t group = hq / hkv;
  const std::vector<std::uint8_t> dense = masks::to_dense(mask);
  const float scale = float(p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(d)));
  const float cap = float(p.softcap);
  const std::vector<float> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()),
      v(p.v.begin(), p.v.end()), dout(p.dout.begin(), p.dout.end()),
      out(fwd.out.begin(), fwd.out.end());
  // The rounded P and dS of every (q head, row, key), 0 on hidden cells; Delta per (row, head).
  std::vector<float> pr(std::size_t(hq * nq * nk), 0.f), dsr(pr.size(), 0.f);
  std::vector<float> delta(std::size_t(nq * hq), 0.f);
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t i = 0; i < nq; ++i)
    for (std::int64_t h = 0; h < hq; ++h) {
      const float* qi = &q[std::size_t((i * hq + h) * d)];
      const float* gi = &dout[std::size_t((i * hq + h) * d)];
      const float* oi = &out[std::size_t((i * hq + h) * d)];
      float dl = 0.f;
      for (std::int64_t e = 0; e < d; ++e) dl += oi[e] * gi[e];
      delta[std::size_t(i * hq + h)] = dl;
      const float lse = float(fwd.lse[std::size_t(i * hq + h)]);
      const std::int64_t hk = h / group;
      for (std::int64_t j = 0; j < nk; ++j) {
        if (!dense[std::size_t(i * nk + j)]) continue;
        const float* kj = &k[std::size_t((j * hkv + hk) * d)];
        const float* vj = &v[std::size_t((j * hkv + hk) * d)];
        float dot = 0.f, dp = 0.f;
        for (std::int64_t e = 0; e < d; ++e) dot += qi[e] * kj[e], dp += gi[e] * vj[e];
        float l = scale * dot, chain = 1.f;
        if (cap > 0.f) {
          const float t = std::tanh(l / cap);
          l = cap * t;
          chain = 1.f - t * t;
        }
        const float pv = std::exp(l - lse);
        const std::size_t at = std::size_t((h * nq + i) * nk + j);
        pr[at] = round16(in, pv);
        dsr[at] = round16(in, pv * (dp - dl) * chain);
      }
    }
  oracle::BwdResult r;
  r.dq.assign(std::size_t(nq * hq * d), 0.0);
  r.dk.assign(std::size_t(nk * hkv * d), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t i = 0; i < nq; ++i)
    for (std::int64_t h = 0; h < hq; ++h) {
      std::vector<float> acc(std::size_t(d), 0.f);
      for (std::int64_t j = 0; j < nk; ++j) {
        const float ds = dsr[std::size_t((h * nq + i) * nk + j)];
        if (ds == 0.f) continue;
        const float* kj = &k[std::size_t((j * hkv + h / group) * d)];
        for (std::int64_t e = 0; e < d; ++e) acc[std::size_t(e)] += ds * kj[e];
      }
      for (std::int64_t e = 0; e < d; ++e)
        r.dq[std::size_t((i * hq + h) * d + e)] =
            round_to(grad, double(scale * acc[std::size_t(e)]));
    }
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t j = 0; j < nk; ++j)
    for (std::int64_t hk = 0; hk < hkv; ++hk) {
      std::vector<float> ak(std::size_t(d), 0.f), av(std::size_t(d), 0.f);
      for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (std::int64_t i = 0; i < nq; ++i) {
          const std::size_t at = std::size_t((h * nq + i) * nk + j);
          if (pr[at] == 0.f && dsr[at] == 0.f) continue;
          const float* qi = &q[std::size_t((i * hq + h) * d)];
          const float* gi = &dout[std::size_t((i * hq + h) * d)];
          for (std::int64_t e = 0; e < d; ++e) {
            ak[std::size_t(e)] += dsr[at] * qi[e];
            av[std::size_t(e)] += pr[at] * gi[e];
          }
        }
      for (std::int64_t e = 0; e < d; ++e) {
        r.dk[std::size_t((j * hkv + hk) * d + e)] =
            round_to(grad, double(scale * ak[std::size_t(e)]));
        r.dv[std::size_t((j * hkv + hk) * d + e)] =
            round_to(grad, double(av[std::size_t(e)]));
      }
    }
  if (p.sink_len > 0) {
    const bool ssh = p.sink_layout == SinkLayout::kSSH;
    r.dsink.assign(p.sink.size(), 0.0);
    for (std::int64_t i = 0; i < nq; ++i)
      for (std::int64_t h = 0; h < hq; ++h) {
        const float lse = float(fwd.lse[std::size_t(i * hq + h)]);
        if (lse == -std::numeric_limits<float>::infinity()) continue;
        for (std::int64_t t = 0; t < p.sink_len; ++t) {
          const std::size_t idx = std::size_t(ssh ? (i * p.sink_len + t) * hq + h : t * hq + h);
          const float w = std::exp(float(p.sink[idx]) - lse);
          r.dsink[idx] -= double(w * delta[std::size_t(i * hq + h)]);
        }
      }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Comparison

double abs_err(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return kInf;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return kInf;
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return kInf;
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

Verdict expect_close(const oracle::FwdResult& got, const oracle::FwdResult& want,
                     const oracle::FwdResult& naive, std::int64_t d, bool check_max_logits,
                     const std::string& what, const std::string& tag) {
  Verdict v{};
  v.out = rel_err(got.out, want.out);
  v.out_naive = rel_err(naive.out, want.out);
  v.lse = abs_err(got.lse, want.lse);
  v.lse_naive = abs_err(naive.lse, want.lse);
  EXPECT_TRUE(std::isfinite(v.out_naive) && std::isfinite(v.lse_naive))
      << "test bug: the naive reference disagrees with the oracle on NaN/inf positions: " << what;
  EXPECT_LE(v.out, 2 * v.out_naive + 1e-6)
      << "out error vs oracle " << v.out << ", naive " << v.out_naive << ": " << what;
  EXPECT_LE(v.lse, 2 * v.lse_naive + 1e-5)
      << "lse abs error vs oracle " << v.lse << ", naive " << v.lse_naive << ": " << what;
  if (check_max_logits) {
    v.max_logits = lse_err(got.max_logits, want.max_logits);
    EXPECT_LE(v.max_logits, 1e-5) << "max_logits relative error vs oracle: " << what;
  }
  // Rows that see nothing: the oracle gives lse -inf (lse_sink with a sink) and out exactly 0.
  std::int64_t nonzero = 0, bad_lse = 0, rows = 0;
  for (std::size_t r = 0; r < want.lse.size(); ++r) {
    const auto row = [&](const oracle::FwdResult& x, std::int64_t e) {
      return x.out[r * std::size_t(d) + std::size_t(e)];
    };
    bool empty = want.lse[r] == -kInf;
    if (!empty) {
      empty = true;
      for (std::int64_t e = 0; e < d && empty; ++e) empty = row(want, e) == 0.0;
    }
    if (!empty) continue;
    ++rows;
    bad_lse += want.lse[r] == -kInf && got.lse[r] != -kInf;
    for (std::int64_t e = 0; e < d; ++e) nonzero += row(got, e) != 0.0;
  }
  EXPECT_EQ(nonzero, 0) << "rows that see nothing must give out exactly 0: " << what;
  EXPECT_EQ(bad_lse, 0) << "rows that see nothing must give lse exactly -inf: " << what;
  std::cout << "  [" << tag << "] " << what << std::scientific << std::setprecision(2)
            << ": out " << v.out
            << " (naive " << v.out_naive << "), lse " << v.lse << " (naive " << v.lse_naive << ")";
  if (check_max_logits) std::cout << ", max_logits " << v.max_logits;
  if (rows > 0) std::cout << std::defaultfloat << ", " << rows << " empty row-heads";
  std::cout << std::defaultfloat << "\n";
  return v;
}

}  // namespace magi::testing
