// Backend test cases: random problems and masks, typed strided buffers, and the FwdArgs /
// BwdArgs built from them. A buffer stores exactly the values the oracle is given (rounded to
// the tested dtype first), and every gap between strided elements holds NaN: a backend that
// misreads a stride produces NaN, and one that writes outside the view is caught by
// gaps_intact().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "magi/attention.h"
#include "oracle.h"

namespace magi::testing {

enum class Layout { kContiguous, kPadded, kHeadMajor };

inline double round_to(DType t, double x) {
  switch (t) {
    case DType::kF64: return x;
    case DType::kF32: return double(float(x));
    case DType::kBF16: return to_float(to_bf16(float(x)));
    case DType::kF16: return to_float(to_f16(float(x)));
  }
  return x;
}

class Buffer {
 public:
  // kPadded pads every non-last dim by an odd amount (unaligned rows); kHeadMajor lays a
  // [N, H, D] tensor out as [H, N, D] in memory. Both keep the last-dim stride 1.
  Buffer(DType dtype, std::vector<std::int64_t> shape, Layout layout = Layout::kContiguous) {
    view_.dtype = dtype;
    view_.ndim = int(shape.size());
    for (int d = 0; d < view_.ndim; ++d) view_.shape[d] = shape[d];
    const int n = view_.ndim;
    if (layout == Layout::kHeadMajor && n == 3) {
      view_.stride = {shape[2], shape[0] * shape[2], 1, 0};
      extent_ = shape[0] * shape[1] * shape[2];
    } else {
      extent_ = 1;
      for (int d = n - 1; d >= 0; --d) {
        view_.stride[d] = extent_;
        extent_ = extent_ * shape[d] + (layout == Layout::kPadded ? 3 + 2 * (n - 1 - d) : 0);
      }
    }
    words_.assign(std::size_t(extent_ * dtype_size(dtype) + 7) / 8, 0);
    for (std::int64_t e = 0; e < extent_; ++e) put(e, std::nan(""));
    view_.data = extent_ > 0 ? words_.data() : nullptr;
    for (std::int64_t i = 0; i < numel(); ++i) covered_.push_back(offset(i));
  }

  // The view points into words_: copies would alias, moves keep the heap block.
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;

  const TensorView& view() const { return view_; }
  std::int64_t numel() const { return view_.numel(); }

  // Logical row-major values, rounded to the buffer's dtype.
  void store(const std::vector<double>& xs) {
    for (std::int64_t i = 0; i < numel(); ++i) put(offset(i), xs[std::size_t(i)]);
  }
  void fill(double x) { store(std::vector<double>(std::size_t(numel()), x)); }
  std::vector<double> load() const {
    std::vector<double> xs(static_cast<std::size_t>(numel()));
    for (std::int64_t i = 0; i < numel(); ++i) xs[std::size_t(i)] = get(offset(i));
    return xs;
  }
  std::vector<std::uint64_t> raw() const { return words_; }

  // Every element outside the view still holds the NaN it was created with.
  bool gaps_intact() const {
    std::vector<char> in_view(std::size_t(extent_), 0);
    for (std::int64_t e : covered_) in_view[std::size_t(e)] = 1;
    for (std::int64_t e = 0; e < extent_; ++e)
      if (!in_view[std::size_t(e)] && !std::isnan(get(e))) return false;
    return true;
  }

 private:
  std::int64_t offset(std::int64_t flat) const {
    std::int64_t off = 0;
    for (int d = view_.ndim - 1; d >= 0; --d) {
      off += (flat % view_.shape[d]) * view_.stride[d];
      flat /= view_.shape[d];
    }
    return off;
  }
  void put(std::int64_t e, double x) {
    auto* base = reinterpret_cast<unsigned char*>(words_.data());
    switch (view_.dtype) {
      case DType::kF64: std::memcpy(base + e * 8, &x, 8); break;
      case DType::kF32: {
        const float f = float(x);
        std::memcpy(base + e * 4, &f, 4);
        break;
      }
      case DType::kBF16: {
        const BF16 b = to_bf16(float(x));
        std::memcpy(base + e * 2, &b, 2);
        break;
      }
      case DType::kF16: {
        const F16 h = to_f16(float(x));
        std::memcpy(base + e * 2, &h, 2);
        break;
      }
    }
  }
  double get(std::int64_t e) const {
    const auto* base = reinterpret_cast<const unsigned char*>(words_.data());
    switch (view_.dtype) {
      case DType::kF64: {
        double x;
        std::memcpy(&x, base + e * 8, 8);
        return x;
      }
      case DType::kF32: {
        float f;
        std::memcpy(&f, base + e * 4, 4);
        return f;
      }
      case DType::kBF16: {
        BF16 b;
        std::memcpy(&b, base + e * 2, 2);
        return to_float(b);
      }
      case DType::kF16: {
        F16 h;
        std::memcpy(&h, base + e * 2, 2);
        return to_float(h);
      }
    }
    return 0;
  }

  TensorView view_;
  std::vector<std::uint64_t> words_;  // 8-byte words keep fp64 elements aligned
  std::vector<std::int64_t> covered_;
  std::int64_t extent_ = 0;  // elements spanned, gaps included
};

// dtypes of one backend call. `in` is q/k/v/dout; the compute type follows q.
struct Config {
  DType in = DType::kF64;
  DType out = DType::kF64;   // forward out (input of backward)
  DType grad = DType::kF64;  // dq/dk/dv
  DType sink = DType::kF64;
  Layout layout = Layout::kContiguous;
  bool max_logits = true;
  AttnOptions opts;

  DType compute() const { return in == DType::kF64 ? DType::kF64 : DType::kF32; }
};

inline Config config_for(DType in) {
  Config c;
  c.in = in;
  c.out = c.grad = c.sink = in == DType::kF64 ? DType::kF64 : DType::kF32;
  return c;
}

// N(0, 1) inputs rounded to the config's dtypes, so the oracle sees exactly the stored values.
inline oracle::Problem random_problem(std::mt19937_64& rng, std::int64_t nq, std::int64_t nk,
                                      std::int64_t hq, std::int64_t hkv, std::int64_t d,
                                      const Config& cfg, std::int64_t sink_len = 0) {
  std::normal_distribution<double> normal;
  auto draw = [&](std::int64_t n, DType t) {
    std::vector<double> xs(static_cast<std::size_t>(n));
    for (double& x : xs) x = round_to(t, normal(rng));
    return xs;
  };
  oracle::Problem p;
  p.num_q = nq;
  p.num_k = nk;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = d;
  p.q = draw(nq * hq * d, cfg.in);
  p.k = draw(nk * hkv * d, cfg.in);
  p.v = draw(nk * hkv * d, cfg.in);
  p.dout = draw(nq * hq * d, cfg.in);
  p.sink_len = sink_len;
  p.sink_layout = cfg.opts.sink_layout;
  if (sink_len > 0)
    p.sink = draw(sink_len * hq * (cfg.opts.sink_layout == SinkLayout::kSSH ? nq : 1), cfg.sink);
  p.scale = cfg.opts.softmax_scale.value_or(0.0);
  p.softcap = cfg.opts.softcap;
  return p;
}

inline std::vector<std::int64_t> sink_shape(const oracle::Problem& p) {
  if (p.sink_layout == SinkLayout::kSH) return {p.sink_len, p.heads_q};
  return {p.num_q, p.sink_len, p.heads_q};
}

// Buffers of one forward call; out/lse/max_logits start as NaN unless seeded.
struct FwdCall {
  Buffer q, k, v, out, lse, max_logits;
  std::optional<Buffer> sink;
  bool has_max_logits;

  FwdCall(const oracle::Problem& p, const Config& cfg)
      : q(cfg.in, {p.num_q, p.heads_q, p.head_dim}, cfg.layout),
        k(cfg.in, {p.num_k, p.heads_kv, p.head_dim}, cfg.layout),
        v(cfg.in, {p.num_k, p.heads_kv, p.head_dim}, cfg.layout),
        out(cfg.out, {p.num_q, p.heads_q, p.head_dim}, cfg.layout),
        lse(cfg.compute(), {p.num_q, p.heads_q}, cfg.layout),
        max_logits(cfg.compute(), {p.heads_q}, cfg.layout),
        has_max_logits(cfg.max_logits) {
    q.store(p.q);
    k.store(p.k);
    v.store(p.v);
    if (p.sink_len > 0) {
      sink.emplace(cfg.sink, sink_shape(p), cfg.layout);
      sink->store(p.sink);
    }
  }
  FwdArgs args(bool with_sink = true) const {
    FwdArgs a{q.view(), k.view(), v.view(), out.view(), lse.view(), std::nullopt, std::nullopt};
    if (sink && with_sink) a.sink = sink->view();
    if (has_max_logits) a.max_logits = max_logits.view();
    return a;
  }
  oracle::FwdResult result() const { return {out.load(), lse.load(), max_logits.load()}; }
  bool gaps_intact() const {
    return out.gaps_intact() && lse.gaps_intact() && max_logits.gaps_intact();
  }
};

// Buffers of one backward call, given the final forward out/lse (stored in cfg.out / compute).
struct BwdCall {
  Buffer dout, q, k, v, out, lse, dq, dk, dv;
  std::optional<Buffer> sink, dsink;

  BwdCall(const oracle::Problem& p, const oracle::FwdResult& fwd, const Config& cfg,
          bool with_dsink = true)
      : dout(cfg.in, {p.num_q, p.heads_q, p.head_dim}, cfg.layout),
        q(cfg.in, {p.num_q, p.heads_q, p.head_dim}, cfg.layout),
        k(cfg.in, {p.num_k, p.heads_kv, p.head_dim}, cfg.layout),
        v(cfg.in, {p.num_k, p.heads_kv, p.head_dim}, cfg.layout),
        out(cfg.out, {p.num_q, p.heads_q, p.head_dim}, cfg.layout),
        lse(cfg.compute(), {p.num_q, p.heads_q}, cfg.layout),
        dq(cfg.grad, {p.num_q, p.heads_q, p.head_dim}, cfg.layout),
        dk(cfg.grad, {p.num_k, p.heads_kv, p.head_dim}, cfg.layout),
        dv(cfg.grad, {p.num_k, p.heads_kv, p.head_dim}, cfg.layout) {
    dout.store(p.dout);
    q.store(p.q);
    k.store(p.k);
    v.store(p.v);
    out.store(fwd.out);
    lse.store(fwd.lse);
    if (p.sink_len > 0) {
      sink.emplace(cfg.sink, sink_shape(p), cfg.layout);
      sink->store(p.sink);
      if (with_dsink) dsink.emplace(cfg.sink, sink_shape(p), cfg.layout);
    }
  }
  BwdArgs args() const {
    BwdArgs a{dout.view(), q.view(),  k.view(),  v.view(),     out.view(),
              lse.view(),  dq.view(), dk.view(), dv.view(), std::nullopt, std::nullopt};
    if (sink) a.sink = sink->view();
    if (dsink) a.dsink = dsink->view();
    return a;
  }
  oracle::BwdResult result() const {
    return {dq.load(), dk.load(), dv.load(), dsink ? dsink->load() : std::vector<double>{}};
  }
  bool gaps_intact() const {
    return dq.gaps_intact() && dk.gaps_intact() && dv.gaps_intact() &&
           (!dsink || dsink->gaps_intact());
  }
};

inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  return oracle::rel_error(a.data(), b.data(), a.size());
}

inline double max_abs(const std::vector<double>& xs) {
  double m = 0;
  for (double x : xs)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

// max|a - b| / max(max|b|, scale), with non-finite positions required to match. A reference
// that cancels to ~0 (one visible key makes dS = 0, so dq = dk = 0) is judged at `scale`
// instead of dividing rounding noise by zero.
inline double err_at_scale(const std::vector<double>& a, const std::vector<double>& b,
                           double scale) {
  if (std::isinf(rel_err(a, b))) return std::numeric_limits<double>::infinity();
  double diff = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (std::isfinite(b[i])) diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff / std::max({max_abs(b), scale, 1e-300});
}

// lse is a log: its error is absolute for |lse| < 1 (a row of one key can have lse near 0).
inline double lse_err(const std::vector<double>& a, const std::vector<double>& b) {
  return err_at_scale(a, b, 1.0);
}

// Gradients are judged at the scale of the largest of dq, dk, dv.
inline double grad_scale(const oracle::BwdResult& r) {
  return std::max({max_abs(r.dq), max_abs(r.dk), max_abs(r.dv)});
}

// Unit roundoff: half an ulp at 1, i.e. 2^-(significand bits).
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::kF64: return 0x1p-53;
    case DType::kF32: return 0x1p-24;
    case DType::kBF16: return 0x1p-8;
    case DType::kF16: return 0x1p-11;
  }
  return 0;
}

// docs/semantics.md §5: 1e-12 (fp64 compute) or 1e-5 (fp32 compute) relative to the oracle on the
// same rounded inputs, plus one rounding of the stored result when it is narrower than compute.
inline double tolerance(DType compute, DType stored) {
  const double base = compute == DType::kF64 ? 1e-12 : 1e-5;
  return base + (dtype_size(stored) < dtype_size(compute) ? unit_roundoff(stored) : 0.0);
}

// A range of length 0, 1 or random, starting anywhere inside [0, n].
inline Range random_range(std::mt19937_64& rng, std::int64_t n) {
  const std::int64_t start = std::uniform_int_distribution<std::int64_t>(0, n)(rng);
  const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
  const std::int64_t len = kind == 0   ? 0
                           : kind == 1 ? 1
                                       : std::uniform_int_distribution<std::int64_t>(
                                             0, n - start)(rng);
  return {start, std::min(n, start + len)};
}

// Up to `tries` random slices of all four types; a candidate whose rectangle meets an
// accepted one is dropped, so q ranges overlap only where key ranges do not.
inline Mask random_mask(std::mt19937_64& rng, std::int64_t nq, std::int64_t nk, int tries) {
  std::vector<Slice> slices;
  for (int t = 0; t < tries; ++t) {
    const Slice s{random_range(rng, nq), random_range(rng, nk),
                  MaskType(std::uniform_int_distribution<int>(0, 3)(rng))};
    bool meets = false;
    for (const Slice& o : slices)
      meets |= s.q_range.overlaps(o.q_range) && s.k_range.overlaps(o.k_range);
    if (!meets) slices.push_back(s);
  }
  return Mask(nq, nk, std::move(slices));
}

// Packed causal documents of random lengths after 16 global tokens that every row sees.
inline Mask packed_documents(std::mt19937_64& rng, std::int64_t n) {
  std::vector<Slice> slices{Slice{{16, n}, {0, 16}, MaskType::kFull},
                            Slice{{0, 16}, {0, 16}, MaskType::kCausal}};
  for (std::int64_t start = 16; start < n;) {
    const std::int64_t end =
        std::min(n, start + std::uniform_int_distribution<std::int64_t>(1, n / 3)(rng));
    slices.push_back(Slice{{start, end}, {start, end}, MaskType::kCausal});
    start = end;
  }
  return Mask(n, n, std::move(slices));
}

// The given rows of a row-major [rows, width] array, concatenated.
inline std::vector<double> pick_rows(const std::vector<double>& xs,
                                     const std::vector<std::int64_t>& rows, std::int64_t width) {
  std::vector<double> out;
  for (std::int64_t r : rows)
    out.insert(out.end(), xs.begin() + r * width, xs.begin() + (r + 1) * width);
  return out;
}

}  // namespace magi::testing
