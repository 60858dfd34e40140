// The sm90 backward (work in progress, src/kernels/sm90/bwd_kernel.cuh) against the fp64 oracle.
// Each case runs the GPU forward, then the GPU backward on its out (bf16 / fp16) and lse, and
// compares dq, dk, dv (and dsink) with oracle::backward on the same rounded inputs, each at the
// scale of the largest gradient, by docs/semantics.md §5's rule: at most twice the error of
// the same-precision naive backward (naive_backward, sm90_support.h) plus a sixteenth of the
// dtype's unit roundoff. Unwritten outputs stay NaN and fail.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attn_case.h"
#include "magi/attention.h"
#include "magi/mask_builders.h"
#include "sm90_support.h"

namespace magi {
namespace {

using namespace gputest;

struct BwdGot {
  std::vector<double> dq, dk, dv, dsink;
};

BwdGot run_backward(const Mask& mask, const Problem& p, const Case& c, bool accumulate = false,
                    double seed_value = 0.0) {
  GpuCall fwd(p, c);
  attn_forward(mask, fwd.args(), c.opts);
  sync("forward");
  const DType grad = accumulate ? DType::kF32 : c.in;
  DevTensor dout(c.in, {p.num_q, p.heads_q, p.head_dim});
  dout.upload(p.dout);
  DevTensor dq(grad, {p.num_q, p.heads_q, p.head_dim});
  DevTensor dk(grad, {p.num_k, p.heads_kv, p.head_dim});
  DevTensor dv(grad, {p.num_k, p.heads_kv, p.head_dim});
  std::optional<DevTensor> dsink;
  if (accumulate)
    for (DevTensor* t : {&dq, &dk, &dv})
      t->upload(std::vector<double>(std::size_t(numel_of(t->shape)), seed_value));
  BwdArgs a{dout.view, fwd.q.view, fwd.k.view, fwd.v.view, fwd.out.view, fwd.lse.view,
            dq.view,   dk.view,    dv.view,    std::nullopt, std::nullopt};
  if (fwd.sink) {
    a.sink = fwd.sink->view;
    dsink.emplace(DType::kF32, sink_shape(p));
    if (accumulate) dsink->upload(std::vector<double>(std::size_t(numel_of(dsink->shape)), seed_value));
    a.dsink = dsink->view;
  }
  AttnOptions opts = c.opts;
  opts.accumulate = accumulate;
  attn_backward(mask, a, opts);
  sync("backward");
  BwdGot got{dq.download(), dk.download(), dv.download(), {}};
  if (dsink) got.dsink = dsink->download();
  return got;
}

// §5's rule for each gradient: err(gpu) <= 2 err(naive) + u / 16, errors vs the oracle at the
// scale of the largest of dq, dk, dv (dsink at its own).
void expect_grads(const BwdGot& got, const oracle::BwdResult& want,
                  const oracle::BwdResult& naive, DType in, const std::string& what) {
  const double scale = testing::grad_scale(want), tiny = testing::unit_roundoff(in) / 16;
  auto one = [&](const char* name, const std::vector<double>& g, const std::vector<double>& n,
                 const std::vector<double>& w, double at) {
    const double e = testing::err_at_scale(g, w, at), en = testing::err_at_scale(n, w, at);
    EXPECT_TRUE(std::isfinite(en)) << "test bug: the naive " << name
                                   << " disagrees with the oracle on NaN/inf: " << what;
    EXPECT_LE(e, 2 * en + tiny) << name << " error " << e << " vs the naive one's " << en
                                << ": " << what;
  };
  one("dq", got.dq, naive.dq, want.dq, scale);
  one("dk", got.dk, naive.dk, want.dk, scale);
  one("dv", got.dv, naive.dv, want.dv, scale);
  if (!want.dsink.empty())
    one("dsink", got.dsink, naive.dsink, want.dsink, testing::max_abs(want.dsink));
}

// One GPU backward of `mask` against the oracle; false when the variant is not built.
bool check_backward(const Mask& mask, const Case& c, std::uint64_t seed = 1,
                    const std::string& note = "") {
  if (!built(c.in, c.d)) return false;
  const Problem p = make_problem(mask, c, seed);
  const BwdGot got = run_backward(mask, p, c);
  expect_grads(got, oracle::backward(mask, p), naive_backward(mask, p, c.in, c.in), c.in,
               describe(c, mask) + (note.empty() ? "" : " (" + note + ")"));
  return true;
}

TEST(Sm90Backward, DenseMasksWithLengthsNotMultipleOfTheTiles) {
  REQUIRE_GPU();
  for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{300, 300},
                        {77, 300},
                        {300, 77},
                        {129, 257},
                        {1, 1}}) {
    check_backward(masks::full(sq, sk), Case{});
    check_backward(masks::causal(sq, sk), Case{}, 2, "causal");
  }
  Case fp16;
  fp16.in = fp16.out = DType::kF16;
  check_backward(masks::causal(1000, 1000), fp16, 3, "fp16");
}

TEST(Sm90Backward, DocumentsWindowsAndOverlappingSlices) {
  REQUIRE_GPU();
  std::mt19937_64 rng(7);
  std::vector<std::int64_t> lens;
  for (int i = 0; i < 40; ++i)
    lens.push_back(std::uniform_int_distribution<std::int64_t>(1, 40)(rng));
  lens.insert(lens.begin() + 20, 700);
  const auto cu = prefix_sums(lens);
  check_backward(masks::varlen_causal(cu), Case{}, 1, "varlen causal");
  check_backward(masks::varlen_full(cu), Case{}, 2, "varlen full");
  check_backward(masks::sliding_window(700, 900, {64, 32}), Case{}, 3, "window (64, 32)");
  // Overlapping q ranges and overlapping k ranges (no cell in two slices), all four types.
  const Mask overlap(500, 600,
                     {Slice{{0, 300}, {0, 100}, MaskType::kFull},
                      Slice{{0, 500}, {100, 350}, MaskType::kCausal},
                      Slice{{100, 400}, {450, 600}, MaskType::kInvCausal},
                      Slice{{200, 500}, {0, 100}, MaskType::kCausal},
                      Slice{{150, 450}, {300, 450}, MaskType::kBiCausal}});
  check_backward(overlap, Case{}, 4, "overlapping slices");
}

TEST(Sm90Backward, GqaMqaAndSinks) {
  REQUIRE_GPU();
  const Mask mask(600, 700,
                  {Slice{{0, 600}, {100, 700}, MaskType::kCausal},
                   Slice{{0, 600}, {0, 16}, MaskType::kFull}});
  for (std::int64_t hkv : {8, 2, 1}) {
    Case c;
    c.hq = 8;
    c.hkv = hkv;
    check_backward(mask, c, 1, hkv == 8 ? "MHA" : hkv == 1 ? "MQA" : "GQA");
  }
  for (SinkLayout layout : {SinkLayout::kSH, SinkLayout::kSSH}) {
    Case c;
    c.sink_len = 2;
    c.opts.sink_layout = layout;
    check_backward(masks::varlen_causal(prefix_sums({5, 300, 3, 200})), c, 5, "sink");
  }
}

TEST(Sm90Backward, AccumulateAddsIntoTheGivenGradients) {
  REQUIRE_GPU();
  const Mask mask = masks::causal(400, 400);
  const Case c;
  if (!built(c.in, c.d)) return;
  const Problem p = make_problem(mask, c, 9);
  const BwdGot got = run_backward(mask, p, c, true, 0.25);
  // Into fp32 buffers holding 0.25: the sums shift by 0.25 (the naive one too).
  auto shifted = [](oracle::BwdResult r) {
    for (std::vector<double>* x : {&r.dq, &r.dk, &r.dv})
      for (double& e : *x) e += 0.25;
    return r;
  };
  const oracle::BwdResult naive = naive_backward(mask, p, c.in, DType::kF32);
  expect_grads(got, shifted(oracle::backward(mask, p)), shifted(naive), c.in, "accumulate");
}

TEST(Sm90Backward, HeadDims64192And256) {
  // D 64 splits dQ over the warpgroups' keys (both add into one accumulator chunk per block);
  // D 192 and 256 split dK and dV over D (64-key tiles, both warpgroups on the same keys; at
  // 192 in 64-byte swizzle atoms, at 256 dQ in two pieces per warpgroup): dense, causal off
  // the tiles, documents, overlapping slices, GQA, sinks, bf16 and fp16, where built.
  REQUIRE_GPU();
  for (std::int64_t d : {64, 192, 256})
    for (DType t : {DType::kBF16, DType::kF16}) {
      Case c;
      c.d = d;
      c.in = c.out = t;
      const std::string what = "D " + std::to_string(d) + (t == DType::kBF16 ? " bf16 " : " fp16 ");
      if (!check_backward(masks::full(300, 257), c, 1, what + "full")) continue;
      check_backward(masks::causal(129, 400), c, 2, what + "causal");
      check_backward(masks::varlen_causal(prefix_sums({5, 300, 3, 200, 64})), c, 3,
                     what + "varlen causal");
      const Mask overlap(300, 300,  // overlapping q ranges, no cell in two slices
                         {Slice{{0, 300}, {0, 100}, MaskType::kFull},
                          Slice{{50, 250}, {100, 300}, MaskType::kCausal},
                          Slice{{250, 300}, {100, 300}, MaskType::kInvCausal}});
      check_backward(overlap, c, 4, what + "overlapping");
      c.hq = 8;
      c.hkv = 2;
      c.sink_len = 2;
      check_backward(masks::causal(300, 300), c, 5, what + "GQA sink");
    }
}

TEST(Sm90Backward, Softcap) {
  // The chain rule's 1 - tanh^2 from P itself (bwd_kernel.cuh): caps that bend few logits (30),
  // many (5) and nearly all (1), a negative scale, D 64, GQA and a window off the tiles.
  REQUIRE_GPU();
  for (double cap : {30.0, 5.0, 1.0}) {
    Case c;
    c.opts.softcap = cap;
    check_backward(masks::causal(300, 300), c, 1, "softcap causal");
    c.hq = 8;
    c.hkv = 2;
    check_backward(masks::sliding_window(300, 420, {64, 32}), c, 2, "softcap GQA window");
  }
  Case neg;
  neg.opts.softcap = 5.0;
  neg.opts.softmax_scale = -0.2;
  check_backward(masks::full(200, 333), neg, 3, "softcap, negative scale");
  for (std::int64_t d : {64, 192, 256}) {
    Case other;
    other.d = d;
    other.opts.softcap = 5.0;
    check_backward(masks::varlen_causal(prefix_sums({5, 300, 3, 200})), other, 4,
                   "softcap D " + std::to_string(d));
  }
}

TEST(Sm90Backward, DeterministicIsBitwiseRepeatable) {
  // Overlapping q ranges (several tiles and pieces add into the same dq blocks; no cell in two
  // slices), GQA, a document mask and both head dims: two runs bit for bit equal, and right.
  REQUIRE_GPU();
  const Mask overlap(700, 600,
                     {Slice{{0, 350}, {0, 300}, MaskType::kFull},
                      Slice{{0, 700}, {300, 600}, MaskType::kCausal},
                      Slice{{350, 700}, {0, 300}, MaskType::kInvCausal}});
  const Mask docs = masks::varlen_causal(prefix_sums({5, 300, 3, 200, 64, 129}));
  for (std::int64_t d : {128, 64, 192, 256})
    for (const Mask* mask : {&overlap, &docs}) {
      Case c;
      c.d = d;
      c.hq = 8;
      c.hkv = 2;
      c.opts.deterministic = true;
      if (!check_backward(*mask, c, 6, "deterministic")) continue;
      const Problem p = make_problem(*mask, c, 6);
      const BwdGot a = run_backward(*mask, p, c), b = run_backward(*mask, p, c);
      EXPECT_EQ(a.dq, b.dq) << "dq, D " << d;
      EXPECT_EQ(a.dk, b.dk) << "dk, D " << d;
      EXPECT_EQ(a.dv, b.dv) << "dv, D " << d;
    }
}

// sm_margin larger than the SM count leaves one CTA for the backward and for its dq pass: it
// loops over every (k tile, head) item, reusing its rings, dS and dQ staging buffers from item
// to item; GQA, a sink and deterministic mode's tickets on the same CTA; the launches go to a
// user stream. scripts/gpu_test.sh runs the D 128 case under racecheck. Small: racecheck tracks
// every shared-memory access and barrier arrival (at 700 tokens and 4 q heads it did not
// finish in 245 s on the H200).
void one_cta_on_a_user_stream(std::int64_t d) {
  const UserStream stream;
  std::mt19937_64 rng(61);
  const Mask mask = testing::packed_documents(rng, 400);
  for (bool deterministic : {false, true}) {
    Case c;
    c.d = d;
    c.hq = 2;
    c.hkv = 1;
    c.sink_len = 1;
    c.opts.deterministic = deterministic;
    stream.one_cta(c.opts);
    check_backward(mask, c, 62, deterministic ? "one CTA, deterministic" : "one CTA");
  }
}
TEST(Sm90Backward, OneCtaOnAUserStreamD128) {
  REQUIRE_GPU();
  one_cta_on_a_user_stream(128);
}
TEST(Sm90Backward, OneCtaOnAUserStreamD64192And256) {
  REQUIRE_GPU();
  for (std::int64_t d : {64, 192, 256}) one_cta_on_a_user_stream(d);
}

TEST(Sm90Backward, OutAndDqOffTheSixteenByteGrid) {
  // out and dq as views with rows H * D + 1 elements apart (rows off 16-byte boundaries): the
  // row pass and the dq pass take their per-element paths instead of 16-byte accesses; bf16
  // and fp32 (accumulate) dq; the same rule against the oracle.
  REQUIRE_GPU();
  const Mask mask = masks::varlen_causal(prefix_sums({5, 300, 3, 200}));
  for (bool accumulate : {false, true}) {
    Case c;
    c.hq = 4;
    c.hkv = 2;
    if (!built(c.in, c.d)) return;
    const Problem p = make_problem(mask, c, 12);
    const std::int64_t row = p.heads_q * p.head_dim, pitch = row + 1;
    const std::vector<std::int64_t> shape{p.num_q, p.heads_q, p.head_dim},
        strides{pitch, p.head_dim, 1};
    const DType grad = accumulate ? DType::kF32 : c.in;
    const std::size_t out_es = std::size_t(dtype_size(c.out)), dq_es = std::size_t(dtype_size(grad));
    DeviceMem out(std::size_t(p.num_q * pitch) * out_es), dq(std::size_t(p.num_q * pitch) * dq_es);
    out.fill_nan();
    dq.fill_nan();
    GpuCall fwd(p, c);
    FwdArgs fa = fwd.args();
    fa.out = device_view(out.get(), c.out, shape, strides);
    attn_forward(mask, fa, c.opts);
    sync("forward");
    if (accumulate) {  // dq starts at 0 (the padding stays NaN)
      const std::vector<unsigned char> zeros(std::size_t(row) * dq_es, 0);
      for (std::int64_t q = 0; q < p.num_q; ++q)
        cuda_ok(cudaMemcpy(static_cast<unsigned char*>(dq.get()) + std::size_t(q * pitch) * dq_es,
                           zeros.data(), zeros.size(), cudaMemcpyHostToDevice),
                "dq zeroing");
    }
    DevTensor dout(c.in, shape), dk(grad, {p.num_k, p.heads_kv, p.head_dim}),
        dv(grad, {p.num_k, p.heads_kv, p.head_dim});
    dout.upload(p.dout);
    if (accumulate)
      for (DevTensor* t : {&dk, &dv})
        t->upload(std::vector<double>(std::size_t(numel_of(t->shape)), 0.0));
    BwdArgs a{dout.view, fwd.q.view, fwd.k.view, fwd.v.view,
              fa.out,    fwd.lse.view, device_view(dq.get(), grad, shape, strides),
              dk.view,   dv.view,      std::nullopt, std::nullopt};
    AttnOptions opts = c.opts;
    opts.accumulate = accumulate;
    attn_backward(mask, a, opts);
    sync("backward");
    // dq's rows without their padding element.
    const std::vector<double> padded = decode(grad, dq.download());
    BwdGot got{{}, dk.download(), dv.download(), {}};
    for (std::int64_t q = 0; q < p.num_q; ++q)
      got.dq.insert(got.dq.end(), padded.begin() + q * pitch, padded.begin() + q * pitch + row);
    expect_grads(got, oracle::backward(mask, p), naive_backward(mask, p, c.in, grad), c.in,
                 accumulate ? "rows H * D + 1 apart, accumulate" : "rows H * D + 1 apart");
  }
}

}  // namespace
}  // namespace magi
