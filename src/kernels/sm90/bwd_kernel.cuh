// FFA backward on Hopper (sm90a), the main kernel (bwd_params.h has the three launches): one
// persistent CTA per SM pulls (key tile, kv head) items from a global counter, kv head major
// (item = head * num_tiles + tile; key tiles heavy first within a head, work_list.h,
// TileAxis::kKey), so that the CTAs running together share one or two kv heads' Q, dO and dQ
// rows in L2 instead of every head's, and, for every q head of the kv head's group and every
// query block (64 rows, on the grid of 64) of each of the tile's pieces, recomputes P and
// accumulates
//   dV += P^T dO,  dK += dS^T Q,  dQ += dS K  (dS = P * (dP - Delta), dP = dO V^T),
// FlashAttention-3's order (one CTA per key block iterating over query blocks). dK and dV stay
// in registers for the whole item and are written once by their owner (no races, also for
// GQA: the group's q heads run inside the item); each block's dQ goes through shared memory to
// a writer warp that adds it into a fp32 accumulator with bulk reductions (as FA3 does).
//
// Per CTA, warp specialisation as in the forward (fwd_kernel.cuh):
// - warpgroup 0 gives registers away; its first warp is the producer: it takes the next item,
//   hands it to the consumers, loads the tile's K and V once (TMA), then walks the query
//   blocks, loading Q and dO (TMA) and lse / Delta (the lanes, from the workspace rows) into a
//   2-stage ring, with what the consumers need to know of each block (BwdBlockInfo); its
//   second warp is the dQ writer (one cp.reduce.async.bulk per warpgroup and block into
//   dq_acc, which holds each block in the dQ product's fragment order: bwd_params.h); its
//   third and fourth warps are the checker (NaN/inf rows of Q, dO and K tiles, below);
// - two consumer warpgroups own 64 keys each of the 128-key tile: per block, S^T = K Q^T and
//   dP^T = V dO^T (keys in rows: P^T and dS^T are then the A operands of the dV and dK
//   products straight from registers), and each computes half of D of dQ = dS K from dS
//   staged in shared memory by both. Softcap is a template flag (kCapped).
// Correctness first: no intra-warpgroup overlap of softmax and products, no ping-pong between
// the warpgroups yet (the forward's schedule is the model for both).
//
// Masking: a block whose corners the piece does not cover gets P = dS = 0 on the cells it does
// not see (set, not multiplied: a NaN in K or V there must not leak). NaN/inf rule
// (docs/numerics.md): a non-finite value in a row of Q, dO or K that a block's cell does not
// see must not reach the products through that 0 (0 * NaN). The row pass flags such Q / dO
// rows (q_bad); the checker warps zero them in each block's stage, and zero the rows of each K
// tile that hold one (they scan it), before the consumers read them. The cells that see such a
// row are NaN through their row's lse (the row pass's or the forward's). V needs nothing: dP^T
// is masked by selection.
//
// Deterministic mode: dK and dV have one owner and dsink sums in a fixed order already; each
// block's dQ chunk is added in its ticket's turn (dq_tickets, work_list.h), so the fp32 sums
// run in the same order on every call.
#pragma once

#include "tma_encode.h"  // first: before CUTLASS sees the driver call

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include "bwd_params.h"
#include "fwd_device.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
#error "the sm90 backward needs the sm_90a target (wgmma): build with CUDA_ARCHITECTURES 90a"
#endif

namespace magi::kernels::sm90 {

namespace detail {

// One query block as the producer hands it to the consumers, beside its Q / dO stage.
struct BwdBlockInfo {
  unsigned long long bad;  // rows of the block whose q or dout hold a NaN/inf (bit r: row qb + r)
  Piece pc;
  int qb;    // first query row of the block
  int head;  // q head
  int last;  // the item's last block
  int ticket;  // deterministic mode: the block's dq turn (bwd_params.h)
};

// One staged dQ block as the consumers hand it to the dQ writer: rows qb .. qb + 63 (qb a
// multiple of 64) of q head `head` (head -1: no more blocks).
struct DqJob {
  int qb, head, ticket;
};

// dst[i] += src[i] for bytes / 4 floats, src in shared memory (a bulk copy: completes
// asynchronously; the thread's bulk_commit / bulk_wait_read track it).
__device__ inline void bulk_reduce_add(float* dst, const float* src, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                   dst),
               "r"(unsigned(__cvta_generic_to_shared(src))), "r"(bytes)
               : "memory");
}
__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// The thread's committed bulk copies have read their sources (`.read`) or fully completed.
__device__ inline void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// A 16-byte store to a shared-memory address.
__device__ inline void st_shared(unsigned addr, float x, float y, float z, float w) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(x), "f"(y), "f"(z),
               "f"(w)
               : "memory");
}
// Four 8 x 8 matrices of 16-bit elements to shared memory, lane l giving the address of row
// l % 8 of matrix l / 8 and, in register m, its pair of row l / 4 of matrix m (columns
// 2 (l % 4), + 1): the layout of a wgmma accumulator's 8 x 8 pieces.
__device__ inline void stmatrix4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ inline void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Deterministic mode: wait until the block's turn counter reaches `ticket` (acquire), ordered
// before the async proxy's reductions that follow. The scheduler makes the wait finite (an
// earlier contribution belongs to an earlier item, already taken by a running CTA); a counter
// that never arrives (a broken work image) traps after about half a minute instead of hanging.
__device__ inline void wait_turn(const int* turn, int ticket) {
  unsigned ns = 32;
  for (long long spins = 0;; ++spins) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(turn) : "memory");
    if (v == ticket) break;
    if (spins > (1ll << 25)) __trap();
    __nanosleep(ns);
    ns = ns < 1024 ? ns * 2 : ns;
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
// The block's reductions complete: the next turn (release).
__device__ inline void pass_turn(int* turn) {
  bulk_wait_all();
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(turn) : "memory");
}

}  // namespace detail

template <class T, int kD>
struct BwdConfig {
  static_assert(kD == 64 || kD == 128 || kD == 192 || kD == 256);
  static constexpr int kBlockM = bwd_block_m(kD);  // query rows per block
  static constexpr int kBlockN = bwd_block_n(kD);  // keys per tile
  static constexpr int kWarpgroups = 2;
  static constexpr int kConsumerThreads = 128 * kWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // D <= 128: each consumer warpgroup owns 64 keys of the 128-key tile with all of D of dK and
  // dV. D 192 / 256 (kSplitD, bwd_split_d): dK and dV of 64 keys do not fit one warpgroup's
  // registers, so both own the tile's 64 keys and half of D each; both compute the block's
  // S^T and dP^T (the same products: 7 units of tensor work instead of 5).
  static constexpr bool kSplitD = bwd_split_d(kD);
  static constexpr int kKeysPerWG = kSplitD ? kBlockN : kBlockN / kWarpgroups;
  static constexpr int kKVCols = kSplitD ? kD / kWarpgroups : kD;  // of dK, dV per warpgroup
  // The Q / dO ring and the dQ staging ring: shared memory (K, V, Q and dO grow with D).
  static constexpr int kStages = kD <= 192 ? 2 : 1;
  static constexpr int kDQStages = kSplitD ? 1 : 2;
  // One warpgroup's dQ of a block, in fragment order (bwd_params.h): 64 rows x D / 2 from all
  // the tile's keys. (At D 64 each warpgroup once took all of D over its own 64 keys, both
  // adding into one chunk: twice the accumulator traffic per FLOP of D 128.)
  static constexpr int kDQCols = kD / kWarpgroups;
  static constexpr int kDQChunks = kWarpgroups;  // per block in dq_acc
  static constexpr int kDQFloats = bwd_dq_chunk(kD);
  static_assert(kDQFloats == kBlockM * kDQCols && kDQFloats * kDQChunks == kBlockM * kD &&
                kDQFloats % (4 * 128) == 0);
  // dK, dV (64 keys x D fp32: 128 registers at D 128), S^T and dP^T (32 each), P^T and dS^T
  // in bf16: at 232 ptxas serialized every wgmma (C7512); the producer's walk spills at 24.
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <=
                65536 / kThreads / 8 * 8 * kThreads);
  using BM = cute::Int<kBlockM>;
  using BN = cute::Int<kBlockN>;
  using BW = cute::Int<kKeysPerWG>;  // keys per consumer warpgroup
  using HD = cute::Int<kD>;
  using HKV = cute::Int<kKVCols>;  // its columns of dK and dV
  using HD2 = cute::Int<kDQCols>;                // dQ columns per consumer warpgroup
  // ... computed in pieces of at most 64 columns (at D 256 one product of 128 columns beside dK,
  // dV and the A operands in flight made ptxas serialize every wgmma, C7512).
  static constexpr int kDQPieceCols = kDQCols <= 96 ? kDQCols : 64;
  static constexpr int kDQPieces = kDQCols / kDQPieceCols;
  using HDP = cute::Int<kDQPieceCols>;
  using DQK = cute::Int<kBlockN>;  // the keys of the dQ product
  // Rows of D in 128-byte swizzle atoms (64 columns); at D 64 and 192 in 64-byte ones (32
  // columns), so that each warpgroup's 32 or 96 columns of the transposed Q, dO and K views (the
  // MN-major B operands of its dK, dV and dQ products) are whole atoms.
  using AtomK = std::conditional_t<kD == 64 || kD == 192, cute::GMMA::Layout_K_SW64_Atom<T>,
                                   cute::GMMA::Layout_K_SW128_Atom<T>>;
  using AtomMN = cute::GMMA::Layout_MN_SW128_Atom<T>;
  // K and V tiles (keys, D) and the Q / dO ring (rows, D, stage), rows of D as TMA loads them.
  using LayoutKV = decltype(cute::tile_to_shape(AtomK{}, cute::Shape<BN, HD>{}));
  using LayoutQ = decltype(cute::tile_to_shape(AtomK{}, cute::Shape<BM, HD, cute::Int<kStages>>{}));
  // Transposed views (D, rows): the MN-major B operands of dV += P^T dO, dK += dS^T Q (Q, dO)
  // and dQ = dS K (K).
  using LayoutQt = decltype(cute::composition(
      LayoutQ{}, cute::make_ordered_layout(cute::Shape<HD, BM, cute::Int<kStages>>{},
                                           cute::Step<cute::_2, cute::_1, cute::_3>{})));
  using LayoutKt = decltype(cute::composition(
      LayoutKV{}, cute::make_ordered_layout(cute::Shape<HD, BN>{}, cute::Step<cute::_2, cute::_1>{})));
  // dS as the A operand of dQ = dS K: (rows, keys), rows contiguous (MN-major), so that the
  // warpgroups write the pairs of their dS^T fragments as 4-byte stores.
  using LayoutDS = decltype(cute::tile_to_shape(AtomMN{}, cute::Shape<BM, BN>{}));
  using OneWG = cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>;
  // S^T = K Q^T and dP^T = V dO^T: (64 keys, 64 rows, D), both operands K-major in smem.
  using MmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float, cute::Shape<BW, BM, HD>>(), OneWG{}));
  // dV += P^T dO and dK += dS^T Q: (64 keys, HKV, 64 rows), A in registers (the S^T
  // accumulator of 16 columns is the A fragment of one k-step, as P in the forward).
  using MmaKV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<T, T, float, cute::Shape<BW, HKV, BM>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      OneWG{}));
  // dQ (this warpgroup's half of D, or all of D over its keys) = dS K: (64 rows, HD2, DQK),
  // both MN-major.
  using MmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float, cute::Shape<BM, HDP, DQK>, cute::GMMA::Major::MN,
                                 cute::GMMA::Major::MN>(),
      OneWG{}));

  // The TMA copy types of Q tiles and K/V blocks (detail::tma_rows builds them per call).
  template <class Smem>
  using TmaOf =
      decltype(detail::tma_rows<T, kD>(static_cast<const T*>(nullptr), 0, 0, 0, 0, Smem{}));
  using TmaQ = TmaOf<decltype(cute::take<0, 2>(LayoutQ{}))>;
  using TmaKV = TmaOf<LayoutKV>;

  struct Smem {
    alignas(1024) T k[cute::cosize_v<LayoutKV>];
    alignas(1024) T v[cute::cosize_v<LayoutKV>];
    alignas(1024) T q[cute::cosize_v<LayoutQ>];
    alignas(1024) T dout[cute::cosize_v<LayoutQ>];
    alignas(1024) T ds[cute::cosize_v<LayoutDS>];
    alignas(16) float lse2[kStages][kBlockM];
    alignas(16) float delta[kStages][kBlockM];
    detail::BwdBlockInfo info[kStages];
    alignas(8) cute::uint64_t kv_full, kv_empty, kv_checked;
    cute::uint64_t q_full[kStages], q_empty[kStages], q_checked[kStages];
    cute::uint64_t item_full[2], item_empty[2];
    cute::uint64_t dq_full[kDQStages], dq_empty[kDQStages];
    std::int64_t item[2];
    detail::DqJob dq_job[2];
    unsigned k_bad[kBlockN / 32];  // the tile's K rows holding a NaN/inf (the checker)
    // Each block's dQ (fp32, each warpgroup its half of D in fragment order: the consumers'
    // 16-byte stores are conflict-free), handed to the dQ writer warp, which adds each half
    // into the accumulator with one bulk reduction.
    alignas(128) float dq[kDQStages][kWarpgroups][kDQFloats];
  };
  static constexpr int kSmemBytes = int(sizeof(Smem)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 CTA may have");
};

template <class T, int kD>
struct BwdKernelParams {
  BwdParams p;
  typename BwdConfig<T, kD>::TmaQ tma_q;
  typename BwdConfig<T, kD>::TmaQ tma_do;
  typename BwdConfig<T, kD>::TmaKV tma_k;
  typename BwdConfig<T, kD>::TmaKV tma_v;
};

// kCapped: softcap (p.softcap > 0), a template flag: a runtime branch in the block loop cost
// the uncapped kernel 3-4 % (full / causal 16k, same-session A/B).
template <class T, int kD, bool kCapped>
__global__ void __launch_bounds__(BwdConfig<T, kD>::kThreads, 1)
    ffa_bwd_kernel(const __grid_constant__ BwdKernelParams<T, kD> kp) {
  using namespace cute;
  using C = BwdConfig<T, kD>;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kBM = C::kBlockM, kBW = C::kKeysPerWG;
  static_assert(kBM == 64, "q_bad holds a 64-bit word per query block");
  constexpr int kCheckers = 64;  // warps 2 and 3 of the producer warpgroup: the checker
  constexpr int kBarCheck = 4;   // their named barrier
  const BwdParams& p = kp.p;

  extern __shared__ char smem_raw[];
  const unsigned misalign = unsigned(__cvta_generic_to_shared(smem_raw)) & 1023u;
  auto& s = *reinterpret_cast<typename C::Smem*>(smem_raw + ((1024u - misalign) & 1023u));
  Tensor sK = make_tensor(make_smem_ptr(s.k), typename C::LayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(s.v), typename C::LayoutKV{});
  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename C::LayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(s.dout), typename C::LayoutQ{});

  const int tid = int(threadIdx.x);
  const int warpgroup = tid / 128;
  const std::int64_t num_items = std::int64_t(p.num_tiles) * p.heads_kv;
  const int group = p.heads_q / p.heads_kv;

  if (tid == 0) {
    TxBarrier::init(&s.kv_full, 1);
    Barrier::init(&s.kv_empty, C::kWarpgroups);
    Barrier::init(&s.kv_checked, kCheckers);
    for (int i = 0; i < C::kStages; ++i) {
      TxBarrier::init(&s.q_full[i], 32);  // the producer lanes (lse2, delta, info)
      Barrier::init(&s.q_empty[i], C::kConsumerThreads);  // each reader of info, lse2, delta
      Barrier::init(&s.q_checked[i], kCheckers);
    }
    for (int i = 0; i < 2; ++i) {
      Barrier::init(&s.item_full[i], 1);
      Barrier::init(&s.item_empty[i], C::kConsumerThreads + kCheckers);
    }
    for (int i = 0; i < C::kDQStages; ++i) {
      Barrier::init(&s.dq_full[i], C::kConsumerThreads);
      Barrier::init(&s.dq_empty[i], 1);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  detail::wait_for_prerequisites();  // the row pass (bwd_params.h) launched just before

  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    cutlass::arch::warpgroup_reg_dealloc<C::kProducerRegs>();
    if (tid >= 64) {
      // The checker: rows holding a NaN/inf (docs/numerics.md) are zeroed in shared memory
      // before the consumers read them, so that the 0 of P and dS on the cells that do not see
      // them stays 0 in the products (0 * NaN): those of each item's K tile (found here; else
      // dQ = dS K would carry them into every row of the tile's blocks), and those of Q and dO
      // in each block (flagged by the row pass). The rows that see them are NaN through their
      // lse: the forward's (a NaN/inf key) or the row pass's (a NaN/inf in q or dout).
      const int t = tid - 64;
      Tensor sKc = make_tensor(make_smem_ptr(s.k), typename C::LayoutKV{});
      constexpr int kChunks = kD / 8;  // 16-byte chunks of a row: whole in every swizzle
      constexpr bool kBf16 = std::is_same_v<T, cutlass::bfloat16_t>;
      auto chunk = [&](int i) CUTLASS_LAMBDA_FUNC_INLINE {
        return reinterpret_cast<uint4*>(raw_pointer_cast(&sKc(i / kChunks, i % kChunks * 8)));
      };
      int kv_seen = 0, blk_seen = 0;
      for (int n = 0;; ++n) {
        const detail::Ring slot = detail::ring<2>(n);
        Barrier::wait(&s.item_full[slot.stage], slot.phase);
        const std::int64_t item = s.item[slot.stage];
        Barrier::arrive(&s.item_empty[slot.stage]);
        if (item >= num_items) break;
        const Tile tile = p.tiles[item % p.num_tiles];
        if (tile.piece_begin == tile.piece_end) continue;
        TxBarrier::wait(&s.kv_full, kv_seen & 1);
        ++kv_seen;
        // (The last item's bits were read before its kv_checked arrival, long before this.)
        if (t < C::kBlockN / 32) s.k_bad[t] = 0u;
        detail::named_sync(kBarCheck, kCheckers);
        for (int i = t; i < C::kBlockN * kChunks; i += kCheckers)
          if (detail::non_finite8<kBf16>(*chunk(i))) atomicOr(&s.k_bad[i / kChunks / 32], 1u << (i / kChunks % 32));
        detail::named_sync(kBarCheck, kCheckers);
        unsigned any = 0;
        CUTE_UNROLL
        for (int w = 0; w < C::kBlockN / 32; ++w) any |= s.k_bad[w];
        if (any != 0u) {
          for (int i = t; i < C::kBlockN * kChunks; i += kCheckers)
            if (s.k_bad[i / kChunks / 32] >> (i / kChunks % 32) & 1u) *chunk(i) = uint4{};
          cutlass::arch::fence_view_async_shared();  // generic writes before the wgmma reads
        }
        Barrier::arrive(&s.kv_checked);
        // The item's blocks, in the consumers' ring order, up to the one marked last.
        for (;;) {
          const detail::Ring r = detail::ring<C::kStages>(blk_seen++);
          TxBarrier::wait(&s.q_full[r.stage], r.phase);
          const detail::BwdBlockInfo bi = s.info[r.stage];
          if (bi.bad != 0ull) {
            Tensor sQc = make_tensor(make_smem_ptr(s.q), typename C::LayoutQ{});
            Tensor sdOc = make_tensor(make_smem_ptr(s.dout), typename C::LayoutQ{});
            for (int i = t; i < kBM * kChunks; i += kCheckers) {
              const int row = i / kChunks, col = i % kChunks * 8;
              if (bi.bad >> row & 1ull) {
                *reinterpret_cast<uint4*>(raw_pointer_cast(&sQc(row, col, r.stage))) = uint4{};
                *reinterpret_cast<uint4*>(raw_pointer_cast(&sdOc(row, col, r.stage))) = uint4{};
              }
            }
            cutlass::arch::fence_view_async_shared();
          }
          Barrier::arrive(&s.q_checked[r.stage]);
          if (bi.last) break;
        }
      }
      return;
    }
    if (tid >= 32) {
      // The dQ writer: for each staged block, one bulk reduction per warpgroup half (32 KB
      // at D 128 in all) into the block's chunk of the fp32 accumulator, then the buffer back
      // to the consumers once the copies have read it. One thread issues them all.
      if (tid != 32) return;
      const int q_blocks = int(p.rows_pad / kBM);
      for (int j = 0;; ++j) {
        const detail::Ring d = detail::ring<C::kDQStages>(j);
        Barrier::wait(&s.dq_full[d.stage], d.phase);
        const detail::DqJob job = s.dq_job[d.stage];
        if (job.head < 0) break;
        const std::int64_t chunk = std::int64_t(job.head) * q_blocks + job.qb / kBM;
        float* dst = p.dq_acc + chunk * C::kDQChunks * std::int64_t(C::kDQFloats);
        if (p.deterministic) detail::wait_turn(p.turns + chunk, job.ticket);
        for (int w = 0; w < C::kWarpgroups; ++w)
          detail::bulk_reduce_add(dst + w * C::kDQFloats, s.dq[d.stage][w],
                                  C::kDQFloats * int(sizeof(float)));
        detail::bulk_commit();
        if (p.deterministic)
          detail::pass_turn(p.turns + chunk);
        else
          detail::bulk_wait_read();
        Barrier::arrive(&s.dq_empty[d.stage]);
      }
      detail::bulk_wait_all();
      return;
    }
    const int lane = tid;
    if (lane == 0) {
      prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
      prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
      prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
      prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    }
    Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(p.num_q, kD, p.heads_q));
    Tensor mdO = kp.tma_do.get_tma_tensor(make_shape(p.num_q, kD, p.heads_q));
    Tensor mK = kp.tma_k.get_tma_tensor(make_shape(p.num_k, kD, p.heads_kv));
    Tensor mV = kp.tma_v.get_tma_tensor(make_shape(p.num_k, kD, p.heads_kv));
    auto tma_load = [&](const auto& tma, const auto& m, int row0, int head, auto dst,
                        cute::uint64_t& full) {
      copy(tma.with(full), detail::tma_rows_source(tma, m, row0, head, product_each(shape(dst))),
           tma.get_slice(0).partition_D(dst));
    };
    // The TMA copies and the kv_empty waits: one elected thread (fwd_device.cuh).
    using detail::elected;
    constexpr unsigned kKVBytes = unsigned(cosize_v<typename C::LayoutKV> * sizeof(T));
    constexpr unsigned kQBytes = unsigned(kBM * kD * sizeof(T));
    int blk = 0, kv_uses = 0;
    for (int n = 0;; ++n) {
      std::int64_t item = 0;
      if (lane == 0) item = atomicAdd(p.counter, 1);
      item = __shfl_sync(0xffffffff, item, 0);
      const detail::Ring slot = detail::ring<2>(n);
      if (lane == 0) {
        Barrier::wait(&s.item_empty[slot.stage], slot.phase ^ 1);
        s.item[slot.stage] = item;
        Barrier::arrive(&s.item_full[slot.stage]);
      }
      if (item >= num_items) break;
      const Tile tile = p.tiles[item % p.num_tiles];
      const int g = int(item / p.num_tiles);
      if (tile.piece_begin == tile.piece_end) continue;  // the consumers write zeros
      if (elected()) {
        Barrier::wait(&s.kv_empty, (kv_uses & 1) ^ 1);
        TxBarrier::arrive_and_expect_tx(&s.kv_full, 2 * kKVBytes);
        tma_load(kp.tma_k, mK, tile.start, g, sK, s.kv_full);
        tma_load(kp.tma_v, mV, tile.start, g, sV, s.kv_full);
      }
      ++kv_uses;
      // Per piece (the tile's pieces come from the last rows up, make_work_list), its query
      // blocks on the grid of 64 rows (the accumulator's chunks; the piece's rows masked in its
      // first one) from the last down, each for every q head of the group: every tile visits
      // rows in one descending order. Under a causal mask all tiles' walks start at the last
      // row, so the CTAs of a wave meet the same rows at the same time, and in deterministic
      // mode a block's earlier turns (tiles taken before, dq_tickets) come due as it is
      // reached instead of a light tile waiting at every block for the heavy tile ahead of it.
      for (int pi = tile.piece_begin; pi < tile.piece_end; ++pi) {
        const Piece pc = p.pieces[pi];
        const int qb_first = pc.q0 / kBM * kBM;
        const int blocks = pc.q1 > qb_first ? (pc.q1 - qb_first + kBM - 1) / kBM : 0;
        for (int j = blocks - 1; j >= 0; --j) {
          const int qb = qb_first + j * kBM;
          for (int hh = 0; hh < group; ++hh) {
            const int h = g * group + hh;
            const detail::Ring r = detail::ring<C::kStages>(blk++);
            // The block's rows with a NaN/inf (the row pass), loaded before the wait.
            const unsigned long long bad =
                lane == 0 ? p.q_bad[std::int64_t(h) * (p.rows_pad / kBM) + qb / kBM] : 0ull;
            // Lane 0 polls; then each lane acquires the stage itself (one test, already
            // complete) before it overwrites what the consumers read (lse2, delta, info).
            if (lane == 0) Barrier::wait(&s.q_empty[r.stage], r.phase ^ 1);
            __syncwarp();
            Barrier::wait(&s.q_empty[r.stage], r.phase ^ 1);
            // lse (log2 units) and Delta of the block's rows (the workspace rows are padded
            // past the last block: lse +inf, Delta 0).
            const float* l2 = p.lse2 + std::int64_t(h) * p.rows_pad + qb;
            const float* dl = p.delta + std::int64_t(h) * p.rows_pad + qb;
            s.lse2[r.stage][lane] = l2[lane];
            s.lse2[r.stage][lane + 32] = l2[lane + 32];
            s.delta[r.stage][lane] = dl[lane];
            s.delta[r.stage][lane + 32] = dl[lane + 32];
            if (lane == 0) {
              const bool last = hh == group - 1 && pi == tile.piece_end - 1 && j == 0;
              const int ticket = p.deterministic ? p.tickets[p.tickets[pi] + j] : 0;
              s.info[r.stage] = detail::BwdBlockInfo{bad, pc, qb, h, last ? 1 : 0, ticket};
            }
            // Each lane's arrival releases its own stores (q_full counts the 32 lanes; the stage
            // was acquired by every lane above, so any lane may post the copies).
            if (elected()) {
              TxBarrier::arrive_and_expect_tx(&s.q_full[r.stage], 2 * kQBytes);
              tma_load(kp.tma_q, mQ, qb, h, sQ(_, _, r.stage), s.q_full[r.stage]);
              tma_load(kp.tma_do, mdO, qb, h, sdO(_, _, r.stage), s.q_full[r.stage]);
            } else {
              Barrier::arrive(&s.q_full[r.stage]);
            }
          }
        }
      }
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  cutlass::arch::warpgroup_reg_alloc<C::kConsumerRegs>();
  const int ctid = tid - 128;  // 0 .. 255 over the consumers
  // From a shuffle, so ptxas knows it is warp-uniform (uniform registers for what derives from it).
  const int wg = __shfl_sync(0xffffffff, ctid / 128, 0);  // which 64 keys; which half of D of dQ
  const int wtid = ctid % 128;
  const bool leader = wtid == 0;
  typename C::MmaSdP mma_sdp;
  typename C::MmaKV mma_kv;
  typename C::MmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(wtid);
  auto thr_kv = mma_kv.get_thread_slice(wtid);
  auto thr_dq = mma_dq.get_thread_slice(wtid);
  // The wgmma descriptors are rebuilt from an opaque shared-memory base at each use (as in the
  // forward): held across the loop, 8 per operand, they do not fit beside dK, dV, S and dP.
  auto opaque = [](T* ptr) CUTLASS_LAMBDA_FUNC_INLINE {
    asm volatile("" : "+l"(ptr));
    return make_smem_ptr(ptr);
  };
  // A stage of the Q / dO ring, as (rows, D) or transposed (D, rows).
  auto stage_of = [&](T* base, auto layout, int stage) CUTLASS_LAMBDA_FUNC_INLINE {
    return make_tensor(opaque(base), layout)(_, _, stage);
  };
  // This warpgroup's columns of a transposed (D, rows) Q or dO stage: the B operand of its dK
  // and dV products (all of D, or its half under kSplitD).
  auto kv_cols = [&](auto t) CUTLASS_LAMBDA_FUNC_INLINE {
    if constexpr (C::kSplitD)
      return local_tile(t, Shape<typename C::HKV, typename C::BM>{}, make_coord(wg, 0));
    else
      return t;
  };
  // This warpgroup's keys of K or V (A of S^T and dP^T).
  auto keys_of = [&](T* base) CUTLASS_LAMBDA_FUNC_INLINE {
    return local_tile(make_tensor(opaque(base), typename C::LayoutKV{}),
                      Shape<typename C::BW, typename C::HD>{}, make_coord(C::kSplitD ? 0 : wg, 0));
  };
  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<typename C::BW, typename C::BM>{});
  Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<typename C::BW, typename C::BM>{});
  Tensor tdVrdV = partition_fragment_C(mma_kv, Shape<typename C::BW, typename C::HKV>{});
  Tensor tdKrdK = partition_fragment_C(mma_kv, Shape<typename C::BW, typename C::HKV>{});
  Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<typename C::BM, typename C::HDP>{});
  // P^T and dS^T as A operands: per k-step of 16 rows, (column pair, key + 8, column + 8),
  // the S^T accumulator's own order.
  Tensor tPrP = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBM / 16>>>{});
  Tensor tdSrdS = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBM / 16>>>{});
  static_assert(decltype(size(tPrP))::value == decltype(size(tSrS))::value);
  // (key, row) of each S^T element; (key, d) of dK / dV.
  Tensor cS = detail::as_rowcol(
      thr_sdp.partition_C(make_identity_tensor(Shape<typename C::BW, typename C::BM>{})));
  Tensor cKV = detail::as_rowcol(
      thr_kv.partition_C(make_identity_tensor(Shape<typename C::BW, typename C::HKV>{})));
  Tensor S = detail::as_rowcol(tSrS);
  Tensor dP = detail::as_rowcol(tdPrdP);
  Tensor dK = detail::as_rowcol(tdKrdK);
  Tensor dV = detail::as_rowcol(tdVrdV);
  constexpr int kRows = decltype(size<0>(S))::value;  // keys of this thread
  constexpr int kCols = decltype(size<1>(S))::value;  // query rows of this thread
  const float su = p.scale * detail::kLog2e;
  // Softcap c (0: none): l = c tanh(scale * s / c); in log2 units cap2 tanh(s * cap_in), and
  // t = l2 * cap_out.
  constexpr bool capped = kCapped;
  const float cap_in = capped ? p.scale / p.softcap : 0.f;
  const float cap2 = p.softcap * detail::kLog2e;
  const float cap_out = capped ? 1.f / cap2 : 0.f;
  constexpr int kPair = C::kConsumerThreads;
  constexpr int kBarDsFree = 1, kBarDsFull = 2;
  // The dQ staging buffers' address: the stores go as 32-bit shared addresses (through the
  // generic pointers of a CuTe tensor they were 64-bit addresses and 2-byte generic stores).
  const unsigned dq_base = unsigned(__cvta_generic_to_shared(&s.dq[0][0][0]));
  // dS^T to dS by stmatrix (8 x 8 matrices of 16-bit pairs, one 16-byte row address per
  // lane): lane l addresses row l % 8 of matrix l / 8, which is key 16 w + 8 (l / 16) + l % 8
  // of the warpgroup's keys and rows 8 (l / 8 % 2) .. + 7 of the block. dS (rows, keys) keeps
  // a key's 64 rows in one 128-byte line whose 16-byte chunks are swizzled by key % 8 = l % 8
  // (LayoutDS: byte 128 k + 16 (q / 8 ^ k % 8) + 2 (q % 8)); the chunk pair 2 jj of the
  // matrices of stmatrix jj is then the address XOR 32 jj.
  static_assert(kRows == 2 && kCols % 4 == 0 && C::kBlockM * sizeof(T) == 128);
  const unsigned ds_row = [&] {
    const int lane = wtid % 32, key_row = lane % 8;
    const int key = (C::kSplitD ? 0 : kBW * wg) + 16 * (wtid / 32) + 8 * (lane / 16) + key_row;
    return unsigned(__cvta_generic_to_shared(s.ds)) + 128u * unsigned(key) +
           (unsigned((lane / 8 % 2) ^ key_row) << 4);
  }();

  int blk = 0, kv_uses = 0, dq_blocks = 0;
  for (int n = 0;; ++n) {
    const detail::Ring slot = detail::ring<2>(n);
    Barrier::wait(&s.item_full[slot.stage], slot.phase);
    const std::int64_t item = s.item[slot.stage];
    Barrier::arrive(&s.item_empty[slot.stage]);
    if (item >= num_items) {
      // No more blocks: the dQ writer stops.
      const detail::Ring d = detail::ring<C::kDQStages>(dq_blocks);
      Barrier::wait(&s.dq_empty[d.stage], d.phase ^ 1);
      if (ctid == 0) s.dq_job[d.stage] = detail::DqJob{0, -1, 0};
      Barrier::arrive(&s.dq_full[d.stage]);
      break;
    }
    const Tile tile = p.tiles[item % p.num_tiles];
    const int g = int(item / p.num_tiles);
    const int kw = tile.start + (C::kSplitD ? 0 : kBW * wg);  // this warpgroup's first key
    clear(tdKrdK);
    clear(tdVrdV);
    if (tile.piece_begin < tile.piece_end) {
      TxBarrier::wait(&s.kv_full, kv_uses & 1);
      Barrier::wait(&s.kv_checked, kv_uses & 1);
      ++kv_uses;
      for (;;) {
        const detail::Ring r = detail::ring<C::kStages>(blk++);
        TxBarrier::wait(&s.q_full[r.stage], r.phase);
        Barrier::wait(&s.q_checked[r.stage], r.phase);
        const detail::BwdBlockInfo bi = s.info[r.stage];
        const Piece& pc = bi.pc;
        const bool full = covers(pc, bi.qb, kBM, kw, kBW);
        // Zero (set, not multiplied) the cells of x the piece does not see: per key (row i of
        // the thread's fragment) the query rows that see it, as column offsets (per-cell bounds
        // arithmetic was 40 % of the instructions on a sliding-window mask).
        auto mask = [&](auto& x) CUTLASS_LAMBDA_FUNC_INLINE {
          const int q_first = bi.qb + get<1>(cS(0, 0));
          CUTE_UNROLL
          for (int i = 0; i < kRows; ++i) {
            const detail::Offsets o = detail::offsets_from(
                detail::rows_seeing_key(pc, kw + get<0>(cS(i, 0))), q_first, kBM);
            CUTE_UNROLL
            for (int j = 0; j < kCols; ++j) {
              const int off = get<1>(cS(i, j)) - get<1>(cS(0, 0));  // a constant
              x(i, j) = off >= o.lo && off <= o.hi ? x(i, j) : 0.f;
            }
          }
        };
        // This block's lse in registers (16 rows), loaded before the products are issued
        // (behind them the loads waited for the products' operand reads of shared memory).
        float lse2[kCols];
        CUTE_UNROLL
        for (int j = 0; j < kCols; j += 2) {  // the thread's rows in pairs (q, q + 1)
          const float2 l = *reinterpret_cast<const float2*>(&s.lse2[r.stage][get<1>(cS(0, j))]);
          lse2[j] = l.x;
          lse2[j + 1] = l.y;
        }
        {
          Tensor tSrK = thr_sdp.partition_fragment_A(keys_of(s.k));
          detail::wg_gemm_issue(mma_sdp, tSrK, thr_sdp.partition_fragment_B(stage_of(s.q, typename C::LayoutQ{}, r.stage)),
                                tSrS, true);
          Tensor tdPrV = thr_sdp.partition_fragment_A(keys_of(s.v));
          detail::wg_gemm_issue(mma_sdp, tdPrV, thr_sdp.partition_fragment_B(stage_of(s.dout, typename C::LayoutQ{}, r.stage)),
                                tdPrdP, true);
        }
        warpgroup_wait<1>();  // S^T (dP^T may still run)
        warpgroup_fence_operand(tSrS);
        // P^T = exp(l - lse) with the logit l = scale * s, or c tanh(scale * s / c) under
        // softcap c; 0 where the piece does not see the cell (one branch per block: the
        // per-cell selects only in blocks the piece does not cover).
        if constexpr (capped) {
          CUTE_UNROLL
          for (int i = 0; i < kRows; ++i) {
            CUTE_UNROLL
            for (int j = 0; j < kCols; ++j)
              S(i, j) = detail::exp2_approx(fmaf(cap2, tanhf(S(i, j) * cap_in), -lse2[j]));
          }
        } else {
          CUTE_UNROLL
          for (int i = 0; i < kRows; ++i) {
            CUTE_UNROLL
            for (int j = 0; j < kCols; ++j)
              S(i, j) = detail::exp2_approx(fmaf(S(i, j), su, -lse2[j]));
          }
        }
        if (!full) mask(S);
        warpgroup_wait<0>();  // dP^T
        warpgroup_fence_operand(tdPrdP);
        // dS^T = P^T (dP^T - Delta), in place, 0 where the piece does not see the cell; then
        // both in bf16 / fp16 as the A operands of dV and dK (the A operand's element e is the
        // accumulator's element e). FlashAttention-3's order: no fp32 tile stays live beside
        // an A operand in flight (issuing dV before dS spilled and serialized every wgmma).
        CUTE_UNROLL
        for (int j = 0; j < kCols; j += 2) {
          const float2 d = *reinterpret_cast<const float2*>(&s.delta[r.stage][get<1>(cS(0, j))]);
          CUTE_UNROLL
          for (int i = 0; i < kRows; ++i) {
            dP(i, j) = S(i, j) * (dP(i, j) - d.x);
            dP(i, j + 1) = S(i, j + 1) * (dP(i, j + 1) - d.y);
          }
        }
        if constexpr (capped) {
          // dl / d(scale * s) = 1 - t^2 with t = l / c, l recovered from P itself (log2 P + lse
          // in log2 units): no register holds t across the dP^T wait. P = 0 (underflow or
          // masked) keeps the factor 1, so that a NaN of dP^T still gives 0 * NaN.
          CUTE_UNROLL
          for (int i = 0; i < kRows; ++i) {
            CUTE_UNROLL
            for (int j = 0; j < kCols; ++j) {
              const float pv = S(i, j);
              const float t = (__log2f(pv) + s.lse2[r.stage][get<1>(cS(i, j))]) * cap_out;
              dP(i, j) *= pv > 0.f ? 1.f - t * t : 1.f;
            }
          }
        }
        if (!full) mask(dP);
        CUTE_UNROLL
        for (int e = 0; e < size(tSrS); ++e) tPrP(e) = T(tSrS(e));
        CUTE_UNROLL
        for (int e = 0; e < size(tdPrdP); ++e) tdSrdS(e) = T(tdPrdP(e));
        // With one dQ piece (D <= 192), dK is issued after dQ, so that the dQ store to the staging
        // buffer runs under dK (FlashAttention-3's order); at D 256 dK goes with dV.
        constexpr bool kLateDK = C::kDQPieces == 1;
        auto issue_dk = [&]() CUTLASS_LAMBDA_FUNC_INLINE {
          detail::wg_gemm_issue<true>(mma_kv, tdSrdS, thr_kv.partition_fragment_B(kv_cols(stage_of(s.q, typename C::LayoutQt{}, r.stage))),
                                      tdKrdK, false);
        };
        detail::wg_gemm_issue<true>(mma_kv, tPrP, thr_kv.partition_fragment_B(kv_cols(stage_of(s.dout, typename C::LayoutQt{}, r.stage))),
                                    tdVrdV, false);
        if constexpr (!kLateDK) issue_dk();
        // dS^T into shared memory as dS (rows, keys), once both warpgroups' dQ products of
        // the previous block have completed, while dV (and dK) run (the stores only read the
        // registers the products read too).
        Tensor dS = make_tensor(tdSrdS.data(), detail::rowcol(tdPrdP.layout()));
        detail::named_sync(kBarDsFree, kPair);
        // Under kSplitD both warpgroups hold the same dS^T: each stores the keys of two of its
        // four warps (warp w of a warpgroup holds keys 16 w .. 16 w + 15). stmatrix jj stores
        // the warp's keys 0-7 and 8-15 by block rows 16 jj .. + 7 and 16 jj + 8 .. + 15
        // (ds_row, above), from the thread's pairs of rows at its keys.
        if (!C::kSplitD || (wtid / 64) == wg) {
          unsigned row = ds_row;  // opaque: kept as one register, not kCols / 4 hoisted ones
          asm volatile("" : "+r"(row));
          auto pair = [&](int i, int j) CUTLASS_LAMBDA_FUNC_INLINE {
            return *reinterpret_cast<const unsigned*>(&dS(i, j));
          };
          CUTE_UNROLL
          for (int jj = 0; jj < kCols / 4; ++jj)
            detail::stmatrix4(row ^ unsigned(jj << 5), pair(0, 4 * jj), pair(0, 4 * jj + 2),
                              pair(1, 4 * jj), pair(1, 4 * jj + 2));
        }
        cutlass::arch::fence_view_async_shared();  // generic writes before the wgmma reads
        // The staging buffer of this block's dQ free.
        const int dq_stage = detail::ring<C::kDQStages>(dq_blocks).stage;
        Barrier::wait(&s.dq_empty[dq_stage], detail::ring<C::kDQStages>(dq_blocks).phase ^ 1);
        ++dq_blocks;
        detail::named_sync(kBarDsFull, kPair);
        // dQ (unscaled) = dS K to the dQ writer (above), which adds the block into the
        // accumulator: this warpgroup's half of D piece by piece into the staging buffer, element 4 v + e of thread t of piece n at float
        // ((n * kVecs + v) * 128 + t) * 4 + e: the fragment order the dq pass reads back (the
        // pieces are the N tiles of the same MMA's partition of the chunk).
        const unsigned buf = dq_base + unsigned((dq_stage * C::kWarpgroups + wg) * C::kDQFloats * 4);
        constexpr int kVecs = decltype(size(tdQrdQ))::value / 4;
        static_assert(kVecs * 4 * 128 * C::kDQPieces == C::kDQFloats);
        CUTE_UNROLL
        for (int n = 0; n < C::kDQPieces; ++n) {
          {
            // All of the tile's keys of dS, this warpgroup's columns of K (piece n).
            Tensor tdQrdS = thr_dq.partition_fragment_A(make_tensor(opaque(s.ds), typename C::LayoutDS{}));
            Tensor tdQrK = thr_dq.partition_fragment_B(
                local_tile(make_tensor(opaque(s.k), typename C::LayoutKt{}),
                           Shape<typename C::HDP, typename C::DQK>{}, make_coord(wg * C::kDQPieces + n, 0)));
            detail::wg_gemm_issue(mma_dq, tdQrdS, tdQrK, tdQrdQ, true);
          }
          if constexpr (kLateDK) {
            issue_dk();
            warpgroup_wait<1>();  // dV and dQ (dK may run)
            warpgroup_fence_operand(tdVrdV);
            warpgroup_fence_operand(tPrP);
          } else {
            warpgroup_wait<0>();
            if (n == 0) {
              warpgroup_fence_operand(tdVrdV);
              warpgroup_fence_operand(tdKrdK);
              warpgroup_fence_operand(tPrP);  // the A operands of dV and dK, kept until here
              warpgroup_fence_operand(tdSrdS);
              Barrier::arrive(&s.q_empty[r.stage]);  // each thread hands back its reads
            }
          }
          warpgroup_fence_operand(tdQrdQ);
          CUTE_UNROLL
          for (int v = 0; v < kVecs; ++v)
            detail::st_shared(buf + 16u * unsigned((n * kVecs + v) * 128 + wtid), tdQrdQ(4 * v),
                              tdQrdQ(4 * v + 1), tdQrdQ(4 * v + 2), tdQrdQ(4 * v + 3));
        }
        if (ctid == 0) s.dq_job[dq_stage] = detail::DqJob{bi.qb, bi.head, bi.ticket};
        cutlass::arch::fence_view_async_shared();  // generic stores before the bulk reads
        Barrier::arrive(&s.dq_full[dq_stage]);
        if constexpr (kLateDK) {
          warpgroup_wait<0>();  // dK: its reads of the Q stage done
          warpgroup_fence_operand(tdKrdK);
          warpgroup_fence_operand(tdSrdS);
          Barrier::arrive(&s.q_empty[r.stage]);  // each thread hands back its reads
        }
        if (bi.last) break;
      }
      if (leader) Barrier::arrive(&s.kv_empty);
    }
    // Epilogue: dK = scale * sum dS^T Q, dV = sum P^T dO, rows of this warpgroup's keys; the
    // output kind chosen once (a switch beside every store spilled the accumulators).
    auto put = [&](auto& acc, void* out, std::int64_t row_stride, std::int64_t head_stride,
                   OutType type, float mul) CUTLASS_LAMBDA_FUNC_INLINE {
      // st(index of column jj, of column jj + 1, their values), jj even; this warpgroup's
      // columns from col0 (its half of D under kSplitD).
      constexpr int kCol0 = C::kSplitD ? C::kKVCols : 0;
      const int col0 = kCol0 * wg;
      auto each = [&](auto&& st) CUTLASS_LAMBDA_FUNC_INLINE {
        CUTE_UNROLL
        for (int i = 0; i < decltype(size<0>(acc))::value; ++i) {
          const int k = kw + get<0>(cKV(i, 0));
          if (k >= p.num_k) continue;
          const std::int64_t base = std::int64_t(k) * row_stride + std::int64_t(g) * head_stride;
          CUTE_UNROLL
          for (int j = 0; j < decltype(size<1>(acc))::value; j += 2)
            st(base + col0 + get<1>(cKV(i, j)), base + col0 + get<1>(cKV(i, j + 1)),
               acc(i, j) * mul, acc(i, j + 1) * mul);
        }
      };
      using I64 = std::int64_t;
      if (p.accumulate) {  // fp32 (attention.cc checks it)
        float* o = static_cast<float*>(out);
        each([&](I64 a, I64 b, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
          o[a] += x0;
          o[b] += x1;
        });
      } else if (!p.dkv_pairs) {
        each([&](I64 a, I64 b, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
          detail::store(out, a, type, x0);
          detail::store(out, b, type, x1);
        });
      } else if (type == OutType::kBF16) {
        each([&](I64 a, I64, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
          detail::store2<OutType::kBF16>(out, a, x0, x1);
        });
      } else if (type == OutType::kF16) {
        each([&](I64 a, I64, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
          detail::store2<OutType::kF16>(out, a, x0, x1);
        });
      } else {
        each([&](I64 a, I64, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
          detail::store2<OutType::kF32>(out, a, x0, x1);
        });
      }
    };
    put(dK, p.dk, p.dk_row, p.dk_head, p.dk_type, p.scale);
    put(dV, p.dv, p.dv_row, p.dv_head, p.dv_type, 1.f);
  }
}

// The dq pass: dq = scale * accumulator (+ the given dq under accumulate) in dq's dtype. A CTA
// of 128 threads per (64-row block, q head, chunk) reads the chunk back in the fragment order
// the main kernel stored it in (the same MMA's partition of the same tile: exact by
// construction; coalesced 16-byte loads) into a (row, column) tile in shared memory, then
// writes the chunk's columns of each row, 8 per thread (one 16-byte store in bf16 / fp16 when
// the strides allow it, BwdParams::dq_vec). Writing the fragments out directly (2-byte stores, 8 rows per
// warp instruction) moved 0.74 TB/s: half a millisecond at 16k x 32 heads.
template <class T, int kD>
__global__ void __launch_bounds__(128) ffa_bwd_dq_kernel(const __grid_constant__ BwdParams p) {
  using namespace cute;
  using C = BwdConfig<T, kD>;
  constexpr int kBM = C::kBlockM, kCols = C::kDQCols;
  constexpr int kPitch = kCols + 4;  // floats; rows stay 16-byte aligned
  __shared__ alignas(16) float tile[kBM * kPitch];
  const int t = int(threadIdx.x);
  const int blk = int(blockIdx.x), h = int(blockIdx.y), chunk = int(blockIdx.z);
  {
    typename C::MmaDQ mma;
    Tensor c = mma.get_thread_slice(t).partition_C(
        make_identity_tensor(Shape<typename C::BM, typename C::HD2>{}));
    const float4* acc = reinterpret_cast<const float4*>(
        p.dq_acc + ((std::int64_t(h) * (p.rows_pad / kBM) + blk) * C::kDQChunks + chunk) *
                       std::int64_t(C::kDQFloats));
    CUTE_UNROLL
    for (int v = 0; v < decltype(size(c))::value / 4; ++v) {
      const float4 x = acc[v * 128 + t];
      const float xs[4] = {x.x, x.y, x.z, x.w};
      CUTE_UNROLL
      for (int e = 0; e < 4; ++e)
        tile[get<0>(c(4 * v + e)) * kPitch + get<1>(c(4 * v + e))] = p.scale * xs[e];
    }
  }
  __syncthreads();
  constexpr int kVecs = kCols / 8;  // 8-column pieces per row
  for (int i = int(threadIdx.x); i < kBM * kVecs; i += int(blockDim.x)) {
    const int r = i / kVecs, c0 = (i % kVecs) * 8;
    const std::int64_t row = std::int64_t(blk) * kBM + r;
    if (row >= p.num_q) continue;
    const float4 lo = *reinterpret_cast<const float4*>(&tile[r * kPitch + c0]);
    const float4 hi = *reinterpret_cast<const float4*>(&tile[r * kPitch + c0 + 4]);
    float y[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const std::int64_t at = row * p.dq_row + std::int64_t(h) * p.dq_head + chunk * kCols + c0;
    if (p.accumulate) {  // fp32 (attention.cc checks it)
      float* o = static_cast<float*>(p.dq) + at;
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) y[e] += o[e];
    }
    if (!p.dq_vec) {
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) detail::store(p.dq, at + e, p.dq_type, y[e]);
    } else if (p.dq_type == OutType::kF32) {
      float4* o = reinterpret_cast<float4*>(static_cast<float*>(p.dq) + at);
      o[0] = make_float4(y[0], y[1], y[2], y[3]);
      o[1] = make_float4(y[4], y[5], y[6], y[7]);
    } else {
      uint4 w;
      unsigned* wp = &w.x;
      CUTE_UNROLL
      for (int e = 0; e < 4; ++e)
        wp[e] = p.dq_type == OutType::kBF16 ? detail::pack2<OutType::kBF16>(y[2 * e], y[2 * e + 1])
                                            : detail::pack2<OutType::kF16>(y[2 * e], y[2 * e + 1]);
      *reinterpret_cast<uint4*>(static_cast<unsigned short*>(p.dq) + at) = w;
    }
  }
}

// Build the TMA descriptors and launch the main kernel on as many persistent CTAs as fit, and
// the dq pass; defined per instantiation (bwd_inst.cu.in).
template <class T, int kD>
cudaError_t launch_backward(const BwdParams& p, int sms, std::int64_t max_ctas,
                            cudaStream_t stream);
template <class T, int kD>
cudaError_t launch_backward_dq(const BwdParams& p, cudaStream_t stream);

}  // namespace magi::kernels::sm90
