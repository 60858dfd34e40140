// with_device_staging (magi/comm.h) over the real MPI communicator, its copies a host memcpy
// (src/comm/staging.h's seam: "device 0" memory is host memory here, so that the bookkeeping
// runs on a machine without a GPU; the CUDA copies run in tests/gpu). Checked: casts keep the
// rows they do not write; sums into one device output from several reductions in flight add
// up; an in-place all_reduce; host Rows go through without a copy; every other operation
// equals the MPI communicator's on host rows bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dist_env.h"
#include "exchange_model.h"
#include "seed.h"
#include "staging.h"

namespace magi::testing {
namespace {

constexpr std::int64_t kCols = 3;
std::int64_t g_copies = 0;  // copies made through the seam

void fake_copy(void* dst, const void* src, std::size_t bytes, int device, std::uintptr_t) {
  EXPECT_EQ(device, 0) << "a copy for a device the Rows did not name";
  std::memcpy(dst, src, bytes);
  ++g_copies;
}

std::unique_ptr<comm::Communicator> staged() {
  return comm::detail::with_device_staging(world(), {&fake_copy, &fake_copy});
}

comm::Rows on_device(void* data, std::int64_t rows, DType t) {
  comm::Rows r{data, rows, kCols, t};
  r.device = 0;
  r.stream = 7;  // passed through to the copies, never dereferenced
  return r;
}

TEST(DeviceStaging, CastsKeepTheRowsTheyDoNotWrite) {
  auto c = staged();
  const int r = world().rank();
  std::mt19937_64 rng(test_seed() ^ 0x57a6);
  for (int t = 0; t < 10 && !HasFailure(); ++t) {
    const CastCase cc = random_cast_case(rng, world().size(), "case " + std::to_string(t));
    std::vector<double> in(std::size_t(cc.input_rows[std::size_t(r)] * kCols));
    std::vector<double> out(std::size_t(cc.output_rows[std::size_t(r)] * kCols), -1.0);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = double(r * 100000 + std::int64_t(i));
    c->group_cast(on_device(in.data(), cc.input_rows[std::size_t(r)], DType::kF64),
                  on_device(out.data(), cc.output_rows[std::size_t(r)], DType::kF64),
                  cc.args[std::size_t(r)])
        ->wait();
    const std::vector<RowId> want = expected_cast(cc, r);
    for (std::size_t k = 0; k < want.size(); ++k)
      for (std::int64_t col = 0; col < kCols; ++col) {
        const double expect = want[k].rank < 0 ? -1.0
                                               : double(want[k].rank * 100000 +
                                                        want[k].row * kCols + col);
        ASSERT_EQ(out[k * kCols + std::size_t(col)], expect)
            << cc.name << ": rank " << r << " row " << k << " col " << col;
      }
  }
}

TEST(DeviceStaging, SumsOfReductionsInFlightIntoOneOutputAddUp) {
  auto c = staged();
  const int r = world().rank();
  std::mt19937_64 rng(test_seed() ^ 0x5eed);
  const CastCase cc = random_cast_case(rng, world().size(), "reduce");
  const GroupReduceArgs args = plan::reduce_args(cc.args[std::size_t(r)]);
  const std::int64_t in_rows = cc.output_rows[std::size_t(r)], out_rows = cc.input_rows[std::size_t(r)];
  // Two partials (as the runtime's dK of consecutive stages), small integers: exact sums.
  std::vector<float> a(std::size_t(in_rows * kCols)), b(a.size()), out(std::size_t(out_rows * kCols));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(r + 1), b[i] = float(10 * (r + 1));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = float(i % 5);
  const comm::Rows dev_out = on_device(out.data(), out_rows, DType::kF32);
  comm::WorkPtr wa = c->group_reduce(on_device(a.data(), in_rows, DType::kF32), dev_out, args,
                                     comm::ReduceOp::kSum);
  comm::WorkPtr wb = c->group_reduce(on_device(b.data(), in_rows, DType::kF32), dev_out, args,
                                     comm::ReduceOp::kSum);
  wa->wait();
  wb->wait();
  std::vector<GroupReduceArgs> all;
  for (const auto& x : cc.args) all.push_back(plan::reduce_args(x));
  const auto want = expected_reduce(all, out_rows, r);
  for (std::int64_t row = 0; row < out_rows; ++row) {
    double expect = 0;
    for (const RowId& id : want[std::size_t(row)]) expect += 11.0 * (id.rank + 1);
    for (std::int64_t col = 0; col < kCols; ++col) {
      const std::size_t i = std::size_t(row * kCols + col);
      ASSERT_EQ(out[i], float(expect + double(i % 5))) << "rank " << r << " row " << row;
    }
  }
}

TEST(DeviceStaging, AllReduceInPlaceAndHostRowsGoThrough) {
  auto c = staged();
  const int r = world().rank(), n = world().size();
  std::vector<double> x{double(r), -double(r), 1.0};
  comm::Rows rows{x.data(), 1, 3, DType::kF64};
  g_copies = 0;
  c->all_reduce(rows, comm::ReduceOp::kMax)->wait();
  EXPECT_EQ(g_copies, 0) << "host rows were copied";
  EXPECT_EQ(x, (std::vector<double>{double(n - 1), 0.0, 1.0}));
  std::vector<double> y{double(r), 2.0, -1.0};
  c->all_reduce(on_device(y.data(), 1, DType::kF64), comm::ReduceOp::kSum)->wait();
  EXPECT_EQ(g_copies, 2) << "a device all_reduce: one copy in, one back";
  EXPECT_EQ(y, (std::vector<double>{double(n * (n - 1) / 2), 2.0 * n, -1.0 * n}));
  EXPECT_TRUE(c->device_rows());
  EXPECT_EQ(c->size(), n);
  EXPECT_EQ(c->rank(), r);
}

// The other operations: staged on "device" rows, bit for bit what the MPI communicator gives on
// host rows (all_gather_v, reduce_scatter, group_reduce avg, group_reduce_lse).
TEST(DeviceStaging, EveryOtherOperationEqualsTheHostOneBitForBit) {
  auto c = staged();
  auto& w = world();
  const int r = w.rank(), n = w.size();
  std::mt19937_64 rng(test_seed() ^ 0xb17);
  std::normal_distribution<double> normal;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
  for (auto& x : counts) x = std::int64_t(rng() % 4);  // the same on every rank; some 0
  std::int64_t total = 0;
  for (auto x : counts) total += x;
  const std::int64_t mine = counts[std::size_t(r)];
  std::mt19937_64 local(rng() ^ std::uint64_t(r));
  auto draw = [&](std::int64_t rows) {
    std::vector<double> x(std::size_t(rows * kCols));
    for (auto& e : x) e = normal(local);
    return x;
  };
  {  // all_gather_v
    std::vector<double> in = draw(mine), a(std::size_t(total * kCols)), b(a.size());
    w.all_gather_v({in.data(), mine, kCols, DType::kF64}, {a.data(), total, kCols, DType::kF64},
                   counts)->wait();
    c->all_gather_v(on_device(in.data(), mine, DType::kF64), on_device(b.data(), total, DType::kF64),
                    counts)->wait();
    EXPECT_EQ(a, b) << "all_gather_v";
  }
  {  // reduce_scatter
    std::vector<double> in = draw(total), a(std::size_t(mine * kCols)), b(a.size());
    w.reduce_scatter({in.data(), total, kCols, DType::kF64}, {a.data(), mine, kCols, DType::kF64},
                     counts)->wait();
    c->reduce_scatter(on_device(in.data(), total, DType::kF64), on_device(b.data(), mine, DType::kF64),
                      counts)->wait();
    EXPECT_EQ(a, b) << "reduce_scatter";
  }
  const CastCase cc = random_cast_case(rng, n, "reduce");
  const GroupReduceArgs args = plan::reduce_args(cc.args[std::size_t(r)]);
  const std::int64_t in_rows = cc.output_rows[std::size_t(r)], out_rows = cc.input_rows[std::size_t(r)];
  {  // group_reduce avg into an output holding values (0 + x: the staged sum adds at wait)
    std::vector<double> in = draw(in_rows), a(std::size_t(out_rows * kCols), 0.0), b(a);
    w.group_reduce({in.data(), in_rows, kCols, DType::kF64}, {a.data(), out_rows, kCols, DType::kF64},
                   args, comm::ReduceOp::kAvg)->wait();
    c->group_reduce(on_device(in.data(), in_rows, DType::kF64),
                    on_device(b.data(), out_rows, DType::kF64), args, comm::ReduceOp::kAvg)->wait();
    EXPECT_EQ(a, b) << "group_reduce avg";
  }
  {  // group_reduce_lse: out rows [kCols], lse rows [1] (one head of kCols)
    std::vector<double> io = draw(in_rows), il(static_cast<std::size_t>(in_rows)), ao = draw(out_rows),
                        al(static_cast<std::size_t>(out_rows));
    for (auto& x : il) x = local() % 4 == 0 ? -INFINITY : 3 * normal(local);
    for (auto& x : al) x = local() % 3 == 0 ? -INFINITY : 3 * normal(local);
    std::vector<double> bo = ao, bl = al;
    const comm::Rows hio{io.data(), in_rows, kCols, DType::kF64}, hil{il.data(), in_rows, 1, DType::kF64};
    comm::Rows dio = on_device(io.data(), in_rows, DType::kF64), dil = dio;
    dil.data = il.data(), dil.row_elems = 1;
    comm::Rows dbl = on_device(bl.data(), out_rows, DType::kF64);
    dbl.row_elems = 1;
    w.group_reduce_lse(hio, hil, args.input_split_sizes, args.dst_rank,
                       {ao.data(), out_rows, kCols, DType::kF64}, {al.data(), out_rows, 1, DType::kF64},
                       args.output_split_sizes, args.src_ranks)->wait();
    c->group_reduce_lse(dio, dil, args.input_split_sizes, args.dst_rank,
                        on_device(bo.data(), out_rows, DType::kF64), dbl, args.output_split_sizes,
                        args.src_ranks)->wait();
    EXPECT_EQ(ao, bo) << "group_reduce_lse out";
    EXPECT_EQ(al, bl) << "group_reduce_lse lse";
  }
}

}  // namespace
}  // namespace magi::testing
