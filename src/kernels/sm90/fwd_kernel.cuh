// FFA forward on Hopper (sm90a): one persistent CTA per SM pulls (query tile, head) items
// from a global counter (tiles heavy first, work_list.h) and runs one online softmax over
// every key block of every piece the tile sees.
//
// Per CTA: 2 warpgroups (256 threads), a 128-row query tile (64 rows per warpgroup), key
// blocks of 128 (D <= 128) or 64 rows. S = Q K^T is wgmma with both operands in shared
// memory; O += P V is wgmma with P in registers (the S accumulator's layout is the A
// fragment's). K and V blocks are double buffered with cp.async, so the next block loads while
// this one computes. Element masking runs only on blocks that a piece's corners say need it;
// rows outside the piece, keys outside [k0, k1) and cells off the band are -inf. K/V rows
// outside the piece are zero-filled by the copy, never read: a NaN or inf in an unseen V row
// cannot leak into a visible output (0 * inf).
//
// Key decision, v1: no producer warp, no TMA, no ping-pong between warpgroups, no overlap of
// one block's softmax with the next block's QK^T; the structure is FlashAttention-2's on
// wgmma. Those are the next steps (docs/benchmarks.md has the measurements).
#pragma once

#include <cuda_runtime.h>

#include <cute/arch/copy_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "fwd_params.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
#error "the sm90 forward needs the sm_90a target (wgmma): build with CUDA_ARCHITECTURES 90a"
#endif

namespace magi::kernels::sm90 {

template <class T, int kD>
struct FwdConfig {
  static constexpr int kBlockM = kFwdBlockM;
  static constexpr int kBlockN = fwd_block_n(kD);
  static constexpr int kThreads = 256;
  static constexpr int kStages = 2;
  using BM = cute::Int<kBlockM>;
  using BN = cute::Int<kBlockN>;
  using HD = cute::Int<kD>;
  using AtomK = cute::GMMA::Layout_K_SW128_Atom<T>;
  using AtomMN = cute::GMMA::Layout_MN_SW128_Atom<T>;
  using LayoutQ = decltype(cute::tile_to_shape(AtomK{}, cute::Shape<BM, HD>{}));
  using LayoutK = decltype(cute::tile_to_shape(AtomK{}, cute::Shape<BN, HD, cute::Int<kStages>>{}));
  using LayoutVt =
      decltype(cute::tile_to_shape(AtomMN{}, cute::Shape<HD, BN, cute::Int<kStages>>{}));
  using WarpGroups = cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>;
  using MmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float, cute::Shape<BM, BN, HD>>(), WarpGroups{}));
  // P stays in registers (RS wgmma): the S accumulator of 16 columns is exactly the A
  // fragment of one k-step (column pair, row + 8, column + 8), so no shared-memory round trip.
  using MmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<T, T, float, cute::Shape<BM, HD, BN>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      WarpGroups{}));

  struct Smem {
    alignas(1024) T q[cute::cosize_v<LayoutQ>];
    alignas(1024) T k[cute::cosize_v<LayoutK>];
    alignas(1024) T vt[cute::cosize_v<LayoutVt>];
    int next_item;
  };
  // Slack to align the dynamic shared memory to the 1024-byte swizzle period.
  static constexpr int kSmemBytes = int(sizeof(Smem)) + 1024;
};

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
// reversed like unsigned.
__device__ inline void atomic_max(float* addr, float v) {
  if (v >= 0.f)
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

// Rows [row0, row0 + kRows) of one head into shared memory, 16 bytes per cp.async; rows
// outside [lo, hi) are zero-filled by the copy itself (source size 0, reading row lo, which
// is valid). dst(r, c) is the smem address of row r, column c. The row index is made opaque
// so that the compiler recomputes the (swizzled) addresses per block instead of keeping
// dozens of them live across the loop (they spilled to local memory).
template <int kRows, int kD, int kThreads, class T, class Dst>
__device__ void load_rows(const T* base, std::int64_t row_stride, int row0, int lo, int hi,
                          Dst dst, int tid) {
  constexpr int kChunks = kD / 8;
  static_assert((kRows * kChunks) % kThreads == 0);
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    int i = tid + it * kThreads;
    asm volatile("" : "+r"(i));
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const int g = row0 + r;
    const bool inside = g >= lo && g < hi;
    const T* src = base + std::int64_t(inside ? g : lo) * row_stride + c;
    const unsigned d = unsigned(__cvta_generic_to_shared(dst(r, c)));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(inside ? 16 : 0));
  }
}

// Both warpgroups issue their wgmma for C (+)= A B over the K mode, then wait for them.
// kRegA: A is a register fragment (RS), fenced like the accumulator.
template <bool kRegA = false, class Mma, class A, class B, class C>
__device__ void wg_gemm(Mma& mma, A& a, const B& b, C& c, bool zero_init) {
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
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
  if constexpr (kRegA) warpgroup_fence_operand(a);
}

// The (piece, key block) sequence of one tile.
struct BlockIter {
  int piece, end, kb;
  __device__ bool valid() const { return piece < end; }
  __device__ void advance(const Piece* pieces, int block_n) {
    kb += block_n;
    if (kb >= pieces[piece].k1) {
      ++piece;
      if (piece < end) kb = pieces[piece].k0;
    }
  }
};

}  // namespace detail

template <class T, int kD>
__global__ void __launch_bounds__(256, 1) ffa_fwd_kernel(const __grid_constant__ FwdParams p) {
  using namespace cute;
  using C = FwdConfig<T, kD>;
  constexpr int kThreads = C::kThreads;
  using detail::kLn2;
  using detail::kLog2e;
  constexpr int kBM = C::kBlockM, kBN = C::kBlockN;

  extern __shared__ char smem_raw[];
  const unsigned misalign = unsigned(__cvta_generic_to_shared(smem_raw)) & 1023u;
  auto& s = *reinterpret_cast<typename C::Smem*>(smem_raw + ((1024u - misalign) & 1023u));
  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename C::LayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(s.k), typename C::LayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(s.vt), typename C::LayoutVt{});

  const int tid = int(threadIdx.x);
  typename C::MmaQK mma_qk;
  typename C::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  // The wgmma descriptor fragments are made where they are used (below), so that they are
  // recomputed from the smem base instead of holding ~100 registers across the loop.
  // P as the A operand: per k-step of 16 keys, (column pair, row + 8, column + 8), which is
  // the S accumulator's own order, so element i of tOrP is element i of tSrS.
  Tensor tOrP = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBN / 16>>>{});
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<typename C::BM, typename C::BN>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<typename C::BM, typename C::HD>{});
  static_assert(decltype(size(tOrP))::value == decltype(size(tSrS))::value);
  Tensor cS = detail::as_rowcol(
      thr_qk.partition_C(make_identity_tensor(Shape<typename C::BM, typename C::BN>{})));
  Tensor cO = detail::as_rowcol(
      thr_pv.partition_C(make_identity_tensor(Shape<typename C::BM, typename C::HD>{})));
  Tensor S = detail::as_rowcol(tSrS);
  Tensor O = detail::as_rowcol(tOrO);
  constexpr int kRows = decltype(size<0>(S))::value;
  static_assert(kRows == decltype(size<0>(O))::value);

  const T* q_all = static_cast<const T*>(p.q);
  const T* k_all = static_cast<const T*>(p.k);
  const T* v_all = static_cast<const T*>(p.v);
  const int group = p.heads_q / p.heads_kv;
  const bool capped = p.softcap > 0.f;
  // Units of S and m: raw q.k (no softcap, positive scale: the max commutes with the scale) or
  // log2 units, rewritten per element (softcap, or a negative scale); su maps to log2 units.
  const bool rewrite = capped || p.scale < 0.f;
  const float su = rewrite ? 1.f : p.scale * kLog2e;
  const std::int64_t num_items = std::int64_t(p.num_tiles) * p.heads_q;

  while (true) {
    if (tid == 0) s.next_item = atomicAdd(p.counter, 1);
    __syncthreads();
    const std::int64_t item = s.next_item;
    if (item >= num_items) break;
    // Tile-major (each tile's heads together, tiles heavy first). Head-major order measured
    // the same on the H200 (docs/benchmarks.md): K/V reuse in L2 is not the limit here.
    const Tile tile = p.tiles[item / p.heads_q];
    const int h = int(item % p.heads_q), hk = h / group;
    const int q0 = tile.q_start;
    const T* qh = q_all + h * p.q_head;
    const T* kh = k_all + hk * p.k_head;
    const T* vh = v_all + hk * p.v_head;

    detail::load_rows<kBM, kD, kThreads>(qh, p.q_row, q0, 0, p.num_q,
                               [&](int r, int c) { return &sQ(r, c); }, tid);
    cute::cp_async_fence();

    float m[kRows], l[kRows], mraw[kRows];
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) m[i] = -INFINITY, l[i] = 0.f, mraw[i] = -INFINITY;
    clear(tOrO);

    auto load_kv = [&](const detail::BlockIter& it, int stage) {
      const Piece pc = p.pieces[it.piece];
      detail::load_rows<kBN, kD, kThreads>(kh, p.k_row, it.kb, pc.k0, pc.k1,
                                 [&](int r, int c) { return &sK(r, c, stage); }, tid);
      detail::load_rows<kBN, kD, kThreads>(vh, p.v_row, it.kb, pc.k0, pc.k1,
                                 [&](int r, int c) { return &sVt(c, r, stage); }, tid);
      cute::cp_async_fence();
    };

    detail::BlockIter it{tile.piece_begin, tile.piece_end,
                         tile.piece_begin < tile.piece_end ? p.pieces[tile.piece_begin].k0 : 0};
    if (it.valid()) load_kv(it, 0);
    for (int j = 0; it.valid(); ++j) {
      const int stage = j & 1;
      detail::BlockIter next = it;
      next.advance(p.pieces, kBN);
      __syncthreads();  // every warp is done with the other stage's K/V
      if (next.valid()) {
        load_kv(next, stage ^ 1);
        cute::cp_async_wait<1>();
      } else {
        cute::cp_async_wait<0>();
      }
      cutlass::arch::fence_view_async_shared();
      __syncthreads();

      {
        Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
        detail::wg_gemm(mma_qk, tSrQ, thr_qk.partition_fragment_B(sK(_, _, stage)), tSrS, true);
      }

      // Mask (only blocks a piece's corners do not cover), cap, and fold the block into the
      // running max and sum. S stays in raw dot-product units unless softcap rewrites it in
      // log2 units; m is kept in the same units and `su` turns either into log2 units.
      const Piece pc = p.pieces[it.piece];
      const int kb = it.kb;
      const bool full = q0 >= pc.q0 && q0 + kBM <= pc.q1 && kb >= pc.k0 && kb + kBN <= pc.k1 &&
                        kb - (q0 + kBM - 1) >= pc.lo && kb + kBN - 1 - q0 <= pc.hi;
      if (!full) {
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          const int q = q0 + get<0>(cS(i, 0));
          const bool row_in = q >= pc.q0 && q < pc.q1;
          CUTE_UNROLL
          for (int jj = 0; jj < size<1>(S); ++jj) {
            const int k = kb + get<1>(cS(i, jj));
            const bool visible = row_in && k >= pc.k0 && k < pc.k1 && k - q >= pc.lo &&
                                 k - q <= pc.hi;
            if (!visible) S(i, jj) = -INFINITY;
          }
        }
      }
      if (rewrite) {
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          CUTE_UNROLL
          for (int jj = 0; jj < size<1>(S); ++jj) {
            if (S(i, jj) == -INFINITY) continue;  // masked
            const float raw = S(i, jj) * p.scale;
            mraw[i] = fmaxf(mraw[i], raw);
            S(i, jj) = (capped ? p.softcap * tanhf(raw / p.softcap) : raw) * kLog2e;
          }
        }
      }
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        float mx = -INFINITY;
        CUTE_UNROLL
        for (int jj = 0; jj < size<1>(S); ++jj) mx = fmaxf(mx, S(i, jj));
        mx = detail::quad_max(mx);
        const float m_new = fmaxf(m[i], mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new * su;  // log2 units
        const float corr = exp2f(m[i] * su - m_use);               // 0 when m[i] is -inf
        m[i] = m_new;
        l[i] *= corr;
        CUTE_UNROLL
        for (int jj = 0; jj < size<1>(O); ++jj) O(i, jj) *= corr;
        CUTE_UNROLL
        for (int jj = 0; jj < size<1>(S); ++jj) {
          const float pv = exp2f(fmaf(S(i, jj), su, -m_use));
          S(i, jj) = pv;
          l[i] += pv;
        }
      }
      CUTE_UNROLL
      for (int e = 0; e < size(tSrS); ++e) tOrP(e) = T(tSrS(e));
      detail::wg_gemm<true>(mma_pv, tOrP, thr_pv.partition_fragment_B(sVt(_, _, stage)), tOrO,
                            false);
      it = next;
    }

    // Epilogue: normalise, sink, merge with a given partial result, store.
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const int row = q0 + get<0>(cO(i, 0));
      const float l_tot = detail::quad_sum(l[i]);
      float lse = l_tot > 0.f ? (m[i] * su + log2f(l_tot)) * kLn2 : -INFINITY;
      float w = l_tot > 0.f ? 1.f / l_tot : 0.f;  // out = w * O
      if (p.sink != nullptr && row < p.num_q) {
        float ls = -INFINITY;
        const float* sk = p.sink + std::int64_t(row) * p.sink_row + std::int64_t(h) * p.sink_head;
        for (int j = 0; j < p.sink_len; ++j) ls = detail::log_add_exp(ls, sk[j * p.sink_s]);
        const float merged = detail::log_add_exp(lse, ls);
        if (l_tot > 0.f) w *= expf(lse - merged);
        lse = merged;
      }
      if (row >= p.num_q) continue;
      const std::int64_t o_base = std::int64_t(row) * p.o_row + std::int64_t(h) * p.o_head;
      float* lse_ptr = p.lse + std::int64_t(row) * p.lse_row + std::int64_t(h) * p.lse_head;
      float keep = 0.f;  // weight of the given partial output (accumulate)
      if (p.accumulate) {
        const float old = *lse_ptr;
        const float merged = detail::log_add_exp(old, lse);
        if (merged != -INFINITY) {
          keep = old == -INFINITY ? 0.f : expf(old - merged);
          w *= lse == -INFINITY ? 0.f : expf(lse - merged);
        } else {
          keep = 1.f;
        }
        lse = merged;
      }
      CUTE_UNROLL
      for (int jj = 0; jj < size<1>(O); ++jj) {
        const std::int64_t idx = o_base + get<1>(cO(i, jj));
        float x = O(i, jj) * w;
        if (p.accumulate) x += keep * static_cast<const float*>(p.out)[idx];
        detail::store(p.out, idx, p.out_type, x);
      }
      if ((tid & 3) == 0) *lse_ptr = lse;
    }
    if (p.max_logits != nullptr) {
      float mr = -INFINITY;
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i)  // without a cap, m is the raw max itself
        mr = fmaxf(mr, rewrite ? mraw[i] : (m[i] == -INFINITY ? -INFINITY : m[i] * p.scale));
      for (int off = 16; off > 0; off >>= 1) mr = fmaxf(mr, __shfl_xor_sync(0xffffffff, mr, off));
      if ((tid & 31) == 0 && mr != -INFINITY) detail::atomic_max(p.max_logits + h, mr);
    }
    cute::cp_async_wait<0>();  // a tile without key blocks never waited for its Q load
    __syncthreads();           // sQ and next_item are reused by the next item
  }
}

// Launches the kernel on as many persistent CTAs as fit (at most max_ctas; the SMs left after
// sm_margin times the CTAs per SM); defined per instantiation, fwd_inst.cu.in.
template <class T, int kD>
cudaError_t launch_forward(const FwdParams& p, int sms, std::int64_t max_ctas,
                           cudaStream_t stream);

}  // namespace magi::kernels::sm90
