// all_gather_v / reduce_scatter / all_reduce on uneven counts (including ranks with none),
// barrier, and the timeout path: a rank that skips a call makes the others fail with a named
// magi::Error within the timeout instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dist_env.h"
#include "magi/comm.h"
#include "magi/error.h"
#include "seed.h"

namespace magi::testing {
namespace {

constexpr std::int64_t kCols = 2;

// Uneven row counts: rank r owns (r * 3) % 5 rows, so some ranks own none.
std::vector<std::int64_t> uneven_counts(int size) {
  std::vector<std::int64_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back((r * 3) % 5);
  return counts;
}

TEST(Collectives, AllGatherVUneven) {
  auto& w = world();
  const auto counts = uneven_counts(w.size());
  std::int64_t total = 0, offset = 0;
  for (int r = 0; r < w.size(); ++r) {
    if (r < w.rank()) offset += counts[std::size_t(r)];
    total += counts[std::size_t(r)];
  }
  const std::int64_t mine = counts[std::size_t(w.rank())];
  std::vector<double> in(std::size_t(mine * kCols)), out(std::size_t(total * kCols), -1);
  for (std::int64_t i = 0; i < mine * kCols; ++i) in[std::size_t(i)] = double(offset * kCols + i);
  w.all_gather_v({in.data(), mine, kCols, DType::kF64}, {out.data(), total, kCols, DType::kF64}, counts)->wait();
  for (std::int64_t i = 0; i < total * kCols; ++i) ASSERT_EQ(out[std::size_t(i)], double(i)) << "element " << i;
}

TEST(Collectives, ReduceScatterSumUneven) {
  auto& w = world();
  const auto counts = uneven_counts(w.size());
  std::int64_t total = 0, offset = 0;
  for (int r = 0; r < w.size(); ++r) {
    if (r < w.rank()) offset += counts[std::size_t(r)];
    total += counts[std::size_t(r)];
  }
  std::vector<float> in(std::size_t(total * kCols));
  for (std::int64_t i = 0; i < total * kCols; ++i) in[std::size_t(i)] = float((w.rank() + 1) * 100 + i);
  const std::int64_t mine = counts[std::size_t(w.rank())];
  std::vector<float> out(std::size_t(mine * kCols), 12345.0f);
  w.reduce_scatter({in.data(), total, kCols, DType::kF32}, {out.data(), mine, kCols, DType::kF32}, counts)->wait();
  const std::int64_t p = w.size();
  for (std::int64_t i = 0; i < mine * kCols; ++i)
    ASSERT_EQ(out[std::size_t(i)], float(100 * p * (p + 1) / 2 + p * (offset * kCols + i))) << "element " << i;
}

// Checked before anything moves, on every rank alike (comm/layout.cc: one definition for MPI
// and NCCL): the error names the operation and both row shapes.
TEST(Collectives, ReduceScatterRejectsMismatchedRows) {
  auto& w = world();
  const std::vector<std::int64_t> counts(std::size_t(w.size()), 1);
  const std::size_t n = std::size_t(w.size() * kCols);
  std::vector<double> in(n), out(n);
  try {
    w.reduce_scatter({in.data(), w.size(), kCols, DType::kF64},
                     {out.data(), 1, kCols / 2, DType::kF64}, counts);
    ADD_FAILURE() << "reduce_scatter took output rows of another width";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter: input rows are"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(w.all_gather_v({in.data(), 1, kCols, DType::kF64},
                              {out.data(), w.size(), kCols, DType::kF64},
                              std::vector<std::int64_t>(std::size_t(w.size()) + 1, 1)),
               Error);
  EXPECT_NO_THROW(w.barrier());
}

TEST(Collectives, AllReduceSumMaxAndSameBitsEverywhere) {
  auto& w = world();
  std::vector<double> sum{double(w.rank()), 1.0, 0.1 * (w.rank() + 1)};
  std::vector<double> mx{double(w.rank()), -double(w.rank()), 7.0};
  w.all_reduce({sum.data(), 3, 1, DType::kF64}, comm::ReduceOp::kSum)->wait();
  w.all_reduce({mx.data(), 3, 1, DType::kF64}, comm::ReduceOp::kMax)->wait();
  const double p = w.size();
  EXPECT_EQ(sum[0], p * (p - 1) / 2);
  EXPECT_EQ(sum[1], p);
  EXPECT_EQ(mx[0], p - 1);
  EXPECT_EQ(mx[1], 0.0);
  EXPECT_EQ(mx[2], 7.0);
  // The inexact sum of 0.1 (r + 1) must be the same bits on every rank: gather rank 0's.
  std::vector<double> zero_view{w.rank() == 0 ? sum[2] : 0.0};
  std::vector<double> ref = zero_view;
  w.all_reduce({ref.data(), 1, 1, DType::kF64}, comm::ReduceOp::kSum)->wait();
  EXPECT_EQ(ref[0], sum[2]) << "rank " << w.rank() << " holds different bits than rank 0";
  w.barrier();
}

// A NaN on any one rank, first or last in the reduction order, makes the max NaN everywhere
// (max_logits of a head that saw a NaN); -inf on every rank stays -inf.
TEST(Collectives, AllReduceMaxKeepsANanFromAnyRank) {
  auto& w = world();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int n = w.size();
  std::vector<float> x(std::size_t(n + 1), float(w.rank()));
  for (int i = 0; i < n; ++i)
    if (w.rank() == i) x[std::size_t(i)] = nan;  // element i: NaN on rank i only
  x[std::size_t(n)] = -inf;
  w.all_reduce({x.data(), 1, n + 1, DType::kF32}, comm::ReduceOp::kMax)->wait();
  for (int i = 0; i < n; ++i) EXPECT_TRUE(std::isnan(x[std::size_t(i)])) << "element " << i;
  EXPECT_EQ(x[std::size_t(n)], -inf);
}

TEST(Collectives, SkippedCallTimesOutWithANamedPeer) {
  auto& w = world();
  if (w.size() < 2) GTEST_SKIP() << "needs a peer";
  comm::mpi::MpiCommunicator c(MPI_COMM_WORLD);  // its own: this test breaks it
  c.set_timeout(std::chrono::milliseconds(400));
  const int skipper = 1;
  std::vector<double> in(std::size_t(c.size())), out(std::size_t(c.size()));
  std::vector<std::int64_t> ones(std::size_t(c.size()), 1);
  std::vector<std::vector<std::int32_t>> dst;
  std::vector<std::int32_t> src;
  for (int r = 0; r < c.size(); ++r) {
    dst.push_back({r});
    src.push_back(r);
  }
  if (c.rank() == skipper) {
    c.mark_broken("the test made this rank skip a call");
  } else {
    const auto start = std::chrono::steady_clock::now();
    try {
      c.group_cast({in.data(), c.size(), 1, DType::kF64}, ones, dst, {out.data(), c.size(), 1, DType::kF64},
                   ones, src)
          ->wait();
      ADD_FAILURE() << "rank " << c.rank() << ": expected a timeout";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("timed out after 400 ms"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1 (receive"), std::string::npos) << what;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 3.0);
    EXPECT_TRUE(c.broken());
    try {
      c.barrier();
      ADD_FAILURE() << "a broken communicator must refuse further calls";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unusable after an earlier failure"), std::string::npos) << e.what();
    }
  }
  w.barrier();
}

// The progress thread moves a large (rendezvous) message while its sender computes without
// calling MPI: the receiver's wait ends long before the sender's busy phase does. Two ranks
// only (at higher oversubscription the scheduler, not MPI, decides when anything runs).
TEST(Collectives, TransfersProgressWhileSenderComputes) {
  auto& w = world();
  ASSERT_TRUE(w.has_progress_thread()) << "main initialises MPI at MPI_THREAD_MULTIPLE";
  if (w.size() != 2) GTEST_SKIP() << "runs at world size 2";
  constexpr std::int64_t kRows = 1 << 20;  // 8 MB: far above any eager limit
  std::vector<double> in(static_cast<std::size_t>(kRows), double(w.rank())), out(in.size(), -1);
  const int peer = 1 - w.rank();
  const std::vector<std::int64_t> sizes{kRows};
  const std::vector<std::vector<std::int32_t>> dst{{peer}};
  const std::vector<std::int32_t> src{peer};
  using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for the whole host
  auto now = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  w.barrier();
  auto work = w.group_cast({in.data(), kRows, 1, DType::kF64}, sizes, dst,
                           {out.data(), kRows, 1, DType::kF64}, sizes, src);
  // times[0]: when rank 0 first calls MPI again; times[1]: when rank 1's receive completed.
  std::vector<double> times(2, 0.0);
  if (w.rank() == 0) {  // busy elsewhere without touching MPI (a sleep: CI cores are few)
    std::this_thread::sleep_for(std::chrono::seconds(1));
    times[0] = now();
    work->wait();
  } else {
    work->wait();
    times[1] = now();
  }
  EXPECT_EQ(out[0], double(peer));
  EXPECT_EQ(out.back(), double(peer));
  w.all_reduce({times.data(), 1, 2, DType::kF64}, comm::ReduceOp::kSum)->wait();
  EXPECT_LT(times[1], times[0]) << "rank 1's receive completed only after rank 0 called MPI "
                                   "again: no asynchronous progress";
  w.barrier();
}

// check_agree: equal fingerprints pass; differing ones fail on every rank with one message that
// names each group of ranks (here even vs odd ranks), and the communicator stays usable.
TEST(Collectives, CheckAgreeNamesTheDisagreeingRanks) {
  auto& w = world();
  const std::string bytes = "mask and plan";
  const std::uint64_t same = comm::fingerprint(std::as_bytes(std::span(bytes)));
  EXPECT_NO_THROW(comm::check_agree(w, same, "the key"));
  if (w.size() < 2) return;
  const std::uint64_t mine = w.rank() % 2 ? same + 1 : same;
  try {
    comm::check_agree(w, mine, "the key");
    ADD_FAILURE() << "rank " << w.rank() << ": no error for differing fingerprints";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("disagree on the key"), std::string::npos) << msg;
    std::string evens = w.size() == 2 ? "rank 0 " : "ranks 0, 2";
    std::string odds = w.size() <= 3 ? "rank 1 " : "ranks 1, 3";
    EXPECT_NE(msg.find(evens), std::string::npos) << msg;
    EXPECT_NE(msg.find(odds), std::string::npos) << msg;
  }
  EXPECT_FALSE(w.broken());
  EXPECT_NO_THROW(comm::check_agree(w, same, "the key"));
}

TEST(Collectives, FingerprintIsStableAndSeeded) {
  const std::string a = "abc";
  // FNV-1a 64 of "abc" (the published test vector): the same in every process and build.
  EXPECT_EQ(comm::fingerprint(std::as_bytes(std::span(a))), 0xe71fa2190541574bull);
  EXPECT_NE(comm::fingerprint(std::as_bytes(std::span(a)), 1),
            comm::fingerprint(std::as_bytes(std::span(a))));
}

}  // namespace
}  // namespace magi::testing
