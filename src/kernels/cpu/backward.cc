// CPU FFA backward in two race-free passes, so no row is ever written by two threads and the
// result is bitwise independent of the thread count: dq per (64-row query tile, q head), then
// dk/dv per (64-key tile, kv head) over every q head of its group. Each pass recomputes
// P = exp(x - lse) from the final lse (and Delta = rowsum(out * dout), precomputed per row);
// the cost is one extra QK^T and dO V^T, 14 D FLOPs per visible cell where FA2 spends 10 D.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../backend.h"
#include "gemm.h"
#include "io.h"
#include "simd.h"
#include "work.h"

namespace magi::kernels::cpu {
namespace {

template <typename T>
struct BwdScratch {
  // Row tiles ([kBlockQ or kBlockK] x ld_d): Q (scaled), dO, and the dq or dk/dv
  // accumulators; K^T and V^T [head_dim x kBlockK], K [kBlockK x ld_d]; score-shaped tiles
  // [kBlockQ x kBlockK]: P, dP (then dS) and tanh(x / c) under softcap.
  std::int64_t ld_d;
  Scratch<T> q, dout, acc_a, acc_b, kt, vt, k, p, dp, th, lse, delta, row;
  explicit BwdScratch(std::int64_t head_dim)
      : ld_d(round_up(head_dim, Simd<T>::kWidth)),
        q(std::size_t(kBlockQ * ld_d)),
        dout(std::size_t(kBlockQ * ld_d)),
        acc_a(std::size_t(std::max(kBlockQ, kBlockK) * ld_d)),
        acc_b(std::size_t(kBlockK * ld_d)),
        kt(std::size_t(head_dim * kBlockK)),
        vt(std::size_t(head_dim * kBlockK)),
        k(std::size_t(kBlockK * ld_d)),
        p(std::size_t(kBlockQ * kBlockK)),
        dp(std::size_t(kBlockQ * kBlockK)),
        th(std::size_t(kBlockQ * kBlockK)),
        lse(kBlockQ),
        delta(kBlockQ),
        row(std::size_t(ld_d)) {}
};

template <typename T>
class Backward {
 public:
  Backward(const Mask& mask, const BwdArgs& args, const Resolved& r)
      : mask_(mask), a_(args), r_(r), d_(r.dims.head_dim),
        hq_(r.dims.heads_q), group_(r.dims.heads_q / r.dims.heads_kv) {}

  void run() {
    prepare_rows();
    const std::vector<TileWork> q_tiles = query_tiles(mask_, kBlockQ);
    const std::vector<TileWork> k_tiles = key_tiles(mask_, kBlockK);
    const std::vector<Task> dq_tasks = heavy_first(q_tiles, hq_);
    const std::vector<Task> dkv_tasks = heavy_first(k_tiles, r_.dims.heads_kv);
#pragma omp parallel num_threads(r_.num_threads)
    {
      BwdScratch<T> scratch(d_);
#pragma omp for schedule(dynamic, 1) nowait
      for (std::size_t t = 0; t < dq_tasks.size(); ++t)
        dq_task(q_tiles[std::size_t(dq_tasks[t].tile_idx)], dq_tasks[t].head_idx, scratch);
#pragma omp for schedule(dynamic, 1)
      for (std::size_t t = 0; t < dkv_tasks.size(); ++t)
        dkv_task(k_tiles[std::size_t(dkv_tasks[t].tile_idx)], dkv_tasks[t].head_idx, scratch);
    }
    if (a_.dsink) sink_grad();
  }

 private:
  using S = Simd<T>;
  using V = typename S::V;
  static constexpr int kW = S::kWidth;

  // lse_ and delta_ [Nq x Hq] in the compute type; Delta = rowsum(out * dout).
  void prepare_rows() {
    const std::int64_t n = r_.dims.num_q;
    lse_.assign(std::size_t(n * hq_), T(0));
    delta_.assign(std::size_t(n * hq_), T(0));
#pragma omp parallel num_threads(r_.num_threads)
    {
      std::vector<T> o(static_cast<std::size_t>(d_)), g(static_cast<std::size_t>(d_));
#pragma omp for schedule(static)
      for (std::int64_t q = 0; q < n; ++q)
        for (std::int64_t h = 0; h < hq_; ++h) {
          load_row<T>(a_.out, {q, h}, d_, T(1), o.data());
          load_row<T>(a_.dout, {q, h}, d_, T(1), g.data());
          T sum = 0;
          for (std::int64_t c = 0; c < d_; ++c) sum += o[std::size_t(c)] * g[std::size_t(c)];
          delta_[std::size_t(q * hq_ + h)] = sum;
          lse_[std::size_t(q * hq_ + h)] = load_scalar<T>(a_.lse, {q, h});
        }
    }
  }

  // Q (times scale), dO, lse and Delta of rows [q0, q0 + n) of head h into scratch.
  void pack_rows(std::int64_t q0, std::int64_t n, std::int64_t h, BwdScratch<T>& b) const {
    for (std::int64_t i = 0; i < n; ++i) {
      load_row<T>(a_.q, {q0 + i, h}, d_, T(r_.scale), b.q.get() + i * b.ld_d);
      load_row<T>(a_.dout, {q0 + i, h}, d_, T(1), b.dout.get() + i * b.ld_d);
      b.lse.get()[i] = lse_[std::size_t((q0 + i) * hq_ + h)];
      b.delta.get()[i] = delta_[std::size_t((q0 + i) * hq_ + h)];
    }
  }

  // K^T and V^T [d x nk_pad] (zero columns past nk) and, for dq, K [nk x ld_d] of kv head g.
  void pack_keys(Range cols, std::int64_t g, bool with_k, BwdScratch<T>& b) const {
    const std::int64_t nk = cols.size(), nk_pad = round_up(nk, kW);
    T* row = b.row.get();
    for (std::int64_t j = 0; j < nk; ++j) {
      T* k_row = with_k ? b.k.get() + j * b.ld_d : row;
      load_row<T>(a_.k, {cols.start + j, g}, d_, T(1), k_row);
      for (std::int64_t c = 0; c < d_; ++c) b.kt.get()[c * nk_pad + j] = k_row[c];
      load_row<T>(a_.v, {cols.start + j, g}, d_, T(1), row);
      for (std::int64_t c = 0; c < d_; ++c) b.vt.get()[c * nk_pad + j] = row[c];
    }
    for (std::int64_t c = 0; c < d_; ++c)
      for (std::int64_t j = nk; j < nk_pad; ++j) b.kt.get()[c * nk_pad + j] = b.vt.get()[c * nk_pad + j] = 0;
  }

  // P and dS (in b.p and b.dp, [nr x width], row stride ld_s) for scratch rows [r0, r0 + nr)
  // and key columns [c0, c0 + width) of the packed K^T/V^T (row stride ld_s too). Rows are
  // global rows.start + i; columns are global cols_start + c0 + j; only `cols` may be visible.
  void probs(const Slice& s, Range rows, std::int64_t r0, Range cols, std::int64_t cols_start,
             std::int64_t c0, std::int64_t width, std::int64_t ld_s, bool masked,
             BwdScratch<T>& b) const {
    const std::int64_t nr = rows.size(), ld = b.ld_d;
    T* p = b.p.get();
    T* dp = b.dp.get();
    gemm<T, false>(nr, width, d_, b.q.get() + r0 * ld, ld, 1, b.kt.get() + c0, ld_s, p, width);
    gemm<T, false>(nr, width, d_, b.dout.get() + r0 * ld, ld, 1, b.vt.get() + c0, ld_s, dp,
                   width);
    const bool softcap = r_.softcap > 0;
    const T cap = T(r_.softcap), inv_cap = T(1) / cap;
    for (std::int64_t i = 0; i < nr; ++i) {
      T* pr = p + i * width;
      T* dpr = dp + i * width;
      const T lse = b.lse.get()[r0 + i], delta = b.delta.get()[r0 + i];
      if (masked) {
        const std::int64_t base = cols_start + c0;
        const Range vis = visible_keys(s, rows.start + i).intersect(cols);
        const std::int64_t lo = vis.empty() ? 0 : vis.start - base;
        const std::int64_t hi = vis.empty() ? 0 : vis.end - base;
        std::fill(pr, pr + lo, kNegInf<T>);
        std::fill(pr + hi, pr + width, kNegInf<T>);
      }
      if (lse == kNegInf<T>) {  // no visible key and no sink: P = 0
        std::fill_n(pr, width, T(0));
        std::fill_n(dpr, width, T(0));
        continue;
      }
      T* th = b.th.get() + i * width;
      if (softcap)
        for (std::int64_t j = 0; j < width; ++j) {
          th[j] = pr[j] == kNegInf<T> ? T(0) : std::tanh(pr[j] * inv_cap);
          pr[j] = pr[j] == kNegInf<T> ? pr[j] : cap * th[j];
        }
      const V vlse = S::splat(lse), vdelta = S::splat(delta);
      for (std::int64_t j = 0; j < width; j += kW) {
        const V pv = S::exp(S::load(pr + j) - vlse);
        S::store(pr + j, pv);
        V ds = pv * (S::load(dpr + j) - vdelta);
        if (softcap) {
          const V t = S::load(th + j);
          ds *= T(1) - t * t;
        }
        S::store(dpr + j, ds);
      }
    }
  }

  void dq_task(const TileWork& tile, std::int64_t h, BwdScratch<T>& b) const {
    const std::int64_t q0 = tile.rows.start, num_rows = tile.rows.size(), ld = b.ld_d;
    T* dq = b.acc_a.get();
    std::fill_n(dq, num_rows * ld, T(0));
    if (!tile.slices.empty()) pack_rows(q0, num_rows, h, b);
    for (std::int32_t s_idx : tile.slices) {
      const Slice& s = mask_[std::size_t(s_idx)];
      const Range rows = tile.rows.intersect(s.q_range);
      const Range keys = keys_seen_by(s, rows);
      for (std::int64_t k0 = keys.start; k0 < keys.end; k0 += kBlockK) {
        const Range cols{k0, std::min(keys.end, k0 + kBlockK)};
        const Range tile_rows = rows.intersect(rows_seeing(s, cols));
        if (tile_rows.empty()) continue;
        const TileClass cls = classify(s, tile_rows, cols);
        if (cls == TileClass::kEmpty) continue;
        const std::int64_t nk = cols.size(), nk_pad = round_up(nk, kW);
        const std::int64_t r0 = tile_rows.start - q0;
        pack_keys(cols, h / group_, true, b);
        probs(s, tile_rows, r0, cols, cols.start, 0, nk_pad, nk_pad,
              cls == TileClass::kPartial || nk != nk_pad, b);
        gemm<T, true>(tile_rows.size(), ld, nk, b.dp.get(), nk_pad, 1, b.k.get(), ld,
                      dq + r0 * ld, ld);
      }
    }
    for (std::int64_t i = 0; i < num_rows; ++i)
      store_row<T>(a_.dq, {q0 + i, h}, d_, T(r_.scale), dq + i * ld, r_.accumulate);
  }

  void dkv_task(const TileWork& tile, std::int64_t g, BwdScratch<T>& b) const {
    const std::int64_t k0 = tile.rows.start, nk = tile.rows.size(), ld = b.ld_d;
    const std::int64_t nk_pad = round_up(nk, kW);
    T* dk = b.acc_a.get();
    T* dv = b.acc_b.get();
    std::fill_n(dk, nk * ld, T(0));
    std::fill_n(dv, nk * ld, T(0));
    if (!tile.slices.empty()) pack_keys(tile.rows, g, false, b);
    for (std::int64_t h = g * group_; h < (g + 1) * group_; ++h)
      for (std::int32_t s_idx : tile.slices) {
        const Slice& s = mask_[std::size_t(s_idx)];
        const Range cols = tile.rows.intersect(s.k_range);
        const Range rows = rows_seeing(s, cols);
        // Whole vectors of columns around this slice's part of the key tile.
        const std::int64_t c0 = (cols.start - k0) / kW * kW;
        const std::int64_t c1 = std::min(nk_pad, round_up(cols.end - k0, kW));
        for (std::int64_t q0 = rows.start; q0 < rows.end; q0 += kBlockQ) {
          const Range q_rows{q0, std::min(rows.end, q0 + kBlockQ)};
          const TileClass cls = classify(s, q_rows, cols);
          if (cls == TileClass::kEmpty) continue;
          const bool exact = cols.start - k0 == c0 && cols.end - k0 == c1;
          pack_rows(q0, q_rows.size(), h, b);
          probs(s, q_rows, 0, cols, k0, c0, c1 - c0, nk_pad,
                cls == TileClass::kPartial || !exact, b);
          // dV += P^T dO and dK += dS^T (scale Q): A = P^T is read with strides (1, width).
          gemm<T, true>(c1 - c0, ld, q_rows.size(), b.p.get(), 1, c1 - c0, b.dout.get(), ld,
                        dv + c0 * ld, ld);
          gemm<T, true>(c1 - c0, ld, q_rows.size(), b.dp.get(), 1, c1 - c0, b.q.get(), ld,
                        dk + c0 * ld, ld);
        }
      }
    for (std::int64_t j = 0; j < nk; ++j) {
      store_row<T>(a_.dk, {k0 + j, g}, d_, T(1), dk + j * ld, r_.accumulate);
      store_row<T>(a_.dv, {k0 + j, g}, d_, T(1), dv + j * ld, r_.accumulate);
    }
  }

  // dsink_j = -sum_i exp(sink_j - lse_i) Delta_i: over all rows per head for "sh" (summed
  // in row order, one head per thread), per row for "ssh".
  void sink_grad() const {
    const std::int64_t n = r_.dims.num_q, len = r_.dims.sink_len;
    const bool sh = r_.sink_layout == SinkLayout::kSH;
    const auto term = [&](T sink, std::int64_t q, std::int64_t h) {
      const T lse = lse_[std::size_t(q * hq_ + h)];
      return lse == kNegInf<T> ? T(0) : -std::exp(sink - lse) * delta_[std::size_t(q * hq_ + h)];
    };
    const auto put = [&](std::initializer_list<std::int64_t> at, T grad) {
      if (r_.accumulate) grad += load_scalar<T>(*a_.dsink, at);
      store_scalar<T>(*a_.dsink, at, grad);
    };
#pragma omp parallel for schedule(static) num_threads(r_.num_threads)
    for (std::int64_t h = 0; h < hq_; ++h)
      for (std::int64_t j = 0; j < len; ++j) {
        if (sh) {
          const T sink = load_scalar<T>(*a_.sink, {j, h});
          T sum = 0;
          for (std::int64_t q = 0; q < n; ++q) sum += term(sink, q, h);
          put({j, h}, sum);
        } else {
          for (std::int64_t q = 0; q < n; ++q)
            put({q, j, h}, term(load_scalar<T>(*a_.sink, {q, j, h}), q, h));
        }
      }
  }

  const Mask& mask_;
  const BwdArgs& a_;
  const Resolved& r_;
  const std::int64_t d_, hq_, group_;
  std::vector<T> lse_, delta_;
};

}  // namespace

void backward(const Mask& mask, const BwdArgs& args, const Resolved& r) {
  if (r.compute == DType::kF64)
    Backward<double>(mask, args, r).run();
  else
    Backward<float>(mask, args, r).run();
}

}  // namespace magi::kernels::cpu
