// The static solver against its properties (DESIGN "Planner property tests"): every visible
// cell computed exactly once across ranks and stages, what a sender casts is what the receiver
// expects, bytes conserved, zero redundancy, JSON round trip. Hand-picked masks first, then a
// seeded sweep over ~1k random masks (all four slice types, shared q rows) at cp 1..16.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "magi/attention.h"
#include "magi/error.h"
#include "magi/plan.h"
#include "seed.h"

namespace magi::plan {
namespace {

using ::testing::HasSubstr;

std::vector<std::int64_t> positions(const std::vector<Range>& ranges) {
  std::vector<std::int64_t> out;
  for (Range r : ranges)
    for (std::int64_t g = r.start; g < r.end; ++g) out.push_back(g);
  return out;
}

FwdArgs fwd_args(TensorView q, TensorView k, TensorView v, TensorView out, TensorView lse) {
  FwdArgs a;
  a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse;
  return a;
}

// Checks every property of one plan; `where` goes into each failure message.
void check_plan(const Mask& mask, const DistPlan& plan, const std::string& where) {
  const std::int64_t n = mask.total_seqlen_q();
  const int cp = plan.dispatch.cp;
  ASSERT_EQ(int(plan.ranks.size()), cp) << where;
  const std::size_t num_stages = plan.ranks[0].stages.size();
  std::vector<int> count(std::size_t(n * n), 0);
  std::vector<std::vector<std::int64_t>> host_pos(cp);
  std::vector<std::vector<std::vector<std::int64_t>>> recv_pos(cp);
  auto add_cells = [&](const std::vector<Slice>& slices, const std::vector<std::int64_t>& qpos,
                       const std::vector<std::int64_t>& kpos, std::vector<char>* used,
                       std::int64_t expect_area, const std::string& what) {
    std::int64_t total = 0;
    for (const Slice& s : slices) {
      ASSERT_LE(s.q_range.end, std::int64_t(qpos.size())) << where << what << to_string(s);
      ASSERT_LE(s.k_range.end, std::int64_t(kpos.size())) << where << what << to_string(s);
      ASSERT_GE(s.q_range.start, 0) << where << what;
      ASSERT_GE(s.k_range.start, 0) << where << what;
      for (std::int64_t q = s.q_range.start; q < s.q_range.end; ++q) {
        const Range ks = visible_keys(s, q);
        for (std::int64_t k = ks.start; k < ks.end; ++k) {
          ++count[std::size_t(qpos[q] * n + kpos[k])];
          if (used) (*used)[std::size_t(k)] = 1;
        }
      }
      total += area(s);
    }
    EXPECT_EQ(total, expect_area) << where << what;
  };
  std::int64_t tokens = 0;
  for (int r = 0; r < cp; ++r) {
    const RankPlan& rp = plan.ranks[r];
    ASSERT_EQ(rp.stages.size(), num_stages) << where << " rank " << r;
    host_pos[r] = positions(rp.host_ranges);
    tokens += std::int64_t(host_pos[r].size());
    add_cells(rp.host_slices, host_pos[r], host_pos[r], nullptr, rp.host_area,
              " rank " + std::to_string(r) + " host ");
    for (std::size_t t = 0; t < num_stages; ++t) {
      const Stage& st = rp.stages[t];
      const std::string what = " rank " + std::to_string(r) + " stage " + std::to_string(t) + " ";
      recv_pos[r].push_back(positions(st.remote_k_ranges));
      const auto& rv = recv_pos[r].back();
      for (std::size_t i = 0; i + 1 < st.remote_k_ranges.size(); ++i)
        EXPECT_LT(st.remote_k_ranges[i].end, st.remote_k_ranges[i + 1].start) << where << what;
      // Zero redundancy: no held row, every received row used.
      std::vector<char> used(rv.size(), 0);
      add_cells(st.slices, host_pos[r], rv, &used, st.area, what);
      for (std::size_t k = 0; k < rv.size(); ++k) {
        EXPECT_TRUE(used[k]) << where << what << "row " << rv[k] << " received but unused";
        EXPECT_FALSE(std::binary_search(host_pos[r].begin(), host_pos[r].end(), rv[k]))
            << where << what << "row " << rv[k] << " already held";
      }
    }
  }
  EXPECT_EQ(tokens, n) << where;
  // Coverage: exactly the visible cells, each once.
  std::vector<int> expect(std::size_t(n * n), 0);
  for (const Slice& s : mask.slices())
    for (std::int64_t q = s.q_range.start; q < s.q_range.end; ++q) {
      const Range ks = visible_keys(s, q);
      for (std::int64_t k = ks.start; k < ks.end; ++k) ++expect[std::size_t(q * n + k)];
    }
  for (std::int64_t q = 0; q < n; ++q)
    for (std::int64_t k = 0; k < n; ++k)
      ASSERT_EQ(count[std::size_t(q * n + k)], expect[std::size_t(q * n + k)])
          << where << " cell (" << q << ", " << k << ")";
  // Consistency per stage: i's stream to j == j's splits from i, in order; bytes conserved.
  for (std::size_t t = 0; t < num_stages; ++t) {
    std::int64_t sent = 0, received = 0;
    for (int i = 0; i < cp; ++i) {
      const GroupCollectiveArgs& a = plan.ranks[i].stages[t].cast;
      ASSERT_EQ(a.input_split_sizes.size(), a.dst_ranks.size()) << where;
      ASSERT_EQ(a.output_split_sizes.size(), a.src_rank.size()) << where;
      std::int64_t in = 0, out = 0;
      for (std::size_t s = 0; s < a.input_split_sizes.size(); ++s) {
        in += a.input_split_sizes[s];
        sent += a.input_split_sizes[s] * std::int64_t(a.dst_ranks[s].size());
        EXPECT_TRUE(std::is_sorted(a.dst_ranks[s].begin(), a.dst_ranks[s].end())) << where;
        EXPECT_EQ(std::count(a.dst_ranks[s].begin(), a.dst_ranks[s].end(), i), 0) << where;
      }
      for (std::int64_t s : a.output_split_sizes) out += s, received += s;
      EXPECT_LE(in, std::int64_t(host_pos[i].size())) << where << " rank " << i;
      EXPECT_EQ(out, std::int64_t(recv_pos[i][t].size())) << where << " rank " << i;
      const GroupReduceArgs red = reduce_args(a);
      EXPECT_EQ(red.input_split_sizes, a.output_split_sizes);
      EXPECT_EQ(red.dst_rank, a.src_rank);
      EXPECT_EQ(red.output_split_sizes, a.input_split_sizes);
      EXPECT_EQ(red.src_ranks, a.dst_ranks);
    }
    EXPECT_EQ(sent, received) << where << " stage " << t;
    for (int i = 0; i < cp; ++i)
      for (int j = 0; j < cp; ++j) {
        std::vector<std::int64_t> stream, expected;
        const GroupCollectiveArgs& a = plan.ranks[i].stages[t].cast;
        std::int64_t pos = 0;
        for (std::size_t s = 0; s < a.input_split_sizes.size(); ++s) {
          const bool to_j =
              std::find(a.dst_ranks[s].begin(), a.dst_ranks[s].end(), j) != a.dst_ranks[s].end();
          for (std::int64_t x = 0; x < a.input_split_sizes[s]; ++x, ++pos)
            if (to_j) stream.push_back(host_pos[i][std::size_t(pos)]);
        }
        const GroupCollectiveArgs& b = plan.ranks[j].stages[t].cast;
        pos = 0;
        for (std::size_t s = 0; s < b.output_split_sizes.size(); ++s)
          for (std::int64_t x = 0; x < b.output_split_sizes[s]; ++x, ++pos)
            if (b.src_rank[s] == i) expected.push_back(recv_pos[j][t][std::size_t(pos)]);
        ASSERT_EQ(stream, expected) << where << " stage " << t << " " << i << " -> " << j;
      }
  }
}

Mask random_mask(std::mt19937_64& rng, std::int64_t n) {
  std::vector<Slice> slices;
  const int tries = int(rng() % 10);
  for (int i = 0; i < tries; ++i) {
    auto pick = [&] {
      std::int64_t a = std::int64_t(rng() % std::uint64_t(n + 1));
      std::int64_t b = std::int64_t(rng() % std::uint64_t(n + 1));
      return Range{std::min(a, b), std::max(a, b)};
    };
    Slice s{pick(), pick(), MaskType(rng() % 4)};
    slices.push_back(s);
    try {
      validate_slices(n, n, slices);
    } catch (const Error&) {
      slices.pop_back();
    }
  }
  return Mask(n, n, slices);
}

TEST(PlanSolver, FullMaskCastsWholeHostToEveryone) {
  const Mask mask(64, 64, {{{0, 64}, {0, 64}, MaskType::kFull}});
  PlanOptions opts;
  opts.dispatch.cp = 4;
  opts.dispatch.chunk_size = 16;
  opts.num_stages = 1;
  const DistPlan plan = make_plan(mask, opts);
  check_plan(mask, plan, "full cp4");
  for (int r = 0; r < 4; ++r) {
    const GroupCollectiveArgs& a = plan.ranks[r].stages[0].cast;
    ASSERT_EQ(a.input_split_sizes, std::vector<std::int64_t>{16});
    std::vector<std::int32_t> others;
    for (int o = 0; o < 4; ++o)
      if (o != r) others.push_back(o);
    EXPECT_EQ(a.dst_ranks[0], others);
    EXPECT_EQ(a.src_rank, others);
  }
  const TrafficComparison tc = compare_traffic(mask, plan);
  EXPECT_EQ(tc.ours_bytes, tc.ring_bytes);
}

TEST(PlanSolver, CpOneHasNoRemoteRows) {
  const Mask mask(10, 10, {{{0, 10}, {0, 10}, MaskType::kCausal}});
  PlanOptions opts;
  const DistPlan plan = make_plan(mask, opts);
  check_plan(mask, plan, "cp1");
  ASSERT_EQ(plan.ranks[0].stages.size(), 1u);  // ties go to fewer stages
  EXPECT_TRUE(plan.ranks[0].stages[0].remote_k_ranges.empty());
  EXPECT_EQ(plan.ranks[0].host_area, 55);
}

TEST(PlanSolver, EmptyMaskAndExplicitStages) {
  const Mask mask(32, 32, {});
  PlanOptions opts;
  opts.dispatch.cp = 4;
  opts.num_stages = 3;
  const DistPlan plan = make_plan(mask, opts);
  check_plan(mask, plan, "empty");
  for (const RankPlan& rp : plan.ranks) EXPECT_EQ(rp.stages.size(), 3u);
  EXPECT_EQ(plan.predicted_seconds, 0.0);
}

TEST(PlanSolver, CausalStagesPadToTheSameCount) {
  const Mask mask(256, 256, {{{0, 256}, {0, 256}, MaskType::kCausal}});
  PlanOptions opts;
  opts.dispatch.cp = 8;
  opts.dispatch.chunk_size = 16;
  opts.num_stages = 5;
  const DistPlan plan = make_plan(mask, opts);
  check_plan(mask, plan, "causal cp8");
  EXPECT_EQ(plan, make_plan(mask, opts));  // deterministic
}

TEST(PlanSolver, AutoStagesPickFromTheCostModel) {
  const Mask mask(4096, 4096, {{{0, 4096}, {0, 4096}, MaskType::kCausal}});
  PlanOptions opts;
  opts.dispatch.cp = 4;
  opts.cost.seconds_per_message = 0;
  const DistPlan plan = make_plan(mask, opts);
  // Compute-bound with free messages: more stages hide more comm, never fewer than 1.
  EXPECT_GE(plan.ranks[0].stages.size(), 1u);
  EXPECT_LE(plan.ranks[0].stages.size(), 8u);
  opts.num_stages = int(plan.ranks[0].stages.size());
  EXPECT_EQ(make_plan(mask, opts), plan);
  for (int s = 1; s <= 8; ++s) {
    opts.num_stages = s;
    EXPECT_GE(make_plan(mask, opts).predicted_seconds, plan.predicted_seconds - 1e-12) << s;
  }
}

TEST(PlanSolver, JsonRoundTripAndErrors) {
  const Mask mask(
      96, 96, {{{0, 48}, {0, 48}, MaskType::kCausal}, {{48, 96}, {16, 96}, MaskType::kBiCausal}});
  PlanOptions opts;
  opts.dispatch.cp = 3;
  opts.cost.seconds_per_cell = 1.0 / 3.0;
  const DistPlan plan = make_plan(mask, opts);
  EXPECT_EQ(plan_from_json(plan.to_json()), plan);
  EXPECT_EQ(plan_from_json(plan.to_json(2)), plan);
  EXPECT_THAT(plan.summary(), HasSubstr("imbalance"));
  auto error_of = [](const std::string& text) {
    try {
      plan_from_json(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of("{"), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_of("{\"format\": \"x\"}"), HasSubstr("magi.plan.v1"));
  std::string text = plan.to_json();
  text.replace(text.find("\"host_area\""), 11, "\"host_arex\"");
  EXPECT_THAT(error_of(text), HasSubstr("ranks[0] has no field 'host_area'"));
}

TEST(PlanSolver, ValidationErrors) {
  auto error_of = [](const Mask& m, PlanOptions o) {
    try {
      make_plan(m, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PlanOptions opts;
  opts.dispatch.cp = 2;
  EXPECT_THAT(error_of(Mask(8, 16, {}), opts), HasSubstr("self-attention"));
  opts.num_stages = -1;
  EXPECT_THAT(error_of(Mask(8, 8, {}), opts), HasSubstr("num_stages -1"));
  opts.num_stages = 1;
  opts.cost.bytes_per_second = 0;
  EXPECT_THAT(error_of(Mask(8, 8, {}), opts), HasSubstr("bytes_per_second"));
}

// End to end: each rank runs the CPU forward (fp64) on its host slices, then on every stage
// with accumulate, over K/V rows moved by simulating group_cast from the plan's arguments;
// the merged result must equal the single-process forward to 1e-12.
TEST(PlanSolver, ForwardMatchesSingleProcess) {
  const std::uint64_t seed = magi::testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::normal_distribution<double> normal;
  constexpr std::int64_t kHeads = 2, kDim = 8, kRow = kHeads * kDim;
  for (int m = 0; m < 60; ++m) {
    PlanOptions opts;
    opts.dispatch.cp = 1 + int(rng() % 8);
    opts.dispatch.chunk_size = 1 + std::int64_t(rng() % 5);
    const std::int64_t n =
        opts.dispatch.chunk_size * opts.dispatch.cp * (1 + std::int64_t(rng() % 3));
    opts.num_stages = int(rng() % 4);
    const Mask mask = random_mask(rng, n);
    const std::string where = magi::testing::seed_note(seed) + " case " + std::to_string(m);
    const DistPlan plan = make_plan(mask, opts);
    std::vector<double> q(std::size_t(n * kRow)), k(q.size()), v(q.size());
    for (auto* t : {&q, &k, &v})
      for (double& x : *t) x = normal(rng);
    std::vector<double> out(q.size()), lse(std::size_t(n * kHeads));
    auto view = [](std::vector<double>& b, std::int64_t rows) {
      return make_view(b.data(), DType::kF64, {rows, kHeads, kDim});
    };
    attn_forward(mask, fwd_args(view(q, n), view(k, n), view(v, n), view(out, n),
                                make_view(lse.data(), DType::kF64, {n, kHeads})));
    const int cp = plan.dispatch.cp;
    auto gather = [&](const std::vector<double>& src, const std::vector<std::int64_t>& rows) {
      std::vector<double> b;
      for (std::int64_t g : rows)
        b.insert(b.end(), src.begin() + g * kRow, src.begin() + (g + 1) * kRow);
      return b;
    };
    std::vector<std::vector<std::int64_t>> host(cp);
    for (int r = 0; r < cp; ++r) host[r] = positions(plan.ranks[r].host_ranges);
    for (int j = 0; j < cp; ++j) {
      const RankPlan& rp = plan.ranks[j];
      const std::int64_t nl = std::int64_t(host[j].size());
      std::vector<double> ql = gather(q, host[j]), kl = gather(k, host[j]), vl = gather(v, host[j]);
      std::vector<double> ol(ql.size()), ll(std::size_t(nl * kHeads));
      attn_forward(Mask(nl, nl, rp.host_slices),
                   fwd_args(view(ql, nl), view(kl, nl), view(vl, nl), view(ol, nl),
                            make_view(ll.data(), DType::kF64, {nl, kHeads})));
      for (std::size_t t = 0; t < rp.stages.size(); ++t) {
        // Simulated group_cast: j's splits from i consume i's stream to j in order.
        std::vector<std::vector<std::int64_t>> stream(cp);
        for (int i = 0; i < cp; ++i) {
          const GroupCollectiveArgs& a = plan.ranks[i].stages[t].cast;
          std::int64_t pos = 0;
          for (std::size_t s = 0; s < a.input_split_sizes.size(); ++s) {
            const bool to_j = std::count(a.dst_ranks[s].begin(), a.dst_ranks[s].end(), j) > 0;
            for (std::int64_t x = 0; x < a.input_split_sizes[s]; ++x, ++pos)
              if (to_j) stream[i].push_back(host[i][std::size_t(pos)]);
          }
        }
        std::vector<std::int64_t> recv;
        std::vector<std::size_t> next(cp, 0);
        const GroupCollectiveArgs& b = rp.stages[t].cast;
        for (std::size_t s = 0; s < b.output_split_sizes.size(); ++s)
          for (std::int64_t x = 0; x < b.output_split_sizes[s]; ++x)
            recv.push_back(stream[b.src_rank[s]].at(next[b.src_rank[s]]++));
        if (rp.stages[t].slices.empty()) continue;
        const std::int64_t nr = std::int64_t(recv.size());
        std::vector<double> kr = gather(k, recv), vr = gather(v, recv);
        AttnOptions acc;
        acc.accumulate = true;
        attn_forward(Mask(nl, nr, rp.stages[t].slices),
                     fwd_args(view(ql, nl), view(kr, nr), view(vr, nr), view(ol, nl),
                              make_view(ll.data(), DType::kF64, {nl, kHeads})),
                     acc);
      }
      for (std::int64_t i = 0; i < nl; ++i) {
        const std::int64_t g = host[j][std::size_t(i)];
        for (std::int64_t h = 0; h < kHeads; ++h) {
          const double a = ll[std::size_t(i * kHeads + h)], e = lse[std::size_t(g * kHeads + h)];
          if (std::isinf(e)) {
            ASSERT_EQ(a, e) << where << " rank " << j << " row " << g;
          } else {
            ASSERT_NEAR(a, e, 1e-12) << where << " rank " << j << " row " << g;
          }
          for (std::int64_t d = 0; d < kDim; ++d)
            ASSERT_NEAR(ol[std::size_t(i * kRow + h * kDim + d)],
                        out[std::size_t(g * kRow + h * kDim + d)], 1e-12)
                << where << " rank " << j << " row " << g;
        }
      }
    }
  }
}

TEST(PlanSolver, RandomMasksSweep) {
  const std::uint64_t seed = magi::testing::test_seed();
  std::mt19937_64 rng(seed);
  const int num_masks = magi::testing::full_level() ? 4000 : 1000;
  for (int m = 0; m < num_masks; ++m) {
    PlanOptions opts;
    opts.dispatch.cp = 1 + int(rng() % 16);
    const std::int64_t chunk = 1 + std::int64_t(rng() % 6);
    const std::int64_t chunks_per_rank = 1 + std::int64_t(rng() % 3);
    std::int64_t n = chunk * chunks_per_rank * opts.dispatch.cp;
    if (rng() % 4 == 0) {
      opts.dispatch.uneven = true;
      n += std::int64_t(rng() % std::uint64_t(chunk));
    }
    opts.dispatch.chunk_size = rng() % 3 == 0 ? 0 : chunk;
    opts.dispatch.algorithm = rng() % 2 ? DispatchAlgorithm::kMinHeap : DispatchAlgorithm::kRefined;
    opts.num_stages = int(rng() % 5);
    const Mask mask = random_mask(rng, n);
    const std::string where = magi::testing::seed_note(seed) + " mask " + std::to_string(m) +
                              " cp " + std::to_string(opts.dispatch.cp) + ":\n" + mask.to_string();
    DistPlan plan;
    try {
      plan = make_plan(mask, opts);
    } catch (const Error& e) {
      ADD_FAILURE() << where << e.what();
      continue;
    }
    check_plan(mask, plan, where);
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
    if (m % 10 == 0) {
      EXPECT_EQ(plan_from_json(plan.to_json()), plan) << where;
    }
  }
}

}  // namespace
}  // namespace magi::plan
