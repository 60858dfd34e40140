// Distributed calc_attn (docs/semantics.md §3, issue 5): every rank builds the same mask and global
// inputs from one seed, plans with cp = world size, dispatches, runs forward and backward through
// the runtime, undispatches and compares with the single-process CPU kernels on the whole mask
// (1e-12 relative, fp64) and, on small cases, with the fp64 oracle. Checks use EXPECT only, so a
// failing rank still joins every later collective instead of hanging its peers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "attn_case.h"
#include "builder_masks.h"
#include "dist_env.h"
#include "magi/error.h"
#include "magi/mask_builders.h"
#include "magi/runtime.h"
#include "seed.h"

namespace magi {
namespace {

using testing::builder_mask;
using testing::kNumBuilderMasks;
using testing::random_cu;
using testing::world;

constexpr double kTol = 1e-12;

TensorView view(std::vector<double>& b, std::initializer_list<std::int64_t> shape) {
  return make_view(b.data(), DType::kF64, shape);
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what, double tol = kTol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LE(oracle::rel_error(got.data(), want.data(), got.size()), tol)
      << what << " on rank " << world().rank();
}

// This rank's rows of a global [n, h, w] array, in the plan's local order (runtime::dispatch).
std::vector<double> local_rows(const plan::DistPlan& dp, const comm::Communicator& comm,
                               std::vector<double>& global, std::int64_t n, std::int64_t h,
                               std::int64_t w) {
  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  std::vector<double> l(std::size_t(nl * h * w));
  runtime::dispatch(dp, comm, view(global, {n, h, w}), view(l, {nl, h, w}));
  return l;
}

bool all_finite(const std::vector<double>& xs) {
  return std::all_of(xs.begin(), xs.end(), [](double x) { return std::isfinite(x); });
}

// Rows that see no key (and have no sink) hold out 0 and lse -inf; every other value is finite.
void expect_no_nan(const std::vector<double>& out, const std::vector<double>& lse,
                   std::int64_t hq, std::int64_t d, const std::string& where) {
  for (std::size_t r = 0; r < lse.size(); ++r) {
    const double l = lse[r];
    EXPECT_FALSE(std::isnan(l) || l == std::numeric_limits<double>::infinity())
        << where << ": lse row " << r / std::size_t(hq) << " head " << r % std::size_t(hq) << " is " << l;
    for (std::int64_t c = 0; c < d; ++c) {
      const double o = out[r * std::size_t(d) + std::size_t(c)];
      if (!std::isfinite(o) || (std::isinf(l) && o != 0.0)) {
        ADD_FAILURE() << where << ": out row " << r / std::size_t(hq) << " is " << o << " (lse " << l << ")";
        return;
      }
    }
  }
}

void run_case(int kind, std::mt19937_64& rng, const std::string& where) {
  comm::Communicator& comm = world();
  const int cp = comm.size();
  const std::int64_t chunk = 1 + std::int64_t(rng() % 4);
  // Uneven shards: a short last chunk, so ranks hold different token counts.
  const bool uneven = rng() % 3 == 0 && chunk * cp > 1;
  const std::int64_t n = chunk * cp * (2 + std::int64_t(rng() % 3)) -
                         (uneven ? 1 + std::int64_t(rng() % std::uint64_t(chunk * cp - 1)) : 0);
  const Mask mask = builder_mask(kind, rng, n, chunk);
  const bool gqa = rng() % 2, with_sink = rng() % 2;
  const std::int64_t hq = 4, hkv = gqa ? 2 : 4, d = 8, sink_len = with_sink ? 2 : 0;
  testing::Config cfg = testing::config_for(DType::kF64);
  cfg.opts.softcap = rng() % 3 == 0 ? 5.0 : 0.0;
  cfg.opts.num_threads = 1;  // ranks share 2 cores in CI
  // Per-token sink ("ssh") rows are dispatched with q; per-head ("sh") is replicated.
  const bool ssh = with_sink && rng() % 2;
  if (ssh) cfg.opts.sink_layout = SinkLayout::kSSH;
  const oracle::Problem p = testing::random_problem(rng, n, n, hq, hkv, d, cfg, sink_len);
  plan::PlanOptions po;
  po.dispatch.cp = cp;
  po.dispatch.chunk_size = chunk;
  po.dispatch.uneven = uneven;
  po.num_stages = int(rng() % 4);
  const plan::DistPlan dp = plan::make_plan(mask, po);
  const std::string tag = where + " mask kind " + std::to_string(kind) + " n " +
                          std::to_string(n) + " chunk " + std::to_string(chunk) + " stages " +
                          std::to_string(po.num_stages) + (uneven ? " uneven" : "") +
                          (gqa ? " gqa" : "") + (with_sink ? (ssh ? " sink ssh" : " sink sh") : "") +
                          (cfg.opts.softcap > 0 ? " softcap" : "");
  SCOPED_TRACE(tag);

  // Single-process reference on the whole mask.
  std::vector<double> q = p.q, k = p.k, v = p.v, dout = p.dout, sink = p.sink;
  std::vector<double> out(q.size()), lse(std::size_t(n * hq)), ml(static_cast<std::size_t>(hq));
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dsink(sink.size());
  const TensorView sink_v = ssh ? view(sink, {n, sink_len, hq})
                                : view(sink, {std::max<std::int64_t>(sink_len, 1), hq});
  FwdArgs fa{view(q, {n, hq, d}), view(k, {n, hkv, d}), view(v, {n, hkv, d}),
             view(out, {n, hq, d}), view(lse, {n, hq}), std::nullopt, view(ml, {hq})};
  if (with_sink) fa.sink = sink_v;
  attn_forward(mask, fa, cfg.opts);
  BwdArgs ba{view(dout, {n, hq, d}), fa.q, fa.k, fa.v, fa.out, fa.lse,
             view(dq, {n, hq, d}), view(dk, {n, hkv, d}), view(dv, {n, hkv, d}),
             std::nullopt, std::nullopt};
  if (with_sink) ba.sink = sink_v, ba.dsink = ssh ? view(dsink, {n, sink_len, hq}) : view(dsink, {sink_len, hq});
  attn_backward(mask, ba, cfg.opts);

  // Distributed: dispatch, forward, backward, undispatch.
  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  auto local = [&](std::vector<double>& g, std::int64_t h, std::int64_t w) {
    return local_rows(dp, comm, g, n, h, w);
  };
  std::vector<double> ql = local(q, hq, d), kl = local(k, hkv, d), vl = local(v, hkv, d),
                      dol = local(dout, hq, d);
  std::vector<double> sl = ssh ? local(sink, sink_len, hq) : sink;
  const TensorView sink_l = ssh ? view(sl, {nl, sink_len, hq}) : sink_v;
  std::vector<double> ol(ql.size()), ll(std::size_t(nl * hq)), mll(static_cast<std::size_t>(hq));
  FwdArgs la{view(ql, {nl, hq, d}), view(kl, {nl, hkv, d}), view(vl, {nl, hkv, d}),
             view(ol, {nl, hq, d}), view(ll, {nl, hq}), std::nullopt, view(mll, {hq})};
  if (with_sink) la.sink = sink_l;
  runtime::calc_attn_forward(dp, comm, la, cfg.opts);
  std::vector<double> dql(ql.size()), dkl(kl.size()), dvl(vl.size()), dsl(sl.size());
  BwdArgs lb{view(dol, {nl, hq, d}), la.q, la.k, la.v, la.out, la.lse,
             view(dql, {nl, hq, d}), view(dkl, {nl, hkv, d}), view(dvl, {nl, hkv, d}),
             std::nullopt, std::nullopt};
  if (with_sink) lb.sink = sink_l, lb.dsink = ssh ? view(dsl, {nl, sink_len, hq}) : view(dsl, {sink_len, hq});
  runtime::calc_attn_backward(dp, comm, lb, cfg.opts);
  expect_no_nan(ol, ll, hq, d, "local forward on rank " + std::to_string(comm.rank()));
  EXPECT_TRUE(all_finite(dql) && all_finite(dkl) && all_finite(dvl) && all_finite(dsl))
      << "non-finite gradient on rank " << comm.rank();
  std::vector<double> dsg = dsink;
  if (with_sink && !ssh) {  // "sh" dsink is per-rank partial: summed like a replicated parameter's gradient
    comm.all_reduce(comm::Rows{dsl.data(), 1, std::int64_t(dsl.size()), DType::kF64},
                    comm::ReduceOp::kSum)->wait();
    dsg = dsl;
  } else if (ssh) {  // "ssh" dsink rows belong to the rank's q rows
    runtime::undispatch(dp, comm, view(dsl, {nl, sink_len, hq}), view(dsg, {n, sink_len, hq}));
  }

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
  if (with_sink) expect_close(dsg, dsink, "dsink");

  if (n <= 48) {  // the oracle is O(n^2) per head and materialises the dense mask
    const oracle::FwdResult of = oracle::forward(mask, p);
    const oracle::BwdResult ob = oracle::backward(mask, p);
    expect_close(og, of.out, "out vs oracle", 1e-10);
    expect_close(lg, of.lse, "lse vs oracle", 1e-10);
    expect_close(mll, of.max_logits, "max_logits vs oracle", 1e-10);
    expect_close(dqg, ob.dq, "dq vs oracle", 1e-10);
    expect_close(dkg, ob.dk, "dk vs oracle", 1e-10);
    expect_close(dvg, ob.dv, "dv vs oracle", 1e-10);
    if (with_sink) expect_close(dsg, ob.dsink, "dsink vs oracle", 1e-10);
  }
}

TEST(Runtime, EveryBuilderMatchesSingleProcess) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x7e5);
  for (int kind = 0; kind < kNumBuilderMasks; ++kind)
    run_case(kind, rng, testing::seed_note(seed));
}

TEST(Runtime, RandomSweep) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x5eed);
  const int cases = testing::full_level() ? 60 : 12;
  for (int c = 0; c < cases; ++c) run_case(int(rng() % kNumBuilderMasks), rng, testing::seed_note(seed));
}

// bf16 inputs, fp32 outputs: the stages merge in fp32, so the result equals the
// single-process kernel up to fp32 rounding of a different summation order.
TEST(Runtime, Bf16InputsMatchSingleProcess) {
  comm::Communicator& comm = world();
  const int cp = comm.size();
  std::mt19937_64 rng(testing::test_seed() ^ 0xbf16);
  const std::int64_t n = 16 * cp, hq = 4, hkv = 2, d = 16;
  const Mask mask = masks::varlen_causal(random_cu(rng, n));
  plan::PlanOptions po;
  po.dispatch.cp = cp;
  po.dispatch.chunk_size = 4;
  po.num_stages = 2;
  const plan::DistPlan dp = plan::make_plan(mask, po);
  std::normal_distribution<float> normal;
  auto draw = [&](std::int64_t count) {
    std::vector<BF16> xs(static_cast<std::size_t>(count));
    for (BF16& x : xs) x = to_bf16(normal(rng));
    return xs;
  };
  std::vector<BF16> q = draw(n * hq * d), k = draw(n * hkv * d), v = draw(n * hkv * d);
  auto bf = [](std::vector<BF16>& b, std::initializer_list<std::int64_t> shape) {
    return make_view(b.data(), DType::kBF16, shape);
  };
  auto f32 = [](std::vector<float>& b, std::initializer_list<std::int64_t> shape) {
    return make_view(b.data(), DType::kF32, shape);
  };
  std::vector<float> out(q.size()), lse(std::size_t(n * hq));
  AttnOptions opts;
  opts.num_threads = 1;
  attn_forward(mask, {bf(q, {n, hq, d}), bf(k, {n, hkv, d}), bf(v, {n, hkv, d}),
                      f32(out, {n, hq, d}), f32(lse, {n, hq}), std::nullopt, std::nullopt}, opts);

  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  std::vector<BF16> ql(std::size_t(nl * hq * d)), kl(std::size_t(nl * hkv * d)), vl(kl.size());
  runtime::dispatch(dp, comm, bf(q, {n, hq, d}), bf(ql, {nl, hq, d}));
  runtime::dispatch(dp, comm, bf(k, {n, hkv, d}), bf(kl, {nl, hkv, d}));
  runtime::dispatch(dp, comm, bf(v, {n, hkv, d}), bf(vl, {nl, hkv, d}));
  std::vector<float> ol(ql.size()), ll(std::size_t(nl * hq)), og(out.size()), lg(lse.size());
  runtime::calc_attn_forward(dp, comm, {bf(ql, {nl, hq, d}), bf(kl, {nl, hkv, d}),
                                        bf(vl, {nl, hkv, d}), f32(ol, {nl, hq, d}),
                                        f32(ll, {nl, hq}), std::nullopt, std::nullopt}, opts);
  runtime::undispatch(dp, comm, f32(ol, {nl, hq, d}), f32(og, {n, hq, d}));
  runtime::undispatch(dp, comm, f32(ll, {nl, hq}), f32(lg, {n, hq}));
  std::vector<double> got(og.begin(), og.end()), want(out.begin(), out.end());
  expect_close(got, want, "bf16 out", 1e-5);
  got.assign(lg.begin(), lg.end());
  want.assign(lse.begin(), lse.end());
  expect_close(got, want, "bf16 lse", 1e-5);
}

// NaN/inf through the runtime (docs/numerics.md). Two causal documents with a 2-token hole
// between them: a NaN in k row 1 (doc 1) and an inf in v of the last token (doc 2) make
// exactly the rows that see them NaN, on whichever rank they live (at least one rank gets NaN
// rows from a K row it does not hold), max_logits NaN for the poisoned heads after the MAX
// all-reduce; garbage in the hole (q, k, v rows no slice covers) changes nothing, forward and
// backward, bit for bit. Everything equals the single-process kernels (NaN positions first).
TEST(Runtime, NonFiniteInputsPropagateAcrossRanks) {
  comm::Communicator& comm = world();
  const int cp = comm.size();
  const std::int64_t n = 16 * cp, a = 8 * cp - 3, hq = 4, hkv = 2, d = 8;
  const Mask mask(n, n, {Slice{{0, a}, {0, a}, MaskType::kCausal},
                         Slice{{a + 2, n}, {a + 2, n}, MaskType::kCausal}});
  plan::PlanOptions po;
  po.dispatch.cp = cp;
  po.dispatch.chunk_size = 2;
  po.num_stages = 2;
  const plan::DistPlan dp = plan::make_plan(mask, po);
  testing::Config cfg = testing::config_for(DType::kF64);
  cfg.opts.num_threads = 1;
  std::mt19937_64 rng(testing::test_seed() ^ 0x4a4);
  const oracle::Problem p = testing::random_problem(rng, n, n, hq, hkv, d, cfg);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();

  struct Run {
    std::vector<double> out, lse, ml, dq, dk, dv;
  };
  // Single process (local = false) or distributed, on global inputs; results global.
  auto run = [&](std::vector<double> q, std::vector<double> k, std::vector<double> v,
                 bool distributed, bool* remote_nan) {
    std::vector<double> dout = p.dout;
    Run r{std::vector<double>(q.size()), std::vector<double>(std::size_t(n * hq)),
          std::vector<double>(std::size_t(hq)), std::vector<double>(q.size()),
          std::vector<double>(k.size()), std::vector<double>(v.size())};
    if (!distributed) {
      const FwdArgs fa{view(q, {n, hq, d}), view(k, {n, hkv, d}), view(v, {n, hkv, d}),
                       view(r.out, {n, hq, d}), view(r.lse, {n, hq}), std::nullopt,
                       view(r.ml, {hq})};
      attn_forward(mask, fa, cfg.opts);
      attn_backward(mask, {view(dout, {n, hq, d}), fa.q, fa.k, fa.v, fa.out, fa.lse,
                           view(r.dq, {n, hq, d}), view(r.dk, {n, hkv, d}),
                           view(r.dv, {n, hkv, d}), std::nullopt, std::nullopt},
                    cfg.opts);
      return r;
    }
    const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
    auto local = [&](std::vector<double>& g, std::int64_t h, std::int64_t w) {
      return local_rows(dp, comm, g, n, h, w);
    };
    std::vector<double> ql = local(q, hq, d), kl = local(k, hkv, d), vl = local(v, hkv, d),
                        dol = local(dout, hq, d);
    std::vector<double> ol(ql.size()), ll(std::size_t(nl * hq)), dql(ql.size()),
        dkl(kl.size()), dvl(vl.size());
    const FwdArgs la{view(ql, {nl, hq, d}), view(kl, {nl, hkv, d}), view(vl, {nl, hkv, d}),
                     view(ol, {nl, hq, d}), view(ll, {nl, hq}), std::nullopt, view(r.ml, {hq})};
    runtime::calc_attn_forward(dp, comm, la, cfg.opts);
    runtime::calc_attn_backward(dp, comm,
                                {view(dol, {nl, hq, d}), la.q, la.k, la.v, la.out, la.lse,
                                 view(dql, {nl, hq, d}), view(dkl, {nl, hkv, d}),
                                 view(dvl, {nl, hkv, d}), std::nullopt, std::nullopt},
                                cfg.opts);
    if (remote_nan) {  // NaN rows here although this rank holds no non-finite K row
      const bool nan_rows = std::any_of(ll.begin(), ll.end(), [](double x) { return std::isnan(x); });
      *remote_nan = nan_rows && all_finite(kl);
    }
    runtime::undispatch(dp, comm, view(ol, {nl, hq, d}), view(r.out, {n, hq, d}));
    runtime::undispatch(dp, comm, view(ll, {nl, hq}), view(r.lse, {n, hq}));
    runtime::undispatch(dp, comm, view(dql, {nl, hq, d}), view(r.dq, {n, hq, d}));
    runtime::undispatch(dp, comm, view(dkl, {nl, hkv, d}), view(r.dk, {n, hkv, d}));
    runtime::undispatch(dp, comm, view(dvl, {nl, hkv, d}), view(r.dv, {n, hkv, d}));
    return r;
  };
  auto expect_same = [&](const Run& got, const Run& want, const std::string& what, bool bits) {
    const std::pair<const std::vector<double>*, const std::vector<double>*> pairs[] = {
        {&got.out, &want.out}, {&got.lse, &want.lse}, {&got.ml, &want.ml},
        {&got.dq, &want.dq},   {&got.dk, &want.dk},   {&got.dv, &want.dv}};
    const char* names[] = {"out", "lse", "max_logits", "dq", "dk", "dv"};
    for (int i = 0; i < 6; ++i) {
      expect_close(*pairs[i].first, *pairs[i].second, what + " " + names[i]);
      if (bits) {
        EXPECT_EQ(std::memcmp(pairs[i].first->data(), pairs[i].second->data(),
                              pairs[i].first->size() * sizeof(double)), 0)
            << what << " " << names[i] << " on rank " << comm.rank();
      }
    }
  };

  std::vector<double> q = p.q, k = p.k, v = p.v;
  for (std::int64_t c = 0; c < d; ++c) k[std::size_t((1 * hkv + 0) * d + c)] = nan;  // kv head 0
  v[std::size_t(((n - 1) * hkv + 1) * d + 2)] = inf;                                 // kv head 1
  bool remote = false;
  const Run single = run(q, k, v, false, nullptr), dist = run(q, k, v, true, &remote);
  expect_same(dist, single, "poisoned", false);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t h = 0; h < hq; ++h) {
      const bool want_nan = (h < 2 && i >= 1 && i < a) || (h >= 2 && i == n - 1);
      EXPECT_EQ(std::isnan(dist.lse[std::size_t(i * hq + h)]), want_nan) << "row " << i << " head " << h;
    }
  for (std::int64_t h = 0; h < hq; ++h) EXPECT_TRUE(std::isnan(dist.ml[std::size_t(h)])) << h;
  double any_remote = remote ? 1 : 0;
  comm.all_reduce(comm::Rows{&any_remote, 1, 1, DType::kF64}, comm::ReduceOp::kSum)->wait();
  if (cp > 1) {
    EXPECT_GE(any_remote, 1.0) << "no rank saw a NaN from a remote K row";
  }

  // Garbage in the hole (rows and keys a, a + 1) on top of the clean inputs.
  std::vector<double> qg = p.q, kg = p.k, vg = p.v;
  for (std::int64_t t : {a, a + 1})
    for (std::int64_t e = 0; e < hkv * d; ++e) {
      kg[std::size_t(t * hkv * d + e)] = e % 2 ? nan : inf;
      vg[std::size_t(t * hkv * d + e)] = e % 2 ? -inf : nan;
      qg[std::size_t(t * hq * d + e)] = nan;
    }
  const Run clean = run(p.q, p.k, p.v, true, nullptr), garbage = run(qg, kg, vg, true, nullptr);
  expect_same(garbage, clean, "hole garbage", true);
  expect_same(clean, run(p.q, p.k, p.v, false, nullptr), "clean", false);
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
  EXPECT_THROW(runtime::comm_only_seconds(dp, comm, view(g, {n - 1, 1, 8}), view(g, {n - 1, 1, 8}), false),
               magi::Error);
  // A kernel-level error (here softcap) is found before the first collective too: the
  // communicator stays usable.
  AttnOptions bad;
  bad.softcap = -1;
  const FwdArgs ok_args{a.q, a.k, a.v, a.out, a.lse, std::nullopt, std::nullopt};
  EXPECT_THROW(runtime::calc_attn_forward(dp, comm, ok_args, bad), magi::Error);
  EXPECT_NO_THROW(comm.barrier());
}

// CalcStats splits a rank's time into kernels and blocked waits; the comm-alone pass is the
// denominator of the hidden fraction.
TEST(Runtime, StatsAccountForComputeAndWaits) {
  comm::Communicator& comm = world();
  const std::int64_t n = 64 * comm.size(), d = 16;
  plan::PlanOptions po;
  po.dispatch.cp = comm.size();
  po.dispatch.chunk_size = 16;
  po.num_stages = 1;
  const plan::DistPlan dp = plan::make_plan(masks::full(n, n), po);
  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  std::vector<double> x(std::size_t(nl * d), 0.5), out(x.size()), lse(static_cast<std::size_t>(nl));
  const FwdArgs a{view(x, {nl, 1, d}), view(x, {nl, 1, d}), view(x, {nl, 1, d}),
                  view(out, {nl, 1, d}), view(lse, {nl, 1}), std::nullopt, std::nullopt};
  AttnOptions opts;
  opts.num_threads = 1;
  runtime::CalcStats stats;
  runtime::calc_attn_forward(dp, comm, a, opts, &stats);
  EXPECT_GT(stats.compute_s, 0.0);
  EXPECT_GE(stats.wait_s, 0.0);
  // One entry per kernel call: the host stage, then each remote stage with slices (a full
  // mask: every rank's one stage has some at cp > 1); they sum to the totals.
  const std::size_t calls = comm.size() > 1 ? 2 : 1;
  ASSERT_EQ(stats.stage_compute_s.size(), calls);
  ASSERT_EQ(stats.stage_wait_s.size(), calls);
  double c = 0, w = 0;
  for (std::size_t i = 0; i < calls; ++i) c += stats.stage_compute_s[i], w += stats.stage_wait_s[i];
  EXPECT_DOUBLE_EQ(c, stats.compute_s);
  EXPECT_LE(w, stats.wait_s + 1e-12);
  // A second call starts from zero (the stats describe one call).
  runtime::calc_attn_forward(dp, comm, a, opts, &stats);
  EXPECT_EQ(stats.stage_compute_s.size(), calls);
  const double fwd = runtime::comm_only_seconds(dp, comm, a.k, a.v, false);
  const double bwd = runtime::comm_only_seconds(dp, comm, a.k, a.v, true);
  EXPECT_GE(fwd, 0.0);
  EXPECT_GE(bwd, 0.0);
}

// A PreparedRank (the stage masks prepared once) gives the same bits as the masks built per
// call, forward and backward; one made from another plan or for another rank is refused before
// any collective.
TEST(Runtime, PreparedRankMatchesPerCallMasksBitwise) {
  comm::Communicator& comm = world();
  const std::int64_t n = 24 * comm.size(), d = 8;
  std::mt19937_64 rng(testing::test_seed() + 77);
  const Mask mask = masks::varlen_causal(random_cu(rng, n));
  plan::PlanOptions po;
  po.dispatch.cp = comm.size();
  po.dispatch.chunk_size = 4;
  po.num_stages = 2;
  const plan::DistPlan dp = plan::make_plan(mask, po);
  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  std::vector<double> q(std::size_t(nl * 2 * d)), kv(std::size_t(nl * d));
  for (double& x : q) x = std::normal_distribution<double>()(rng);
  for (double& x : kv) x = std::normal_distribution<double>()(rng);
  const runtime::PreparedRank pr(dp, comm.rank());
  EXPECT_EQ(pr.num_stages(), dp.ranks[std::size_t(comm.rank())].stages.size());
  const auto run = [&](const runtime::PreparedRank* prepared) {
    std::vector<double> out(q.size()), lse(std::size_t(nl * 2)), dout(q.size(), 0.25);
    std::vector<double> dq(q.size()), dk(kv.size()), dv(kv.size());
    AttnOptions opts;
    opts.num_threads = 1;
    runtime::calc_attn_forward(dp, comm, {view(q, {nl, 2, d}), view(kv, {nl, 1, d}),
                                          view(kv, {nl, 1, d}), view(out, {nl, 2, d}),
                                          view(lse, {nl, 2}), std::nullopt, std::nullopt},
                               opts, nullptr, prepared);
    runtime::calc_attn_backward(dp, comm, {view(dout, {nl, 2, d}), view(q, {nl, 2, d}),
                                           view(kv, {nl, 1, d}), view(kv, {nl, 1, d}),
                                           view(out, {nl, 2, d}), view(lse, {nl, 2}),
                                           view(dq, {nl, 2, d}), view(dk, {nl, 1, d}),
                                           view(dv, {nl, 1, d}), std::nullopt, std::nullopt},
                                opts, nullptr, prepared);
    for (auto* x : {&lse, &dq, &dk, &dv}) out.insert(out.end(), x->begin(), x->end());
    return out;
  };
  const std::vector<double> want = run(nullptr), got = run(&pr), again = run(&pr);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(want.data(), again.data(), want.size() * sizeof(double)), 0);

  // Another plan's (other stage slices), or another rank's: refused on every rank alike.
  plan::PlanOptions other = po;
  other.num_stages = 1;
  const plan::DistPlan dp1 = plan::make_plan(masks::full(n, n), other);
  const runtime::PreparedRank wrong_plan(dp1, comm.rank());
  std::vector<double> out(q.size()), lse(std::size_t(nl * 2));
  const FwdArgs a{view(q, {nl, 2, d}), view(kv, {nl, 1, d}), view(kv, {nl, 1, d}),
                  view(out, {nl, 2, d}), view(lse, {nl, 2}), std::nullopt, std::nullopt};
  EXPECT_THROW(runtime::calc_attn_forward(dp, comm, a, {}, nullptr, &wrong_plan), magi::Error);
  if (comm.size() > 1) {
    const runtime::PreparedRank wrong_rank(dp, (comm.rank() + 1) % comm.size());
    EXPECT_THROW(runtime::calc_attn_forward(dp, comm, a, {}, nullptr, &wrong_rank), magi::Error);
  }
  EXPECT_THROW(runtime::PreparedRank(dp, comm.size()), magi::Error);
  EXPECT_NO_THROW(comm.barrier());
}

// calc_attn_workspace_bytes is runtime.h's formula: two slots of the largest stage's remote
// K/V rows (and, backward, their fp32 partial dK/dV), after the largest kernel workspace.
TEST(Runtime, WorkspaceBytesFollowTheFormula) {
  comm::Communicator& comm = world();
  const std::int64_t n = 256 * comm.size(), hq = 4, hkv = 2, d = 64;
  plan::PlanOptions po;
  po.dispatch.cp = comm.size();
  po.dispatch.chunk_size = 32;
  po.num_stages = 2;
  const plan::DistPlan dp = plan::make_plan(masks::causal(n, n), po);
  const auto align = [](std::size_t b) { return (b + 255) / 256 * 256; };
  for (int r = 0; r < comm.size(); ++r) {
    const std::int64_t nl = dp.dispatch.rank_tokens(r);
    std::int64_t rows = 0;
    for (const plan::Stage& st : dp.ranks[std::size_t(r)].stages) {
      std::int64_t nr = 0;
      for (const Range k : st.remote_k_ranges) nr += k.size();
      rows = std::max(rows, nr);
    }
    const std::size_t kv = align(std::size_t(rows * hkv * d * 2));  // bf16 rows
    const std::size_t part = align(std::size_t(rows * hkv * d * 4));  // fp32 partials
    EXPECT_EQ(runtime::calc_attn_workspace_bytes(dp, r, hq, hkv, d, DType::kBF16, false),
              align(attn_forward_workspace_bytes(std::max(nl, rows), hkv)) + 4 * kv)
        << "rank " << r;
    EXPECT_EQ(runtime::calc_attn_workspace_bytes(dp, r, hq, hkv, d, DType::kBF16, true),
              align(attn_backward_workspace_bytes(nl, hq, d)) + 4 * kv + 4 * part)
        << "rank " << r;
  }
  EXPECT_THROW(runtime::calc_attn_workspace_bytes(dp, comm.size(), hq, hkv, d, DType::kBF16, false),
               magi::Error);
  EXPECT_THROW(runtime::calc_attn_workspace_bytes(dp, 0, hq, 0, d, DType::kBF16, false),
               magi::Error);
}

}  // namespace
}  // namespace magi
