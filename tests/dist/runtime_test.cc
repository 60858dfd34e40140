// Distributed calc_attn (SPEC §3, issue 5): every rank builds the same mask and global inputs
// from one seed, plans with cp = world size, dispatches, runs forward and backward through the
// runtime, undispatches and compares with the single-process CPU kernels on the whole mask
// (1e-12 relative, fp64) and, on small cases, with the fp64 oracle. Checks use EXPECT only, so
// a failing rank still joins every later collective instead of hanging its peers.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attn_case.h"
#include "dist_env.h"
#include "magi/error.h"
#include "magi/mask_builders.h"
#include "magi/runtime.h"
#include "seed.h"

namespace magi {
namespace {

using testing::world;

constexpr double kTol = 1e-12;

std::vector<std::int64_t> random_cu(std::mt19937_64& rng, std::int64_t n) {
  std::vector<std::int64_t> cu{0};
  while (cu.back() < n)
    cu.push_back(std::min(n, cu.back() + 1 + std::int64_t(rng() % std::uint64_t(n / 2 + 1))));
  return cu;
}

// Builders of SPEC §1 by index; every rank draws the same one.
Mask make_mask(int kind, std::mt19937_64& rng, std::int64_t n, std::int64_t chunk) {
  switch (kind) {
    case 0: return masks::causal(n, n);
    case 1: return masks::varlen_causal(random_cu(rng, n));
    case 2: return masks::sliding_window(n, n, {3, 1});
    case 3: {  // overlapping q ranges: every answer sees the shared question
      const std::int64_t question = n / 3, a = (n - question) / 2;
      const std::vector<std::int64_t> answers{a, n - question - a};
      return masks::shared_question(question, answers);
    }
    case 4:  // only the first chunk's rows see anything: most ranks compute nothing
      return Mask(n, n, {Slice{{0, chunk}, {0, n}, MaskType::kFull}});
    case 5: return masks::varlen_sliding_window(random_cu(rng, n), {4, 0}, 2);
    case 6: return masks::varlen_block_causal(random_cu(rng, n), 3, true);
    default: return testing::random_mask(rng, n, n, 6);
  }
}

TensorView view(std::vector<double>& b, std::initializer_list<std::int64_t> shape) {
  return make_view(b.data(), DType::kF64, shape);
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what, double tol = kTol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LE(oracle::rel_error(got.data(), want.data(), got.size()), tol)
      << what << " on rank " << world().rank();
}

void run_case(int kind, std::mt19937_64& rng, const std::string& where) {
  comm::Communicator& comm = world();
  const int cp = comm.size();
  const std::int64_t chunk = 1 + std::int64_t(rng() % 4);
  const std::int64_t n = chunk * cp * (2 + std::int64_t(rng() % 3));
  const Mask mask = make_mask(kind, rng, n, chunk);
  const bool gqa = rng() % 2, with_sink = rng() % 2;
  const std::int64_t hq = 4, hkv = gqa ? 2 : 4, d = 8, sink_len = with_sink ? 2 : 0;
  testing::Config cfg = testing::config_for(DType::kF64);
  cfg.opts.softcap = rng() % 3 == 0 ? 5.0 : 0.0;
  cfg.opts.num_threads = 1;  // ranks share 2 cores in CI
  const oracle::Problem p = testing::random_problem(rng, n, n, hq, hkv, d, cfg, sink_len);
  plan::PlanOptions po;
  po.dispatch.cp = cp;
  po.dispatch.chunk_size = chunk;
  po.num_stages = int(rng() % 4);
  const plan::DistPlan dp = plan::make_plan(mask, po);
  const std::string tag = where + " mask kind " + std::to_string(kind) + " n " +
                          std::to_string(n) + " stages " + std::to_string(po.num_stages) +
                          (gqa ? " gqa" : "") + (with_sink ? " sink" : "") +
                          (cfg.opts.softcap > 0 ? " softcap" : "");
  SCOPED_TRACE(tag);

  // Single-process reference on the whole mask.
  std::vector<double> q = p.q, k = p.k, v = p.v, dout = p.dout, sink = p.sink;
  std::vector<double> out(q.size()), lse(std::size_t(n * hq)), ml(static_cast<std::size_t>(hq));
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dsink(sink.size());
  const TensorView sink_v = view(sink, {std::max<std::int64_t>(sink_len, 1), hq});
  FwdArgs fa{view(q, {n, hq, d}), view(k, {n, hkv, d}), view(v, {n, hkv, d}),
             view(out, {n, hq, d}), view(lse, {n, hq}), std::nullopt, view(ml, {hq})};
  if (with_sink) fa.sink = sink_v;
  attn_forward(mask, fa, cfg.opts);
  BwdArgs ba{view(dout, {n, hq, d}), fa.q, fa.k, fa.v, fa.out, fa.lse,
             view(dq, {n, hq, d}), view(dk, {n, hkv, d}), view(dv, {n, hkv, d}),
             std::nullopt, std::nullopt};
  if (with_sink) ba.sink = sink_v, ba.dsink = view(dsink, {sink_len, hq});
  attn_backward(mask, ba, cfg.opts);

  // Distributed: dispatch, forward, backward, undispatch.
  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  auto local = [&](std::vector<double>& global, std::int64_t h) {
    std::vector<double> l(std::size_t(nl * h * d));
    runtime::dispatch(dp, comm, view(global, {n, h, d}), view(l, {nl, h, d}));
    return l;
  };
  std::vector<double> ql = local(q, hq), kl = local(k, hkv), vl = local(v, hkv),
                      dol = local(dout, hq);
  std::vector<double> ol(ql.size()), ll(std::size_t(nl * hq)), mll(static_cast<std::size_t>(hq));
  FwdArgs la{view(ql, {nl, hq, d}), view(kl, {nl, hkv, d}), view(vl, {nl, hkv, d}),
             view(ol, {nl, hq, d}), view(ll, {nl, hq}), std::nullopt, view(mll, {hq})};
  if (with_sink) la.sink = sink_v;
  runtime::calc_attn_forward(dp, comm, la, cfg.opts);
  std::vector<double> dql(ql.size()), dkl(kl.size()), dvl(vl.size()), dsl(sink.size());
  BwdArgs lb{view(dol, {nl, hq, d}), la.q, la.k, la.v, la.out, la.lse,
             view(dql, {nl, hq, d}), view(dkl, {nl, hkv, d}), view(dvl, {nl, hkv, d}),
             std::nullopt, std::nullopt};
  if (with_sink) lb.sink = sink_v, lb.dsink = view(dsl, {sink_len, hq});
  runtime::calc_attn_backward(dp, comm, lb, cfg.opts);
  if (with_sink)  // dsink is per-rank partial: summed like a replicated parameter's gradient
    comm.all_reduce(comm::Rows{dsl.data(), 1, std::int64_t(dsl.size()), DType::kF64},
                    comm::ReduceOp::kSum)->wait();

  auto global = [&](std::vector<double>& l, std::int64_t h) {
    std::vector<double> g(std::size_t(n * h * d));
    runtime::undispatch(dp, comm, view(l, {nl, h, d}), view(g, {n, h, d}));
    return g;
  };
  std::vector<double> og = global(ol, hq), dqg = global(dql, hq), dkg = global(dkl, hkv),
                      dvg = global(dvl, hkv), lg(lse.size());
  runtime::undispatch(dp, comm, view(ll, {nl, hq}), view(lg, {n, hq}));
  expect_close(og, out, "out");
  expect_close(lg, lse, "lse");
  expect_close(mll, ml, "max_logits");
  expect_close(dqg, dq, "dq");
  expect_close(dkg, dk, "dk");
  expect_close(dvg, dv, "dv");
  if (with_sink) expect_close(dsl, dsink, "dsink");

  if (n <= 48) {  // the oracle is O(n^2) per head and materialises the dense mask
    const oracle::FwdResult of = oracle::forward(mask, p);
    const oracle::BwdResult ob = oracle::backward(mask, p);
    expect_close(og, of.out, "out vs oracle", 1e-10);
    expect_close(lg, of.lse, "lse vs oracle", 1e-10);
    expect_close(dqg, ob.dq, "dq vs oracle", 1e-10);
    expect_close(dkg, ob.dk, "dk vs oracle", 1e-10);
    expect_close(dvg, ob.dv, "dv vs oracle", 1e-10);
  }
}

TEST(Runtime, EveryBuilderMatchesSingleProcess) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x7e5);
  for (int kind = 0; kind < 8; ++kind)
    run_case(kind, rng, testing::seed_note(seed));
}

TEST(Runtime, RandomSweep) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x5eed);
  const int cases = testing::full_level() ? 60 : 12;
  for (int c = 0; c < cases; ++c) run_case(int(rng() % 8), rng, testing::seed_note(seed));
}

// Bad arguments throw on the calling rank before any collective (no peer is left waiting).
TEST(Runtime, RejectsBadArgumentsBeforeCommunicating) {
  comm::Communicator& comm = world();
  const std::int64_t n = 4 * comm.size();
  plan::PlanOptions po;
  po.dispatch.cp = comm.size();
  po.dispatch.chunk_size = 2;
  const plan::DistPlan dp = plan::make_plan(masks::causal(n, n), po);
  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  std::vector<double> g(std::size_t(n * 8)), l(std::size_t(nl * 8)), lse(static_cast<std::size_t>(nl));
  EXPECT_THROW(runtime::dispatch(dp, comm, view(g, {n - 1, 1, 8}), view(l, {nl, 1, 8})), magi::Error);
  AttnOptions acc;
  acc.accumulate = true;
  const FwdArgs a{view(l, {nl, 1, 8}), view(l, {nl, 1, 8}), view(l, {nl, 1, 8}),
                  view(l, {nl, 1, 8}), view(lse, {nl, 1}), std::nullopt, std::nullopt};
  EXPECT_THROW(runtime::calc_attn_forward(dp, comm, a, acc), magi::Error);
}

}  // namespace
}  // namespace magi
