// CPU FFA backward in two race-free passes, so no row is ever written by two threads and the
// result is bitwise independent of the thread count: dq per (256-row query tile, q head), then
// dk/dv per (64-key tile, kv head) over every q head of its group. Each pass recomputes
// P = exp(x - lse) from the final lse (and Delta = rowsum(out * dout), precomputed per row);
// the cost is one extra QK^T and dO V^T, 14 D FLOPs per visible cell where FA2 spends 10 D.
// Non-finite inputs (docs/numerics.md): the packs store such rows as zeros and flag them; a
// row that reads one (or whose out, lse or dout is not finite) gets lse NaN, and its visible
// cells, only those, get P = dS = NaN, so the NaN reaches exactly the gradients it touches.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../backend.h"
#include "gemm.h"
#include "io.h"
#include "pack.h"
#include "simd.h"
#include "work.h"

#include "isa.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {
namespace {

template <typename T>
struct BwdScratch {
  // Accumulators [kBlockQ or kBlockK x ld] (dq, or dk and dv); score-shaped tiles
  // [kBlockQ x kBlockK]: P, dP (then dS) and tanh(x / c) under softcap.
  Scratch<T> acc_a, acc_b, p, dp, th;
  explicit BwdScratch(std::int64_t ld)
      : acc_a(std::size_t(std::max(kBlockQ, kBlockK) * ld)),
        acc_b(std::size_t(kBlockK * ld)),
        p(std::size_t(kBlockQ * kBlockK)),
        dp(std::size_t(kBlockQ * kBlockK)),
        th(std::size_t(kBlockQ * kBlockK)) {}
};

template <typename T>
class Backward {
 public:
  Backward(const Mask& mask, const BwdArgs& args, const Resolved& r)
      : mask_(mask), a_(args), r_(r), d_(r.dims.head_dim), nq_(r.dims.num_q),
        hq_(r.dims.heads_q), group_(r.dims.heads_q / r.dims.heads_kv),
        q_bad_(hq_, nq_), kv_bad_(r.dims.heads_kv, r.dims.num_k),
        q_(args.q, T(r.scale), r.num_threads, &q_bad_, kPoisonQ),
        do_(args.dout, T(1), r.num_threads, &q_bad_, kPoisonDout),
        k_(args.k, T(1), r.num_threads, &kv_bad_, kPoisonQK),
        kt_(args.k, r.num_threads, &kv_bad_, kPoisonQK),
        vt_(args.v, r.num_threads, &kv_bad_, kPoisonV), ld_(q_.width()) {}

  void run() {
    prepare_rows();
    const std::vector<TileWork> q_tiles = query_tiles(mask_, kBlockQ);
    const bool q_bad = q_bad_.any(), kv_bad = kv_bad_.any();
    if (q_bad || kv_bad) poison_rows(q_tiles, q_bad, kv_bad);
    const std::vector<TileWork> k_tiles = key_tiles(mask_, kBlockK);
    const std::vector<Task> dq_tasks = heavy_first(q_tiles, hq_);
    const std::vector<Task> dkv_tasks = heavy_first(k_tiles, r_.dims.heads_kv);
#pragma omp parallel num_threads(r_.num_threads)
    {
      BwdScratch<T> scratch(ld_);
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

  std::size_t at(std::int64_t h, std::int64_t q) const { return std::size_t(h * nq_ + q); }

  // lse_ and delta_ head-major [Hq][Nq] in the compute type; Delta = rowsum(out * dout).
  void prepare_rows() {
    lse_.assign(std::size_t(nq_ * hq_), T(0));
    delta_.assign(std::size_t(nq_ * hq_), T(0));
#pragma omp parallel num_threads(r_.num_threads)
    {
      std::vector<T> o(static_cast<std::size_t>(d_));
#pragma omp for collapse(2) schedule(static)
      for (std::int64_t q = 0; q < nq_; ++q)  // memory order of out [Nq, Hq, D]
        for (std::int64_t h = 0; h < hq_; ++h) {
          load_row<T>(a_.out, {q, h}, d_, T(1), o.data());
          const T* g = do_.at(h, q);
          // Rounded like the micro-kernel's dP = dO V^T, so that a row with one visible key
          // (out = v) gets dP - Delta = 0 exactly rather than rounding noise.
          const T delta = dot_like_gemm(o.data(), g, d_);
          const T lse = load_scalar<T>(a_.lse, {q, h});
          // dout is read by every row with a key or a sink (lse > -inf); a NaN or +inf lse
          // or a non-finite out poisons the row as well.
          const bool poisoned = lse != kNegInf<T> && (!std::isfinite(lse) || !std::isfinite(delta) ||
                                                       (q_bad_.at(h, q) & kPoisonDout));
          delta_[at(h, q)] = delta;
          lse_[at(h, q)] = poisoned ? std::numeric_limits<T>::quiet_NaN() : lse;
        }
    }
  }

  // lse = NaN for the rows that read a flagged input: a flagged q row that sees a key, a row
  // that sees a flagged key. A pass over the query tiles' key tiles without arithmetic;
  // each task writes only its own rows.
  void poison_rows(const std::vector<TileWork>& q_tiles, bool q_bad, bool kv_bad) {
    constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
    const std::vector<std::uint8_t> tile_bad = kv_bad_.per_block(kBlockK);
    const std::int64_t num_key_tiles = (r_.dims.num_k + kBlockK - 1) / kBlockK;
    const auto num_tiles = std::int64_t(q_tiles.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(r_.num_threads)
    for (std::int64_t ti = 0; ti < num_tiles; ++ti) {
      const TileWork& tile = q_tiles[std::size_t(ti)];
      for (std::int32_t s_idx : tile.slices) {
        const Slice& s = mask_[std::size_t(s_idx)];
        const Range rows = tile.rows.intersect(s.q_range);
        if (q_bad)
          for (std::int64_t q = rows.start; q < rows.end; ++q)
            for (std::int64_t h = 0; h < hq_; ++h)
              if ((q_bad_.at(h, q) & kPoisonQ) && !visible_keys(s, q).empty())
                lse_[at(h, q)] = kNaN;
        if (!kv_bad) continue;
        for_each_key_tile(s, rows, [&](std::int64_t t, Range tile_rows, Range cols, TileClass) {
          for (std::int64_t g = 0; g < r_.dims.heads_kv; ++g) {
            if (!tile_bad[std::size_t(g * num_key_tiles + t)]) continue;
            for (std::int64_t j = cols.start; j < cols.end; ++j) {
              if (!kv_bad_.at(g, j)) continue;
              const Range seeing = tile_rows.intersect(rows_seeing(s, Range{j, j + 1}));
              for (std::int64_t q = seeing.start; q < seeing.end; ++q)
                for (std::int64_t h = g * group_; h < (g + 1) * group_; ++h) lse_[at(h, q)] = kNaN;
            }
          }
        });
      }
    }
  }

  // A poisoned row: P = dS = NaN on its visible cells, 0 on the others.
  void poisoned_cells(const Slice& s, std::int64_t q, Range cols, const TileCols& tc,
                      bool masked, T* pr, T* dpr) const {
    constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
    const std::int64_t width = tc.width();
    const Range vis = masked ? visible_keys(s, q).intersect(cols) : cols;
    std::fill_n(pr, width, T(0));
    std::fill_n(dpr, width, T(0));
    if (vis.empty()) return;
    std::fill(pr + (vis.start - tc.base()), pr + (vis.end - tc.base()), kNaN);
    std::fill(dpr + (vis.start - tc.base()), dpr + (vis.end - tc.base()), kNaN);
  }

  // P and dS into b.p and b.dp ([rows x width]) for rows of head h against packed key
  // columns tc (K^T at kt, V^T at vt, row stride kBlockK); only `cols` may be visible.
  void probs(const Slice& s, std::int64_t h, Range rows, Range cols, const TileCols& tc,
             bool masked, const T* kt, const T* vt, BwdScratch<T>& b) const {
    const std::int64_t nr = rows.size(), width = tc.width();
    T* p = b.p.get();
    T* dp = b.dp.get();
    gemm<T, false>(nr, width, d_, q_.at(h, rows.start), q_.stride(), 1, kt, kBlockK, p, width);
    gemm<T, false>(nr, width, d_, do_.at(h, rows.start), do_.stride(), 1, vt, kBlockK, dp,
                   width);
    const bool softcap = r_.softcap > 0;
    const T cap = T(r_.softcap), inv_cap = T(1) / cap;
    for (std::int64_t i = 0; i < nr; ++i) {
      T* pr = p + i * width;
      T* dpr = dp + i * width;
      const T lse = lse_[at(h, rows.start + i)], delta = delta_[at(h, rows.start + i)];
      if (lse == kNegInf<T>) {  // no visible key and no sink: P = 0
        std::fill_n(pr, width, T(0));
        std::fill_n(dpr, width, T(0));
        continue;
      }
      if (std::isnan(lse)) {
        poisoned_cells(s, rows.start + i, cols, tc, masked, pr, dpr);
        continue;
      }
      if (masked) mask_row(s, rows.start + i, cols, tc.base(), width, pr);
      T* th = b.th.get() + i * width;
      if (softcap)
        for (std::int64_t j = 0; j < width; ++j) {
          const bool hidden = pr[j] == kNegInf<T>;
          th[j] = hidden ? T(0) : std::tanh(pr[j] * inv_cap);
          pr[j] = hidden ? pr[j] : cap * th[j];
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
    const std::int64_t q0 = tile.rows.start, g = h / group_;
    T* dq = b.acc_a.get();
    std::fill_n(dq, tile.rows.size() * ld_, T(0));
    for (std::int32_t s_idx : tile.slices) {
      const Slice& s = mask_[std::size_t(s_idx)];
      for_each_key_tile(s, tile.rows.intersect(s.q_range),
                        [&](std::int64_t t, Range tile_rows, Range cols, TileClass cls) {
        const TileCols tc = tile_cols<T>(t, cols);
        probs(s, h, tile_rows, cols, tc, cls == TileClass::kPartial || tc.widened,
              kt_.tile(g, t) + tc.c0, vt_.tile(g, t) + tc.c0, b);
        // dq += dS K over exactly `cols`.
        gemm<T, true>(tile_rows.size(), ld_, cols.size(), b.dp.get() + (cols.start - tc.base()),
                      tc.width(), 1, k_.at(g, cols.start), k_.stride(),
                      dq + (tile_rows.start - q0) * ld_, ld_);
      });
    }
    for (std::int64_t i = 0; i < tile.rows.size(); ++i)
      store_row<T>(a_.dq, {q0 + i, h}, d_, T(r_.scale), dq + i * ld_, r_.accumulate);
  }

  void dkv_task(const TileWork& tile, std::int64_t g, BwdScratch<T>& b) const {
    const std::int64_t k0 = tile.rows.start, t = k0 / kBlockK;
    T* dk = b.acc_a.get();
    T* dv = b.acc_b.get();
    std::fill_n(dk, tile.rows.size() * ld_, T(0));
    std::fill_n(dv, tile.rows.size() * ld_, T(0));
    for (std::int64_t h = g * group_; h < (g + 1) * group_; ++h)
      for (std::int32_t s_idx : tile.slices) {
        const Slice& s = mask_[std::size_t(s_idx)];
        const Range cols = tile.rows.intersect(s.k_range);
        const Range rows = rows_seeing(s, cols);
        const TileCols tc = tile_cols<T>(t, cols);
        const std::int64_t off = cols.start - tc.base();
        for (std::int64_t q0 = rows.start; q0 < rows.end; q0 += kBlockQ) {
          const Range q_rows{q0, std::min(rows.end, q0 + kBlockQ)};
          const TileClass cls = classify(s, q_rows, cols);
          if (cls == TileClass::kEmpty) continue;
          probs(s, h, q_rows, cols, tc, cls == TileClass::kPartial || tc.widened,
                kt_.tile(g, t) + tc.c0, vt_.tile(g, t) + tc.c0, b);
          // dV += P^T dO and dK += dS^T (scale Q) over exactly `cols`: A = P^T is read with
          // strides (1, width), so no transpose is stored.
          T* dv_rows = dv + (cols.start - k0) * ld_;
          T* dk_rows = dk + (cols.start - k0) * ld_;
          gemm<T, true>(cols.size(), ld_, q_rows.size(), b.p.get() + off, 1, tc.width(),
                        do_.at(h, q0), do_.stride(), dv_rows, ld_);
          gemm<T, true>(cols.size(), ld_, q_rows.size(), b.dp.get() + off, 1, tc.width(),
                        q_.at(h, q0), q_.stride(), dk_rows, ld_);
        }
      }
    for (std::int64_t j = 0; j < tile.rows.size(); ++j) {
      store_row<T>(a_.dk, {k0 + j, g}, d_, T(1), dk + j * ld_, r_.accumulate);
      store_row<T>(a_.dv, {k0 + j, g}, d_, T(1), dv + j * ld_, r_.accumulate);
    }
  }

  // dsink_j = -sum_i exp(sink_j - lse_i) Delta_i: over all rows per head for "sh" (summed
  // in row order, one head per thread), per row for "ssh".
  void sink_grad() const {
    const std::int64_t len = r_.dims.sink_len;
    const bool sh = r_.sink_layout == SinkLayout::kSH;
    const auto term = [&](T sink, std::int64_t q, std::int64_t h) {
      const T lse = lse_[at(h, q)];
      return lse == kNegInf<T> ? T(0) : -std::exp(sink - lse) * delta_[at(h, q)];
    };
    const auto put = [&](std::initializer_list<std::int64_t> idx, T grad) {
      if (r_.accumulate) grad += load_scalar<T>(*a_.dsink, idx);
      store_scalar<T>(*a_.dsink, idx, grad);
    };
#pragma omp parallel for schedule(static) num_threads(r_.num_threads)
    for (std::int64_t h = 0; h < hq_; ++h)
      for (std::int64_t j = 0; j < len; ++j) {
        if (sh) {
          const T sink = load_scalar<T>(*a_.sink, {j, h});
          T sum = 0;
          for (std::int64_t q = 0; q < nq_; ++q) sum += term(sink, q, h);
          put({j, h}, sum);
        } else {
          for (std::int64_t q = 0; q < nq_; ++q)
            put({q, j, h}, term(load_scalar<T>(*a_.sink, {q, j, h}), q, h));
        }
      }
  }

  const Mask& mask_;
  const BwdArgs& a_;
  const Resolved& r_;
  const std::int64_t d_, nq_, hq_, group_;
  NonFinite q_bad_;   // per q head: kPoisonQ, kPoisonDout
  NonFinite kv_bad_;  // per kv head: kPoisonQK (k), kPoisonV
  const Rows<T> q_, do_, k_;  // scale * Q, dO, K
  const TilePack<T> kt_, vt_;    // K^T and V^T per key tile
  const std::int64_t ld_;
  std::vector<T> lse_, delta_;
};

}  // namespace

void backward(const Mask& mask, const BwdArgs& args, const Resolved& r) {
  if (r.compute == DType::kF64)
    Backward<double>(mask, args, r).run();
  else
    Backward<float>(mask, args, r).run();
}

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
