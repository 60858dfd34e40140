// Distributed roll (docs/semantics.md §3, multi-token-prediction labels): every rank builds the
// same global rows (random bit patterns) and plan from one seed, dispatches, rolls through the
// runtime and compares bit for bit with torch.roll (or the fill-shift) computed on the global
// array, both on its local rows and after undispatch. Checks use EXPECT only, so a failing rank
// still joins every later collective instead of hanging its peers.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
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

std::vector<std::int64_t> random_cu(std::mt19937_64& rng, std::int64_t n) {
  std::vector<std::int64_t> cu{0};
  while (cu.back() < n)
    cu.push_back(std::min(n, cu.back() + 1 + std::int64_t(rng() % std::uint64_t(n / 2 + 1))));
  return cu;
}

Mask make_mask(int kind, std::mt19937_64& rng, std::int64_t n) {
  switch (kind) {
    case 0: return masks::causal(n, n);
    case 1: return masks::varlen_causal(random_cu(rng, n));
    case 2: return masks::sliding_window(n, n, {3, 1});
    default: return testing::random_mask(rng, n, n, 6);
  }
}

// Expected row bytes of a fill row (the runtime converts the double to the dtype).
std::vector<unsigned char> fill_row(DType dt, std::int64_t elems, double v) {
  std::vector<unsigned char> r(std::size_t(elems * dtype_size(dt)));
  for (std::int64_t e = 0; e < elems; ++e) {
    unsigned char* p = r.data() + e * dtype_size(dt);
    switch (dt) {
      case DType::kF64: std::memcpy(p, &v, 8); break;
      case DType::kF32: { const float f = float(v); std::memcpy(p, &f, 4); break; }
      case DType::kBF16: { const auto b = to_bf16(float(v)).bits; std::memcpy(p, &b, 2); break; }
      case DType::kF16: { const auto b = to_f16(float(v)).bits; std::memcpy(p, &b, 2); break; }
    }
  }
  return r;
}

void run_case(std::mt19937_64& rng, const std::string& where, std::int64_t shift_override,
              bool use_override) {
  comm::Communicator& comm = world();
  const int cp = comm.size();
  const bool uneven = rng() % 3 == 0;
  const std::int64_t chunk = 1 + std::int64_t(rng() % 5);
  std::int64_t n = chunk * cp * (1 + std::int64_t(rng() % 4));
  if (uneven) n += std::int64_t(rng() % std::uint64_t(chunk * cp));  // short last chunk
  const Mask mask = make_mask(int(rng() % 4), rng, n);
  plan::PlanOptions po;
  po.dispatch.cp = cp;
  po.dispatch.chunk_size = chunk;
  po.dispatch.uneven = uneven;
  po.dispatch.algorithm =
      rng() % 2 ? plan::DispatchAlgorithm::kRefined : plan::DispatchAlgorithm::kMinHeap;
  po.num_stages = 1;
  const plan::DistPlan dp = plan::make_plan(mask, po);

  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};
  const DType dt = dtypes[rng() % 4];
  const std::int64_t widths[] = {1, 3, 8, 17};
  const std::int64_t w = widths[rng() % 4];
  std::int64_t shift;
  switch (rng() % 6) {
    case 0: shift = 0; break;
    case 1: shift = n * (std::int64_t(rng() % 5) - 2); break;                       // multiple of N
    case 2: shift = std::int64_t(rng() % std::uint64_t(4 * n + 1)) + n; break;      // > N
    case 3: shift = -std::int64_t(rng() % std::uint64_t(4 * n + 1)); break;         // negative
    default: shift = std::int64_t(rng() % std::uint64_t(2 * n + 1)) - n; break;
  }
  if (use_override) shift = shift_override;
  std::optional<double> fill;
  if (rng() % 3 == 0) fill = rng() % 2 ? -100.0 : 1.5;
  const std::string tag = where + " n " + std::to_string(n) + " chunk " + std::to_string(chunk) +
                          (uneven ? " uneven" : "") + " dtype " + std::string(dtype_name(dt)) +
                          " width " + std::to_string(w) + " shift " + std::to_string(shift) +
                          (fill ? " fill " + std::to_string(*fill) : " wrap");
  SCOPED_TRACE(tag);

  const std::int64_t row = w * dtype_size(dt);
  std::vector<unsigned char> g(std::size_t(n * row)), want(g.size());
  for (auto& b : g) b = static_cast<unsigned char>(rng());
  const std::vector<unsigned char> frow = fill_row(dt, w, fill.value_or(0.0));
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t src;  // no overflow at the int64 extremes
    if (!fill)
      src = (i - (shift % n + n) % n + n) % n;  // torch.roll
    else
      src = shift <= -n || shift >= n || i - shift < 0 || i - shift >= n ? -1 : i - shift;
    if (src >= 0)
      std::memcpy(want.data() + i * row, g.data() + src * row, std::size_t(row));
    else
      std::memcpy(want.data() + i * row, frow.data(), std::size_t(row));
  }

  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  auto v = [&](std::vector<unsigned char>& b, std::int64_t rows) {
    return make_view(b.data(), dt, {rows, w});
  };
  std::vector<unsigned char> lin(std::size_t(nl * row)), lout(lin.size()), lwant(lin.size());
  runtime::dispatch(dp, comm, v(g, n), v(lin, nl));
  runtime::dispatch(dp, comm, v(want, n), v(lwant, nl));
  std::vector<unsigned char> lin_copy = lin;
  runtime::roll(dp, comm, v(lin, nl), v(lout, nl), shift, fill);
  EXPECT_TRUE(lin == lin_copy) << "input modified on rank " << comm.rank();
  EXPECT_TRUE(lout == lwant) << "local rows differ on rank " << comm.rank();
  std::vector<unsigned char> got(g.size());
  runtime::undispatch(dp, comm, v(lout, nl), v(got, n));
  EXPECT_TRUE(got == want) << "global rows differ on rank " << comm.rank();
}

TEST(Roll, MatchesTorchRollOnGlobalArray) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x4011);
  const int cases = testing::full_level() ? 300 : 60;
  for (int c = 0; c < cases; ++c) run_case(rng, testing::seed_note(seed), 0, false);
}

TEST(Roll, SpecialShifts) {  // MTP label shifts and the edges, every rank the same list
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x5417);
  for (const std::int64_t s : std::initializer_list<std::int64_t>{-1, 1, -2, 2, 0, 1000003, -1000003,
                               std::numeric_limits<std::int64_t>::max(),
                               std::numeric_limits<std::int64_t>::min()})
    for (int rep = 0; rep < 3; ++rep) run_case(rng, testing::seed_note(seed), s, true);
}

// Bad arguments throw on the calling rank before any collective (no peer is left waiting).
TEST(Roll, RejectsBadArgumentsBeforeCommunicating) {
  comm::Communicator& comm = world();
  const std::int64_t n = 4 * comm.size();
  plan::PlanOptions po;
  po.dispatch.cp = comm.size();
  po.dispatch.chunk_size = 2;
  const plan::DistPlan dp = plan::make_plan(masks::causal(n, n), po);
  const std::int64_t nl = dp.dispatch.rank_tokens(comm.rank());
  std::vector<float> a(std::size_t(nl * 4)), b(std::size_t(nl * 4)), c(std::size_t(nl * 8));
  const TensorView va = make_view(a.data(), DType::kF32, {nl, 4});
  EXPECT_THROW(runtime::roll(dp, comm, va, make_view(b.data(), DType::kF32, {nl - 1, 4}), 1),
               magi::Error);
  EXPECT_THROW(runtime::roll(dp, comm, va, make_view(c.data(), DType::kF32, {nl, 8}), 1),
               magi::Error);
  EXPECT_THROW(runtime::roll(dp, comm, va, va, 1), magi::Error);
}

}  // namespace
}  // namespace magi
