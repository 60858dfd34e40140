// CPU FFA forward: tiled online softmax (docs/semantics.md §2), one task per (256-row query tile,
// head). A task keeps each row's running max m, sum l and unnormalised output O in scratch and
// folds in every slice touching its rows, 64-key tile by tile, so rows shared by several slices
// merge without atomics. Only tiles the mask calls partial pay for element masking. Non-finite
// inputs (docs/numerics.md) never enter the tile loops: the packs store such rows as zeros and flag
// them, and a row that sees a flagged key or holds a flagged q gets NaN out and lse at the end (one
// flag test per key tile; the key loop runs only on flagged tiles).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "../backend.h"
#include "magi/numeric.h"
#include "gemm.h"
#include "io.h"
#include "pack.h"
#include "simd.h"
#include "work.h"

#include "isa.h"

#ifdef MAGI_CPU_AMX
#include "amx.h"
#endif

namespace magi::kernels::cpu::MAGI_CPU_NS {
namespace {

// Spare rows past kBlockQ in the row scratch: the AMX products run over whole 32-row blocks.
constexpr std::int64_t kSpareRows = 32;
#ifdef MAGI_CPU_AMX
static_assert(kSpareRows == kAmxRows);
#endif

template <typename T>
struct FwdScratch {
  // Q (times scale) and O are [kBlockQ x ld]; S (scores, then probabilities) is
  // [kBlockQ x kBlockK]. ld = head_dim rounded up to the vector width (to 32 on AMX); the
  // padding stays zero. The row sums l are kept as one vector per row, reduced once per task
  // instead of once per key tile. On AMX, qb is Q in bf16 (unscaled: the scale is applied to
  // the fp32 scores, as rounding q * scale to bf16 would move the logits by 2^-9) and pb is P
  // in bf16, the A of P V (amx.h).
  std::int64_t ld;
  Scratch<T> q, o, s, m, l, row;
  Scratch<std::uint16_t> qb, pb;
  std::vector<std::uint8_t> poison;  // per row: Poison bits (pack.h)
  FwdScratch(std::int64_t ld_, bool amx)
      : ld(ld_),
        q(amx ? 0 : std::size_t(kBlockQ * ld)),  // the AMX path keeps Q in qb only
        o(std::size_t((kBlockQ + kSpareRows) * ld)),
        s(std::size_t((kBlockQ + kSpareRows) * kBlockK)),
        m(kBlockQ),
        l(std::size_t(kBlockQ * Simd<T>::kWidth)),
        row(std::size_t(ld)),
        qb(amx ? std::size_t((kBlockQ + kSpareRows) * ld) : 0),
        pb(amx ? std::size_t((kBlockQ + kSpareRows) * kBlockK) : 0),
        poison(std::size_t(kBlockQ)) {}
};

template <typename T>
class Forward {
 public:
  Forward(const Mask& mask, const FwdArgs& args, const Resolved& r)
      : mask_(mask), a_(args), r_(r), d_(r.dims.head_dim),
        group_(r.dims.heads_q / r.dims.heads_kv), amx_(use_amx(args)),
        kv_bad_(r.dims.heads_kv, r.dims.num_k) {
    if (amx_) {
#ifdef MAGI_CPU_AMX
      akt_.emplace(args.k, AmxPack::Kind::kKeysT, r.num_threads, &kv_bad_, kPoisonQK);
      av_.emplace(args.v, AmxPack::Kind::kValues, r.num_threads, &kv_bad_, kPoisonV);
#endif
    } else {
      kt_.emplace(args.k, r.num_threads, &kv_bad_, kPoisonQK);
      v_.emplace(args.v, T(1), r.num_threads, &kv_bad_, kPoisonV);
    }
    if (!kv_bad_.any()) return;
    num_key_tiles_ = (r.dims.num_k + kBlockK - 1) / kBlockK;
    tile_bad_ = kv_bad_.per_block(kBlockK);
  }

  void run() {
    const std::vector<TileWork> tiles = query_tiles(mask_, kBlockQ);
    const std::vector<Task> tasks = heavy_first(tiles, r_.dims.heads_q);
    // Per-task maxima of scale * q.k, reduced per head after the loop in task order.
    std::vector<T> task_max(tasks.size(), kNegInf<T>);
#pragma omp parallel num_threads(r_.num_threads)
    {
      FwdScratch<T> scratch(ld(), amx_);
#ifdef MAGI_CPU_AMX
      if (amx_) amx_configure();
#endif
#pragma omp for schedule(dynamic, 1)
      for (std::size_t t = 0; t < tasks.size(); ++t)
        task_max[t] = run_task(tiles[std::size_t(tasks[t].tile_idx)], tasks[t].head_idx, scratch);
#ifdef MAGI_CPU_AMX
      if (amx_) amx_release();
#endif
    }
    if (a_.max_logits) store_max_logits(tasks, task_max);
  }

 private:
  using S = Simd<T>;
  using V = typename S::V;
  static constexpr int kW = S::kWidth;

  // exp of a softmax argument (<= 0 or NaN): in fp32 by exp_fast_nonpos (2.6e-7 relative,
  // half the vector work of exp(); docs/benchmarks.md), in fp64 by exp_nonpos, which is exp()
  // bit for bit there.
  static V softmax_exp(V x) {
    if constexpr (sizeof(T) == 4)
      return S::exp_fast_nonpos(x);
    else
      return S::exp_nonpos(x);
  }

  // bf16 q, k, v and out on AMX tiles (amx.h), judged like the GPU kernels; an fp32 out keeps
  // the fp32 path and its 1e-5 contract.
  static bool use_amx([[maybe_unused]] const FwdArgs& a) {
#ifdef MAGI_CPU_AMX
    return std::is_same_v<T, float> && a.q.dtype == DType::kBF16 &&
           a.k.dtype == DType::kBF16 && a.v.dtype == DType::kBF16 &&
           a.out.dtype == DType::kBF16;
#else
    return false;
#endif
  }
  // The AMX path applies the scale inside the softmax's exp unless a softcap needs scaled
  // scores first.
  bool amx_fused_scale() const { return r_.softcap <= 0 && r_.scale > 0; }
  std::int64_t ld() const {
#ifdef MAGI_CPU_AMX
    if (amx_) return amx_ld(d_);
#endif
    return round_up(d_, kW);
  }

  T run_task(const TileWork& tile, std::int64_t h, FwdScratch<T>& b) const {
    const std::int64_t q0 = tile.rows.start, num_rows = tile.rows.size(), ld = b.ld;
    T* m = b.m.get();
    T* l = b.l.get();
    std::fill_n(m, num_rows, kNegInf<T>);
    std::fill_n(l, num_rows * kW, T(0));
    std::fill_n(b.o.get(), num_rows * ld, T(0));
    std::uint8_t* poison = b.poison.data();
    std::fill_n(poison, num_rows, std::uint8_t(0));
    if (!tile.slices.empty())
      for (std::int64_t i = 0; i < num_rows; ++i) {
#ifdef MAGI_CPU_AMX
        if constexpr (std::is_same_v<T, float>)
          if (amx_) {  // bf16 q as it is, unscaled
            std::uint16_t* qb = b.qb.get() + i * ld;
            const std::uint16_t* src = bf16_row(a_.q, {q0 + i, h});
            if (bf16_all_finite(src, d_)) {
              std::copy_n(src, d_, qb);
            } else {
              std::fill_n(qb, d_, std::uint16_t(0));
              poison[i] = kPoisonQ;
            }
            continue;
          }
#endif
        T* row = b.q.get() + i * ld;
        load_row<T>(a_.q, {q0 + i, h}, d_, T(r_.scale), row);
        if (zero_if_non_finite(row, d_)) poison[i] = kPoisonQ;
      }
    T raw_max = kNegInf<T>;
    const std::int64_t g = h / group_;
    for (std::int32_t s_idx : tile.slices) {
      const Slice& s = mask_[std::size_t(s_idx)];
      for_each_key_tile(s, tile.rows.intersect(s.q_range),
                        [&](std::int64_t t, Range tile_rows, Range cols, TileClass cls) {
        if (!tile_bad_.empty() && tile_bad_[std::size_t(g * num_key_tiles_ + t)])
          poison_rows(s, g, tile_rows, cols, poison - q0);
        const TileCols tc = amx_ ? whole_tile(t, cols) : tile_cols<T>(t, cols);
        const T x = key_tile(s, tile_rows, tile_rows.start - q0, cols, tc,
                             cls == TileClass::kPartial || tc.widened, g, t, b);
        raw_max = std::max(raw_max, x);
      });
    }
    if (finish_rows(tile.rows, h, b)) return std::numeric_limits<T>::quiet_NaN();
    if (r_.softcap > 0) return raw_max;
    for (std::int64_t i = 0; i < num_rows; ++i) raw_max = std::max(raw_max, m[i]);
    return raw_max;
  }

  // poison[q] |= the bits of every flagged key of cols that row q of rows sees.
  void poison_rows(const Slice& s, std::int64_t g, Range rows, Range cols,
                   std::uint8_t* poison) const {
    for (std::int64_t j = cols.start; j < cols.end; ++j) {
      const std::uint8_t bits = kv_bad_.at(g, j);
      if (bits == 0) continue;
      const Range seeing = rows.intersect(rows_seeing(s, Range{j, j + 1}));
      for (std::int64_t q = seeing.start; q < seeing.end; ++q) poison[q] |= bits;
    }
  }

  // All 64 columns of key tile t, for the AMX products (which take whole 32-key blocks).
  static TileCols whole_tile(std::int64_t t, Range cols) {
    TileCols tc;
    tc.start = t * kBlockK;
    tc.c1 = kBlockK;
    tc.widened = cols.start != tc.start || cols.end != tc.start + kBlockK;
    return tc;
  }

  // One key tile (t, of kv head g) of one slice for rows `rows` (first at scratch row r0):
  // scores against packed columns tc, masking, online softmax update, then O += P V over
  // exactly `cols` (the fp32 path) or over all 64 keys, P being 0 outside cols (AMX).
  // Returns the max raw logit (softcap only).
  T key_tile(const Slice& s, Range rows, std::int64_t r0, Range cols, const TileCols& tc,
             bool masked, std::int64_t g, std::int64_t t, FwdScratch<T>& b) const {
    const std::int64_t nr = rows.size(), width = tc.width(), ld = b.ld;
    T* sc = b.s.get();
    NextTile next;
    [[maybe_unused]] std::uint16_t* pb = nullptr;
    if (!amx_) {
      const T* kt = kt_->tile(g, t);
      gemm<T, false>(nr, width, d_, b.q.get() + r0 * ld, ld, 1, kt + tc.c0, kBlockK, sc, width);
      const std::int64_t v_bytes = kBlockK * v_->stride() * std::int64_t(sizeof(T));
      next = next_tile(kt + d_ * kBlockK, d_ * kBlockK * std::int64_t(sizeof(T)),
                       v_->at(g, tc.start + kBlockK), v_bytes, nr);
    } else {
#ifdef MAGI_CPU_AMX
      if constexpr (std::is_same_v<T, float>) {
        amx_qk(round_up(nr, kAmxRows), ld, b.qb.get() + r0 * ld, akt_->tile(g, t), sc);
        // Without softcap the scale is folded into the softmax's exp argument (amx.h); the
        // softcap takes scaled scores.
        if (!amx_fused_scale()) {
          const V scale = S::splat(T(r_.scale));
          for (std::int64_t j = 0; j < nr * width; j += kW)
            S::store(sc + j, S::load(sc + j) * scale);
        }
        next = next_tile(akt_->tile(g, t + 1), akt_->tile_bytes(), av_->tile(g, t + 1),
                         av_->tile_bytes(), nr);
        pb = b.pb.get();
      }
#endif
    }
    if (masked)
      for (std::int64_t i = 0; i < nr; ++i)
        mask_row(s, rows.start + i, cols, tc.base(), width, sc + i * width);
    T raw_max = kNegInf<T>;
    if (r_.softcap > 0) raw_max = apply_softcap(sc, nr * width);
    T* m = b.m.get() + r0;
    T* l = b.l.get() + r0 * kW;
    for (std::int64_t i = 0; i < nr; ++i) {
      next.prefetch(i);
      T* row = sc + i * width;
      V vmax = S::load(row);
      for (std::int64_t j = kW; j < width; j += kW) vmax = S::max(vmax, S::load(row + j));
      // Scores still unscaled on the fused AMX path: max(s) * scale = max(s * scale), scale > 0.
      const T to_scaled = pb != nullptr && amx_fused_scale() ? T(r_.scale) : T(1);
      const T row_max = S::reduce_max(vmax) * to_scaled;
      const T m_new = std::max(m[i], row_max);
      // A row with nothing visible so far: P is all zero (exp(-inf) = 0); subtracting 0
      // instead of -inf avoids -inf - -inf = NaN.
      const T shift_s = m_new == kNegInf<T> ? T(0) : m_new;
      V vsum{};
      if (pb == nullptr) {
        const V shift = S::splat(shift_s);
        for (std::int64_t j = 0; j < width; j += kW) {
          const V p = softmax_exp(S::load(row + j) - shift);  // <= 0: shift >= row max
          S::store(row + j, p);
          vsum += p;
        }
      }
#ifdef MAGI_CPU_AMX
      if constexpr (std::is_same_v<T, float>)
        if (pb != nullptr) {
          // p = exp(s * scale - m) = 2^(s * scale log2(e) - m log2(e)), stored as bf16.
          constexpr float kLog2e = 1.4426950408889634f;
          const float c = (amx_fused_scale() ? float(r_.scale) : 1.0f) * kLog2e;
          vsum = amx_softmax_row(row, c, shift_s * kLog2e, pb + i * kBlockK);
        }
#endif
      const T alpha = m[i] == m_new ? T(1) : std::exp(m[i] - m_new);
      S::store(l + i * kW, S::load(l + i * kW) * alpha + vsum);
      m[i] = m_new;
      if (alpha != T(1)) {
        T* o = b.o.get() + (r0 + i) * ld;
        for (std::int64_t c = 0; c < ld; c += kW) S::store(o + c, S::load(o + c) * alpha);
      }
    }
    if (!amx_) {
      gemm<T, true>(nr, ld, cols.size(), sc + (cols.start - tc.base()), width, 1,
                    v_->at(g, cols.start), v_->stride(), b.o.get() + r0 * ld, ld);
      return raw_max;
    }
#ifdef MAGI_CPU_AMX
    if constexpr (std::is_same_v<T, float>) {
      // Rows past nr of the last 32-row block add P = 0: the O rows there (other rows of the
      // task, or spare ones) stay as they are.
      const std::int64_t blocks = round_up(nr, kAmxRows);
      std::fill(pb + nr * kBlockK, pb + blocks * kBlockK, std::uint16_t(0));
      amx_pv(blocks, ld, pb, av_->tile(g, t), b.o.get() + r0 * ld);
    }
#endif
    return raw_max;
  }

  // The next key tile's K^T and V rows (32 KiB each at D 128, fp32), fetched into L2 while
  // this tile is computed, a few lines per row of the softmax. They come from L3 or memory
  // (K and V of a head outgrow L2 at 4k tokens), and the first row block of each column
  // block stalled on them: perf put 17 % of P V's samples on one load of B. Past the end of
  // a head (or of the pack) it fetches lines nobody reads next; prefetches never fault.
  struct NextTile {
    const char* k = nullptr;  // K^T of the next tile, contiguous (TilePack, AmxPack)
    const char* v = nullptr;  // V of the next tile: kBlockK rows, stride apart, or a tile
    std::int64_t k_bytes = 0, v_bytes = 0, per_row = 64;
    void prefetch(std::int64_t i) const {
      for (std::int64_t c = i * per_row; c < (i + 1) * per_row; c += 64) {
        if (c < k_bytes) __builtin_prefetch(k + c, 0, 2);
        if (c < v_bytes) __builtin_prefetch(v + c, 0, 2);
      }
    }
  };
  static NextTile next_tile(const void* k, std::int64_t k_bytes, const void* v,
                            std::int64_t v_bytes, std::int64_t nr) {
    NextTile n;
    n.k = static_cast<const char*>(k);
    n.v = static_cast<const char*>(v);
    n.k_bytes = k_bytes;
    n.v_bytes = v_bytes;
    n.per_row = round_up((std::max(k_bytes, v_bytes) + nr - 1) / nr, 64);
    return n;
  }

  // x = c * tanh(x / c) on visible cells; returns the max pre-softcap logit.
  T apply_softcap(T* sc, std::int64_t n) const {
    const T cap = T(r_.softcap), inv_cap = T(1) / cap;
    T raw_max = kNegInf<T>;
    for (std::int64_t j = 0; j < n; ++j) {
      if (sc[j] == kNegInf<T>) continue;
      raw_max = std::max(raw_max, sc[j]);
      sc[j] = cap * std::tanh(sc[j] * inv_cap);
    }
    return raw_max;
  }

  // Normalise and merge with the sink and, when accumulating, with the existing out/lse:
  // lse = logaddexp(lse_a, lse_b, lse_sink), out = exp(lse_a - lse) out_a + exp(lse_b - lse)
  // out_b with out_b = O / l, lse_b = m + log l, i.e. exp(lse_b - lse) / l = exp(m - lse).
  // A poisoned row, a NaN given lse or sink, or any non-finite result makes the whole row's
  // out and its lse NaN. Returns whether some row is NaN (its head's max_logits is NaN then,
  // whatever the cause: the GPU kernel cannot tell a V from a K poison, and one rule is simpler).
  bool finish_rows(Range rows, std::int64_t h, FwdScratch<T>& b) const {
    constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
    const bool acc = r_.accumulate;
    bool any_nan = false;
    for (std::int64_t i = 0; i < rows.size(); ++i) {
      const std::int64_t q = rows.start + i;
      const T m = b.m.get()[i], l = S::reduce_sum(S::load(b.l.get() + i * kW));
      // A q row is read only by a row that sees a key (l >= 1 then: its max cell adds 1).
      const std::uint8_t bits = b.poison[std::size_t(i)];
      const bool qk = (bits & kPoisonQK) || ((bits & kPoisonQ) && l > 0);
      const T lse_b = l == 0 ? kNegInf<T> : m + std::log(l);  // NaN stays NaN
      const T lse_a = acc ? load_scalar<T>(a_.lse, {q, h}) : kNegInf<T>;
      const T lse_s = a_.sink ? lse_sink(q, h) : kNegInf<T>;
      const bool poisoned = qk || (bits & kPoisonV) || std::isnan(lse_a) || std::isnan(lse_s);
      if (!poisoned && acc && lse_b == kNegInf<T> && lse_s == kNegInf<T>) continue;  // untouched
      T* o = b.o.get() + i * b.ld;
      T lse = poisoned ? kNaN : merge_row(q, h, m, l, lse_a, lse_b, lse_s, o, b);
      if (std::isnan(lse)) std::fill_n(o, d_, kNaN);
      any_nan |= std::isnan(lse);
      store_row<T>(a_.out, {q, h}, d_, T(1), o, false);
      store_scalar<T>(a_.lse, {q, h}, lse);
    }
    return any_nan;
  }

  // lse = logaddexp(lse_a, lse_b, lse_s) and the merged out row in o; NaN when the result
  // is not finite (an inf in out or lse, e.g. from a given out that holds one).
  T merge_row(std::int64_t q, std::int64_t h, T m, T l, T lse_a, T lse_b, T lse_s, T* o,
              FwdScratch<T>& b) const {
    const T top = std::max({lse_a, lse_b, lse_s});
    if (top == kNegInf<T>) {
      std::fill_n(o, d_, T(0));
      return kNegInf<T>;
    }
    const T lse = top + std::log(std::exp(lse_a - top) + std::exp(lse_b - top) +
                                 std::exp(lse_s - top));
    const T cb = l > 0 ? std::exp(m - lse) : T(0);
    for (std::int64_t c = 0; c < d_; ++c) o[c] *= cb;
    if (r_.accumulate && lse_a != kNegInf<T>) {
      T* row = b.row.get();
      load_row<T>(a_.out, {q, h}, d_, std::exp(lse_a - lse), row);
      for (std::int64_t c = 0; c < d_; ++c) o[c] += row[c];
    }
    return std::isfinite(lse) && all_finite(o, d_) ? lse : std::numeric_limits<T>::quiet_NaN();
  }

  // logsumexp over the sink logits of (row q, head h).
  T lse_sink(std::int64_t q, std::int64_t h) const {
    const std::int64_t n = std::min<std::int64_t>(r_.dims.sink_len, kMaxSinkLen);
    if (n == 0) return kNegInf<T>;
    T x[kMaxSinkLen];
    for (std::int64_t j = 0; j < n; ++j) {
      x[j] = r_.sink_layout == SinkLayout::kSH ? load_scalar<T>(*a_.sink, {j, h})
                                               : load_scalar<T>(*a_.sink, {q, j, h});
      if (std::isnan(x[j])) return x[j];  // max_element would skip it
    }
    const T top = *std::max_element(x, x + n);  // +inf: inf - inf below makes NaN
    if (top == kNegInf<T>) return top;
    T sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += std::exp(x[j] - top);
    return top + std::log(sum);
  }

  void store_max_logits(const std::vector<Task>& tasks, const std::vector<T>& task_max) const {
    std::vector<T> head_max(std::size_t(r_.dims.heads_q), kNegInf<T>);
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      T& hm = head_max[std::size_t(tasks[t].head_idx)];
      hm = nan_max(hm, task_max[t]);
    }
    for (std::int64_t h = 0; h < r_.dims.heads_q; ++h) {
      T x = head_max[std::size_t(h)];
      if (r_.accumulate) x = nan_max(x, load_scalar<T>(*a_.max_logits, {h}));
      store_scalar<T>(*a_.max_logits, {h}, x);
    }
  }

  const Mask& mask_;
  const FwdArgs& a_;
  const Resolved& r_;
  const std::int64_t d_, group_;
  const bool amx_;
  NonFinite kv_bad_;  // K (kPoisonQK) and V (kPoisonV) rows held NaN/inf, per kv head
  // K^T per key tile and V rows (fp32 path), or both per key tile in bf16 (AMX).
  std::optional<TilePack<T>> kt_;
  std::optional<Rows<T>> v_;
#ifdef MAGI_CPU_AMX
  std::optional<AmxPack> akt_, av_;
#endif
  std::int64_t num_key_tiles_ = 0;
  // Poison bits per (kv head, key tile), tested once per tile visit; empty when none is set.
  std::vector<std::uint8_t> tile_bad_;
};

}  // namespace

void forward(const Mask& mask, const FwdArgs& args, const Resolved& r) {
  if (r.compute == DType::kF64)
    Forward<double>(mask, args, r).run();
  else
    Forward<float>(mask, args, r).run();
}

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
