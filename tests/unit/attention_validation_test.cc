// Every check of the public attention boundary, one test each: a well-formed call is broken in
// exactly one way and the error must name the culprit (tensor or option) and its value. The
// last tests make sure legal-but-unusual inputs (broadcast strides, empty tensors, bf16 out)
// are accepted rather than rejected.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

#include "magi/attention.h"
#include "magi/error.h"

namespace magi {
namespace {

template <typename F>
::testing::AssertionResult throws_with(F&& f, std::string_view want) {
  try {
    f();
  } catch (const Error& e) {
    if (std::string_view(e.what()).find(want) != std::string_view::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message \"" << e.what() << "\" lacks \"" << want
                                         << "\"";
  }
  return ::testing::AssertionFailure() << "nothing thrown; wanted an error with \"" << want
                                       << "\"";
}

// A valid fp32 call: Nq 4, Nk 5, Hq 4, Hkv 2 and head dim d, full mask, sink [2, Hq].
struct Fwd {
  std::int64_t nq, nk, hq, hkv, d;
  std::vector<double> q, k, v, out, lse, max_logits, sink;  // doubles: room for any dtype
  Mask mask;
  FwdArgs args;
  AttnOptions opts;

  explicit Fwd(std::int64_t d_ = 8, std::int64_t nq_ = 4, std::int64_t nk_ = 5)
      : nq(nq_), nk(nk_), hq(4), hkv(2), d(d_), q(nq * hq * d, 0.5), k(nk * hkv * d, 0.25),
        v(nk * hkv * d, 1.0), out(nq * hq * d), lse(nq * hq), max_logits(hq), sink(2 * hq),
        mask(nq, nk, {Slice{{0, nq}, {0, nk}, MaskType::kFull}}) {
    args.q = make_view(q.data(), DType::kF32, {nq, hq, d});
    args.k = make_view(k.data(), DType::kF32, {nk, hkv, d});
    args.v = make_view(v.data(), DType::kF32, {nk, hkv, d});
    args.out = make_view(out.data(), DType::kF32, {nq, hq, d});
    args.lse = make_view(lse.data(), DType::kF32, {nq, hq});
    args.max_logits = make_view(max_logits.data(), DType::kF32, {hq});
    args.sink = make_view(sink.data(), DType::kF32, {2, hq});
  }
  void operator()() const { attn_forward(mask, args, opts); }
};

struct Bwd {
  Fwd f;
  std::vector<double> dout, dq, dk, dv, dsink;
  BwdArgs args;
  AttnOptions opts;

  Bwd()
      : dout(f.q.size(), 0.1), dq(f.q.size()), dk(f.k.size()), dv(f.v.size()),
        dsink(f.sink.size()) {
    args.dout = make_view(dout.data(), DType::kF32, {f.nq, f.hq, f.d});
    args.q = f.args.q;
    args.k = f.args.k;
    args.v = f.args.v;
    args.out = f.args.out;
    args.lse = f.args.lse;
    args.dq = make_view(dq.data(), DType::kF32, {f.nq, f.hq, f.d});
    args.dk = make_view(dk.data(), DType::kF32, {f.nk, f.hkv, f.d});
    args.dv = make_view(dv.data(), DType::kF32, {f.nk, f.hkv, f.d});
    args.sink = f.args.sink;
    args.dsink = make_view(dsink.data(), DType::kF32, {2, f.hq});
  }
  void operator()() const { attn_backward(f.mask, args, opts); }
};

TEST(AttentionValidation, QMustHaveThreeDims) {
  Fwd f;
  f.args.q.ndim = 2;
  EXPECT_TRUE(throws_with(f, "q: expected 3 dims, got 2"));
}

TEST(AttentionValidation, LseMustHaveTwoDims) {
  Fwd f;
  f.args.lse = make_view(f.lse.data(), DType::kF32, {f.nq, f.hq, 1});
  EXPECT_TRUE(throws_with(f, "lse: expected 2 dims, got 3"));
}

TEST(AttentionValidation, GradientsMustHaveThreeDims) {
  for (auto [field, name] : {std::pair{&BwdArgs::dout, "dout"}, {&BwdArgs::dq, "dq"},
                             {&BwdArgs::dk, "dk"}, {&BwdArgs::dv, "dv"}, {&BwdArgs::out, "out"}}) {
    Bwd b;
    (b.args.*field).ndim = 4;
    EXPECT_TRUE(throws_with(b, std::string(name) + ": expected 3 dims, got 4"));
  }
}

TEST(AttentionValidation, NegativeSizeIsRejected) {
  Fwd f;
  f.args.v.shape[0] = -5;
  f.args.k.shape[0] = -5;
  EXPECT_TRUE(throws_with(f, "k: negative size -5 in dim 0"));
}

TEST(AttentionValidation, KAndVMustShareAShape) {
  Fwd f;
  f.args.v.shape[1] = 1;
  EXPECT_TRUE(throws_with(f, "v: shape [5, 1, 8] differs from k shape [5, 2, 8]"));
}

TEST(AttentionValidation, TokenCountsMustMatchTheMask) {
  Fwd f;
  f.mask = Mask(6, 5, {});
  EXPECT_TRUE(throws_with(f, "q: 4 tokens but the mask has total_seqlen_q 6"));
  Fwd g;
  g.mask = Mask(4, 3, {});
  EXPECT_TRUE(throws_with(g, "k: 5 tokens but the mask has total_seqlen_k 3"));
}

TEST(AttentionValidation, HeadDimsMustAgree) {
  Fwd f;
  f.args.k.shape[2] = f.args.v.shape[2] = 16;
  EXPECT_TRUE(throws_with(f, "k: head dim 16 differs from q head dim 8"));
}

TEST(AttentionValidation, QueryHeadsMustBeAMultipleOfKvHeads) {
  Fwd f;
  f.args.q.shape[1] = f.args.out.shape[1] = 3;
  EXPECT_TRUE(throws_with(f, "q: 3 heads are not a multiple of the 2 heads of k and v"));
  Fwd g;
  g.args.k.shape[1] = g.args.v.shape[1] = 0;
  EXPECT_TRUE(throws_with(g, "k: no heads"));
}

TEST(AttentionValidation, HeadDimMustBeAMultipleOfEight) {
  EXPECT_TRUE(throws_with(Fwd(12), "q: head dim 12 is not a positive multiple of 8"));
}

TEST(AttentionValidation, HeadDimMustNotExceedTheMaximum) {
  EXPECT_TRUE(throws_with(Fwd(264), "q: head dim 264 exceeds kMaxHeadDim 256"));
}

TEST(AttentionValidation, LastDimMustBeUnitStride) {
  Fwd f;
  f.args.q.stride = {64, 16, 2, 0};
  EXPECT_TRUE(throws_with(f, "q: last-dim stride 2 is not 1: non-contiguous strides the backend "
                             "cannot honour"));
  Fwd g;
  g.args.lse.stride = {1, 4, 0, 0};
  EXPECT_TRUE(throws_with(g, "lse: last-dim stride 4 is not 1"));
}

TEST(AttentionValidation, NegativeStridesAreRejected) {
  Fwd f;
  f.args.k.stride[0] = -16;
  EXPECT_TRUE(throws_with(f, "k: negative stride -16 in dim 0"));
}

TEST(AttentionValidation, ZeroStrideOnAnOutputAliasesRows) {
  Fwd f;
  f.args.out.stride[0] = 0;
  EXPECT_TRUE(throws_with(f, "out: zero stride in dim 0 of size 4 makes its rows alias"));
  Bwd b;
  b.args.dk.stride[1] = 0;
  EXPECT_TRUE(throws_with(b, "dk: zero stride in dim 1 of size 2"));
}

TEST(AttentionValidation, OverlappingOutputStridesAreRejected) {
  Fwd f;
  f.args.out.stride = {32, 4, 1, 0};  // heads 4 apart but 8 wide
  EXPECT_TRUE(throws_with(f, "out: stride 4 of dim 1 overlaps the smaller dims"));
  Bwd b;
  b.args.dsink->stride = {2, 1, 0, 0};  // [2, 4] with rows 2 apart
  EXPECT_TRUE(throws_with(b, "dsink: stride 2 of dim 0 overlaps"));
}

TEST(AttentionValidation, NullDataWithElementsIsRejected) {
  Fwd f;
  f.args.v.data = nullptr;
  EXPECT_TRUE(throws_with(f, "v: null data with 80 elements"));
}

TEST(AttentionValidation, InputDtypesMustMatch) {
  Fwd f;
  f.args.k.dtype = DType::kBF16;
  EXPECT_TRUE(throws_with(f, "k: dtype bf16 is not fp32"));
  Bwd b;
  b.args.dout.dtype = DType::kF64;
  EXPECT_TRUE(throws_with(b, "dout: dtype fp64 is not fp32"));
}

TEST(AttentionValidation, LseMustBeTheComputeType) {
  Fwd f;
  f.args.lse.dtype = DType::kF64;
  EXPECT_TRUE(throws_with(f, "lse: dtype fp64 is not fp32"));
  Fwd g;  // fp64 inputs compute in fp64
  for (TensorView* t : {&g.args.q, &g.args.k, &g.args.v}) t->dtype = DType::kF64;
  g.args.sink.reset();
  EXPECT_TRUE(throws_with(g, "lse: dtype fp32 is not fp64"));
  Bwd b;
  b.args.lse.dtype = DType::kBF16;
  EXPECT_TRUE(throws_with(b, "lse: dtype bf16 is not fp32"));
}

TEST(AttentionValidation, MaxLogitsMustBeTheComputeTypeAndPerHead) {
  Fwd f;
  f.args.max_logits->dtype = DType::kF64;
  EXPECT_TRUE(throws_with(f, "max_logits: dtype fp64 is not fp32"));
  Fwd g;
  g.args.max_logits->shape[0] = 3;
  EXPECT_TRUE(throws_with(g, "max_logits: shape [3] is not [Hq=4]"));
}

TEST(AttentionValidation, AccumulateNeedsComputeTypeOutputs) {
  Fwd f;
  f.opts.accumulate = true;
  f.args.out.dtype = DType::kBF16;
  EXPECT_TRUE(throws_with(f, "out: dtype bf16 is not fp32 (accumulate needs the compute type)"));
  for (auto [field, name] :
       {std::pair{&BwdArgs::dq, "dq"}, {&BwdArgs::dk, "dk"}, {&BwdArgs::dv, "dv"}}) {
    Bwd b;
    b.opts.accumulate = true;
    (b.args.*field).dtype = DType::kF16;
    EXPECT_TRUE(throws_with(b, std::string(name) + ": dtype fp16 is not fp32 (accumulate"));
  }
}

TEST(AttentionValidation, OutputShapesMustFollowTheInputs) {
  Fwd f;
  f.args.out.shape[2] = 16;
  EXPECT_TRUE(throws_with(f, "out: shape [4, 4, 16] differs from q shape [4, 4, 8]"));
  Fwd g;
  g.args.lse.shape[1] = 5;
  EXPECT_TRUE(throws_with(g, "lse: shape [4, 5] is not [Nq, Hq]"));
  Bwd b;
  b.args.dv.shape[0] = 4;
  EXPECT_TRUE(throws_with(b, "dv: shape [4, 2, 8] differs from v shape [5, 2, 8]"));
  Bwd c;
  c.args.dout.shape[0] = 3;
  EXPECT_TRUE(throws_with(c, "dout: shape [3, 4, 8] differs from q shape [4, 4, 8]"));
}

// validate_* run the same checks and compute nothing (the runtime calls them before its first
// collective): a valid call leaves the outputs untouched, an invalid one throws the same error.
TEST(AttentionValidation, ValidateChecksWithoutComputing) {
  Fwd f;
  std::fill(f.out.begin(), f.out.end(), -7.0);
  EXPECT_NO_THROW(validate_forward(f.mask, f.args, f.opts));
  EXPECT_TRUE(std::all_of(f.out.begin(), f.out.end(), [](double x) { return x == -7.0; }));
  f.opts.softcap = -1;
  EXPECT_TRUE(throws_with([&] { validate_forward(f.mask, f.args, f.opts); }, "softcap: -1"));
  Bwd b;
  std::fill(b.dq.begin(), b.dq.end(), -7.0);
  EXPECT_NO_THROW(validate_backward(b.f.mask, b.args, b.opts));
  EXPECT_TRUE(std::all_of(b.dq.begin(), b.dq.end(), [](double x) { return x == -7.0; }));
  b.args.dv.shape[0] = 4;
  EXPECT_TRUE(throws_with([&] { validate_backward(b.f.mask, b.args, b.opts); },
                          "dv: shape [4, 2, 8] differs from v shape [5, 2, 8]"));
}

TEST(AttentionValidation, TensorsMustShareQsDevice) {
  Fwd f;
  f.args.k.device = Device::kCUDA;
  EXPECT_TRUE(throws_with(f, "k: on cuda:0 but q is on cpu"));
  Bwd b;
  b.args.dq.device = Device::kCUDA;
  b.args.dq.device_idx = 3;
  EXPECT_TRUE(throws_with(b, "dq: on cuda:3 but q is on cpu"));
  Fwd g;
  g.args.q.device = g.args.k.device = g.args.v.device = Device::kCUDA;
  g.args.sink->device = g.args.out.device = g.args.lse.device = Device::kCUDA;
  g.args.out.device_idx = 1;
  EXPECT_TRUE(throws_with(g, "out: on cuda:1 but q is on cuda:0") ||
              throws_with(g, "built without CUDA") || throws_with(g, "is not bf16 or fp16"));
}

TEST(AttentionValidation, GpuRejectsWhatItCannotRun) {
  Fwd f;  // fp32 inputs: a CPU-only build says so first, a CUDA build names the dtype
  f.args.q.device = f.args.k.device = f.args.v.device = Device::kCUDA;
  f.args.sink->device = f.args.out.device = f.args.lse.device = Device::kCUDA;
  EXPECT_TRUE(throws_with(f, "q: on cuda:0 but this magiattn was built without CUDA") ||
              throws_with(f, "q: dtype fp32 is not bf16 or fp16"));
  Bwd b;  // the same for the backward
  for (TensorView* t : {&b.args.q, &b.args.k, &b.args.v, &b.args.out, &b.args.lse, &b.args.dout,
                        &b.args.dq, &b.args.dk, &b.args.dv, &*b.args.sink, &*b.args.dsink})
    t->device = Device::kCUDA;
  EXPECT_TRUE(throws_with(b, "q: on cuda:0 but this magiattn was built without CUDA") ||
              throws_with(b, "q: dtype fp32 is not bf16 or fp16"));
}

TEST(AttentionValidation, SinkShapeFollowsItsLayout) {
  Fwd f;
  f.args.sink->shape[1] = 3;
  EXPECT_TRUE(throws_with(f, "sink: shape [2, 3] is not [S_sink, Hq=4] for layout \"sh\""));
  Fwd g;
  g.opts.sink_layout = SinkLayout::kSSH;
  EXPECT_TRUE(throws_with(g, "sink: 2 dims, but layout \"ssh\" is [Nq, S_sink, Hq]"));
  Fwd h;
  h.opts.sink_layout = SinkLayout::kSSH;
  h.args.sink = make_view(h.sink.data(), DType::kF32, {5, 1, 4});
  EXPECT_TRUE(throws_with(h, "sink: shape [5, 1, 4] is not [Nq=4, S_sink, Hq=4]"));
}

TEST(AttentionValidation, SinkLengthMustBeOneToMax) {
  Fwd f;
  f.args.sink->shape[0] = 0;
  EXPECT_TRUE(throws_with(f, "sink: length 0 is not in [1, 8]"));
  std::vector<float> big(9 * 4);
  Fwd g;
  g.args.sink = make_view(big.data(), DType::kF32, {9, 4});
  EXPECT_TRUE(throws_with(g, "sink: length 9 is not in [1, 8]"));
}

TEST(AttentionValidation, SinkDtypeIsFp32OrFp64WithFp64Inputs) {
  Fwd f;
  f.args.sink->dtype = DType::kBF16;
  EXPECT_TRUE(throws_with(f, "sink: dtype bf16 is not fp32 (or fp64 with fp64 inputs)"));
  Fwd g;
  g.args.sink->dtype = DType::kF64;
  EXPECT_TRUE(throws_with(g, "sink: dtype fp64 is not fp32"));
}

TEST(AttentionValidation, DsinkMustMatchTheSink) {
  Bwd b;
  b.args.dsink->shape[0] = 1;
  EXPECT_TRUE(throws_with(b, "dsink: shape [1, 4] differs from sink shape [2, 4]"));
  Bwd c;
  c.args.dsink->dtype = DType::kF64;
  EXPECT_TRUE(throws_with(c, "dsink: dtype fp64 is not fp32"));
  Bwd d;
  d.args.sink.reset();
  EXPECT_TRUE(throws_with(d, "dsink: given without a sink"));
}

TEST(AttentionValidation, SoftcapMustBeFiniteAndNonNegative) {
  for (double c : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Fwd f;
    f.opts.softcap = c;
    EXPECT_TRUE(throws_with(f, "softcap: "));
    EXPECT_TRUE(throws_with(f, "must be finite and >= 0"));
  }
  Fwd f;
  f.opts.softcap = -1;
  EXPECT_TRUE(throws_with(f, "softcap: -1 must be finite"));
}

TEST(AttentionValidation, SoftmaxScaleMustBeFiniteAndNonZero) {
  for (double s : {0.0, std::nan(""), -std::numeric_limits<double>::infinity()}) {
    Bwd b;
    b.opts.softmax_scale = s;
    EXPECT_TRUE(throws_with(b, "softmax_scale: "));
    EXPECT_TRUE(throws_with(b, "must be finite and nonzero"));
  }
}

TEST(AttentionValidation, NumThreadsMustNotBeNegative) {
  Fwd f;
  f.opts.num_threads = -2;
  EXPECT_TRUE(throws_with(f, "num_threads: -2 must be >= 0"));
}

TEST(AttentionValidation, SmMarginMustNotBeNegative) {
  Bwd b;
  b.opts.sm_margin = -1;
  EXPECT_TRUE(throws_with(b, "sm_margin: -1 must be >= 0"));
}

TEST(AttentionValidation, SinkLayoutNames) {
  EXPECT_EQ(sink_layout_from_name("sh"), SinkLayout::kSH);
  EXPECT_EQ(sink_layout_from_name("ssh"), SinkLayout::kSSH);
  EXPECT_TRUE(throws_with([] { sink_layout_from_name("hs"); }, "sink layout 'hs'"));
}

TEST(AttentionValidation, FlopsCountFourPerCellPerHeadDim) {
  EXPECT_DOUBLE_EQ(attn_fwd_flops(10, 3, 64), 4.0 * 10 * 3 * 64);
  EXPECT_DOUBLE_EQ(attn_fwd_flops(0, 3, 64), 0.0);
}

// Legal inputs that must reach the backend.

TEST(AttentionValidation, WellFormedCallsPass) {
  Fwd f;
  EXPECT_NO_THROW(f());
  Bwd b;
  EXPECT_NO_THROW(b());
  f.opts.num_threads = 0;  // 0 means all hardware threads
  EXPECT_NO_THROW(f());
}

TEST(AttentionValidation, NarrowOutputWithoutAccumulateIsAccepted) {
  Fwd f;
  f.args.out.dtype = DType::kBF16;
  EXPECT_NO_THROW(f());
  Bwd b;
  b.args.dq.dtype = b.args.dk.dtype = b.args.dv.dtype = DType::kF16;
  b.args.out.dtype = DType::kBF16;
  EXPECT_NO_THROW(b());
}

TEST(AttentionValidation, Fp32SinkWithFp64InputsIsAccepted) {
  Fwd f;
  for (TensorView* t : {&f.args.q, &f.args.k, &f.args.v, &f.args.out, &f.args.lse,
                        &*f.args.max_logits})
    t->dtype = DType::kF64;
  EXPECT_NO_THROW(f());
}

TEST(AttentionValidation, EmptyTensorsMayHaveNullData) {
  Fwd f(8, 0, 0);
  f.args.q.data = f.args.k.data = f.args.v.data = f.args.out.data = f.args.lse.data = nullptr;
  f.args.sink.reset();
  EXPECT_NO_THROW(f());
}

TEST(AttentionValidation, BroadcastInputStridesAreHonoured) {
  // k and v with token stride 0 read one row for every token: same as writing it out.
  const Fwd f;
  std::vector<float> kv_row(16), kv_full(5 * 16);
  for (int e = 0; e < 16; ++e) kv_row[e] = 0.1f * float(e) - 0.7f;
  for (int t = 0; t < 5; ++t)
    for (int e = 0; e < 16; ++e) kv_full[t * 16 + e] = kv_row[e];
  std::vector<float> q(4 * 4 * 8), out_a(q.size()), out_b(q.size()), lse(16);
  for (std::size_t n = 0; n < q.size(); ++n) q[n] = std::sin(float(n));
  FwdArgs a{make_view(q.data(), DType::kF32, {4, 4, 8}),
            make_view(kv_row.data(), DType::kF32, {5, 2, 8}),
            make_view(kv_row.data(), DType::kF32, {5, 2, 8}),
            make_view(out_a.data(), DType::kF32, {4, 4, 8}),
            make_view(lse.data(), DType::kF32, {4, 4}), std::nullopt, std::nullopt};
  a.k.stride[0] = a.v.stride[0] = 0;
  ASSERT_NO_THROW(attn_forward(f.mask, a));
  FwdArgs b = a;
  b.k = b.v = make_view(kv_full.data(), DType::kF32, {5, 2, 8});
  b.out = make_view(out_b.data(), DType::kF32, {4, 4, 8});
  ASSERT_NO_THROW(attn_forward(f.mask, b));
  for (std::size_t n = 0; n < out_a.size(); ++n) EXPECT_NEAR(out_a[n], out_b[n], 1e-6) << n;
}

}  // namespace
}  // namespace magi
