// PreparedMask (include/magi/prepared.h): a backend's state is built once per (device, key)
// and lives as long as the object; on CPU tensors a prepared mask computes exactly what its
// Mask does. The GPU side (work lists resident on the device, CUDA graphs) is
// tests/gpu/sm90_prepared_test.cc.
#include "magi/prepared.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <random>
#include <vector>

#include "attn_case.h"
#include "magi/attention.h"
#include "magi/error.h"
#include "magi/mask_builders.h"

namespace magi {
namespace {

template <class T>
void expect_same_bits(const std::vector<T>& want, const std::vector<T>& got) {
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(T)), 0);
}

struct Counted final : PreparedState {
  explicit Counted(std::size_t b) : bytes(b) {}
  std::size_t device_bytes() const override { return bytes; }
  std::size_t bytes;
};

TEST(PreparedMask, BuildsEachStateOnceAndKeepsIt) {
  const PreparedMask pm(masks::causal(64, 64));
  int builds = 0;
  const auto build = [&](std::size_t bytes) {
    return [&builds, bytes] {
      ++builds;
      return std::make_unique<Counted>(bytes);
    };
  };
  const PreparedState& a = pm.state(0, 1, build(100));
  EXPECT_EQ(&pm.state(0, 1, build(7)), &a);  // the same object, not rebuilt
  const PreparedState& b = pm.state(0, 2, build(20));
  const PreparedState& c = pm.state(1, 1, build(3));
  EXPECT_EQ(builds, 3);
  EXPECT_EQ(pm.num_states(), 3u);
  EXPECT_EQ(pm.device_bytes(), 123u);
  EXPECT_EQ(&pm.state(0, 1, build(1)), &a);  // still valid after later insertions
  EXPECT_NE(&b, &c);
  EXPECT_EQ(pm.mask(), masks::causal(64, 64));
}

TEST(PreparedMask, CpuForwardEqualsTheMaskPathBitwise) {
  std::mt19937_64 rng(12);
  const Mask mask = testing::packed_documents(rng, 300);
  const oracle::Problem p = testing::random_problem(rng, 300, 300, 4, 2, 32, {}, 0);
  std::vector<float> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()),
      v(p.v.begin(), p.v.end());
  const auto run = [&](const auto& m) {
    std::vector<float> out(q.size()), lse(std::size_t(300 * 4));
    FwdArgs a{make_view(q.data(), DType::kF32, {300, 4, 32}),
              make_view(k.data(), DType::kF32, {300, 2, 32}),
              make_view(v.data(), DType::kF32, {300, 2, 32}),
              make_view(out.data(), DType::kF32, {300, 4, 32}),
              make_view(lse.data(), DType::kF32, {300, 4}), {}, {}};
    attn_forward(m, a);
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  };
  const PreparedMask pm(mask);
  expect_same_bits(run(mask), run(pm));
  EXPECT_EQ(pm.num_states(), 0u);  // the CPU backend keeps nothing per mask
}

TEST(PreparedMask, CpuBackwardEqualsTheMaskPathBitwise) {
  std::mt19937_64 rng(21);
  const Mask mask = testing::packed_documents(rng, 200);
  oracle::Problem p = testing::random_problem(rng, 200, 200, 2, 1, 16, {}, 0);
  std::vector<double>& q = p.q;
  std::vector<double>& k = p.k;
  std::vector<double>& v = p.v;
  std::vector<double> out(q.size()), lse(400), dout(q.size(), 0.5);
  auto view = [](std::vector<double>& x, std::initializer_list<std::int64_t> shape) {
    return make_view(x.data(), DType::kF64, shape);
  };
  attn_forward(mask, FwdArgs{view(q, {200, 2, 16}), view(k, {200, 1, 16}), view(v, {200, 1, 16}),
                             view(out, {200, 2, 16}), view(lse, {200, 2}), {}, {}});
  const auto grads = [&](const auto& m) {
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
    attn_backward(m, BwdArgs{view(dout, {200, 2, 16}), view(q, {200, 2, 16}),
                             view(k, {200, 1, 16}), view(v, {200, 1, 16}),
                             view(out, {200, 2, 16}), view(lse, {200, 2}), view(dq, {200, 2, 16}),
                             view(dk, {200, 1, 16}), view(dv, {200, 1, 16}), {}, {}});
    dq.insert(dq.end(), dk.begin(), dk.end());
    dq.insert(dq.end(), dv.begin(), dv.end());
    return dq;
  };
  const PreparedMask pm(mask);
  expect_same_bits(grads(mask), grads(pm));
}

// DeviceRanges (the GPU's stale-range check): every field is checked, and a CPU call or a
// plain-Mask call refuses them, each with an error naming device_ranges.
TEST(PreparedMask, DeviceRangesAreValidated) {
  const Mask mask = masks::causal(16, 16);
  const PreparedMask pm(mask);
  std::vector<float> q(16 * 8), out(16 * 8), lse(16);
  const std::int32_t dummy[4] = {0, 16, 0, 16};
  FwdArgs a{make_view(q.data(), DType::kF32, {16, 1, 8}),
            make_view(q.data(), DType::kF32, {16, 1, 8}),
            make_view(q.data(), DType::kF32, {16, 1, 8}),
            make_view(out.data(), DType::kF32, {16, 1, 8}),
            make_view(lse.data(), DType::kF32, {16, 1}), {}, {}};
  const DeviceRanges ok{dummy, dummy + 2, nullptr, 4, 4, 1};
  const auto message = [&](const auto& m, DeviceRanges d) -> std::string {
    FwdArgs b = a;
    b.device_ranges = d;
    try {
      attn_forward(m, b);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  DeviceRanges d = ok;
  d.count = 2;
  EXPECT_NE(message(pm, d).find("device_ranges: 2 slices but the prepared mask has 1"),
            std::string::npos);
  d = ok;
  d.range_bytes = 2;
  EXPECT_NE(message(pm, d).find("are not 4 or 8 bytes"), std::string::npos);
  d = ok;
  d.type_bytes = 16;
  EXPECT_NE(message(pm, d).find("are not 4 or 8 bytes"), std::string::npos);
  d = ok;
  d.k = nullptr;
  EXPECT_NE(message(pm, d).find("null q or k ranges"), std::string::npos);
  EXPECT_NE(message(pm, ok).find("device_ranges: only for GPU calls (q is on cpu)"),
            std::string::npos);
  EXPECT_NE(message(mask, ok).find("device_ranges: only with a PreparedMask"), std::string::npos);
  EXPECT_NE(message(pm, DeviceRanges{}).find("device_ranges: 0 slices but the prepared mask has 1"),
            std::string::npos);
}

TEST(PreparedMask, WorkspaceBytesGrowWithKeysAndHeads) {
  const std::size_t base = attn_forward_workspace_bytes(0, 1);
  EXPECT_GT(base, 0u);
  EXPECT_EQ(base % 4, 0u);
  EXPECT_LT(attn_forward_workspace_bytes(32, 1), attn_forward_workspace_bytes(33, 1));
  EXPECT_LT(attn_forward_workspace_bytes(1 << 20, 1), attn_forward_workspace_bytes(1 << 20, 8));
  // One bit per key row and kv head, plus a fixed header and padding per head.
  EXPECT_LE(attn_forward_workspace_bytes(1 << 20, 8), (std::size_t(1) << 20) + 4096);
  EXPECT_THROW(attn_forward_workspace_bytes(-1, 1), Error);
}

TEST(PreparedMask, BackwardWorkspaceBytesFollowTheHeaderFormula) {
  // attention.h: 4 Hq R (D + 2) + 12 Hq R / 64 + 16, R = Nq rounded up to 64.
  for (std::int64_t nq : {0, 1, 63, 64, 65, 1000, 1 << 20})
    for (std::int64_t hq : {1, 3, 32})
      for (std::int64_t d : {64, 128}) {
        const std::size_t r = std::size_t((nq + 63) / 64 * 64);
        EXPECT_EQ(attn_backward_workspace_bytes(nq, hq, d),
                  4 * std::size_t(hq) * r * std::size_t(d + 2) + 12 * std::size_t(hq) * r / 64 + 16)
            << "Nq " << nq << " Hq " << hq << " D " << d;
      }
  EXPECT_THROW(attn_backward_workspace_bytes(-1, 1, 128), Error);
  EXPECT_THROW(attn_backward_workspace_bytes(1, 1, -128), Error);
}

}  // namespace
}  // namespace magi
