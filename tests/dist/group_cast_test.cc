// group_cast, bit-exact (docs/semantics.md §5): every element encodes (source rank, source row,
// column), so a misrouted, reordered or missing row is named in the failure; rows past the last
// output split must stay untouched. Hand-written cases first, then random irregular splits, then
// the planner's real arguments (make_plan on random masks with cp = world size).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <sstream>
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
constexpr std::uint64_t kUntouched = ~std::uint64_t(0);

std::uint64_t code(int rank, std::int64_t row, std::int64_t col) {
  return (std::uint64_t(rank) << 48) | (std::uint64_t(row) << 16) | std::uint64_t(col);
}

std::string decode(std::uint64_t x) {
  if (x == kUntouched) return "(untouched)";
  std::ostringstream os;
  os << "(rank " << (x >> 48) << ", row " << ((x >> 16) & 0xffffffffu) << ", col " << (x & 0xffff)
     << ")";
  return os.str();
}

// Runs one case on this rank; returns the received codes (for callers that check more).
std::vector<std::uint64_t> run_cast(const CastCase& c, const std::string& where) {
  auto& w = world();
  const int r = w.rank();
  std::vector<std::uint64_t> in(std::size_t(c.input_rows[std::size_t(r)] * kCols));
  std::vector<std::uint64_t> out(std::size_t(c.output_rows[std::size_t(r)] * kCols), kUntouched);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = code(r, std::int64_t(i) / kCols, std::int64_t(i) % kCols);
  const comm::Rows input{in.data(), c.input_rows[std::size_t(r)], kCols, DType::kF64};
  const comm::Rows output{out.data(), c.output_rows[std::size_t(r)], kCols, DType::kF64};
  w.group_cast(input, output, c.args[std::size_t(r)])->wait();
  const std::vector<RowId> want = expected_cast(c, r);
  for (std::size_t k = 0; k < want.size(); ++k)
    for (std::int64_t col = 0; col < kCols; ++col) {
      const std::uint64_t expect = want[k].rank < 0 ? kUntouched : code(want[k].rank, want[k].row, col);
      const std::uint64_t got = out[k * kCols + std::size_t(col)];
      if (got != expect) {
        ADD_FAILURE() << where << ": rank " << r << " output row " << k << " col " << col << " holds "
                      << decode(got) << ", expected " << decode(expect);
        return out;
      }
    }
  return out;
}

TEST(GroupCast, NaiveAllToAll) {
  // magi_notes §5.5 "naive_a2a": rank r sends one row to each rank; rank r receives row r of
  // every rank, in source order.
  const int size = world().size();
  CastCase c{"naive a2a", std::vector<GroupCollectiveArgs>(static_cast<std::size_t>(size)), {}, {}};
  for (int r = 0; r < size; ++r) {
    auto& a = c.args[std::size_t(r)];
    for (int p = 0; p < size; ++p) {
      a.input_split_sizes.push_back(1);
      a.dst_ranks.push_back({p});
      a.output_split_sizes.push_back(1);
      a.src_rank.push_back(p);
    }
    c.input_rows.push_back(size);
    c.output_rows.push_back(size);
  }
  run_cast(c, c.name);
}

TEST(GroupCast, OneSplitToEveryRankAndEmptySplits) {
  const int size = world().size();
  CastCase c{"broadcast from the last rank", std::vector<GroupCollectiveArgs>(static_cast<std::size_t>(size)), {}, {}};
  std::vector<std::int32_t> all;
  for (int r = 0; r < size; ++r) all.push_back(r);
  for (int r = 0; r < size; ++r) {
    auto& a = c.args[std::size_t(r)];
    if (r == size - 1) {
      a.input_split_sizes = {0, 4, 0};
      a.dst_ranks = {all, all, {}};
    }
    a.output_split_sizes = {2, 0, 2};
    a.src_rank = {size - 1, 0, size - 1};
    c.input_rows.push_back(r == size - 1 ? 5 : 0);  // every other rank sends nothing
    c.output_rows.push_back(6);                     // 2 rows of right padding
  }
  run_cast(c, c.name);
}

TEST(GroupCast, RejectsBadArgumentsNamingTheCulprit) {
  auto& w = world();
  std::vector<std::uint64_t> buf(4);
  const comm::Rows rows{buf.data(), 4, 1, DType::kF64};
  const std::vector<std::int64_t> splits{2, 2};
  const std::vector<std::vector<std::int32_t>> bad_dst{{0}, {w.size()}};
  const std::vector<std::int32_t> src{0};
  const std::vector<std::int64_t> one{0};
  try {
    w.group_cast(rows, splits, bad_dst, rows, one, src);
    FAIL() << "expected magi::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("destination of split 1 is rank " + std::to_string(w.size())),
              std::string::npos) << e.what();
  }
  const std::vector<std::int64_t> too_many{3, 2};
  EXPECT_THROW(w.group_cast(rows, too_many, std::vector<std::vector<std::int32_t>>{{0}, {0}}, rows,
                            one, src),
               Error);
}

TEST(GroupCast, RandomIrregularSplits) {
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  for (int t = 0; t < 40 && !HasFailure(); ++t) {
    const CastCase c = random_cast_case(rng, world().size(), "random case " + std::to_string(t));
    run_cast(c, c.name + ", " + seed_note(seed));
  }
}

// Global token of every row of a range list, in order.
std::vector<std::int64_t> tokens(const std::vector<Range>& ranges) {
  std::vector<std::int64_t> out;
  for (const Range& r : ranges)
    for (std::int64_t t = r.start; t < r.end; ++t) out.push_back(t);
  return out;
}

TEST(GroupCast, PlannerArgumentsMoveTheRightTokens) {
  auto& w = world();
  const int size = w.size();
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0xca57);
  for (int m = 0; m < 12 && !HasFailure(); ++m) {
    plan::PlanOptions opts;
    opts.dispatch.cp = size;
    opts.dispatch.chunk_size = 1 + std::int64_t(rng() % 4);
    const std::int64_t n = opts.dispatch.chunk_size * size * (1 + std::int64_t(rng() % 4));
    opts.num_stages = int(rng() % 4);
    std::vector<std::int64_t> cu{0};
    while (cu.back() < n) cu.push_back(std::min(n, cu.back() + 1 + std::int64_t(rng() % std::uint64_t(n))));
    const Mask mask = m % 3 == 0 ? masks::causal(n, n) : m % 3 == 1 ? masks::varlen_causal(cu) : masks::full(n, n);
    const plan::DistPlan p = plan::make_plan(mask, opts);
    const std::string where = "plan " + std::to_string(m) + " (n " + std::to_string(n) + "), " + seed_note(seed);
    const std::size_t num_stages = p.ranks[0].stages.size();
    for (const auto& rp : p.ranks) ASSERT_EQ(rp.stages.size(), num_stages) << where;
    for (std::size_t t = 0; t < num_stages; ++t) {
      CastCase c{where + " stage " + std::to_string(t), {}, {}, {}};
      for (int r = 0; r < size; ++r) {
        c.args.push_back(p.ranks[std::size_t(r)].stages[t].cast);
        c.input_rows.push_back(p.dispatch.rank_tokens(r));
        c.output_rows.push_back(std::int64_t(tokens(p.ranks[std::size_t(r)].stages[t].remote_k_ranges).size()));
      }
      const std::vector<std::uint64_t> out = run_cast(c, c.name);
      const auto want = tokens(p.ranks[std::size_t(w.rank())].stages[t].remote_k_ranges);
      for (std::size_t k = 0; k < want.size(); ++k) {
        const std::uint64_t x = out[k * kCols];
        ASSERT_NE(x, kUntouched) << c.name << ": receive row " << k << " was not written";
        const auto host = tokens(p.ranks[std::size_t(x >> 48)].host_ranges);
        ASSERT_EQ(host.at((x >> 16) & 0xffffffffu), want[k])
            << c.name << ": rank " << w.rank() << " receive row " << k << " got " << decode(x);
      }
    }
  }
}

}  // namespace
}  // namespace magi::testing
