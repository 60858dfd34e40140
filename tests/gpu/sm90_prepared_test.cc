// The sm90 forward on a PreparedMask (include/magi/prepared.h): the work list is built and
// uploaded once per (device, head dim) and reused; a call with a workspace is stream work only,
// so it can be captured in a CUDA graph and replayed with new inputs. Every result is checked
// against the fp64 oracle (sm90_support.h's rule) and, where the work list is the same, bitwise
// against the one-shot path.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn_case.h"
#include "magi/attention.h"
#include "magi/error.h"
#include "magi/mask_builders.h"
#include "magi/prepared.h"
#include "sm90_support.h"

namespace magi {
namespace {

using namespace gputest;
using oracle::FwdResult;
using oracle::Problem;

Mask documents(std::uint64_t seed, std::int64_t n) {
  std::mt19937_64 rng(seed);
  return testing::packed_documents(rng, n);
}

DeviceMem workspace_for(const Problem& p) {
  return DeviceMem(attn_forward_workspace_bytes(p.num_k, p.heads_kv));
}

FwdArgs with_workspace(FwdArgs a, const DeviceMem& ws) {
  a.workspace = Workspace{ws.get(), ws.bytes()};
  return a;
}

bool same_bits(const FwdResult& a, const FwdResult& b) {
  const auto eq = [](const std::vector<double>& x, const std::vector<double>& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
    return true;
  };
  return eq(a.out, b.out) && eq(a.lse, b.lse) && eq(a.max_logits, b.max_logits);
}

TEST(Sm90Prepared, PreparedOnceEqualsTheOneShotPathBitwise) {
  REQUIRE_GPU();
  const Mask mask = documents(3, 1500);
  Case c;
  c.sink_len = 1;
  const Problem p = make_problem(mask, c, 4);
  GpuCall once(p, c);
  attn_forward(mask, once.args(), c.opts);
  const FwdResult want = once.result();

  const PreparedMask pm(mask);
  EXPECT_EQ(pm.num_states(), 0u);
  const DeviceMem ws = workspace_for(p);
  for (int call = 0; call < 3; ++call) {  // with and without a workspace
    GpuCall g(p, c);
    attn_forward(pm, call == 1 ? g.args() : with_workspace(g.args(), ws), c.opts);
    const FwdResult got = g.result();
    EXPECT_TRUE(same_bits(got, want)) << "call " << call << " differs from the one-shot path";
    EXPECT_EQ(pm.num_states(), 1u) << "the work list must be built once, call " << call;
  }
  EXPECT_GT(pm.device_bytes(), 0u);
  compare(mask, p, c, want, describe(c, mask) + " [prepared]");
}

TEST(Sm90Prepared, OneWorkListPerTileShape) {
  REQUIRE_GPU();
  const Mask mask = masks::causal(700, 700);
  const PreparedMask pm(mask);
  std::size_t shapes = 0;
  for (std::int64_t d : {128, 64, 256}) {
    Case c;
    c.d = d;
    if (!built(c.in, c.d)) continue;
    ++shapes;
    const Problem p = make_problem(mask, c, 5);
    GpuCall g(p, c);
    attn_forward(pm, g.args(), c.opts);
    compare(mask, p, c, g.result(), describe(c, mask) + " [prepared, D " + std::to_string(d) + "]");
  }
  EXPECT_EQ(pm.num_states(), shapes);  // D 64, 128 and 256 have three different tile shapes
}

TEST(Sm90Prepared, WorkspaceFlagsDoNotCarryOverBetweenCalls) {
  REQUIRE_GPU();
  // A NaN in a seen key row makes its rows NaN; the next call on the same workspace with clean
  // inputs must not see the previous call's row flags.
  const Mask mask = masks::causal(512, 512);
  Case c;
  const PreparedMask pm(mask);
  Problem bad = make_problem(mask, c, 6);
  const Problem clean = bad;
  bad.k[std::size_t(40 * bad.heads_kv * bad.head_dim)] = std::nan("");
  const DeviceMem ws = workspace_for(clean);
  GpuCall first(bad, c);
  attn_forward(pm, with_workspace(first.args(), ws), c.opts);
  const FwdResult poisoned = first.result();
  EXPECT_TRUE(std::isnan(poisoned.lse[std::size_t(100 * bad.heads_q)]))
      << "row 100 sees key 40, which holds a NaN";
  GpuCall second(clean, c);
  attn_forward(pm, with_workspace(second.args(), ws), c.opts);
  compare(mask, clean, c, second.result(), describe(c, mask) + " [workspace reused]");
}

TEST(Sm90Prepared, CapturedGraphReplaysWithNewInputs) {
  REQUIRE_GPU();
  const Mask mask = documents(8, 2000);
  Case c;
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  c.opts.cuda_stream = reinterpret_cast<std::uintptr_t>(stream);
  const Problem p1 = make_problem(mask, c, 9), p2 = make_problem(mask, c, 10);
  for (bool prepared_before : {true, false}) {
    // Prepared before the capture (the usual warm-up), or on the first call inside it.
    const PreparedMask pm(mask);
    GpuCall g(p1, c);
    const DeviceMem ws = workspace_for(p1);
    if (prepared_before) {
      attn_forward(pm, with_workspace(g.args(), ws), c.opts);
      cuda_ok(cudaStreamSynchronize(stream), "warm-up");
    }
    cudaGraph_t graph = nullptr;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    attn_forward(pm, with_workspace(g.args(), ws), c.opts);
    cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t exec = nullptr;
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    const std::string what = describe(c, mask) + (prepared_before ? " [graph]" : " [graph, "
                                                                                 "prepared in capture]");
    for (const Problem* p : {&p1, &p2}) {  // replay, then new inputs in the same buffers
      g.q.upload(p->q);
      g.k.upload(p->k);
      g.v.upload(p->v);
      cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
      cuda_ok(cudaStreamSynchronize(stream), "graph replay");
      compare(mask, *p, c, g.result(), what);
    }
    EXPECT_EQ(pm.num_states(), 1u);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST(Sm90Prepared, BadWorkspacesAreErrorsNamingIt) {
  REQUIRE_GPU();
  const Mask mask = masks::causal(256, 256);
  Case c;
  const Problem p = make_problem(mask, c, 11);
  const PreparedMask pm(mask);
  GpuCall g(p, c);
  const std::size_t need = attn_forward_workspace_bytes(p.num_k, p.heads_kv);
  const DeviceMem ws(need + 16);
  const auto message = [&](Workspace w) -> std::string {
    FwdArgs a = g.args();
    a.workspace = w;
    try {
      attn_forward(pm, a, c.opts);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(Workspace{ws.get(), need - 1}).find("workspace: " + std::to_string(need - 1) +
                                                         " bytes, but " + std::to_string(need)),
            std::string::npos);
  const auto* base = static_cast<unsigned char*>(ws.get());
  EXPECT_NE(message(Workspace{const_cast<unsigned char*>(base) + 4, need}).find("16-byte aligned"),
            std::string::npos);
  EXPECT_NE(message(Workspace{nullptr, need}).find("workspace"), std::string::npos);
  EXPECT_EQ(message(Workspace{ws.get(), need}), "");
  sync("good workspace");
}

// The caller's ranges on the device, int32 [N, 2] q, [N, 2] k, [N] types, from a mask's slices.
struct DeviceSlices {
  DeviceMem q, k, t;
  std::int64_t n;
  explicit DeviceSlices(const Mask& m)
      : q(16 * m.size() + 16), k(16 * m.size() + 16), t(8 * m.size() + 16), n(std::int64_t(m.size())) {
    std::vector<std::int32_t> qs, ks, ts;
    for (const Slice& sl : m.slices()) {
      qs.insert(qs.end(), {std::int32_t(sl.q_range.start), std::int32_t(sl.q_range.end)});
      ks.insert(ks.end(), {std::int32_t(sl.k_range.start), std::int32_t(sl.k_range.end)});
      ts.push_back(std::int32_t(sl.type));
    }
    put(q, qs);
    put(k, ks);
    put(t, ts);
  }
  static void put(DeviceMem& d, const std::vector<std::int32_t>& v) {
    std::vector<unsigned char> bytes(d.bytes(), 0);
    std::memcpy(bytes.data(), v.data(), v.size() * sizeof(std::int32_t));
    d.upload(bytes);
  }
  DeviceRanges view() const { return DeviceRanges{q.get(), k.get(), t.get(), 4, 4, n}; }
};

TEST(Sm90Prepared, DeviceRangesThatDifferFromThePreparedOnesGiveNan) {
  REQUIRE_GPU();
  const Mask mask = documents(13, 1200);
  Case c;
  const Problem p = make_problem(mask, c, 14);
  const PreparedMask pm(mask);
  GpuCall plain(p, c);
  attn_forward(pm, plain.args(), c.opts);
  const FwdResult want = plain.result();
  const DeviceSlices same(mask);
  GpuCall checked(p, c);
  FwdArgs a = checked.args();
  a.device_ranges = same.view();
  attn_forward(pm, a, c.opts);
  EXPECT_TRUE(same_bits(checked.result(), want)) << "matching ranges must change nothing";

  // Other ranges than the prepared ones (one slice's end moved, or one type): all NaN.
  std::vector<Slice> moved = mask.slices();
  moved.back().q_range.end -= 1;
  std::vector<Slice> retyped = mask.slices();
  retyped.front().type = retyped.front().type == MaskType::kCausal ? MaskType::kFull
                                                                   : MaskType::kCausal;
  for (const auto& other : {moved, retyped}) {
    const DeviceSlices stale(Mask(mask.total_seqlen_q(), mask.total_seqlen_k(), other));
    GpuCall g(p, c);
    FwdArgs b = g.args();
    b.device_ranges = stale.view();
    attn_forward(pm, b, c.opts);
    const FwdResult got = g.result();
    std::size_t finite = 0;
    for (double x : got.out) finite += !std::isnan(x);
    for (double x : got.lse) finite += !std::isnan(x);
    for (double x : got.max_logits) finite += !std::isnan(x);
    EXPECT_EQ(finite, 0u) << "stale ranges must make every out, lse and max_logits NaN";
  }
  // Validation: the count must be the prepared mask's, and only prepared calls take them.
  DeviceRanges wrong = same.view();
  wrong.count += 1;
  a.device_ranges = wrong;
  EXPECT_THROW(attn_forward(pm, a, c.opts), Error);
  a.device_ranges = same.view();
  EXPECT_THROW(attn_forward(mask, a, c.opts), Error);
  sync("device ranges");
}

TEST(Sm90Prepared, OneWorkspaceKeepsNoStateBetweenCalls) {
  REQUIRE_GPU();
  // The workspace carries its bookkeeping from call to call (fwd_params.h FwdWorkspaceLayout:
  // no memset): starting from garbage (DeviceMem fills 0xff), a call with stale ranges, one
  // with a NaN in K and clean calls in any order on the one workspace each give their own
  // result, bit for bit.
  const Mask mask = masks::causal(1200, 1200);
  Case c;
  const Problem clean = make_problem(mask, c, 15);
  Problem bad = clean;
  bad.k[std::size_t(300 * bad.heads_kv * bad.head_dim)] = std::nan("");
  const PreparedMask pm(mask);
  GpuCall ref(clean, c);
  attn_forward(pm, ref.args(), c.opts);
  const FwdResult want = ref.result();
  const DeviceSlices same(mask);
  std::vector<Slice> moved = mask.slices();
  moved.back().q_range.end -= 1;
  const DeviceSlices stale(Mask(mask.total_seqlen_q(), mask.total_seqlen_k(), moved));
  const DeviceMem ws = workspace_for(clean);
  enum Kind { kClean, kStale, kNan };
  for (Kind kind : {kClean, kStale, kClean, kNan, kClean, kNan, kStale, kStale, kClean, kClean}) {
    GpuCall g(kind == kNan ? bad : clean, c);
    FwdArgs a = with_workspace(g.args(), ws);
    a.device_ranges = kind == kStale ? stale.view() : same.view();
    attn_forward(pm, a, c.opts);
    const FwdResult got = g.result();
    if (kind == kClean) {
      EXPECT_TRUE(same_bits(got, want)) << "a clean call after others on the same workspace";
    } else if (kind == kStale) {
      std::size_t finite = 0;
      for (double x : got.lse) finite += !std::isnan(x);
      EXPECT_EQ(finite, 0u) << "stale ranges: every lse NaN";
    } else {
      EXPECT_TRUE(std::isnan(got.lse[std::size_t(400 * clean.heads_q)])) << "row 400 sees key 300";
      EXPECT_EQ(got.lse[std::size_t(10 * clean.heads_q)], want.lse[std::size_t(10 * clean.heads_q)])
          << "row 10 does not see key 300";
    }
  }
  sync("one workspace");
}

}  // namespace
}  // namespace magi
