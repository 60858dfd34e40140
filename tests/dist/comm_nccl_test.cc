// The NCCL communicator against the MPI one: every operation runs on the same inputs through
// both, NCCL on device buffers (on a stream of their own, so the event ordering is exercised)
// and MPI on host copies, and the results must agree bit for bit (casts, sums, averages, maxes;
// NaNs compare as NaN whatever their payload, row_kernels.h) or, for lse-merge, to a few ulp
// (CUDA's exp / log1p are not glibc's; the count of differing elements is printed). Random
// cases come from one seed on every rank (exchange_model.h). Then: host Rows, reductions in
// flight into one output, bad arguments rejected before anything is posted, and (np >= 2) a
// peer that never posts: the watchdog aborts and every later call throws.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dist_env.h"
#include "exchange_model.h"
#include "magi/error.h"
#include "magi/nccl.h"
#include "nccl_env.h"
#include "seed.h"

namespace magi::testing {
namespace {

using Bytes = std::vector<unsigned char>;

#define NEED_NCCL()                                                   \
  std::string skip_why;                                               \
  comm::Communicator* nccl_ptr = nccl_world(&skip_why);               \
  if (!nccl_ptr) GTEST_SKIP() << "comm_nccl_test: " << skip_why;      \
  comm::Communicator& nccl = *nccl_ptr

void ok(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

cudaStream_t test_stream() {
  static cudaStream_t s = [] {
    cudaStream_t t = nullptr;
    cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking);
    return t;
  }();
  return s;
}

// A device copy of host bytes, on the test stream.
class Dev {
 public:
  explicit Dev(const Bytes& host) : bytes_(host.size()) {
    if (bytes_ == 0) return;
    ok(cudaMallocAsync(&p_, bytes_, test_stream()), "cudaMallocAsync");
    ok(cudaMemcpyAsync(p_, host.data(), bytes_, cudaMemcpyHostToDevice, test_stream()), "upload");
    ok(cudaStreamSynchronize(test_stream()), "upload");  // host bytes may go
  }
  ~Dev() {
    if (p_) cudaFreeAsync(p_, test_stream());
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  // After the operation's wait(): queued after it on the stream.
  Bytes download() const {
    Bytes h(bytes_);
    if (bytes_ == 0) return h;
    ok(cudaMemcpyAsync(h.data(), p_, bytes_, cudaMemcpyDeviceToHost, test_stream()), "download");
    ok(cudaStreamSynchronize(test_stream()), "download");
    return h;
  }
  comm::Rows rows(std::int64_t n, std::int64_t elems, DType t) const {
    int device = 0;
    cudaGetDevice(&device);
    return {p_, n, elems, t, device, reinterpret_cast<std::uintptr_t>(test_stream())};
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

comm::Rows host_rows(Bytes& b, std::int64_t n, std::int64_t elems, DType t) {
  return {b.data(), n, elems, t};
}

// Values across 40 binades: sums round, so a different order would show.
template <typename T>
Bytes random_values(std::mt19937_64& rng, std::int64_t n) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> e(-20, 20);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& x : v) x = T(std::ldexp(u(rng), e(rng)));
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

Bytes random_bytes(std::mt19937_64& rng, std::int64_t n) {
  Bytes b(static_cast<std::size_t>(n));
  for (auto& x : b) x = static_cast<unsigned char>(rng());
  return b;
}

template <typename T>
std::vector<T> as(const Bytes& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

// Bit-identical, except that two NaNs are equal.
template <typename T>
void expect_same(const Bytes& got, const Bytes& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const auto g = as<T>(got), w = as<T>(want);
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(w[i])) continue;
    if (std::memcmp(&g[i], &w[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << " on rank " << world().rank() << ": element " << i << " is "
                    << g[i] << " on NCCL, " << w[i] << " on MPI";
      return;
    }
  }
}

void expect_same_bytes(const Bytes& got, const Bytes& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      ADD_FAILURE() << what << " on rank " << world().rank() << ": byte " << i << " differs";
      return;
    }
}

void expect_same_dtype(DType t, const Bytes& got, const Bytes& want, const std::string& what) {
  if (t == DType::kF64)
    expect_same<double>(got, want, what);
  else if (t == DType::kF32)
    expect_same<float>(got, want, what);
  else
    expect_same_bytes(got, want, what);
}

// Every split and padding of `c` times k: the same routing with long contiguous runs (the
// multi-block and 16-byte paths of the kernels).
CastCase scaled(CastCase c, std::int64_t k) {
  for (auto& a : c.args) {
    for (auto& s : a.input_split_sizes) s *= k;
    for (auto& s : a.output_split_sizes) s *= k;
  }
  for (auto& n : c.input_rows) n *= k;
  for (auto& n : c.output_rows) n *= k;
  return c;
}

std::vector<CastCase> cases(std::mt19937_64& rng, int n) {
  std::vector<CastCase> out;
  for (int t = 0; t < n; ++t) out.push_back(random_cast_case(rng, world().size(), "case " + std::to_string(t)));
  out.push_back(scaled(random_cast_case(rng, world().size(), "scaled case"), 257));
  return out;
}

TEST(NcclComm, GroupCastMatchesMpi) {
  NEED_NCCL();
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0x11);
  const int r = world().rank();
  // 32-byte rows (16-byte copies) and 6-byte rows (byte copies).
  const std::pair<DType, std::int64_t> shapes[] = {{DType::kF32, 8}, {DType::kBF16, 3}};
  for (const CastCase& c : cases(rng, 12)) {
    for (auto [t, elems] : shapes) {
      if (HasFailure()) return;
      const std::string where = c.name + " " + std::string(dtype_name(t)) + ", " + seed_note(seed);
      const std::int64_t in_n = c.input_rows[std::size_t(r)], out_n = c.output_rows[std::size_t(r)];
      const std::int64_t row = elems * dtype_size(t);
      Bytes in = random_bytes(rng, in_n * row), want = random_bytes(rng, out_n * row);
      Dev din(in), dout(want);
      nccl.group_cast(din.rows(in_n, elems, t), dout.rows(out_n, elems, t), c.args[std::size_t(r)])->wait();
      world().group_cast(host_rows(in, in_n, elems, t), host_rows(want, out_n, elems, t),
                         c.args[std::size_t(r)])->wait();
      expect_same_bytes(dout.download(), want, "group_cast " + where);
    }
  }
}

template <typename T>
void reduce_case(comm::Communicator& nccl, const CastCase& c, comm::ReduceOp op,
                 std::mt19937_64& rng, const std::string& where) {
  constexpr DType kT = sizeof(T) == 8 ? DType::kF64 : DType::kF32;
  constexpr std::int64_t kCols = 5;
  const int r = world().rank();
  const plan::GroupReduceArgs a = plan::reduce_args(c.args[std::size_t(r)]);
  const std::int64_t in_n = c.output_rows[std::size_t(r)], out_n = c.input_rows[std::size_t(r)];
  Bytes in = random_values<T>(rng, in_n * kCols), want = random_values<T>(rng, out_n * kCols);
  Dev din(in), dout(want);
  nccl.group_reduce(din.rows(in_n, kCols, kT), dout.rows(out_n, kCols, kT), a, op)->wait();
  world().group_reduce(host_rows(in, in_n, kCols, kT), host_rows(want, out_n, kCols, kT), a, op)->wait();
  expect_same<T>(dout.download(), want, "group_reduce " + comm::reduce_op_name(op) + " " + where);
}

TEST(NcclComm, GroupReduceSumAndAvgMatchMpi) {
  NEED_NCCL();
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0x22);
  for (const CastCase& c : cases(rng, 12)) {
    if (HasFailure()) return;
    const std::string where = c.name + ", " + seed_note(seed);
    for (auto op : {comm::ReduceOp::kSum, comm::ReduceOp::kAvg}) {
      reduce_case<float>(nccl, c, op, rng, "fp32 " + where);
      reduce_case<double>(nccl, c, op, rng, "fp64 " + where);
    }
  }
}

// Out values and lse (20 % -inf) of `rows` rows of `heads` heads of d. Out values in [0.5, 1):
// a merge is a convex combination, so without cancellation a few ulp bound its error.
template <typename T>
std::pair<Bytes, Bytes> lse_rows(std::mt19937_64& rng, std::int64_t rows, std::int64_t heads, std::int64_t d) {
  std::uniform_real_distribution<double> u(-3, 3), half(0.5, 1);
  std::vector<T> o(static_cast<std::size_t>(rows * heads * d));
  for (T& x : o) x = T(half(rng));
  Bytes out(o.size() * sizeof(T));
  std::memcpy(out.data(), o.data(), out.size());
  std::vector<T> lse(static_cast<std::size_t>(rows * heads));
  for (T& l : lse) l = rng() % 5 == 0 ? -std::numeric_limits<T>::infinity() : T(u(rng));
  Bytes lb(lse.size() * sizeof(T));
  std::memcpy(lb.data(), lse.data(), lb.size());
  return {out, lb};
}

// Equal -inf patterns and values within `ulps` units of roundoff of the larger magnitude;
// returns how many elements differ at all.
template <typename T>
std::int64_t expect_close(const Bytes& got, const Bytes& want, double ulps, const std::string& what) {
  const auto g = as<T>(got), w = as<T>(want);
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::memcmp(&g[i], &w[i], sizeof(T)) == 0 || (std::isnan(g[i]) && std::isnan(w[i]))) continue;
    ++differ;
    const double tol = ulps * std::numeric_limits<T>::epsilon() * std::max(std::abs(double(w[i])), 1.0);
    if (!(std::abs(double(g[i]) - double(w[i])) <= tol)) {
      ADD_FAILURE() << what << " on rank " << world().rank() << ": element " << i << " is " << g[i]
                    << " on NCCL, " << w[i] << " on MPI";
      return differ;
    }
  }
  return differ;
}

template <typename T>
std::int64_t lse_case(comm::Communicator& nccl, const CastCase& c, std::mt19937_64& rng,
                      const std::string& where) {
  constexpr DType kT = sizeof(T) == 8 ? DType::kF64 : DType::kF32;
  constexpr std::int64_t kHeads = 3, kD = 40;
  const int r = world().rank();
  const plan::GroupReduceArgs a = plan::reduce_args(c.args[std::size_t(r)]);
  const std::int64_t in_n = c.output_rows[std::size_t(r)], out_n = c.input_rows[std::size_t(r)];
  auto [io, il] = lse_rows<T>(rng, in_n, kHeads, kD);
  auto [oo, ol] = lse_rows<T>(rng, out_n, kHeads, kD);
  Dev dio(io), dil(il), doo(oo), dol(ol);
  nccl.group_reduce_lse(dio.rows(in_n, kHeads * kD, kT), dil.rows(in_n, kHeads, kT), a.input_split_sizes,
                        a.dst_rank, doo.rows(out_n, kHeads * kD, kT), dol.rows(out_n, kHeads, kT),
                        a.output_split_sizes, a.src_ranks)
      ->wait();
  world().group_reduce_lse(host_rows(io, in_n, kHeads * kD, kT), host_rows(il, in_n, kHeads, kT),
                           a.input_split_sizes, a.dst_rank, host_rows(oo, out_n, kHeads * kD, kT),
                           host_rows(ol, out_n, kHeads, kT), a.output_split_sizes, a.src_ranks)
      ->wait();
  return expect_close<T>(doo.download(), oo, 32, "lse-merge out " + where) +
         expect_close<T>(dol.download(), ol, 8, "lse-merge lse " + where);
}

TEST(NcclComm, GroupReduceLseMatchesMpiToAFewUlp) {
  NEED_NCCL();
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0x33);
  std::int64_t differ32 = 0, differ64 = 0;
  for (const CastCase& c : cases(rng, 8)) {
    if (HasFailure()) return;
    differ32 += lse_case<float>(nccl, c, rng, "fp32 " + c.name + ", " + seed_note(seed));
    differ64 += lse_case<double>(nccl, c, rng, "fp64 " + c.name + ", " + seed_note(seed));
  }
  std::printf("[rank %d] lse-merge: %lld fp32 and %lld fp64 elements differ from MPI's in some bit\n",
              world().rank(), static_cast<long long>(differ32), static_cast<long long>(differ64));
}

// Rank r holds counts[r] rows (some none).
std::vector<std::int64_t> random_counts(std::mt19937_64& rng) {
  std::vector<std::int64_t> counts;
  for (int p = 0; p < world().size(); ++p) counts.push_back(std::int64_t(rng() % 4 == 0 ? 0 : rng() % 600));
  return counts;
}

TEST(NcclComm, DenseCollectivesMatchMpi) {
  NEED_NCCL();
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0x44);
  const int r = world().rank();
  constexpr std::int64_t kCols = 6;
  for (int t = 0; t < 6 && !HasFailure(); ++t) {
    const std::string where = "trial " + std::to_string(t) + ", " + seed_note(seed);
    const auto counts = random_counts(rng);
    std::int64_t total = 0;
    for (auto n : counts) total += n;
    const std::int64_t mine = counts[std::size_t(r)];
    {  // all_gather_v of fp64 rows
      Bytes in = random_values<double>(rng, mine * kCols), want = random_values<double>(rng, total * kCols);
      Dev din(in), dout(want);
      nccl.all_gather_v(din.rows(mine, kCols, DType::kF64), dout.rows(total, kCols, DType::kF64), counts)->wait();
      world().all_gather_v(host_rows(in, mine, kCols, DType::kF64), host_rows(want, total, kCols, DType::kF64),
                           counts)->wait();
      expect_same<double>(dout.download(), want, "all_gather_v " + where);
    }
    {  // reduce_scatter (sum) of fp32
      Bytes in = random_values<float>(rng, total * kCols), want = random_values<float>(rng, mine * kCols);
      Dev din(in), dout(want);
      nccl.reduce_scatter(din.rows(total, kCols, DType::kF32), dout.rows(mine, kCols, DType::kF32), counts)->wait();
      world().reduce_scatter(host_rows(in, total, kCols, DType::kF32), host_rows(want, mine, kCols, DType::kF32),
                             counts)->wait();
      expect_same<float>(dout.download(), want, "reduce_scatter " + where);
    }
    for (auto op : {comm::ReduceOp::kSum, comm::ReduceOp::kMax}) {
      for (DType dt : {DType::kF32, DType::kF64}) {
        const std::int64_t n = std::int64_t(rng() % 300);
        Bytes data = dt == DType::kF32 ? random_values<float>(rng, n * kCols) : random_values<double>(rng, n * kCols);
        if (op == comm::ReduceOp::kMax && n > 0) {  // a NaN on one rank, and signed zeros
          const std::size_t es = std::size_t(dtype_size(dt));
          const std::size_t nan_at = std::size_t(t) % std::size_t(n * kCols);
          if (r == world().size() - 1) {
            if (dt == DType::kF32) {
              const float x = std::nanf("");
              std::memcpy(&data[nan_at * es], &x, es);
            } else {
              const double x = std::nan("");
              std::memcpy(&data[nan_at * es], &x, es);
            }
          }
          // Element 0: +0 on odd ranks, -0 on even ones (max keeps the first of equal zeros).
          if (dt == DType::kF32) {
            const float z = r % 2 ? 0.0f : -0.0f;
            std::memcpy(&data[0], &z, es);
          } else {
            const double z = r % 2 ? 0.0 : -0.0;
            std::memcpy(&data[0], &z, es);
          }
        }
        Dev d(data);
        nccl.all_reduce(d.rows(n, kCols, dt), op)->wait();
        world().all_reduce(host_rows(data, n, kCols, dt), op)->wait();
        expect_same_dtype(dt, d.download(), data,
                          "all_reduce " + comm::reduce_op_name(op) + " " + std::string(dtype_name(dt)) + " " + where);
      }
    }
  }
}

TEST(NcclComm, HostRowsWork) {
  NEED_NCCL();
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0x55);
  const int r = world().rank();
  for (const CastCase& c : cases(rng, 4)) {
    if (HasFailure()) return;
    const std::int64_t in_n = c.input_rows[std::size_t(r)], out_n = c.output_rows[std::size_t(r)];
    Bytes in = random_bytes(rng, in_n * 4), init = random_bytes(rng, out_n * 4);
    Bytes host_out = init, want = init, dev_in_out = init;
    // Host in, host out.
    nccl.group_cast(host_rows(in, in_n, 1, DType::kF32), host_rows(host_out, out_n, 1, DType::kF32),
                    c.args[std::size_t(r)])->wait();
    world().group_cast(host_rows(in, in_n, 1, DType::kF32), host_rows(want, out_n, 1, DType::kF32),
                       c.args[std::size_t(r)])->wait();
    expect_same_bytes(host_out, want, "group_cast host -> host " + c.name);
    // Device in, host out.
    Dev din(in);
    nccl.group_cast(din.rows(in_n, 1, DType::kF32), host_rows(dev_in_out, out_n, 1, DType::kF32),
                    c.args[std::size_t(r)])->wait();
    expect_same_bytes(dev_in_out, want, "group_cast device -> host " + c.name);
  }
  // all_reduce in place on host rows, as check_agree does.
  std::vector<double> x{double(r + 1), -double(r)};
  nccl.all_reduce(comm::Rows{x.data(), 1, 2, DType::kF64}, comm::ReduceOp::kSum)->wait();
  const double p = world().size();
  EXPECT_EQ(x[0], p * (p + 1) / 2);
  EXPECT_EQ(x[1], -p * (p - 1) / 2);
  nccl.barrier();
}

TEST(NcclComm, ReductionsInFlightIntoOneOutputAllLand) {
  NEED_NCCL();
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed ^ 0x66);
  const int r = world().rank();
  constexpr std::int64_t kCols = 4;
  const CastCase c = scaled(random_cast_case(rng, world().size(), "in flight"), 31);
  const plan::GroupReduceArgs a = plan::reduce_args(c.args[std::size_t(r)]);
  const std::int64_t in_n = c.output_rows[std::size_t(r)], out_n = c.input_rows[std::size_t(r)];
  std::vector<Bytes> ins;
  for (int k = 0; k < 3; ++k) ins.push_back(random_values<float>(rng, in_n * kCols));
  Bytes want = random_values<float>(rng, out_n * kCols);
  Dev dout(want);
  std::vector<std::unique_ptr<Dev>> dins;
  std::vector<comm::WorkPtr> works;
  for (const Bytes& in : ins) {  // all three posted before any wait
    dins.push_back(std::make_unique<Dev>(in));
    works.push_back(nccl.group_reduce(dins.back()->rows(in_n, kCols, DType::kF32),
                                      dout.rows(out_n, kCols, DType::kF32), a, comm::ReduceOp::kSum));
  }
  for (auto& w : works) w->wait();
  for (Bytes& in : ins)
    world().group_reduce(host_rows(in, in_n, kCols, DType::kF32), host_rows(want, out_n, kCols, DType::kF32),
                         a, comm::ReduceOp::kSum)->wait();
  expect_same<float>(dout.download(), want, "three sums in flight into one output");
}

void expect_error(const std::function<void()>& f, const std::string& needle, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no magi::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << what << ": the error does not say \"" << needle << "\": " << e.what();
  }
}

TEST(NcclComm, BadArgumentsThrowBeforeAnythingIsPosted) {
  NEED_NCCL();
  const int size = world().size();
  Bytes b(64 * 8);
  Dev d(b);
  const comm::Rows rows = d.rows(8, 16, DType::kF32);
  const std::vector<std::int64_t> too_many{9};
  const std::vector<std::vector<std::int32_t>> to_self{{world().rank()}};
  const std::vector<std::int32_t> from_self{world().rank()};
  const std::vector<std::int64_t> one{1};
  expect_error([&] { nccl.group_cast(rows, too_many, to_self, rows, one, from_self); },
               "splits sum to 9 rows but the input buffer has 8", "split sum above the rows");
  const std::vector<std::vector<std::int32_t>> to_outside{{size}};
  expect_error([&] { nccl.group_cast(rows, one, to_outside, rows, one, from_self); },
               "destination of split 0 is rank " + std::to_string(size), "rank out of range");
  comm::Rows half = rows;
  half.dtype = DType::kF16;
  const std::vector<std::int32_t> dst_self{world().rank()};
  const std::vector<std::vector<std::int32_t>> src_self{{world().rank()}};
  expect_error([&] { nccl.group_reduce(half, one, dst_self, half, one, src_self, comm::ReduceOp::kSum); },
               "fp32 or fp64, got fp16", "fp16 reduce");
  comm::Rows elsewhere = rows;
  elsewhere.device = rows.device + 1;
  expect_error([&] { nccl.all_reduce(elsewhere, comm::ReduceOp::kSum); },
               "on device " + std::to_string(rows.device + 1), "a buffer on another device");
  expect_error([&] { nccl.all_reduce(rows, comm::ReduceOp::kAvg); }, "avg is not sum or max",
               "all_reduce avg");
  EXPECT_FALSE(nccl.broken());
  nccl.barrier();  // still usable, and every rank still in step
}

// Last: it breaks the NCCL world. Rank 0 sends to rank 1, which never posts the receive.
TEST(NcclComm, ZzAPeerThatNeverPostsBreaksTheCommunicatorWithANamedError) {
  NEED_NCCL();
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks";
  if (world().rank() == 0) {
    nccl.set_timeout(std::chrono::milliseconds(1000));
    Bytes b(4 * 1024);
    Dev d(b);
    const std::vector<std::int64_t> all{1024}, none{};
    const std::vector<std::vector<std::int32_t>> to_1{{1}};
    const std::vector<std::int32_t> no_src{};
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    try {
      comm::WorkPtr w = nccl.group_cast(d.rows(1024, 1, DType::kF32), all, to_1,
                                        d.rows(1024, 1, DType::kF32), none, no_src);
      while (!nccl.broken() && std::chrono::steady_clock::now() - start < std::chrono::seconds(15))
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      w->wait();
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_TRUE(nccl.broken());
    EXPECT_NE(error.find("group_cast"), std::string::npos) << error;
    EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
    expect_error([&] { nccl.barrier(); }, "unusable after an earlier failure", "a call after the abort");
  }
  world().barrier();
}

}  // namespace
}  // namespace magi::testing
