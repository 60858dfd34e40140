// The forward's two matrix products on AMX tiles, for bf16 inputs with a bf16 output: S = Q K^T
// (bf16 x bf16 -> fp32, products exact, sums in fp32) and O += P V with P split into two bf16
// parts, hi + lo (16 significant bits, not fp32's 24 but 2^-17 against out's own 2^-9): P
// rounded once to bf16, as the GPU kernels do it, measured an error of 0.00393 against the
// fp64 oracle on a 33 x 70 causal case (tests/unit/cpu_forward_test.cc, Bf16InAndOut), over
// the CPU contract's 1e-5 + 2^-8 = 0.00392. The softmax between them stays fp32 (forward.cc). Compiled only into the
// `amx` copy of forward.cc (src/CMakeLists.txt: -mamx-tile -mamx-bf16), which dispatch.cc runs
// only after CPUID and the kernel's permission for the tile state said yes.
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
#include <utility>

#include "io.h"
#include "pack.h"
#include "work.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {

// Row counts of the tile products are whole 32-row blocks: the caller's scratch has kAmxRows
// spare rows past kBlockQ, and zeroes the P rows past its own (see Forward::key_tile).
inline constexpr std::int64_t kAmxRows = 32;
// Head dims are padded with zeros to a multiple of 32 (one A tile row of bf16).
inline std::int64_t amx_ld(std::int64_t head_dim) { return round_up(head_dim, 32); }

// bf16 bits of x, rounded to nearest even (x finite).
inline std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float from_bf16_bits(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// dst[0, n) = src rounded to bf16 (finite values).
inline void to_bf16(const float* src, std::int64_t n, std::uint16_t* dst) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_bits(src[i]);
}
// The softmax's vector code below uses GCC vector operators where they exist and the
// zero-masking forms of the intrinsics otherwise (all lanes on): GCC 12's unmasked forms start
// from _mm512_undefined_*, which -Wmaybe-uninitialized reports once inlined.
using AmxU32 = std::uint32_t __attribute__((vector_size(64)));
inline constexpr __mmask16 kAllLanes = 0xffff;

// 2^t for t <= 0 on AVX-512: t = n + f, |f| <= 1/2, 2^f = exp(f ln2) by Taylor series of
// degree 6 (|f ln2| <= 0.347: 0.347^7 / 7! = 1.2e-7, about fp32's ulp, against P's 2^-17 as
// hi + lo), times 2^n by vscalefps, which also flushes to exactly 0: t is clamped at -160, where
// 1.5 * 2^-160 rounds to 0, so masked cells (-inf) and rows with nothing visible add exactly 0.
inline __m512 amx_exp2(__m512 t) {
  t = _mm512_maskz_max_ps(kAllLanes, t, _mm512_set1_ps(-160.0f));
  const __m512 n =
      _mm512_maskz_roundscale_ps(kAllLanes, t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = t - n;  // exact
  constexpr float kLn2 = 0.6931471805599453f;
  constexpr float c2 = kLn2 * kLn2 / 2, c3 = c2 * kLn2 / 3, c4 = c3 * kLn2 / 4,
                  c5 = c4 * kLn2 / 5, c6 = c5 * kLn2 / 6;
  __m512 p = _mm512_set1_ps(c6);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c5));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kLn2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(kAllLanes, p, n);
}

// The 16 bf16 of h's low (kHalf 0) or high half widened back to fp32.
using AmxU16 = std::uint16_t __attribute__((vector_size(64)));
using AmxU16Half = std::uint16_t __attribute__((vector_size(32)));
template <int kHalf>
inline __m512 bf16_half_to_f32(AmxU16 h) {
  const AmxU16Half x = [&]<int... I>(std::integer_sequence<int, I...>) {
    return __builtin_shufflevector(h, h, (kHalf * 16 + I)...);
  }(std::make_integer_sequence<int, 16>());
  return __m512(AmxU32(_mm512_maskz_cvtepu16_epi32(kAllLanes, __m256i(x))) << 16);
}

// One row of P for P V: p = 2^(s * c - b) for the row's kBlockK scores s, stored as bf16 hi + lo
// (hi = p rounded to bf16, lo = p - hi rounded to bf16: 16 significant bits; vcvtne2ps2bf16
// rounds to nearest even like bf16_bits, and takes denormals as 0, which moves p by < 2^-126);
// returns the row's sum of p, per lane. The scale and log2(e) are folded into c and b (no
// separate pass over the scores), and p never goes back to memory as fp32.
inline __m512 amx_softmax_row(const float* s, float c, float b, std::uint16_t* hi,
                              std::uint16_t* lo) {
  const __m512 vc = _mm512_set1_ps(c), vb = _mm512_set1_ps(b);
  __m512 sum = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < kBlockK; j += 32) {
    const __m512 p0 = amx_exp2(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vc, vb));
    const __m512 p1 = amx_exp2(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), vc, vb));
    sum += p0 + p1;
    const AmxU16 h = AmxU16(_mm512_cvtne2ps_pbh(p1, p0));  // p0 in the low half
    const AmxU16 l =
        AmxU16(_mm512_cvtne2ps_pbh(p1 - bf16_half_to_f32<1>(h), p0 - bf16_half_to_f32<0>(h)));
    std::memcpy(hi + j, &h, sizeof h);
    std::memcpy(lo + j, &l, sizeof l);
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
#pragma omp parallel num_threads(num_threads)
    {
      Scratch<float> row{std::size_t(ld_)};
#pragma omp for collapse(2) schedule(static)
      for (std::int64_t t = 0; t < num_tiles_; ++t)
        for (std::int64_t h = 0; h < heads_; ++h) {
          std::uint16_t* dst = data_.get() + (h * num_tiles_ + t) * ld_ * kBlockK;
          for (std::int64_t j = 0; j < std::min(kBlockK, n - t * kBlockK); ++j) {
            load_row<float>(x, {t * kBlockK + j, h}, d, 1.0f, row.get());
            if (zero_if_non_finite(row.get(), d)) bad->mark(h, t * kBlockK + j, bits);
            for (std::int64_t c = 0; c < d; ++c)
              dst[kind == Kind::kKeysT ? ((c / 2) * kBlockK + j) * 2 + c % 2
                                       : ((j / 2) * ld_ + c) * 2 + j % 2] = bf16_bits(row.get()[c]);
          }
        }
    }
  }
  const std::uint16_t* tile(std::int64_t h, std::int64_t t) const {
    return data_.get() + (h * num_tiles_ + t) * ld_ * kBlockK;
  }
  std::int64_t tile_bytes() const { return ld_ * kBlockK * 2; }

 private:
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

// o[rows x ld] += (p + p_lo)[rows x 64] * V of one tile (kValues layout); rows a multiple
// of 32.
inline void amx_pv(std::int64_t rows, std::int64_t ld, const std::uint16_t* p,
                   const std::uint16_t* p_lo, const std::uint16_t* v, float* o) {
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
        _tile_loadd(4, p_lo + r * kBlockK + k, ps);
        _tile_loadd(5, p_lo + (r + 16) * kBlockK + k, ps);
        amx_dp_2x2();
      }
      _tile_stored(0, o0, os);
      _tile_stored(1, o0 + 16, os);
      _tile_stored(2, o1, os);
      _tile_stored(3, o1 + 16, os);
    }
}

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
