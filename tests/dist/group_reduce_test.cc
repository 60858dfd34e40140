// group_reduce (sum, avg) with small integers, so every sum is exact in any order and results
// compare bit for bit; lse-merge against a closed-form long-double computation; the reduce
// arguments of real plans are the transpose of their cast arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dist_env.h"
#include "exchange_model.h"
#include "magi/error.h"
#include "magi/mask_builders.h"
#include "magi/plan.h"
#include "seed.h"

namespace magi::testing {
namespace {

constexpr std::int64_t kCols = 3;

double contribution(int rank, std::int64_t row, std::int64_t col) {
  return double((rank + 1) * 1000 + (row % 64) * 10 + col);
}

std::vector<GroupReduceArgs> transpose(const CastCase& c) {
  std::vector<GroupReduceArgs> out;
  for (const auto& a : c.args) out.push_back(plan::reduce_args(a));
  return out;
}

// Reduce over the transpose of cast case `c`: input rows = cast output rows and vice versa.
template <typename T>
void run_reduce(const CastCase& c, comm::ReduceOp op, const std::string& where) {
  auto& w = world();
  const int r = w.rank();
  const std::vector<GroupReduceArgs> args = transpose(c);
  const std::int64_t in_rows = c.output_rows[std::size_t(r)], out_rows = c.input_rows[std::size_t(r)];
  // avg divides by up to 8 sources: multiples of 840 keep every quotient an integer.
  const double unit = op == comm::ReduceOp::kAvg ? 840.0 : 1.0;
  std::vector<T> in(std::size_t(in_rows * kCols)), out(std::size_t(out_rows * kCols));
  for (std::int64_t i = 0; i < in_rows * kCols; ++i) in[std::size_t(i)] = T(unit * contribution(r, i / kCols, i % kCols));
  for (std::int64_t i = 0; i < out_rows * kCols; ++i) out[std::size_t(i)] = T(i % 7);
  constexpr DType kType = sizeof(T) == 8 ? DType::kF64 : DType::kF32;
  w.group_reduce(comm::Rows{in.data(), in_rows, kCols, kType}, comm::Rows{out.data(), out_rows, kCols, kType},
                 args[std::size_t(r)], op)
      ->wait();
  const auto want = expected_reduce(args, out_rows, r);
  for (std::int64_t row = 0; row < out_rows; ++row)
    for (std::int64_t col = 0; col < kCols; ++col) {
      const auto& from = want[std::size_t(row)];
      double expect = 0;
      for (const RowId& id : from) expect += unit * contribution(id.rank, id.row, col);
      if (op == comm::ReduceOp::kAvg && !from.empty()) expect /= double(from.size());
      expect += double((row * kCols + col) % 7);
      const T got = out[std::size_t(row * kCols + col)];
      if (got != T(expect)) {
        ADD_FAILURE() << where << ": rank " << r << " output row " << row << " col " << col << " is "
                      << got << ", expected " << expect << " from " << from.size() << " contributions";
        return;
      }
    }
}

TEST(GroupReduce, SumAndAvgOnRandomIrregularSplits) {
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0x5c);
  for (int t = 0; t < 30 && !HasFailure(); ++t) {
    const CastCase c = random_cast_case(rng, world().size(), "random case " + std::to_string(t));
    const std::string where = c.name + ", " + seed_note(seed);
    run_reduce<double>(c, comm::ReduceOp::kSum, where + " sum fp64");
    run_reduce<float>(c, comm::ReduceOp::kSum, where + " sum fp32");
    run_reduce<double>(c, comm::ReduceOp::kAvg, where + " avg fp64");
  }
}

TEST(GroupReduce, PlannerReduceArgsAreTheTranspose) {
  const int size = world().size();
  for (int m = 0; m < 4; ++m) {
    plan::PlanOptions opts;
    opts.dispatch.cp = size;
    opts.dispatch.chunk_size = 2 + m;
    opts.num_stages = m;
    const std::int64_t n = opts.dispatch.chunk_size * size * 3;
    const plan::DistPlan p = plan::make_plan(m % 2 ? masks::causal(n, n) : masks::full(n, n), opts);
    for (std::size_t t = 0; t < p.ranks[0].stages.size(); ++t) {
      CastCase c{"plan " + std::to_string(m) + " stage " + std::to_string(t), {}, {}, {}};
      for (int r = 0; r < size; ++r) {
        const auto& stage = p.ranks[std::size_t(r)].stages[t];
        const GroupReduceArgs ra = plan::reduce_args(stage.cast);
        EXPECT_EQ(ra.input_split_sizes, stage.cast.output_split_sizes) << c.name;
        EXPECT_EQ(ra.dst_rank, stage.cast.src_rank) << c.name;
        EXPECT_EQ(ra.output_split_sizes, stage.cast.input_split_sizes) << c.name;
        EXPECT_EQ(ra.src_ranks, stage.cast.dst_ranks) << c.name;
        c.args.push_back(stage.cast);
        c.input_rows.push_back(p.dispatch.rank_tokens(r));
        std::int64_t recv = 0;
        for (const Range& k : stage.remote_k_ranges) recv += k.size();
        c.output_rows.push_back(recv);
      }
      run_reduce<double>(c, comm::ReduceOp::kSum, c.name);
    }
  }
}

// lse-merge of [rows, heads, d] partial outputs; -inf lse entries (empty rows) on both sides.
template <typename T>
void run_lse(const CastCase& c, std::mt19937_64& rng, double tol, const std::string& where) {
  constexpr std::int64_t kHeads = 2, kDim = 3, kRow = kHeads * kDim;
  constexpr DType kType = sizeof(T) == 8 ? DType::kF64 : DType::kF32;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  auto& w = world();
  const int size = w.size(), r = w.rank();
  const std::vector<GroupReduceArgs> args = transpose(c);
  // Every rank generates every rank's inputs (same seed), so the expectation is local.
  std::vector<std::vector<T>> all_out(static_cast<std::size_t>(size)), all_lse(static_cast<std::size_t>(size));
  std::normal_distribution<double> normal;
  for (int q = 0; q < size; ++q) {
    const std::int64_t rows = c.output_rows[std::size_t(q)];
    for (std::int64_t i = 0; i < rows * kRow; ++i) all_out[std::size_t(q)].push_back(T(normal(rng)));
    for (std::int64_t i = 0; i < rows * kHeads; ++i)
      all_lse[std::size_t(q)].push_back(rng() % 4 == 0 ? kNegInf : T(3 * normal(rng)));
  }
  // The existing output differs per rank: draw it from a local generator so that `rng` stays
  // in step on every rank.
  std::mt19937_64 local(rng() ^ std::uint64_t(r));
  const std::int64_t out_rows = c.input_rows[std::size_t(r)];
  std::vector<T> out(std::size_t(out_rows * kRow)), lse(std::size_t(out_rows * kHeads));
  for (auto& x : out) x = T(normal(local));
  for (auto& x : lse) x = local() % 3 == 0 ? kNegInf : T(3 * normal(local));
  const std::vector<T> out0 = out, lse0 = lse;
  auto& mine_out = all_out[std::size_t(r)];
  auto& mine_lse = all_lse[std::size_t(r)];
  const std::int64_t in_rows = c.output_rows[std::size_t(r)];
  const auto& a = args[std::size_t(r)];
  w.group_reduce_lse(comm::Rows{mine_out.data(), in_rows, kRow, kType},
                     comm::Rows{mine_lse.data(), in_rows, kHeads, kType}, a.input_split_sizes, a.dst_rank,
                     comm::Rows{out.data(), out_rows, kRow, kType}, comm::Rows{lse.data(), out_rows, kHeads, kType},
                     a.output_split_sizes, a.src_ranks)
      ->wait();
  const auto want = expected_reduce(args, out_rows, r);
  for (std::int64_t row = 0; row < out_rows; ++row)
    for (std::int64_t h = 0; h < kHeads; ++h) {
      // Closed form over {existing output} + contributions, in long double.
      std::vector<std::pair<long double, const T*>> parts{
          {lse0[std::size_t(row * kHeads + h)], &out0[std::size_t(row * kRow + h * kDim)]}};
      for (const RowId& id : want[std::size_t(row)])
        parts.push_back({all_lse[std::size_t(id.rank)][std::size_t(id.row * kHeads + h)],
                         &all_out[std::size_t(id.rank)][std::size_t(id.row * kRow + h * kDim)]});
      long double m = -INFINITY;
      for (auto& p : parts) m = std::max(m, p.first);
      const T got_lse = lse[std::size_t(row * kHeads + h)];
      const T* got = &out[std::size_t(row * kRow + h * kDim)];
      if (m == -INFINITY) {
        EXPECT_EQ(got_lse, kNegInf) << where << " row " << row;
        for (std::int64_t e = 0; e < kDim; ++e) EXPECT_EQ(got[e], parts[0].second[e]) << where << " row " << row;
        continue;
      }
      long double s = 0;
      for (auto& p : parts) s += std::exp(p.first - m);
      const long double l = m + std::log(s);
      ASSERT_NEAR(double(got_lse), double(l), tol * (1 + std::abs(double(l)))) << where << " row " << row << " head " << h;
      for (std::int64_t e = 0; e < kDim; ++e) {
        long double o = 0;
        for (auto& p : parts)
          if (p.first != -INFINITY) o += std::exp(p.first - l) * p.second[e];
        ASSERT_NEAR(double(got[e]), double(o), tol * (1 + std::abs(double(o))))
            << where << " rank " << r << " row " << row << " head " << h << " elem " << e;
      }
    }
}

TEST(GroupReduce, LseMergeMatchesClosedForm) {
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0x15e);
  for (int t = 0; t < 15 && !HasFailure(); ++t) {
    const CastCase c = random_cast_case(rng, world().size(), "random case " + std::to_string(t));
    run_lse<double>(c, rng, 1e-12, c.name + " fp64, " + seed_note(seed));
    run_lse<float>(c, rng, 1e-5, c.name + " fp32, " + seed_note(seed));
  }
}

TEST(GroupReduce, RejectsLseOpAndIntegerDtypes) {
  auto& w = world();
  std::vector<std::uint16_t> buf(4);
  const comm::Rows rows{buf.data(), 4, 1, DType::kBF16};
  const std::vector<std::int64_t> none;
  EXPECT_THROW(w.group_reduce(rows, none, {}, rows, none, {}, comm::ReduceOp::kSum), Error);
  std::vector<double> d(4);
  const comm::Rows drows{d.data(), 4, 1, DType::kF64};
  EXPECT_THROW(w.group_reduce(drows, none, {}, drows, none, {}, comm::ReduceOp::kLseMerge), Error);
}

}  // namespace
}  // namespace magi::testing
