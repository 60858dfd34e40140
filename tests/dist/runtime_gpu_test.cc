// The distributed runtime on CUDA tensors (issue 16's one-GPU path): mpirun -np 1-4 processes
// share the GPU, the MPI communicator behind host staging (comm.h with_device_staging). Every
// rank builds the same bf16 problem, plans it for cp = world size, runs calc_attn forward and
// backward on device tensors (dispatched on the device too) and compares, on its own rows, with
// the fp64 oracle by docs/semantics.md §5's rule against the single-GPU kernel on the whole
// problem: err(distributed) <= 2 err(single GPU) + u / 16 (the stages merge in fp32 where the
// single call merges inside its tiles; both round P to bf16). Checks use EXPECT only, so a
// failing rank still joins every later collective.
//
// MAGI_TEST_COMM=nccl runs the same cases over the NCCL communicator instead (one GPU per rank,
// bootstrapped over MPI: nccl_env.h), device rows straight through without staging.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attn_case.h"
#include "builder_masks.h"
#include "dist_env.h"
#include "magi/error.h"
#include "magi/mask_builders.h"
#include "magi/runtime.h"
#include "sm90_support.h"
#if MAGI_TEST_NCCL
#include "nccl_env.h"
#endif

namespace magi {
namespace {

using namespace gputest;

bool use_nccl() {
  const char* c = std::getenv("MAGI_TEST_COMM");
  return c && std::string(c) == "nccl";
}

// The communicator under test: MPI (the default) or, with MAGI_TEST_COMM=nccl, NCCL; nullptr
// with *skip saying why where NCCL cannot run here.
comm::Communicator* comm_under_test(std::string* skip) {
  if (!use_nccl()) return &testing::world();
#if MAGI_TEST_NCCL
  return testing::nccl_world(skip);
#else
  *skip = "built without the NCCL communicator";
  ADD_FAILURE() << "MAGI_TEST_COMM=nccl, but runtime_gpu_test was " << *skip;
  return nullptr;
#endif
}

comm::Communicator& comm_world() {
  std::string skip;
  comm::Communicator* c = comm_under_test(&skip);
  MAGI_CHECK(c != nullptr, "no communicator: ", skip);
  return *c;
}

// REQUIRE_GPU, and under NCCL one GPU per rank.
#define REQUIRE_COMM()                                                            \
  do {                                                                            \
    REQUIRE_GPU();                                                                \
    std::string skip_why;                                                         \
    if (!comm_under_test(&skip_why)) GTEST_SKIP() << MAGI_GPU_TEST_BINARY ": " << skip_why; \
  } while (0)

// Global rows [n, h, d] -> this rank's local rows, on the host (the reference's side).
std::vector<double> local_of(const plan::DistPlan& dp, std::vector<double> global, std::int64_t n,
                             std::int64_t h, std::int64_t d) {
  const std::int64_t nl = dp.dispatch.rank_tokens(comm_world().rank());
  std::vector<double> l(std::size_t(nl * h * d));
  runtime::dispatch(dp, comm_world(), make_view(global.data(), DType::kF64, {n, h, d}),
                    make_view(l.data(), DType::kF64, {nl, h, d}));
  return l;
}

double err(const std::vector<double>& got, const std::vector<double>& want, double scale) {
  return testing::err_at_scale(got, want, scale);
}

// A case beyond the mask and heads: sink tokens ("sh": per head, replicated on every rank),
// softcap, the plan's stages and chunk, uneven shards.
struct Extras {
  std::int64_t sink_len = 0;
  double softcap = 0;
  int stages = 2;
  std::int64_t chunk = 64;
  bool uneven = false;
};

void run_case(const Mask& mask, std::int64_t hq, std::int64_t hkv, const std::string& what,
              const Extras& x) {
  comm::Communicator& world = comm_world();
  SCOPED_TRACE(what + " on rank " + std::to_string(world.rank()));
  Case c;
  c.hq = hq, c.hkv = hkv;
  c.out = DType::kF32;  // the runtime keeps out in the compute type
  c.sink_len = x.sink_len;
  c.opts.softcap = x.softcap;
  const std::int64_t n = mask.total_seqlen_q(), d = c.d;
  const Problem p = make_problem(mask, c, 41);  // every rank: the same rounded inputs
  plan::PlanOptions po;
  po.dispatch.cp = world.size();
  po.dispatch.chunk_size = x.chunk;
  po.dispatch.uneven = x.uneven;
  po.num_stages = x.stages;
  const plan::DistPlan dp = plan::make_plan(mask, po);
  const std::int64_t nl = dp.dispatch.rank_tokens(world.rank());

  // The single-GPU kernel on the whole problem.
  GpuCall whole(p, c);
  attn_forward(mask, whole.args(true), c.opts);
  DevTensor dout(c.in, {n, hq, d}), dq(DType::kF32, {n, hq, d}), dk(DType::kF32, {n, hkv, d}),
      dv(DType::kF32, {n, hkv, d});
  std::optional<DevTensor> dsink, dsink_l;  // the whole problem's, this rank's partial
  std::optional<TensorView> sink_v, dsink_v, dsink_lv;
  if (whole.sink) {
    dsink.emplace(DType::kF32, whole.sink->shape);
    dsink_l.emplace(DType::kF32, whole.sink->shape);
    sink_v = whole.sink->view, dsink_v = dsink->view, dsink_lv = dsink_l->view;
  }
  dout.upload(p.dout);
  attn_backward(mask, BwdArgs{dout.view, whole.q.view, whole.k.view, whole.v.view, whole.out.view,
                              whole.lse.view, dq.view, dk.view, dv.view, sink_v, dsink_v},
                c.opts);
  sync("single-GPU reference");

  // Distributed, on device tensors: global inputs on the device, dispatched there.
  auto local_dev = [&](const DevTensor& g, std::int64_t h) {
    DevTensor l(g.dtype, {nl, h, d});
    runtime::dispatch(dp, world, g.view, l.view);
    return l;
  };
  DevTensor ql = local_dev(whole.q, hq), kl = local_dev(whole.k, hkv), vl = local_dev(whole.v, hkv),
            dol = local_dev(dout, hq);
  DevTensor ol(DType::kF32, {nl, hq, d}), ll(DType::kF32, {nl, hq}), mll(DType::kF32, {hq});
  runtime::CalcStats stats;  // CUDA events on the compute stream (runtime.h)
  runtime::calc_attn_forward(dp, world,
                             FwdArgs{ql.view, kl.view, vl.view, ol.view, ll.view, sink_v,
                                     mll.view},
                             c.opts, &stats);
  EXPECT_EQ(stats.stage_compute_s.size(), stats.stage_wait_s.size());
  EXPECT_GE(stats.stage_compute_s.size(), nl > 0 ? 1u : 0u) << "one entry per kernel call";
  double compute = 0;
  for (double x : stats.stage_compute_s) {
    EXPECT_GE(x, 0.0);
    compute += x;
  }
  EXPECT_NEAR(compute, stats.compute_s, 1e-9);
  if (nl > 0) EXPECT_GT(stats.compute_s, 0.0) << "the host stage's kernels took no GPU time";
  EXPECT_GE(stats.wait_s, 0.0);
  DevTensor dql(DType::kF32, {nl, hq, d}), dkl(DType::kF32, {nl, hkv, d}),
      dvl(DType::kF32, {nl, hkv, d});
  const BwdArgs ba{dol.view, ql.view, kl.view, vl.view, ol.view, ll.view,
                   dql.view, dkl.view, dvl.view, sink_v, dsink_lv};
  runtime::calc_attn_backward(dp, world, ba, c.opts);
  // dsink is each rank's partial: summed like a replicated parameter's gradient.
  if (dsink_lv) runtime::all_reduce(world, *dsink_lv, comm::ReduceOp::kSum);
  sync("distributed");

  // The same calls carving every scratch buffer from one workspace (runtime.h
  // calc_attn_workspace_bytes; what the Python front passes from torch's allocator): the
  // same bits as the calls that allocate their own.
  {
    const auto bytes = [&](bool bwd) {
      return runtime::calc_attn_workspace_bytes(dp, world.rank(), hq, hkv, d, c.in, bwd);
    };
    const std::size_t ws_bytes = std::max(bytes(false), bytes(true));
    DevTensor ws(DType::kF32, {std::int64_t(ws_bytes / 4) + 1});
    DevTensor o2(DType::kF32, {nl, hq, d}), l2(DType::kF32, {nl, hq}), dq2(DType::kF32, {nl, hq, d}),
        dk2(DType::kF32, {nl, hkv, d}), dv2(DType::kF32, {nl, hkv, d});
    FwdArgs fa{ql.view, kl.view, vl.view, o2.view, l2.view, sink_v, std::nullopt};
    fa.workspace = Workspace{ws.view.data, bytes(false)};
    runtime::calc_attn_forward(dp, world, fa, c.opts);
    // The backward bitwise only in deterministic mode (else dq's fp32 atomics reorder).
    AttnOptions det = c.opts;
    det.deterministic = true;
    DevTensor dq3(DType::kF32, {nl, hq, d}), dk3(DType::kF32, {nl, hkv, d}),
        dv3(DType::kF32, {nl, hkv, d});
    std::optional<DevTensor> ds2, ds3;  // the sink's gradient of each call (unchecked here)
    if (whole.sink) ds2.emplace(DType::kF32, whole.sink->shape), ds3.emplace(DType::kF32, whole.sink->shape);
    BwdArgs b3 = ba;
    b3.dq = dq3.view, b3.dk = dk3.view, b3.dv = dv3.view;
    if (ds3) b3.dsink = ds3->view;
    runtime::calc_attn_backward(dp, world, b3, det);
    BwdArgs b2 = ba;
    b2.dq = dq2.view, b2.dk = dk2.view, b2.dv = dv2.view;
    if (ds2) b2.dsink = ds2->view;
    b2.workspace = Workspace{ws.view.data, bytes(true)};
    runtime::calc_attn_backward(dp, world, b2, det);
    sync("distributed, with a workspace");
    EXPECT_EQ(o2.download(), ol.download()) << "out with a workspace";
    EXPECT_EQ(l2.download(), ll.download()) << "lse with a workspace";
    EXPECT_EQ(dq2.download(), dq3.download()) << "dq with a workspace";
    EXPECT_EQ(dk2.download(), dk3.download()) << "dk with a workspace";
    EXPECT_EQ(dv2.download(), dv3.download()) << "dv with a workspace";
    // One byte short: refused on every rank before the first collective, naming the size.
    fa.workspace->bytes = bytes(false) - 1;
    try {
      runtime::calc_attn_forward(dp, world, fa, c.opts);
      ADD_FAILURE() << "a workspace one byte short was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("calc_attn_workspace_bytes"), std::string::npos)
          << e.what();
    }
  }

  // Both against the oracle, on this rank's rows.
  const oracle::FwdResult of = oracle::forward(mask, p);
  const oracle::BwdResult ob = oracle::backward(mask, p);
  const double u = testing::unit_roundoff(c.in) / 16;
  auto check = [&](const char* name, const std::vector<double>& dist, std::vector<double> single,
                   std::vector<double> want, std::int64_t h, std::int64_t w, double scale) {
    const std::vector<double> s = local_of(dp, std::move(single), n, h, w);
    const std::vector<double> o = local_of(dp, std::move(want), n, h, w);
    const double e = err(dist, o, scale), es = err(s, o, scale);
    EXPECT_TRUE(std::isfinite(es)) << name << ": the single-GPU kernel disagrees with the oracle on NaN";
    EXPECT_LE(e, 2 * es + u) << name << ": distributed error " << e << " vs single-GPU " << es;
  };
  const double gs = testing::grad_scale(ob);
  check("out", ol.download(), whole.out.download(), of.out, hq, d, 0);
  check("lse", ll.download(), whole.lse.download(), of.lse, hq, 1, 1.0);
  check("dq", dql.download(), dq.download(), ob.dq, hq, d, gs);
  check("dk", dkl.download(), dk.download(), ob.dk, hkv, d, gs);
  check("dv", dvl.download(), dv.download(), ob.dv, hkv, d, gs);
  EXPECT_EQ(mll.download(), whole.max_logits.download()) << "max_logits (a max: exact)";
  if (dsink) {  // replicated: every rank holds the whole sum
    const double e = err(dsink_l->download(), ob.dsink, testing::max_abs(ob.dsink));
    const double es = err(dsink->download(), ob.dsink, testing::max_abs(ob.dsink));
    EXPECT_LE(e, 2 * es + u) << "dsink: distributed error " << e << " vs single-GPU " << es;
  }
  // Rows that see no key hold zeros, never NaN (SPEC §5; a rank may hold only such rows).
  for (double o : ol.download()) {
    if (!std::isfinite(o)) {
      ADD_FAILURE() << "a non-finite out element on rank " << world.rank();
      break;
    }
  }
}

TEST(RuntimeGpu, CalcAttnOnDeviceTensorsMatchesTheSingleGpuKernel) {
  REQUIRE_COMM();
  if (!built(DType::kBF16, 128)) return;
  std::mt19937_64 rng(5);
  const std::int64_t n = 320 * comm_world().size();
  run_case(masks::causal(n, n), 4, 2, "causal", {});
  run_case(masks::varlen_causal(prefix_sums({n / 4, 7, n / 2, 33, n - n / 4 - n / 2 - 40})), 4, 4,
           "varlen causal", {.stages = 3});
  run_case(masks::sliding_window(n, n, {96, 0}), 4, 1, "sliding window, MQA", {.stages = 1});
  run_case(testing::packed_documents(rng, n), 4, 2, "packed documents, no overlap stages",
           {.stages = 0});
}

// Every builder of docs/semantics.md §1 (and a random mask with overlapping q ranges; the last
// but one: only the first chunk's rows see anything, so most ranks hold only unseen rows),
// with GQA or MQA, sinks, softcap, uneven shards and 0-3 stages drawn per case.
TEST(RuntimeGpu, EveryBuilderWithSinkSoftcapAndUnevenShards) {
  REQUIRE_COMM();
  if (!built(DType::kBF16, 128)) return;
  const int cp = comm_world().size();
  std::mt19937_64 rng(0x6b1d);
  for (int kind = 0; kind < testing::kNumBuilderMasks; ++kind) {
    Extras x;
    x.chunk = 64;
    x.uneven = rng() % 3 == 0;
    const std::int64_t n = x.chunk * cp * 3 - (x.uneven ? 1 + std::int64_t(rng() % 40) : 0);
    const Mask mask = testing::builder_mask(kind, rng, n, x.chunk);
    const std::int64_t hkv = rng() % 2 ? 2 : 1;
    x.sink_len = rng() % 2 ? 2 : 0;
    x.softcap = rng() % 3 == 0 ? 20.0 : 0.0;
    x.stages = int(rng() % 4);
    run_case(mask, 4, hkv, "builder mask " + std::to_string(kind) + (x.uneven ? " uneven" : "") +
                               (x.sink_len ? " sink" : "") + (x.softcap > 0 ? " softcap" : "") +
                               " stages " + std::to_string(x.stages),
             x);
  }
}

// Rows [begin, begin + rows) of a contiguous device tensor.
TensorView row_slice(const TensorView& t, std::int64_t begin, std::int64_t rows) {
  TensorView v = t;
  v.data = static_cast<unsigned char*>(t.data) + begin * t.stride[0] * dtype_size(t.dtype);
  v.shape[0] = rows;
  return v;
}

// The stage kernels of a cp-2 plan of a causal 8k mask, in one process and without any
// communication: for each rank's share (its q rows, its K/V rows then each stage's fetched
// rows), the host-stage call and the stage calls with accumulate must give what one call
// over the share's whole mask gives. `magiattn run --ranks 2 --device cuda --comm mpi
// --seqlen 8192 --mask causal` hung on the H200 (2026-12-02): rank 0 blocked inside CUDA, its
// peer waiting for it; the same sequence through magiattn._C hung in one process for rank 0's
// share and not for rank 1's. The cause was the forward kernel's Q hand-off on query tiles
// without keys (rank 0's remote stage has 512 such rows; fixed in fwd_kernel.cuh, and
// Sm90Forward.ManyKeylessTilesInARowDoNotHang pins it down): this test passes since.
TEST(RuntimeGpu, StageKernelsOfACausal8kPlanMergeLikeOneCall) {
  REQUIRE_GPU();
  if (!built(DType::kBF16, 128)) return;
  if (comm_world().size() != 1) GTEST_SKIP() << "one process, no communication: runs at np 1";
  const std::int64_t n = 8192, hq = 8, hkv = 2, d = 128;
  plan::PlanOptions po;
  po.dispatch.cp = 2;
  const plan::DistPlan dp = plan::make_plan(masks::causal(n, n), po);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + "'s share");
    const plan::RankPlan& rp = dp.ranks[std::size_t(r)];
    const std::int64_t nl = dp.dispatch.rank_tokens(r);
    std::vector<Slice> all = rp.host_slices;
    std::vector<std::int64_t> offset, rows;  // each stage's K rows in the share
    std::int64_t nk = nl;
    for (const plan::Stage& st : rp.stages) {
      std::int64_t nr = 0;
      for (const Range k : st.remote_k_ranges) nr += k.size();
      for (Slice sl : st.slices) {
        sl.k_range = Range{sl.k_range.start + nk, sl.k_range.end + nk};
        all.push_back(sl);
      }
      offset.push_back(nk), rows.push_back(nr);
      nk += nr;
    }
    const Mask share(nl, nk, all);
    Case c;
    c.hq = hq, c.hkv = hkv, c.out = DType::kF32, c.max_logits = false;
    const Problem p = make_problem(share, c, 7);
    GpuCall one(p, c);
    attn_forward(share, one.args(), c.opts);
    DevTensor out(DType::kF32, {nl, hq, d}), lse(DType::kF32, {nl, hq});
    FwdArgs a{one.q.view, row_slice(one.k.view, 0, nl), row_slice(one.v.view, 0, nl), out.view,
              lse.view, std::nullopt, std::nullopt};
    attn_forward(Mask(nl, nl, rp.host_slices), a, c.opts);
    AttnOptions acc = c.opts;
    acc.accumulate = true;
    for (std::size_t s = 0; s < rp.stages.size(); ++s) {
      a.k = row_slice(one.k.view, offset[s], rows[s]);
      a.v = row_slice(one.v.view, offset[s], rows[s]);
      attn_forward(Mask(nl, rows[s], rp.stages[s].slices), a, acc);
    }
    sync("staged forward");
    const std::vector<double> o1 = one.out.download();
    EXPECT_LE(testing::err_at_scale(out.download(), o1, 0), 1e-2) << "out";
    EXPECT_LE(testing::err_at_scale(lse.download(), one.lse.download(), 1.0), 1e-4) << "lse";

    // Backward on the one call's out and lse: dq summed over the calls, dK/dV per segment.
    DevTensor dout(c.in, {nl, hq, d}), dq1(DType::kF32, {nl, hq, d}), dk1(DType::kF32, {nk, hkv, d}),
        dv1(DType::kF32, {nk, hkv, d}), dq(DType::kF32, {nl, hq, d}),
        dk(DType::kF32, {nk, hkv, d}), dv(DType::kF32, {nk, hkv, d});
    dout.upload(p.dout);
    const std::vector<double> zeros(std::size_t(nk * hkv * d), 0.0);
    dk.upload(zeros), dv.upload(zeros);
    attn_backward(share, BwdArgs{dout.view, one.q.view, one.k.view, one.v.view, one.out.view,
                                 one.lse.view, dq1.view, dk1.view, dv1.view, std::nullopt,
                                 std::nullopt}, c.opts);
    BwdArgs b{dout.view, one.q.view, a.k, a.v, one.out.view, one.lse.view, dq.view,
              row_slice(dk.view, 0, nl), row_slice(dv.view, 0, nl), std::nullopt, std::nullopt};
    b.k = row_slice(one.k.view, 0, nl), b.v = row_slice(one.v.view, 0, nl);
    attn_backward(Mask(nl, nl, rp.host_slices), b, c.opts);
    for (std::size_t s = 0; s < rp.stages.size(); ++s) {
      b.k = row_slice(one.k.view, offset[s], rows[s]);
      b.v = row_slice(one.v.view, offset[s], rows[s]);
      b.dk = row_slice(dk.view, offset[s], rows[s]);
      b.dv = row_slice(dv.view, offset[s], rows[s]);
      attn_backward(Mask(nl, rows[s], rp.stages[s].slices), b, acc);
    }
    sync("staged backward");
    EXPECT_LE(testing::err_at_scale(dq.download(), dq1.download(), 0), 1e-2) << "dq";
    EXPECT_LE(testing::err_at_scale(dk.download(), dk1.download(), 0), 1e-2) << "dk";
    EXPECT_LE(testing::err_at_scale(dv.download(), dv1.download(), 0), 1e-2) << "dv";
  }
}

TEST(RuntimeGpu, DeviceDispatchAndUndispatchMatchTheHostOnes) {
  REQUIRE_COMM();
  comm::Communicator& world = comm_world();
  const std::int64_t n = 200 * world.size() + 3, h = 2, d = 8;
  plan::PlanOptions po;
  po.dispatch.cp = world.size();
  po.dispatch.chunk_size = 16;
  po.dispatch.uneven = true;
  const plan::DistPlan dp = plan::make_plan(masks::causal(n, n), po);
  const std::int64_t nl = dp.dispatch.rank_tokens(world.rank());
  std::vector<double> g(std::size_t(n * h * d));
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = double(i);
  DevTensor gd(DType::kF32, {n, h, d}), ld(DType::kF32, {nl, h, d}), back(DType::kF32, {n, h, d});
  gd.upload(g);
  runtime::dispatch(dp, world, gd.view, ld.view);
  runtime::undispatch(dp, world, ld.view, back.view);
  sync("dispatch");
  EXPECT_EQ(ld.download(), local_of(dp, g, n, h, d));
  EXPECT_EQ(back.download(), g);
}

}  // namespace
}  // namespace magi
