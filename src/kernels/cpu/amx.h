// The forward's two matrix products on AMX tiles, for bf16 inputs with a bf16 output: S = Q K^T
// (bf16 x bf16 -> fp32, products exact, sums in fp32) and O += P V with P rounded once to bf16,
// the arithmetic of the GPU kernels and of torch's CPU SDPA. Such a call is judged by the GPU
// kernels' rule (docs/semantics.md §5: at most twice the error of a same-precision naive
// implementation), not by the fp32 path's 1e-5 plus the output's rounding: P's rounding alone
// can move out by 2^-9 of the largest |v| (cpu_forward_test.cc's Bf16InAndOut). The
// softmax between the products stays fp32, and the row sums l add the unrounded p, as the naive
// reference does, so lse keeps fp32's accuracy (forward.cc). Compiled only into the `amx` copy
// of forward.cc (src/CMakeLists.txt: -mamx-tile -mamx-bf16), which dispatch.cc runs only after
// CPUID and the kernel's permission for the tile state said yes.
//
// Tiles: one configuration for the whole call, every tile 16 rows x 64 bytes (16 fp32 or 32
// bf16). tmm0-3 accumulate a 32 x 32 block of C, tmm4-5 hold two 16-row slabs of A, tmm6-7 two
// 16-column slabs of B. B must be VNNI: row p of a B tile holds (B[2p][n], B[2p+1][n]) for its
// 16 columns n; AmxPack stores K^T and V that way once per call, per 64-key tile.
#pragma once

#include "isa.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "io.h"
#include "pack.h"
#include "work.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {

// Row counts of the tile products are whole 32-row blocks: the caller's scratch has kAmxRows
// spare rows past kBlockQ, and zeroes the P rows past its own (see Forward::key_tile).
inline constexpr std::int64_t kAmxRows = 32;
// Head dims are padded with zeros to a multiple of 32 (one A tile row of bf16).
inline std::int64_t amx_ld(std::int64_t head_dim) { return round_up(head_dim, 32); }

// The bits of the bf16 row of x (a bf16 tensor, last dim contiguous) that starts at `at`: the AMX
// path takes bf16 q, k and v as they are, with no trip through fp32.
inline const std::uint16_t* bf16_row(const TensorView& x,
                                     std::initializer_list<std::int64_t> at) {
  return reinterpret_cast<const std::uint16_t*>(element(x, at));
}
// No NaN or inf among row[0, n) (exponent bits all ones).
inline bool bf16_all_finite(const std::uint16_t* row, std::int64_t n) {
  std::uint16_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) bad |= (row[i] & 0x7f80u) == 0x7f80u;
  return bad == 0;
}
// The softmax's vector code below uses GCC vector operators where they exist and the
// zero-masking forms of the intrinsics otherwise (all lanes on): GCC 12's unmasked forms start
// from _mm512_undefined_*, which -Wmaybe-uninitialized reports once inlined.
inline constexpr __mmask16 kAllLanes = 0xffff;

// 2^t for t <= 0 on AVX-512: t = n + f, |f| <= 1/2, 2^f by kExp2Poly (simd.h; about fp32's
// rounding, so l and lse keep fp32's accuracy), times 2^n by vscalefps, which also flushes to
// exactly 0: t is clamped at -160, where 1.5 * 2^-160 rounds to 0, so masked cells (-inf) and
// rows with nothing visible add exactly 0.
inline __m512 amx_exp2(__m512 t) {
  t = _mm512_maskz_max_ps(kAllLanes, t, _mm512_set1_ps(-160.0f));
  const __m512 n =
      _mm512_maskz_roundscale_ps(kAllLanes, t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = t - n;  // exact
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int k = 1; k < 6; ++k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[k]));
  return _mm512_maskz_scalef_ps(kAllLanes, p, n);
}

// One row of P for P V: p = 2^(s * c - b) for the row's kBlockK scores s, stored rounded to
// bf16 (vcvtne2ps2bf16: nearest even, denormals taken as 0, which moves p by < 2^-126); returns
// the row's sum of the unrounded p, per lane. The scale and log2(e) are folded into c and b (no
// separate pass over the scores), and p never goes to memory as fp32.
inline __m512 amx_softmax_row(const float* s, float c, float b, std::uint16_t* p) {
  const __m512 vc = _mm512_set1_ps(c), vb = _mm512_set1_ps(b);
  __m512 sum = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < kBlockK; j += 32) {
    const __m512 p0 = amx_exp2(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vc, vb));
    const __m512 p1 = amx_exp2(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), vc, vb));
    sum += p0 + p1;
    const __m512bh h = _mm512_cvtne2ps_pbh(p1, p0);  // p0 in the low half
    std::memcpy(p + j, &h, sizeof h);
  }
  return sum;
}

// Loads the palette for this thread: tile state is per thread, and every OpenMP thread of the
// forward's parallel region runs tile instructions.
inline void amx_configure() {
  struct alignas(64) {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}
inline void amx_release() { _tile_release(); }

// K (kKeysT) or V (kValues) of one call in bf16 per (kv head, 64-key tile), each tile ld * 64
// elements: kKeysT [ld / 2][64 keys][2 dims] (the B of Q K^T), kValues [32 key pairs][ld][2
// keys] (the B of P V). Keys past n and dims past d are zero; rows holding a NaN or inf are
// stored as zeros and marked in bad, like TilePack and Rows (pack.h).
class AmxPack {
 public:
  enum class Kind { kKeysT, kValues };
  AmxPack(const TensorView& x, Kind kind, int num_threads, NonFinite* bad, std::uint8_t bits)
      : heads_(x.shape[1]), num_tiles_((x.shape[0] + kBlockK - 1) / kBlockK),
        ld_(amx_ld(x.shape[2])), data_(std::size_t(heads_ * num_tiles_ * ld_ * kBlockK), true) {
    const std::int64_t n = x.shape[0], d = x.shape[2];
    // Tile by tile, and within a tile row by row across heads: a row's heads are contiguous in
    // x [n, heads, d], so the reads stream.
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (std::int64_t t = 0; t < num_tiles_; ++t) {
      const std::int64_t rows = std::min(kBlockK, n - t * kBlockK);
      for (std::int64_t j = 0; j < rows; j += 2)
        for (std::int64_t h = 0; h < heads_; ++h) {
          std::uint16_t* dst = data_.get() + (h * num_tiles_ + t) * ld_ * kBlockK;
          // Rows j and j + 1 of the tile; a missing or non-finite row reads as zeros.
          const std::uint16_t* r[2] = {nullptr, nullptr};
          for (int e = 0; e < 2 && j + e < rows; ++e) {
            const std::uint16_t* row = bf16_row(x, {t * kBlockK + j + e, h});
            if (bf16_all_finite(row, d))
              r[e] = row;
            else
              bad->mark(h, t * kBlockK + j + e, bits);
          }
          if (kind == Kind::kKeysT)
            keys_t(r, d, j, dst);
          else
            values(r, d, j, dst);
        }
    }
  }
  const std::uint16_t* tile(std::int64_t h, std::int64_t t) const {
    return data_.get() + (h * num_tiles_ + t) * ld_ * kBlockK;
  }
  std::int64_t tile_bytes() const { return ld_ * kBlockK * 2; }

 private:
  // K^T: key j's dims (2c, 2c + 1) are one 32-bit word, word c of the tile's column j (head
  // dims are multiples of 8: attention.cc checks).
  static void keys_t(const std::uint16_t* const r[2], std::int64_t d, std::int64_t j,
                     std::uint16_t* dst) {
    for (int e = 0; e < 2; ++e)
      if (r[e] != nullptr)
        for (std::int64_t c = 0; c < d; c += 2)
          std::memcpy(dst + ((c / 2) * kBlockK + j + e) * 2, r[e] + c, 4);
  }
  // V: keys j and j + 1 interleaved, (v[j][c], v[j + 1][c]) for every dim c, 32 dims a step.
  void values(const std::uint16_t* const r[2], std::int64_t d, std::int64_t j,
              std::uint16_t* dst) const {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    std::uint16_t* out = dst + (j / 2) * ld_ * 2;
    for (std::int64_t c = 0; c < d; c += 32) {
      const __mmask32 m = d - c >= 32 ? ~__mmask32(0) : (__mmask32(1) << (d - c)) - 1;
      const __m512i a = r[0] ? _mm512_maskz_loadu_epi16(m, r[0] + c) : _mm512_setzero_si512();
      const __m512i b = r[1] ? _mm512_maskz_loadu_epi16(m, r[1] + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + c * 2, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(out + c * 2 + 32, _mm512_permutex2var_epi16(a, hi, b));
    }
  }

  std::int64_t heads_, num_tiles_, ld_;
  Scratch<std::uint16_t> data_;
};

// C tiles 0-3 (a 32 x 32 block of fp32) += A tiles 4, 5 (its two 16-row halves) times B tiles
// 6, 7 (its two 16-column halves): the products' one step.
inline void amx_dp_2x2() {
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// s[rows x 64] = q[rows x ld] * K^T of one tile (kKeysT layout); rows a multiple of 32.
inline void amx_qk(std::int64_t rows, std::int64_t ld, const std::uint16_t* q,
                   const std::uint16_t* kt, float* s) {
  const std::int64_t qs = ld * 2;  // bytes per row of q
  constexpr std::int64_t ks = kBlockK * 4, ss = kBlockK * 4;
  for (std::int64_t r = 0; r < rows; r += 32)
    for (std::int64_t n = 0; n < kBlockK; n += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (std::int64_t c = 0; c < ld; c += 32) {
        _tile_loadd(4, q + r * ld + c, qs);
        _tile_loadd(5, q + (r + 16) * ld + c, qs);
        _tile_loadd(6, kt + (c / 2 * kBlockK + n) * 2, ks);
        _tile_loadd(7, kt + (c / 2 * kBlockK + n + 16) * 2, ks);
        amx_dp_2x2();
      }
      _tile_stored(0, s + r * kBlockK + n, ss);
      _tile_stored(1, s + r * kBlockK + n + 16, ss);
      _tile_stored(2, s + (r + 16) * kBlockK + n, ss);
      _tile_stored(3, s + (r + 16) * kBlockK + n + 16, ss);
    }
}

// o[rows x ld] += p[rows x 64] * V of one tile (kValues layout); rows a multiple of 32.
inline void amx_pv(std::int64_t rows, std::int64_t ld, const std::uint16_t* p,
                   const std::uint16_t* v, float* o) {
  const std::int64_t os = ld * 4, vs = ld * 4;
  constexpr std::int64_t ps = kBlockK * 2;
  for (std::int64_t r = 0; r < rows; r += 32)
    for (std::int64_t d = 0; d < ld; d += 32) {
      float* o0 = o + r * ld + d;
      float* o1 = o0 + 16 * ld;
      _tile_loadd(0, o0, os);
      _tile_loadd(1, o0 + 16, os);
      _tile_loadd(2, o1, os);
      _tile_loadd(3, o1 + 16, os);
      for (std::int64_t k = 0; k < kBlockK; k += 32) {
        _tile_loadd(4, p + r * kBlockK + k, ps);
        _tile_loadd(5, p + (r + 16) * kBlockK + k, ps);
        _tile_loadd(6, v + (k / 2 * ld + d) * 2, vs);
        _tile_loadd(7, v + (k / 2 * ld + d + 16) * 2, vs);
        amx_dp_2x2();
      }
      _tile_stored(0, o0, os);
      _tile_stored(1, o0 + 16, os);
      _tile_stored(2, o1, os);
      _tile_stored(3, o1 + 16, os);
    }
}

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
