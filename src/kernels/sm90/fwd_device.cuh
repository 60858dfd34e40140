// Device-side helpers of the sm90 kernels (fwd_kernel.cuh, bwd_kernel.cuh): accumulator views, quad
// reductions, the LSE merge, output stores, named barriers, the wgmma issue, the walk over a
// tile's key blocks and the mbarrier ring position.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/cluster_sm90.hpp>

#include "block_cover.h"
#include "fwd_params.h"

namespace magi::kernels::sm90 {

namespace detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// GMMA accumulator ((2, 2, V), M, N) -> ((2, M), (2, V, N)): this thread's rows, then its
// columns (mode 0 of the value is a column pair, mode 1 the row 8 below, mode 2 the next 8
// columns).
template <class Layout>
__device__ auto rowcol(Layout l) {
  using namespace cute;
  auto v = get<0>(l);
  return make_layout(make_layout(get<1>(v), get<1>(l)),
                     make_layout(get<0>(v), get<2>(v), get<2>(l)));
}

template <class Tensor>
__device__ auto as_rowcol(Tensor&& t) {
  return cute::make_tensor(t.data(), rowcol(t.layout()));
}

// A TMA descriptor over a strided (rows, kD, heads) tensor (strides in elements), copying tiles
// of the shared-memory layout's shape (host side, per call).
template <class T, int kD, class SmemLayout>
auto tma_rows(const T* ptr, int rows, int heads, std::int64_t row_stride, std::int64_t head_stride,
              SmemLayout smem) {
  using namespace cute;
  using RowsLayout = Layout<Shape<int, int, int>, Stride<std::int64_t, _1, std::int64_t>>;
  const RowsLayout g(make_shape(rows, kD, heads), make_stride(row_stride, _1{}, head_stride));
  return make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(ptr), g), smem,
                       product_each(shape(smem)), _1{});
}

// The TMA source (tma's partition) of `rows` (a shape: rows x D) of head `head` of the tensor
// m = tma.get_tma_tensor(...), from row row0 on (device side, both kernels' producers).
template <class Tma, class M, class Rows>
__device__ auto tma_rows_source(const Tma& tma, const M& m, int row0, int head, Rows rows) {
  using namespace cute;
  return tma.get_slice(0).partition_S(
      local_tile(domain_offset(make_coord(row0, 0), m(_, _, head)), rows, make_coord(0, 0)));
}

// 2^x as one MUFU.EX2 (flushes results below 2^-126 to 0; exp2f adds a range test and two
// predicated multiplies per element to produce denormals, which a probability never needs).
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The 4 lanes of a quad hold the same rows.
__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

__device__ inline float log_add_exp(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const float m = fmaxf(a, b);
  return m + log1pf(expf(-fabsf(a - b)));
}

// Float max through the integer atomics: non-negative floats order like ints, negative ones
// reversed like unsigned. A NaN is stored as 0x7fffffff, above every float as an int and below
// every negative one as unsigned: once there it stays (max_logits of a poisoned head).
__device__ inline void atomic_max(float* addr, float v) {
  if (v != v)
    atomicMax(reinterpret_cast<int*>(addr), 0x7fffffff);
  else if (v >= 0.f)
    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
  else
    atomicMin(reinterpret_cast<unsigned*>(addr), __float_as_uint(v));
}

__device__ inline void store(void* out, std::int64_t idx, OutType t, float x) {
  switch (t) {
    case OutType::kBF16: static_cast<__nv_bfloat16*>(out)[idx] = __float2bfloat16_rn(x); break;
    case OutType::kF16: static_cast<__half*>(out)[idx] = __float2half_rn(x); break;
    case OutType::kF32: static_cast<float*>(out)[idx] = x; break;
  }
}

// Two adjacent columns in one store (idx even, the pair aligned: FwdParams::out_pairs), the
// output type a template argument so that a store is one instruction without a branch.
template <OutType kT>
__device__ inline void store2(void* out, std::int64_t idx, float x0, float x1) {
  if constexpr (kT == OutType::kBF16) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + idx) =
        __floats2bfloat162_rn(x0, x1);
  } else if constexpr (kT == OutType::kF16) {
    *reinterpret_cast<__half2*>(static_cast<__half*>(out) + idx) = __floats2half2_rn(x0, x1);
  } else {
    *reinterpret_cast<float2*>(static_cast<float*>(out) + idx) = make_float2(x0, x1);
  }
}

// Named barriers among the consumer warpgroups (0 is __syncthreads).
__device__ inline void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A shared-memory wgmma descriptor stepped by one 64-bit add. CUTLASS 4.2's DescriptorIterator
// adds to the low word and copies the high one, which ptxas turns into a UIADD3 and a UMOV of
// the high word for every k-step; a 64-bit add is one UIADD3.64, as in FFA's forward (its
// CUTLASS adds 64 bits). The start address is the low 14 bits: a step never carries out of
// the low word, so the descriptors are the same. The loop: 457 -> 446 instructions a key block
// at D 64, 492 -> 476 at D 128; same-run A/B on an H100 +1.6 % at D 64, +0.6 % at D 128 (means
// over 6 cells, docs/benchmarks.md, thirteenth session).
struct Desc64 {
  using reference = cute::GmmaDescriptor;
  using element_type = cute::GmmaDescriptor;
  using value_type = cute::GmmaDescriptor;
  cute::GmmaDescriptor desc_;
  __device__ reference operator*() const { return desc_; }
  template <class I>
  __device__ reference operator[](const I& i) const { return *(*this + i); }
  template <class I>
  __device__ Desc64 operator+(const I& offset) const {
    return {cute::GmmaDescriptor{desc_.desc_ + std::uint64_t(offset)}};
  }
};
// What mma_unpack asks of a descriptor iterator (found by argument-dependent lookup).
template <class NewT>
__device__ Desc64 recast_ptr(const Desc64& it) {
  static_assert(std::is_same_v<NewT, std::uint64_t>, "a descriptor recasts to uint64_t only");
  return it;
}
__device__ inline cute::GmmaDescriptor raw_pointer_cast(const Desc64& it) { return it.desc_; }
// A descriptor tensor stepped by Desc64 (the forward's K and V operands). Not Q's: ptxas keeps
// those, the same every key block, in uniform registers as CUTLASS steps them; stepped by
// Desc64 they were recomputed each block (D 64 loop 459 instructions a block against 457).
template <class T>
__device__ auto desc64(const T& t) {
  static_assert(std::is_same_v<std::decay_t<decltype(t.data())>, cute::GMMA::DescriptorIterator>,
                "desc64 takes a shared-memory descriptor tensor");
  return cute::make_tensor(Desc64{t.data().desc_}, t.layout());
}

// A warpgroup issues its wgmma for C (+)= A B over the K mode as one batch (not waited for).
// kRegA: A is a register fragment (RS), fenced like the accumulator.
template <bool kRegA = false, class Mma, class A, class B, class C>
__device__ void wg_gemm_issue(Mma& mma, A& a, const B& b, C& c, bool zero_init) {
  using namespace cute;
  warpgroup_fence_operand(c);
  if constexpr (kRegA) warpgroup_fence_operand(a);
  warpgroup_arrive();
  mma.accumulate_ = zero_init ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// Work item n of the forward as (tile, q head): kv heads outermost, then the tiles (heavy
// first, work_list.h), then the q heads of the kv head's group. The CTAs running at any time
// then share one kv head's K and V (16 MB at 32k tokens, D 128), which stays in L2; with the
// tiles outermost they streamed every kv head's K and V at once (128 MB at 32k, past the
// H200's 50 MB L2: full 32k read 576 TFLOP/s against 633 at 16k, docs/benchmarks.md).
struct FwdItem {
  int tile, head;
};
__device__ inline FwdItem fwd_item(std::int64_t item, int num_tiles, int group) {
  const std::int64_t per_kv_head = std::int64_t(num_tiles) * group;
  const int g = int(item / per_kv_head), r = int(item % per_kv_head);
  return {r / group, g * group + r % group};
}

// The producer's walk over a tile's key blocks: piece by piece, from each piece's k0 in steps
// of block_n.
struct BlockIter {
  int piece, end, kb, k1;
  __device__ bool valid() const { return piece < end; }
  // To the next block; true when that block starts a new piece (or the walk ended).
  __device__ bool advance(const Piece* pieces, int block_n) {
    kb += block_n;
    if (kb < k1) return false;
    if (++piece < end) kb = pieces[piece].k0, k1 = pieces[piece].k1;
    return true;
  }
  __device__ static BlockIter first(const Tile& t, const Piece* pieces) {
    const bool any = t.piece_begin < t.piece_end;
    return {t.piece_begin, t.piece_end, any ? pieces[t.piece_begin].k0 : 0,
            any ? pieces[t.piece_begin].k1 : 0};
  }
};

// One key block as the producer hands it to the consumers, in shared memory beside its K
// stage (written before the stage's K load is posted, read after its k_full wait): the piece
// (for element masking), the first key and what the consumers need to know about it.
using sm90::kBadWords;

struct BlockInfo {
  enum : int {
    kLast = 1,      // the tile's last block
    kFixed = 2,     // the fixer zeroes V rows of this block: wait for v_ready, not v_full
    kFullRows = 4,  // << warpgroup: the piece covers the block for that warpgroup's 64 rows
    kRunShift = 8,  // flags >> kRunShift: the run after this block (unmasked_run)
  };
  Piece pc;
  int kb, flags;
};
static_assert(kMaxUnmaskedRun <= (0x7fffffff >> BlockInfo::kRunShift), "a run fits the flags");

// Bits [kb, kb + live) of one head's row flags (live <= 128, the rest 0), read by a whole warp
// (lane i loads word kb / 32 + i; the flag array has kBadWords + 1 words of padding per head).
__device__ inline void block_row_flags(const unsigned* head_flags, int kb, int live, int lane,
                                       unsigned (&out)[kBadWords]) {
  const int sh = kb & 31;
  const unsigned mine = lane <= kBadWords ? head_flags[(kb >> 5) + lane] : 0u;
#pragma unroll
  for (int w = 0; w < kBadWords; ++w) {
    const unsigned lo = __shfl_sync(0xffffffffu, mine, w), hi = __shfl_sync(0xffffffffu, mine, w + 1);
    unsigned x = sh ? (lo >> sh) | (hi << (32 - sh)) : lo;
    const int n = live - 32 * w;  // keys of this word inside the piece
    x = n <= 0 ? 0u : n < 32 ? x & ((1u << n) - 1u) : x;
    out[w] = x;
  }
}

// A 4 x 4 transpose over the four threads of a quad (q = lane % 4): afterwards x[c] of thread q
// is what x[q] of thread c was. Two shuffle rounds, each swapping one bit of the thread index
// with the same bit of the element index. Every lane of the warp must take part.
__device__ inline void quad_transpose(unsigned (&x)[4], int q) {
  const bool b0 = q & 1, b1 = q & 2;
  unsigned a = __shfl_xor_sync(0xffffffffu, b0 ? x[0] : x[1], 1);
  unsigned b = __shfl_xor_sync(0xffffffffu, b0 ? x[2] : x[3], 1);
  if (b0) x[0] = a, x[2] = b;
  else x[1] = a, x[3] = b;
  a = __shfl_xor_sync(0xffffffffu, b1 ? x[0] : x[2], 2);
  b = __shfl_xor_sync(0xffffffffu, b1 ? x[1] : x[3], 2);
  if (b1) x[0] = a, x[1] = b;
  else x[2] = a, x[3] = b;
}

// Two floats as one bf16x2 / fp16x2 word (the lower column in the low half).
template <OutType kT>
__device__ inline unsigned pack2(float x0, float x1) {
  static_assert(kT != OutType::kF32);
  unsigned u;
  if constexpr (kT == OutType::kBF16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(x0, x1);
    memcpy(&u, &v, 4);
  }
  return u;
}

// Whether 8 bf16 (kBf16) or fp16 values hold a NaN or inf: all exponent bits set.
template <bool kBf16>
__device__ inline bool non_finite8(uint4 x) {
  constexpr unsigned e = kBf16 ? 0x7F807F80u : 0x7C007C00u;
  return (__vcmpeq2(x.x & e, e) | __vcmpeq2(x.y & e, e) | __vcmpeq2(x.z & e, e) |
          __vcmpeq2(x.w & e, e)) != 0u;
}

// The element mask of a block that a piece does not cover, one fragment row at a time (every
// slice type is a band lo <= k - q <= hi, mask.h): the query rows that see key k, or the keys
// that row q sees, form one interval [first, last] (64-bit: k - hi and q + hi may pass the
// int range; empty when k or q is outside the piece).
struct Interval {
  long long first, last;
};
__device__ inline Interval rows_seeing_key(const Piece& pc, int k) {
  if (k < pc.k0 || k >= pc.k1) return {1, 0};
  return {max((long long)pc.q0, (long long)k - pc.hi), min((long long)pc.q1 - 1, (long long)k - pc.lo)};
}
__device__ inline Interval keys_seen_by_row(const Piece& pc, int q) {
  if (q < pc.q0 || q >= pc.q1) return {1, 0};
  return {max((long long)pc.k0, (long long)q + pc.lo), min((long long)pc.k1 - 1, (long long)q + pc.hi)};
}
// The interval as offsets from `base` (the thread's first column), clamped to [-1, n]: a
// column at offset o in [0, n) is seen iff lo <= o <= hi. A fragment's column offsets are
// constants of its layout, so a cell costs two compares.
struct Offsets {
  int lo, hi;
};
__device__ inline Offsets offsets_from(Interval iv, int base, int n) {
  auto clip = [n](long long v) { return int(v < -1 ? -1 : v > n ? n : v); };
  return {clip(iv.first - base), clip(iv.last - base)};
}

// Programmatic dependent launch (sm90): the pre-pass lets the forward kernel, launched as its
// dependent, start its CTAs early; the kernel waits for the pre-pass's completion and memory
// before its first global access. Both are no-ops without the launch attribute.
__device__ inline void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ inline void wait_for_prerequisites() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// The one thread of a converged warp that issues its TMA copies and waits on their barriers:
// elect.sync over the whole warp picks the same lane every time, as the parity waits need, and
// tells ptxas that one thread runs the branch, so each TMA copy is one UTMALDG on uniform
// registers (under lane == 0 ptxas wrapped each copy in a loop electing a lane, about 12
// instructions a copy).
__device__ inline bool elected() { return cute::elect_one_sync() != 0u; }

// Pulls a line into L1 (no register, no wait).
__device__ inline void prefetch_l1(const void* ptr) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(ptr));
}

// Ring position of the n-th use of a buffer with `stages` copies: its stage, and the parity
// the consumer waits for (the producer waits for the other one: a fresh mbarrier's previous
// phase counts as complete).
struct Ring {
  int stage;
  unsigned phase;
};
template <int kStages>
__device__ Ring ring(int n) {
  return {n % kStages, unsigned((n / kStages) & 1)};
}

}  // namespace detail

}  // namespace magi::kernels::sm90
