// FFA forward on Hopper (sm90a): one persistent CTA per SM pulls (query tile, head) items
// from a global counter (kv heads outermost, tiles heavy first: fwd_item) and runs one online
// softmax over every key block of every piece the tile sees.
//
// Per CTA, warpgroups with different jobs (warp specialisation):
// - warpgroup 0 gives registers away (40 each, 32 at D 64; setmaxnreg) and runs two warps:
//   the producer takes the next item from the counter, hands it to the consumers through
//   shared memory, walks the tile's pieces and loads the Q tile and a ring of K and V blocks
//   with TMA, each stage guarded by a full and an empty mbarrier, writing beside each K stage
//   what the consumers need to know of its block (BlockInfo: piece, first key, last / fixed /
//   no-mask flags), so the consumers never read the work list; the fixer zeroes non-finite V
//   rows that masked cells would otherwise multiply (below);
// - two consumer warpgroups (232 registers each) own 64 query rows each of the 128-row tile
//   (three of 160 registers at D 64: 192 rows). Each releases Q after its last Q K^T of the
//   tile, so the next item's Q load overlaps the last softmax, P V and the epilogue.
//   S = Q K^T is wgmma with both operands in shared memory; O += P V is wgmma with P in
//   registers (the S accumulator's layout is the A fragment's).
// Overlap, as in FlashAttention-3: within a consumer, block j's softmax runs while the tensor
// cores compute block j-1's P V (issued with block j's Q K^T); across the consumers, named
// barriers pass a token that orders their wgmma issue round robin, so that one warpgroup's
// softmax runs while another's matrix products do.
//
// Runs: where a piece's blocks are seen whole by every row of the tile, the producer counts the
// run after the block it writes the info of (unmasked_run) and writes no info for the run's
// blocks; the consumers take them in a loop of their own, without the info, the mask and
// NaN/inf tests or the test for the tile's last block (at D 64 408 instructions a block against
// 446; not at D 128, where the second copy of the step did not fit the registers).
//
// Masking: element masks run only on blocks whose corners a piece does not cover; rows
// outside the piece, keys outside [k0, k1) and cells off the band are -inf (whatever K holds
// there), so their P is exactly 0. But 0 * NaN is NaN: a pass over K and V before the kernel
// flags every key row of the tensors holding a NaN/inf (FwdParams::bad_rows, and bad_any per
// kv head). Every unflagged V row is finite, so its masked cells add exactly 0, also in a block
// that runs past its piece's k1 (rows past the tensor's end are TMA's zero fill). For a flagged
// head (rare) the producer posts a job for each block with masked cells: the fixer warp waits
// for the block's TMA, zeroes its rows past k1 and its flagged rows, and only then releases it
// to the consumers (v_ready), so a non-finite V row cannot leak into a row that does not see
// it, and the producer never waits for it. The consumers set l = NaN for their rows that see a
// flagged key (docs/numerics.md: the row's out and lse are NaN). A call without a flagged head
// posts no job (the fixer warp exits at once), and its blocks pay one test a tile.
//
// mbarrier waits go by phase parity: a thread may wait only on a phase right after one it has
// itself seen complete (or one that cannot be two phases ahead), so only the thread that
// waited on every earlier use of a buffer waits on it, and its warp follows it.
#pragma once

#include "tma_encode.h"  // first: before CUTLASS sees the driver call

#include <cuda_runtime.h>

#include <cfloat>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include "fwd_device.cuh"
#include "fwd_params.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
#error "the sm90 forward needs the sm_90a target (wgmma): build with CUDA_ARCHITECTURES 90a"
#endif

// Key blocks the producer's L2 prefetch runs ahead of the ring; a build knob for measuring
// (-DMAGI_FWD_PREFETCH=0 turns it off; docs/benchmarks.md has the A/B).
#ifndef MAGI_FWD_PREFETCH
#define MAGI_FWD_PREFETCH 4
#endif
// Runs of unmasked key blocks in a loop of their own (the consumer loop); a build knob for
// measuring (-DMAGI_FWD_RUNS=0: every block through the general step).
#ifndef MAGI_FWD_RUNS
#define MAGI_FWD_RUNS 1
#endif

namespace magi::kernels::sm90 {

template <class T, int kD, bool kRewrite>
struct FwdConfig {
  static constexpr int kWarpgroups = fwd_consumer_warpgroups(kD);  // consumers, 64 rows each
  static constexpr int kBlockM = fwd_block_m(kD);
  static constexpr int kBlockN = fwd_block_n(kD);
  static constexpr int kConsumerThreads = 128 * kWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // K/V ring depth: 3 where it fits in the 227 KB of shared memory (D 128; D 192 and 256 take
  // 2), and 2 at D 64 (three consumer warpgroups), where 3 fit too. Same-run A/B on an H200
  // (docs/benchmarks.md, twelfth session): 2 stages +1-3 % at D 64, -7 to -10 % at D 128.
  static constexpr int kStages =
      kWarpgroups == 2 && kD * (kBlockM + 3 * 2 * kBlockN) * int(sizeof(T)) <= 224 * 1024 ? 3 : 2;
  // Key blocks the producer prefetches into L2 ahead of the ring (0: none).
  static constexpr int kPrefetch = MAGI_FWD_PREFETCH;
  // Registers after setmaxnreg, within what the CTA launches with (65536 / kThreads each,
  // rounded down to 8: 168 at 384 threads, 128 at 512). With 2 consumer warpgroups the
  // producer keeps 40 (its walk and the BlockInfo it writes, without spilling); with 3 it
  // keeps 32 (spilling a few values of its walk to L1) so the consumers get 160.
  static constexpr int kProducerRegs = kWarpgroups == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = kWarpgroups == 2 ? 232 : 160;
  // P in two register sets by block parity, O rescaled late (the consumer loop), where the
  // registers allow: at D 128. At D 64 (160 registers) the second P spilled, above D 128
  // ptxas serialized the wgmma; with one P, the late rescale measured 1-3 % slower at D 64.
  static constexpr bool kTwoP = kD == 128;
  // Runs of unmasked blocks go through a loop of their own, which reads no block info (the
  // consumer loop). Not where the second copy of the step does not fit the registers: at D 128
  // (two P) ptxas serialized every wgmma, in the rewriting kernel (softcap, negative scale) the
  // consumer code spilled (276 spill instructions at D 64, against 4).
  static constexpr bool kRuns = MAGI_FWD_RUNS && !kTwoP && !kRewrite;
  // With one P and two consumer warpgroups (D 192, 256), the softmax waits for the P V in
  // flight after its exponentials, not before its row maxima (the consumer loop). Same-run A/Bs
  // (docs/benchmarks.md, fourteenth session): at 64k +0.5 to +4.3 % (H200, D 192 and 256) and
  // +1.4 to +2.4 % (H100, D 256); at 16k -0.9 to -2.5 % (H200; H100 D 256 -2.5 and +2.5 %).
  // At D 64 (three warpgroups, the MUFU as busy as the tensor pipe) it lost 7-10 %.
  static constexpr bool kLateWait = !kTwoP && kWarpgroups == 2;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <=
                65536 / kThreads / 8 * 8 * kThreads);
  using BM = cute::Int<kBlockM>;
  using BN = cute::Int<kBlockN>;
  using HD = cute::Int<kD>;
  using AtomK = cute::GMMA::Layout_K_SW128_Atom<T>;
  using LayoutQ = decltype(cute::tile_to_shape(AtomK{}, cute::Shape<BM, HD>{}));
  using LayoutK = decltype(cute::tile_to_shape(AtomK{}, cute::Shape<BN, HD, cute::Int<kStages>>{}));
  // V is stored like K (rows of D, TMA's natural box) and read by the P V product through a
  // transposed view (D, keys): the MN-major B operand.
  using LayoutV = LayoutK;
  using LayoutVt = decltype(cute::composition(
      LayoutV{}, cute::make_ordered_layout(cute::Shape<HD, BN, cute::Int<kStages>>{},
                                           cute::Step<cute::_2, cute::_1, cute::_3>{})));
  using WarpGroups = cute::Layout<cute::Shape<cute::Int<kWarpgroups>, cute::_1, cute::_1>>;
  using MmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float, cute::Shape<BM, BN, HD>>(), WarpGroups{}));
  // P stays in registers (RS wgmma): the S accumulator of 16 columns is exactly the A
  // fragment of one k-step (column pair, row + 8, column + 8), so no shared-memory round trip.
  using MmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<T, T, float, cute::Shape<BM, HD, BN>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      WarpGroups{}));

  // The TMA copy types of Q tiles and K/V blocks (detail::tma_rows builds them per call).
  template <class Smem>
  using TmaOf =
      decltype(detail::tma_rows<T, kD>(static_cast<const T*>(nullptr), 0, 0, 0, 0, Smem{}));
  using TmaQ = TmaOf<LayoutQ>;
  using TmaKV = TmaOf<decltype(cute::take<0, 2>(LayoutK{}))>;

  struct Smem {
    alignas(1024) T q[cute::cosize_v<LayoutQ>];
    alignas(1024) T k[cute::cosize_v<LayoutK>];
    alignas(1024) T v[cute::cosize_v<LayoutV>];
    // full: the producer's data landed; empty: the consumers are done with the buffer (K and
    // the item slots count every consumer thread, each also hands back its read of info /
    // item; Q and V one arrival per warpgroup after its wgmma completed).
    alignas(8) cute::uint64_t q_full, q_empty;
    cute::uint64_t k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
    cute::uint64_t item_full[2], item_empty[2];
    // Masked V blocks of a head with flagged rows: the producer posts a job, the fixer warp
    // zeroes the flagged rows and those past the piece once TMA has landed, then arrives on
    // v_ready.
    cute::uint64_t v_ready[kStages], job_full[2], job_empty[2];
    std::int64_t item[2];
    int job[2][5];  // stage (-1: stop), v_full parity, first row to zero (the block's keys
                    // inside its piece), the block's kb and its kv head
    detail::BlockInfo info[kStages];  // the block in each K stage (fwd_device.cuh)
    // With kLateWait, a word per consumer thread, written and never read: the store that keeps
    // the softmax's wait for the P V in flight after its exponentials (the consumer loop).
    unsigned wait_anchor[kLateWait ? kConsumerThreads : 1];
  };
  // Slack to align the dynamic shared memory to the 1024-byte swizzle period.
  static constexpr int kSmemBytes = int(sizeof(Smem)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 CTA may have");
};

// The kernel's one parameter: the plain parameters and the three TMA descriptors (built on
// the host per call, fwd_inst.cu.in).
template <class T, int kD, bool kRewrite>
struct FwdKernelParams {
  FwdParams p;
  typename FwdConfig<T, kD, kRewrite>::TmaQ tma_q;
  typename FwdConfig<T, kD, kRewrite>::TmaKV tma_k;
  typename FwdConfig<T, kD, kRewrite>::TmaKV tma_v;
};

template <class T, int kD, bool kRewrite>
__global__ void __launch_bounds__(FwdConfig<T, kD, kRewrite>::kThreads, 1)
    ffa_fwd_kernel(const __grid_constant__ FwdKernelParams<T, kD, kRewrite> kp) {
  using namespace cute;
  using C = FwdConfig<T, kD, kRewrite>;
  using detail::kLn2;
  using detail::kLog2e;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kBN = C::kBlockN, kStages = C::kStages;
  const FwdParams& p = kp.p;

  extern __shared__ char smem_raw[];
  const unsigned misalign = unsigned(__cvta_generic_to_shared(smem_raw)) & 1023u;
  auto& s = *reinterpret_cast<typename C::Smem*>(smem_raw + ((1024u - misalign) & 1023u));
  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename C::LayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(s.k), typename C::LayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(s.v), typename C::LayoutV{});
  Tensor sVt = make_tensor(make_smem_ptr(s.v), typename C::LayoutVt{});

  const int tid = int(threadIdx.x);
  const int warpgroup = tid / 128;
  const std::int64_t num_items = std::int64_t(p.num_tiles) * p.heads_q;
  const int group = p.heads_q / p.heads_kv;

  if (tid == 0) {
    TxBarrier::init(&s.q_full, 1);
    Barrier::init(&s.q_empty, C::kWarpgroups);
    for (int i = 0; i < kStages; ++i) {
      TxBarrier::init(&s.k_full[i], 1);
      TxBarrier::init(&s.v_full[i], 1);
      Barrier::init(&s.k_empty[i], C::kConsumerThreads);  // each reader of info[i] (release_k)
      Barrier::init(&s.v_empty[i], C::kWarpgroups);
    }
    for (int i = 0; i < kStages; ++i) Barrier::init(&s.v_ready[i], 1);
    for (int i = 0; i < 2; ++i) {
      Barrier::init(&s.job_full[i], 1);
      Barrier::init(&s.job_empty[i], 32);  // every fixer lane hands its read back
      Barrier::init(&s.item_full[i], 1);
      Barrier::init(&s.item_empty[i], C::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  // Launched as the row-flag pass's dependent (programmatic launch): everything above ran
  // while it drained; nothing below reads global memory before it completed.
  detail::wait_for_prerequisites();

  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    cutlass::arch::warpgroup_reg_dealloc<C::kProducerRegs>();
    const int lane = tid % 32;
    if (tid >= 64) return;
    if (tid >= 32) {
      // The fixer warp: for each posted job, wait for the V block's TMA, zero its rows past
      // the piece and its flagged rows (generic-proxy stores over what the async proxy wrote:
      // the mbarrier wait orders them after it, the proxy fence orders the wgmma reads after
      // them).
      // A call without a flagged kv head (nearly always) posts it no job but the stop: it exits
      // rather than wait in the sleep loop of an mbarrier, woken to issue a test each time.
      bool any_bad = false;
      for (int i = lane; i < p.heads_kv; i += 32) any_bad |= p.bad_any[i] != 0u;
      if (!__any_sync(0xffffffffu, any_bad)) return;
      Tensor sV = make_tensor(make_smem_ptr(s.v), typename C::LayoutV{});
      for (int j = 0;; ++j) {
        const detail::Ring slot = detail::ring<2>(j);
        Barrier::wait(&s.job_full[slot.stage], slot.phase);
        const int stage = s.job[slot.stage][0];
        if (stage < 0) break;
        TxBarrier::wait(&s.v_full[stage], unsigned(s.job[slot.stage][1]));
        constexpr int kChunks = kD / 8;
#pragma unroll 1
        for (int i = s.job[slot.stage][2] * kChunks + lane; i < kBN * kChunks; i += 32)
          *reinterpret_cast<uint4*>(&sV(i / kChunks, (i % kChunks) * 8, stage)) = uint4{0, 0, 0, 0};
        unsigned flagged[detail::kBadWords];  // the block's flagged rows inside its piece
        detail::block_row_flags(p.bad_rows + std::int64_t(s.job[slot.stage][4]) * p.bad_words,
                                s.job[slot.stage][3], s.job[slot.stage][2], lane, flagged);
        CUTE_UNROLL
        for (int w = 0; w < detail::kBadWords; ++w)
          for (unsigned bad = flagged[w]; bad != 0u; bad &= bad - 1u) {
            const int row = 32 * w + __ffs(int(bad)) - 1;
            for (int c = lane; c < kChunks; c += 32)
              *reinterpret_cast<uint4*>(&sV(row, c * 8, stage)) = uint4{0, 0, 0, 0};
          }
        cutlass::arch::fence_view_async_shared();
        __syncwarp();
        if (lane == 0) Barrier::arrive(&s.v_ready[stage]);
        Barrier::arrive(&s.job_empty[slot.stage]);
      }
      return;
    }
    // The TMA copies, the stage barriers' waits and the fixer's jobs: one elected thread.
    using detail::elected;
    int jobs = 0;  // jobs posted to the fixer
    auto post_job = [&](int stage, unsigned phase, int first_row, int kb, int kv_head) {
      const detail::Ring slot = detail::ring<2>(jobs++);
      Barrier::wait(&s.job_empty[slot.stage], slot.phase ^ 1);
      s.job[slot.stage][0] = stage;
      s.job[slot.stage][1] = int(phase);
      s.job[slot.stage][2] = first_row;
      s.job[slot.stage][3] = kb;
      s.job[slot.stage][4] = kv_head;
      Barrier::arrive(&s.job_full[slot.stage]);
    };
    if (lane == 0) {
      prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
      prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
      prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    }
    Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(p.num_q, kD, p.heads_q));
    Tensor mK = kp.tma_k.get_tma_tensor(make_shape(std::max(p.num_k, 1), kD, p.heads_kv));
    Tensor mV = kp.tma_v.get_tma_tensor(make_shape(std::max(p.num_k, 1), kD, p.heads_kv));
    // One TMA copy of the rows from row0 on of one head into dst (a Q tile or a K/V stage),
    // completing on `full` with dst's byte count. K and V go through L2 with evict-last, Q
    // (read once) with evict-first: every CTA streams the same kv head's K/V (items are kv-head
    // major), 32 MB of it at 64k tokens and D 128.
    auto tma_load = [&](const auto& tma, const auto& m, int row0, int head, cute::uint64_t& full,
                        auto dst, TMA::CacheHintSm90 hint) {
      TxBarrier::arrive_and_expect_tx(&full, unsigned(size(dst) * sizeof(T)));
      copy(tma.with(full, 0, hint),
           detail::tma_rows_source(tma, m, row0, head, product_each(shape(dst))),
           tma.get_slice(0).partition_D(dst));
    };
    // The same rows, only into L2 (no shared memory, no barrier): K/V blocks a few steps
    // ahead of the ring, so a mask that reads scattered blocks (block-sparse, beyond L2)
    // does not wait on DRAM with only kStages loads in flight.
    auto l2_prefetch = [&](const auto& tma, const auto& m, int row0, int head) {
      prefetch(tma, detail::tma_rows_source(tma, m, row0, head,
                                            Shape<typename C::BN, typename C::HD>{}));
    };
    int blk = 0;      // key blocks loaded so far (the ring position)
    int q_loads = 0;  // Q tiles loaded so far (q_full / q_empty phases)
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
      if (item >= num_items) {
        if (elected()) post_job(-1, 0, 0, -1, 0);
        break;
      }
      const detail::FwdItem it_h = detail::fwd_item(item, p.num_tiles, group);
      const Tile tile = p.tiles[it_h.tile];
      const int h = it_h.head, hk = h / group;
      const bool head_bad = p.bad_any[hk] != 0u;  // a NaN/inf in this head's K or V (rare)
      // Q only for a tile with keys (one without has its rows written from nothing): the
      // consumers count the same loads. Loading it anyway raced: a leader hands Q back right
      // after its own wait, so with two keyless tiles in a row the next load could complete
      // q_full twice before a slower warp of its warpgroup waited once (same parity: a hang).
      if (tile.piece_begin < tile.piece_end && elected()) {
        Barrier::wait(&s.q_empty, (q_loads & 1) ^ 1);
        tma_load(kp.tma_q, mQ, tile.start, h, s.q_full, sQ, TMA::CacheHintSm90::EVICT_FIRST);
      }
      q_loads += tile.piece_begin < tile.piece_end;
      // The walk holds its piece in registers; all lanes pull the next 32 pieces into L1
      // together whenever it enters a new group of 32 (so a tile of many small pieces does
      // not wait on a dependent global load per block).
      auto warm = [&](int piece) {
        if ((piece - tile.piece_begin) % 32 == 0 && piece + lane < tile.piece_end)
          detail::prefetch_l1(&p.pieces[piece + lane]);
      };
      auto it = detail::BlockIter::first(tile, p.pieces);
      Piece pc{};
      if (it.valid()) warm(it.piece), pc = p.pieces[it.piece];
      // A second walk kPrefetch blocks ahead sends the first block of each piece to L2: a
      // piece's later blocks follow in order, but the jump to a new piece (block-sparse,
      // documents beyond L2) would otherwise wait on DRAM with only kStages loads in flight.
      auto ahead = it;
      bool ahead_new = false;
      for (int i = 0; i < C::kPrefetch && ahead.valid(); ++i) ahead_new = ahead.advance(p.pieces, kBN);
      int run_left = 0;  // blocks of an unmasked run still to load (the consumers read no info)
      while (it.valid()) {
        const detail::Ring r = detail::ring<kStages>(blk++);
        const bool in_run = run_left > 0;
        detail::BlockInfo info{pc, it.kb, 0};
        const bool last_piece = it.piece == it.end - 1;
        const bool new_piece = it.advance(p.pieces, kBN);  // it: the next block
        bool fix = false;
        int live = 0;
        if (in_run) {
          --run_left;
        } else {
          if (!it.valid()) info.flags |= detail::BlockInfo::kLast;
          for (int w = 0; w < C::kWarpgroups; ++w)
            if (covers(pc, tile.start + 64 * w, 64, info.kb, kBN))
              info.flags |= detail::BlockInfo::kFullRows << w;
          // The unmasked blocks after this one, which the consumers run without their info
          // (the consumer loop). A head with a flagged row has none: its blocks need their info.
          if (C::kRuns && !head_bad) {
            run_left = unmasked_run(pc, tile.start, C::kBlockM, info.kb, kBN, last_piece);
            info.flags |= run_left << detail::BlockInfo::kRunShift;
          }
          // A head with a flagged key row (rare) has the fixer look at each of its blocks with
          // masked cells, to zero the flagged V rows there and those past the piece (where
          // every row sees every key, every row is NaN anyway); the fixer and the consumers
          // read the row flags themselves, so the producer (40 registers) carries none of it.
          live = pc.k1 - info.kb < kBN ? pc.k1 - info.kb : kBN;
          constexpr int kAllFull = ((1 << C::kWarpgroups) - 1) * detail::BlockInfo::kFullRows;
          fix = head_bad && (info.flags & kAllFull) != kAllFull;
          if (fix) info.flags |= detail::BlockInfo::kFixed;
        }
        if (ahead.valid()) {
          if (ahead_new && elected()) {
            l2_prefetch(kp.tma_k, mK, ahead.kb, hk);
            l2_prefetch(kp.tma_v, mV, ahead.kb, hk);
          }
          ahead_new = ahead.advance(p.pieces, kBN);
        }
        if (elected()) {
          Barrier::wait(&s.k_empty[r.stage], r.phase ^ 1);
          if (!in_run) s.info[r.stage] = info;  // published by the K load's arrive (release)
          tma_load(kp.tma_k, mK, info.kb, hk, s.k_full[r.stage], sK(_, _, r.stage),
                   TMA::CacheHintSm90::EVICT_LAST);
          Barrier::wait(&s.v_empty[r.stage], r.phase ^ 1);
          tma_load(kp.tma_v, mV, info.kb, hk, s.v_full[r.stage], sV(_, _, r.stage),
                   TMA::CacheHintSm90::EVICT_LAST);
          if (fix) post_job(r.stage, r.phase, live, info.kb, hk);
        }
        if (new_piece && it.valid()) warm(it.piece), pc = p.pieces[it.piece];
      }
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  cutlass::arch::warpgroup_reg_alloc<C::kConsumerRegs>();
  const int ctid = tid - 128;            // 0 .. kConsumerThreads - 1 over the consumers
  // From a shuffle, so ptxas knows it is warp-uniform and keeps what derives from it (Q's wgmma
  // descriptors, the barrier ids, the BlockInfo flag bit) in uniform registers.
  const int wg = __shfl_sync(0xffffffff, ctid / 128, 0);  // which 64 rows of the tile
  const bool leader = ctid % 128 == 0;   // arrives on v_empty and q_empty for its warpgroup
  typename C::MmaQK mma_qk;
  typename C::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(ctid);
  auto thr_pv = mma_pv.get_thread_slice(ctid);
  // The slice of Q K^T's A operand (Q in shared memory) is the warpgroup's: see issue_qk.
  auto thr_qk_a = mma_qk.get_thread_slice(wg * 128);
  // P as the A operand: per k-step of 16 keys, (column pair, row + 8, column + 8), which is
  // the S accumulator's own order, so element i of tOrP is element i of tSrS. Two of them, by
  // block parity, where C::kTwoP: block j's P is written while block j-1's P V reads the other.
  Tensor tOrP = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBN / 16>>>{});
  Tensor tOrP2 = make_tensor<T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBN / 16>>>{});
  using PTensor = decltype(tOrP);
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

  const bool capped = p.softcap > 0.f;
  // Units of S and m: raw q.k (no softcap, positive scale: the max commutes with the scale) or
  // log2 units, rewritten per element (softcap, or a negative scale); su maps to log2 units.
  constexpr bool rewrite = kRewrite;  // == fwd_rewrite(p.scale, p.softcap), chosen on the host
  const float su = rewrite ? 1.f : p.scale * kLog2e;
  // The running max before any key: finite, so that no per-block test for -inf is needed (the
  // rescale factor of the first block is 2^(huge negative) = 0, a row that sees only masked
  // cells keeps it and l = 0), with m_none * su finite. A row whose visible logits are all at
  // or below it (|q.k| >= 3.4e38 / max(1, su)) reads as empty (docs/numerics.md).
  const float m_none = -FLT_MAX / fmaxf(su, 1.f);

  // Scheduler barriers, a token passed round the warpgroups: w waits on 1 + w (with the one
  // before it, 2 x 128 threads) before issuing its products, then lets the next one go;
  // warpgroup 0 goes first.
  constexpr int kPair = 256;
  const int my_bar = 1 + wg;
  const int next_bar = 1 + (wg + 1) % C::kWarpgroups;
  if (wg == C::kWarpgroups - 1) detail::named_arrive(1, kPair);

  int blk = 0, q_uses = 0;  // key blocks and Q tiles consumed (the producer's counts)
  unsigned ready_phases = 0;
  for (int n = 0;; ++n) {
    const detail::Ring slot = detail::ring<2>(n);
    Barrier::wait(&s.item_full[slot.stage], slot.phase);
    const std::int64_t item = s.item[slot.stage];
    Barrier::arrive(&s.item_empty[slot.stage]);  // each thread hands back its own read
    if (item >= num_items) break;
    const detail::FwdItem it_h = detail::fwd_item(item, p.num_tiles, group);
    const Tile tile = p.tiles[it_h.tile];
    const int h = it_h.head;
    const int q0 = tile.start;
    const bool head_bad = p.bad_any[h / group] != 0u;  // a NaN/inf in this head's K or V (rare)

    float m[kRows], l[kRows], mraw[kRows];
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) m[i] = m_none, l[i] = 0.f, mraw[i] = -INFINITY;
    bool saw_full = false;  // a block this warpgroup's rows see whole (for the -inf rows test)
    clear(tOrO);

    // Mask the block (only when a piece's corners do not cover this warpgroup's 64 rows), cap,
    // and fold it into the running max; S becomes P (unnormalised, fp32) and corr[i] the
    // factor that O's row i needs.
    // fast: a block of an unmasked run (bi is not its info: no mask).
    auto softmax = [&](bool fast, const detail::BlockInfo& bi, float (&corr)[kRows],
                       bool wait_pv) CUTLASS_LAMBDA_FUNC_INLINE {
      const Piece& pc = bi.pc;
      const int kb = bi.kb;
      // A visible logit of -inf (an inf in q), or +-inf under softcap, would vanish or turn
      // finite: l = NaN instead, found where the softcap looks at each cell anyway or, in a
      // plain covered block, by a row max of -inf (an inf in q makes every logit of its row
      // infinite or NaN, so a +inf or NaN poisons the row by itself). Masked blocks add no
      // per-cell test: docs/numerics.md says what that leaves.
      const bool full = fast || (bi.flags & (detail::BlockInfo::kFullRows << wg));
      if constexpr (!rewrite) saw_full |= full;
      if (!full) {
        // Per row the keys it sees, as column offsets (detail::offsets_from): two compares
        // per cell.
        const int k_first = kb + get<1>(cS(0, 0));
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          const detail::Offsets o = detail::offsets_from(
              detail::keys_seen_by_row(pc, q0 + get<0>(cS(i, 0))), k_first, kBN);
          CUTE_UNROLL
          for (int jj = 0; jj < size<1>(S); ++jj) {
            const int off = get<1>(cS(i, jj)) - get<1>(cS(0, 0));  // a constant
            if (!(off >= o.lo && off <= o.hi)) S(i, jj) = -INFINITY;
          }
        }
      }
      if constexpr (rewrite) {
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          CUTE_UNROLL
          for (int jj = 0; jj < size<1>(S); ++jj) {
            if (S(i, jj) == -INFINITY) {  // masked, or (in a block without masking) an inf
              if (full) l[i] = __int_as_float(0x7fffffff);
              continue;
            }
            const float raw = S(i, jj) * p.scale;
            if (!(fabsf(raw) <= FLT_MAX)) l[i] = __int_as_float(0x7fffffff);
            mraw[i] = fmaxf(mraw[i], raw);
            S(i, jj) = (capped ? p.softcap * tanhf(raw / p.softcap) : raw) * kLog2e;
          }
        }
      }
      // Row maxima seeded with the running max (so the new running max directly), two chains
      // a row, the quad exchanges of all rows together, then the exponentials.
      constexpr int kCols = decltype(size<1>(S))::value;
      static_assert(kCols % 2 == 0);
      float mx[kRows];
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        float a = m[i], b = S(i, 1);
        CUTE_UNROLL
        for (int jj = 0; jj < kCols; jj += 2) a = fmaxf(a, S(i, jj));
        CUTE_UNROLL
        for (int jj = 3; jj < kCols; jj += 2) b = fmaxf(b, S(i, jj));
        mx[i] = fmaxf(a, b);
      }
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) mx[i] = detail::quad_max(mx[i]);
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        // corr rescales O and l: 2^0 = 1 exactly where the max did not move (mx == m), 0 at the
        // first key (m was m_none). (Letting the max lag by a slack, as FlashAttention-4 does,
        // makes the largest P inexact in bf16: measured 2.1x the naive error on a peaked
        // softmax, over docs/semantics.md §5's 2x, for 1-4% of speed.)
        corr[i] = detail::exp2_approx((m[i] - mx[i]) * su);
        m[i] = mx[i];
        const float m_use = m[i] * su;  // log2 units, finite
        // Each row's two sums start from its first pair (0 + P is P: two adds a row fewer).
        S(i, 0) = detail::exp2_approx(fmaf(S(i, 0), su, -m_use));
        S(i, 1) = detail::exp2_approx(fmaf(S(i, 1), su, -m_use));
        float sum0 = S(i, 0), sum1 = S(i, 1);
        CUTE_UNROLL
        for (int jj = 2; jj < kCols; jj += 2) {
          S(i, jj) = detail::exp2_approx(fmaf(S(i, jj), su, -m_use));
          S(i, jj + 1) = detail::exp2_approx(fmaf(S(i, jj + 1), su, -m_use));
          sum0 += S(i, jj);
          sum1 += S(i, jj + 1);
        }
        l[i] = l[i] * corr[i] + (sum0 + sum1);
      }
      // With wait_pv, the P V in flight reads tOrP, where P goes next: wait for it here, after
      // the whole softmax, which so runs under it. ptxas hoists a wgmma wait to the top of its
      // basic block (before the row maxima) unless a memory operation before it holds it back:
      // a store of the row sums, which need every exponential, does (3 instructions a block).
      if (wait_pv) {
        unsigned sums = 0;
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) sums |= __float_as_uint(l[i]);
        *reinterpret_cast<volatile unsigned*>(&s.wait_anchor[ctid]) = sums;
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
      }
    };
    // At D 64 every block rescales O, even when no row's max moved (corr 1): skipping it behind
    // a warp vote was measured 6-7% slower there (and equal at D 128 with one P); above D 128,
    // where O is 96 or 128 registers a thread, the step skips it (+3-6 % at D 256, -1 to +2 %
    // at D 192: docs/benchmarks.md), and at D 128 (two P) too, to keep it out of the turn.
    auto rescale_o = [&](const float (&corr)[kRows]) CUTLASS_LAMBDA_FUNC_INLINE {
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        CUTE_UNROLL
        for (int jj = 0; jj < size<1>(O); ++jj) O(i, jj) *= corr[i];
      }
    };
    // The rescale skipped where no row of the warp moved its max (most blocks after the first
    // few; O * 1 is O, so the result is the same bits).
    auto rescale_o_if_moved = [&](const float (&corr)[kRows]) CUTLASS_LAMBDA_FUNC_INLINE {
      bool moved = false;
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) moved |= corr[i] != 1.f;
      if (__any_sync(0xffffffff, moved)) rescale_o(corr);
    };
    auto convert_p = [&](PTensor& P) CUTLASS_LAMBDA_FUNC_INLINE {
      CUTE_UNROLL
      for (int e = 0; e < size(tSrS); ++e) P(e) = T(tSrS(e));
    };
    // Q's wgmma descriptors live in uniform registers: thr_qk_a partitions by the warpgroup
    // index from a shuffle, which ptxas knows is warp-uniform (from ctid it built them in
    // general registers and moved each to a uniform one per block, 16 R2UR a block at D 128).
    // Up to D 128 they are built once (hoisted out of the loop); above, their 16 k-steps' worth
    // spilled, so they are rebuilt each block from a base the compiler cannot hoist: stage & 0,
    // with the 0 read from the parameters (num_q >= 0, so num_q >> 31 is 0).
    auto issue_qk = [&](int stage) CUTLASS_LAMBDA_FUNC_INLINE {
      T* const q_base = kD <= 128 ? s.q : s.q + (stage & (p.num_q >> 31));
      Tensor tSrQ = thr_qk_a.partition_fragment_A(
          make_tensor(make_smem_ptr(q_base), typename C::LayoutQ{}));
      const auto tSrK = detail::desc64(thr_qk.partition_fragment_B(sK(_, _, stage)));
      detail::wg_gemm_issue(mma_qk, tSrQ, tSrK, tSrS, true);
    };
    auto issue_pv = [&](int stage, PTensor& P) CUTLASS_LAMBDA_FUNC_INLINE {
      const auto tOrV = detail::desc64(thr_pv.partition_fragment_B(sVt(_, _, stage)));
      detail::wg_gemm_issue<true>(mma_pv, P, tOrV, tOrO, false);
    };

    // With three consumer warpgroups (D 64) only the first in the turn waits on a block's K and
    // V barriers: the others take their turn on the same block after it (the token orders
    // them), so both have landed. Out of the turn's critical section, the two waits' latency
    // went from three warpgroups' turns to one: +2-6 % at D 64 on an H100, level at D 128 (two
    // warpgroups), docs/benchmarks.md (eleventh session). The block's info is read after the
    // token then. FFA's forward does the same.
    constexpr bool kFirstWaits = C::kWarpgroups == 3;
    const bool waits = !kFirstWaits || wg == 0;
    // The warpgroup's turn at the tensor cores (the token from the one before it), with the
    // block's info: read before the turn, or after it where only the first warpgroup waited.
    auto take_turn = [&](int stage) CUTLASS_LAMBDA_FUNC_INLINE {
      detail::BlockInfo info;
      if (!kFirstWaits) info = s.info[stage];
      detail::named_sync(my_bar, kPair);
      if (kFirstWaits) info = s.info[stage];
      return info;
    };
    // V of a block is ready when its TMA landed, or, for a block the fixer zeroes rows of,
    // when the fixer is done (v_ready advances only on those blocks: a bit per stage). With
    // wait false (a warpgroup after the first, above) only that phase bit advances.
    auto wait_v = [&](const detail::Ring& r, bool fixed, bool wait = true) {
      if (fixed) {
        if (wait) Barrier::wait(&s.v_ready[r.stage], (ready_phases >> r.stage) & 1u);
        ready_phases ^= 1u << r.stage;
      } else if (wait) {
        TxBarrier::wait(&s.v_full[r.stage], r.phase);
      }
    };
    // Rows that see a key whose K or V row holds a NaN/inf: l = NaN (docs/numerics.md). The
    // flags come from global memory, only for a head that has some (rare).
    auto poison_rows = [&](const detail::BlockInfo& bi) {
      if (!head_bad) return;
      const Piece& pc = bi.pc;
      const int live = pc.k1 - bi.kb < kBN ? pc.k1 - bi.kb : kBN;
      unsigned flagged[detail::kBadWords];
      detail::block_row_flags(p.bad_rows + std::int64_t(h / group) * p.bad_words, bi.kb, live,
                              ctid % 32, flagged);
      CUTE_UNROLL
      for (int w = 0; w < detail::kBadWords; ++w)
        for (unsigned bad = flagged[w]; bad != 0u; bad &= bad - 1u) {
          const int k = bi.kb + 32 * w + __ffs(int(bad)) - 1;
          CUTE_UNROLL
          for (int i = 0; i < kRows; ++i) {
            const int q = q0 + get<0>(cS(i, 0));
            if (q >= pc.q0 && q < pc.q1 && k >= pc.k0 && k < pc.k1 && k - q >= pc.lo &&
                k - q <= pc.hi)
              l[i] = __int_as_float(0x7fffffff);
          }
        }
    };
    // K's stage (and its info) back to the producer by every consumer thread, after its own
    // read of info (the warpgroup's Q K^T has completed: a wgmma group completes for the whole
    // warpgroup). One warp instruction, as the leader's arrive would be. The leader alone after
    // the turn's named barrier would order the reads too, but compute-sanitizer's racecheck
    // does not follow that chain (bar.sync, then another thread's arrive): with it, racecheck
    // reported 8 hazards on the one-CTA test cases, and 0 with this (2026-12-05).
    auto release_k = [&](int stage) { Barrier::arrive(&s.k_empty[stage]); };
    // Q is free once the tile's last Q K^T has completed: released there (not after the last
    // P V and the epilogue), so the next item's Q load overlaps them.
    auto release_q_after_last = [&](const detail::BlockInfo& bi) {
      if ((bi.flags & detail::BlockInfo::kLast) && leader) Barrier::arrive(&s.q_empty);
    };
    // The rows' weights (out = w * O + keep * the given partial output), LSE and max_logits
    // need no O: computed while the item's last P V runs (finish_rows), then O is stored.
    float w[kRows], keep[kRows];  // out = w * O + keep * (the given partial output)
    float lse_out[kRows];
    std::int64_t o_base[kRows];   // -1: a row past the end
    auto finish_rows = [&]() {
      bool any_nan = false;         // a row of this thread is NaN (max_logits)
      // Ranges that differ from the prepared ones (FwdParams::stale): every row NaN, as a row
      // that read a NaN.
      // (*epoch changes only at the end of the kernel, below)
      const bool stale = p.stale != nullptr && *p.stale == fwd_stale_mark(*p.epoch);
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        const int row = q0 + get<0>(cO(i, 0));
        // A row whose max is still m_none after a block it sees whole read only -inf (or NaN)
        // logits there: an inf in q (a flagged key poisons its rows itself).
        if (!rewrite && saw_full && m[i] == m_none) l[i] = __int_as_float(0x7fffffff);
        const float l_sum = detail::quad_sum(l[i]);  // NaN: the row read a NaN/inf
        const float l_tot = stale ? __int_as_float(0x7fffffff) : l_sum;
        float lse = l_tot == 0.f ? -INFINITY : (m[i] * su + log2f(l_tot)) * kLn2;
        w[i] = l_tot == 0.f ? 0.f : 1.f / l_tot;
        keep[i] = 0.f;
        o_base[i] = -1;
        if (row >= p.num_q) continue;
        if (p.sink != nullptr) {
          float ls = -INFINITY;
          const float* sk = p.sink + std::int64_t(row) * p.sink_row + std::int64_t(h) * p.sink_head;
          for (int j = 0; j < p.sink_len; ++j) ls = detail::log_add_exp(ls, sk[j * p.sink_s]);
          const float merged = detail::log_add_exp(lse, ls);
          if (l_tot > 0.f) w[i] *= expf(lse - merged);
          lse = merged;
        }
        o_base[i] = std::int64_t(row) * p.o_row + std::int64_t(h) * p.o_head;
        if (p.accumulate) {
          const float old = p.lse[std::int64_t(row) * p.lse_row + std::int64_t(h) * p.lse_head];
          const float merged = detail::log_add_exp(old, lse);
          if (merged != -INFINITY) {
            keep[i] = old == -INFINITY ? 0.f : expf(old - merged);
            w[i] *= lse == -INFINITY ? 0.f : expf(lse - merged);
          } else {
            keep[i] = 1.f;
          }
          lse = merged;
        }
        if (lse != lse || lse == INFINITY) {  // docs/numerics.md: out and lse NaN
          lse = w[i] = __int_as_float(0x7fffffff);
          any_nan = true;
        }
        lse_out[i] = lse;
      }
      // A quad's four threads read a row's given LSE above, its first writes it: after all reads.
      __syncwarp();
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i)
        if (o_base[i] >= 0 && (ctid & 3) == 0) {
          const std::int64_t row = q0 + get<0>(cO(i, 0));
          p.lse[row * p.lse_row + std::int64_t(h) * p.lse_head] = lse_out[i];
        }
      if (p.max_logits != nullptr) {
        float mr = -INFINITY;
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i)  // without a cap, m is the raw max itself
          mr = fmaxf(mr, rewrite ? mraw[i] : (m[i] == m_none ? -INFINITY : m[i] * p.scale));
        for (int off = 16; off > 0; off >>= 1) mr = fmaxf(mr, __shfl_xor_sync(0xffffffff, mr, off));
        if (__any_sync(0xffffffff, any_nan)) mr = __int_as_float(0x7fffffff);  // a NaN row
        if ((ctid & 31) == 0 && mr != -INFINITY) detail::atomic_max(p.max_logits + h, mr);
      }
    };
    if (tile.piece_begin < tile.piece_end) {  // the producer walks the blocks (BlockInfo)
      TxBarrier::wait(&s.q_full, q_uses++ & 1);
      float corr[kRows];
      detail::Ring r = detail::ring<kStages>(blk++);
      if (waits) TxBarrier::wait(&s.k_full[r.stage], r.phase);
      detail::BlockInfo bi = take_turn(r.stage);
      issue_qk(r.stage);
      detail::named_arrive(next_bar, kPair);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      poison_rows(bi);
      release_k(r.stage);
      release_q_after_last(bi);
      softmax(/*fast=*/false, bi, corr, /*wait_pv=*/false);
      if constexpr (!C::kTwoP) rescale_o(corr);  // O is 0: as the steps do
      convert_p(tOrP);
      // Block j's softmax runs under block j-1's P V. With C::kTwoP nothing after the softmax
      // needs that P V complete: P alternates between two register sets, and the next step
      // waits for the P V (behind the K wait's branch: ptxas moves a wgmma wait to the top of
      // its basic block), then rescales O by block j's corr behind a warp vote (skipped where
      // no row moved its max) before the warpgroup's turn at the tensor cores. Written after
      // the turn's Q K^T, the 64 multiplies were spread through the turn by ptxas (123
      // instructions from its barrier to its release, FFA's 82); only a branch keeps them out.
      // With one P, the rescale and the wait right after the softmax, the wait ran before the
      // softmax at D 128 (the kernel's most stalled instruction, 6 % of the samples;
      // docs/benchmarks.md).
      detail::Ring prev = r;  // the block whose P V is next
      bool prev_fixed = bi.flags & detail::BlockInfo::kFixed;
      int pending = -1;       // V stage of a P V in flight not yet waited for (-1: none)
      // Blocks after the last one whose info was read that every row sees whole, none fixed or
      // the last (the producer's unmasked_run): a step with `fast` runs one without its info,
      // its mask or NaN tests and the tests for the tile's last block, in a loop of its own.
      int run = C::kRuns ? bi.flags >> detail::BlockInfo::kRunShift : 0;
      // One key block; returns whether it was the tile's last.
      auto step = [&](bool fast, PTensor& p_prev, PTensor& p_next) CUTLASS_LAMBDA_FUNC_INLINE {
        r = detail::ring<kStages>(blk++);
        if (waits) TxBarrier::wait(&s.k_full[r.stage], r.phase);
        if constexpr (C::kTwoP) {
          warpgroup_wait<0>();  // the P V issued a step ago, which read p_next
          warpgroup_fence_operand(tOrO);
          warpgroup_fence_operand(p_next);
          if (leader && pending >= 0) Barrier::arrive(&s.v_empty[pending]);
          rescale_o_if_moved(corr);
        }
        if (fast)
          detail::named_sync(my_bar, kPair);
        else
          bi = take_turn(r.stage);
        issue_qk(r.stage);
        wait_v(prev, !fast && prev_fixed, waits);  // a run has no fixed block
        issue_pv(prev.stage, p_prev);
        detail::named_arrive(next_bar, kPair);
        pending = prev.stage;
        warpgroup_wait<1>();  // S of this block; the P V may still run
        warpgroup_fence_operand(tSrS);
        if (!fast) poison_rows(bi);
        release_k(r.stage);
        if (!fast) release_q_after_last(bi);
        softmax(fast, bi, corr, /*wait_pv=*/C::kLateWait);
        if constexpr (!C::kTwoP) {
          if constexpr (!C::kLateWait) {
            warpgroup_wait<0>();
            warpgroup_fence_operand(tOrO);
            warpgroup_fence_operand(p_prev);
          }
          if (leader) Barrier::arrive(&s.v_empty[pending]);
          pending = -1;
          if constexpr (kD > 128)
            rescale_o_if_moved(corr);
          else
            rescale_o(corr);
        }
        convert_p(p_next);
        prev = r;
        if (fast) return false;
        prev_fixed = bi.flags & detail::BlockInfo::kFixed;
        if constexpr (C::kRuns) run = bi.flags >> detail::BlockInfo::kRunShift;
        return bool(bi.flags & detail::BlockInfo::kLast);
      };
      bool last_in_p2 = false;  // the last block's P is in tOrP2
      if (!(bi.flags & detail::BlockInfo::kLast)) {
        for (;;) {  // each step says whether its block was the last
          if constexpr (C::kTwoP) {  // two blocks a round: each P is one set of registers
            if (step(/*fast=*/false, tOrP, tOrP2)) {
              last_in_p2 = true;
              break;
            }
            if (step(/*fast=*/false, tOrP2, tOrP)) break;
          } else {
            for (; run > 0; --run) step(/*fast=*/true, tOrP, tOrP);
            if (step(/*fast=*/false, tOrP, tOrP)) break;
          }
        }
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      if (leader && pending >= 0) Barrier::arrive(&s.v_empty[pending]);
      if constexpr (C::kTwoP) rescale_o(corr);
      wait_v(prev, prev_fixed);
      if (last_in_p2)
        issue_pv(prev.stage, tOrP2);
      else
        issue_pv(prev.stage, tOrP);
      finish_rows();  // under the last P V
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      warpgroup_fence_operand(tOrP2);
      if (leader) Barrier::arrive(&s.v_empty[prev.stage]);
    } else {
      finish_rows();  // a tile without keys: no Q, no blocks
    }

    // Epilogue: O normalised, merged with a given partial result, stored, in one straight-line
    // pass for the output kind, chosen once per tile (a switch on the dtype beside every store
    // made the epilogue ~3000 instructions of branches, 20 % of the stall samples on 8k
    // sliding window).
    // put(row i, index of column jj, of column jj + 1, their values) for the C fragment's
    // column pairs jj, jj + 1 (jj even), which are adjacent in memory when out_pairs.
    auto store_o = [&](auto&& put) CUTLASS_LAMBDA_FUNC_INLINE {
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        if (o_base[i] < 0) continue;
        CUTE_UNROLL
        for (int jj = 0; jj < size<1>(O); jj += 2)
          put(i, o_base[i] + get<1>(cO(i, jj)), o_base[i] + get<1>(cO(i, jj + 1)),
              O(i, jj) * w[i], O(i, jj + 1) * w[i]);
      }
    };
    using detail::store2;
    using I64 = std::int64_t;
    if (p.accumulate) {  // fp32 out (attention.cc checks it)
      float* out = static_cast<float*>(p.out);
      store_o([&](int i, I64 a, I64 b, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
        out[a] = x0 + keep[i] * out[a];
        out[b] = x1 + keep[i] * out[b];
      });
    } else if (p.out_rows16) {
      // 16 bytes a store: the C fragment gives a quad's thread q the column pairs 8 g + 2 q
      // of each group g of 8 columns (its rows are the quad's), so after a transpose over the
      // quad of four groups' pairs, thread q holds the 8 columns of group g0 + q. A quarter of
      // the store instructions of the paired path, each row's 64 bytes whole sectors: the O
      // store of an item went from 5000 to 1900 cycles at D 128 (docs/benchmarks.md).
      auto rows16 = [&](auto pack) CUTLASS_LAMBDA_FUNC_INLINE {
        const int q = ctid & 3;
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          CUTE_UNROLL
          for (int g0 = 0; g0 < size<1>(O) / 2; g0 += 4) {
            unsigned x[4];
            CUTE_UNROLL
            for (int c = 0; c < 4; ++c)
              x[c] = pack(O(i, 2 * (g0 + c)) * w[i], O(i, 2 * (g0 + c) + 1) * w[i]);
            detail::quad_transpose(x, q);  // every lane, also on rows past the end
            if (o_base[i] >= 0)
              *reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(p.out) + o_base[i] +
                                        8 * (g0 + q)) = make_uint4(x[0], x[1], x[2], x[3]);
          }
        }
      };
      static_assert(decltype(size<1>(O))::value % 8 == 0, "groups of 8 columns, four at a time");
      if (p.out_type == OutType::kBF16)
        rows16([](float a, float b) { return detail::pack2<OutType::kBF16>(a, b); });
      else
        rows16([](float a, float b) { return detail::pack2<OutType::kF16>(a, b); });
    } else if (!p.out_pairs) {
      store_o([&](int, I64 a, I64 b, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
        detail::store(p.out, a, p.out_type, x0);
        detail::store(p.out, b, p.out_type, x1);
      });
    } else if (p.out_type == OutType::kBF16) {
      store_o([&](int, I64 a, I64, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
        store2<OutType::kBF16>(p.out, a, x0, x1);
      });
    } else if (p.out_type == OutType::kF16) {
      store_o([&](int, I64 a, I64, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
        store2<OutType::kF16>(p.out, a, x0, x1);
      });
    } else {
      store_o([&](int, I64 a, I64, float x0, float x1) CUTLASS_LAMBDA_FUNC_INLINE {
        store2<OutType::kF32>(p.out, a, x0, x1);
      });
    }
  }
  // The last CTA of the grid to finish readies the workspace for the next call (fwd_params.h
  // FwdWorkspaceLayout). A CTA counts itself once all its consumer threads are past their last
  // item (its producer and fixer, which also read bad_any, finished theirs before); no fence:
  // what this call read is in registers by then, and the next call reads these words after
  // the kernel boundary.
  detail::named_sync(1 + C::kWarpgroups, C::kConsumerThreads);
  if (ctid == 0 && atomicAdd(p.done, 1u) == gridDim.x - 1u) {
    for (int h = 0; h < p.heads_kv; ++h) p.bad_any[h] = 0u;
    atomicAdd(p.epoch, 1ull);  // every other reader of the epoch is done
  }
}

// Builds the TMA descriptors and launches the kernel on as many persistent CTAs as fit (at
// most max_ctas; the SMs left after sm_margin times the CTAs per SM); defined per
// instantiation, fwd_inst.cu.in.
template <class T, int kD>
cudaError_t launch_forward(const FwdParams& p, int sms, std::int64_t max_ctas,
                           cudaStream_t stream);

}  // namespace magi::kernels::sm90
