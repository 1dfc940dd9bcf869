// Note [Native convolution] (runtime/native_conv.cc) through warden::compile on backend "cpp":
// conv2d of every form the kernel takes (strides, paddings, dilations, bias or not, 1x1 to 5x5
// and rectangular kernels, widths that are and are not a multiple of 8, channel counts that are
// and are not a multiple of 4) against eager within a tolerance, with eager's sizes and strides;
// NaN and infinities; the fallbacks to ATen; the models of tests/models/models.h that convolve.
// Each test asserts whether the kernel ran.
#include <cmath>
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/codegen_replay.h"
#include "runtime/warden.h"
#include "tests/models/models.h"
#include "tests/test_env.h"
#include "tracer/autocast_compat.h"

namespace warden {
namespace {

using Args = std::vector<c10::IValue>;
using Outputs = std::vector<at::Tensor>;
using test_util::ScopedCacheDir;

Options Cpp(const std::string& name) {
  Options o;
  o.name = name;
  o.backend = "cpp";
  return o;
}

struct ConvCase {
  std::string name;
  int64_t n, c, h, w, o, kh, kw;
  std::vector<int64_t> stride, padding, dilation;
  bool bias;
};

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_EQ(got.strides(), want.strides()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-5, /*equal_nan=*/true))
      << what << " max diff " << (got - want).abs().nan_to_num(0).max().item<float>();
}

// conv2d(x, w, b, stride, padding, dilation) with w and b captured, compiled on "cpp".
CompiledFunction CompileConv(const ConvCase& c, const at::Tensor& w, const at::Tensor& b) {
  const std::vector<int64_t> stride = c.stride, padding = c.padding, dilation = c.dilation;
  return compile(
      [w, b, stride, padding, dilation](const Args& a) -> Outputs {
        return {at::conv2d(a[0].toTensor(), w, b, stride, padding, dilation)};
      },
      Cpp("conv_" + c.name));
}

// Compiles `run` (one tensor in, one out) on "cpp" and calls it three times with fresh inputs
// against eager; returns the native kernel calls the hits made.
int64_t ThreeCalls(const std::string& name, const std::function<at::Tensor(const at::Tensor&)>& run,
                   const std::function<at::Tensor()>& input) {
  ScopedCacheDir cache;
  CompiledFunction f = compile([run](const Args& a) -> Outputs { return {run(a[0].toTensor())}; }, Cpp(name));
  int64_t native = 0;
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = input();
    const at::Tensor want = run(x);
    const int64_t before = codegen::NativeCallsOnThisThread();
    const Outputs got = f({x});
    native += codegen::NativeCallsOnThisThread() - before;
    EXPECT_EQ(got.size(), 1u);
    if (got.size() == 1) ExpectClose(got[0], want, name + " call " + std::to_string(call));
  }
  EXPECT_EQ(f.stats().compiles, 1) << name;
  return native;
}

// Compiles `op` on "cpp", traces it on x and hits it once: the hit must not run a native kernel.
// Returns the hit's result.
at::Tensor HitWithoutKernel(const std::string& name, const std::function<at::Tensor(const at::Tensor&)>& op,
                            const at::Tensor& x) {
  ScopedCacheDir cache;
  CompiledFunction f = compile([op](const Args& a) -> Outputs { return {op(a[0].toTensor())}; }, Cpp(name));
  f({x});
  const int64_t before = codegen::NativeCallsOnThisThread();
  const Outputs got = f({x});
  EXPECT_EQ(codegen::NativeCallsOnThisThread(), before) << name;
  EXPECT_EQ(got.size(), 1u) << name;
  return got.empty() ? at::Tensor() : got[0];
}

// The case's conv2d with weight w and bias b, three calls against eager.
int64_t CheckAgainstEager(const ConvCase& c, const at::Tensor& w, const at::Tensor& b,
                          const std::function<at::Tensor()>& input) {
  return ThreeCalls(
      "conv_" + c.name, [w, b, c](const at::Tensor& x) { return at::conv2d(x, w, b, c.stride, c.padding, c.dilation); },
      input);
}

int64_t CheckCase(const ConvCase& c) {
  torch::manual_seed(5);
  // Scaled as nn::Conv2d initializes them, so that the outputs are O(1) whatever the tap count
  // and the tolerance stays meaningful.
  const at::Tensor w = torch::randn({c.o, c.c, c.kh, c.kw}) / std::sqrt(static_cast<double>(c.c * c.kh * c.kw));
  const at::Tensor b = c.bias ? torch::randn({c.o}) : at::Tensor();
  return CheckAgainstEager(c, w, b, [&c] { return torch::randn({c.n, c.c, c.h, c.w}); });
}

TEST(NativeConv, MatchesEagerForEveryForm) {
  torch::NoGradGuard no_grad;
  const std::vector<ConvCase> cases = {
      {"3x3_same", 2, 3, 16, 16, 8, 3, 3, {1}, {1}, {1}, true},
      {"3x3_valid", 2, 4, 10, 12, 5, 3, 3, {1}, {0}, {1}, false},  // 5 channels: a partial block
      {"1x1", 3, 8, 9, 7, 16, 1, 1, {1}, {0}, {1}, true},          // width 7: one partial vector
      {"1x1_stride2", 2, 8, 16, 16, 16, 1, 1, {2}, {0}, {1}, false},
      {"3x3_stride2", 2, 8, 16, 16, 16, 3, 3, {2}, {1}, {1}, false},
      {"3x3_stride2_odd", 1, 3, 15, 17, 6, 3, 3, {2}, {1}, {1}, true},
      {"5x5_pad2", 2, 3, 20, 20, 7, 5, 5, {1}, {2}, {1}, true},
      {"rect_kernel", 2, 2, 11, 13, 4, 2, 5, {1, 2}, {1, 0}, {1}, true},
      {"dilation2", 1, 3, 14, 14, 4, 3, 3, {1}, {2}, {2}, true},
      {"dilation_stride", 2, 2, 19, 23, 9, 3, 3, {3, 2}, {1, 2}, {2, 3}, false},
      {"stride3_large_pad", 1, 2, 9, 9, 3, 3, 3, {3}, {3}, {1}, true},
      {"wide_rows", 1, 2, 5, 40, 4, 3, 3, {1}, {1}, {1}, true},   // five vectors per row
      {"one_pixel_out", 2, 4, 3, 3, 8, 3, 3, {1}, {0}, {1}, true},  // output 1x1
      {"batch1_64ch", 1, 64, 8, 8, 64, 3, 3, {1}, {1}, {1}, true},
  };
  for (const ConvCase& c : cases) {
    // One native call per hit: the first call is the trace, eagerly.
    EXPECT_EQ(CheckCase(c), 2) << c.name;
  }
}

// NaN and infinities in the input propagate as in eager.
TEST(NativeConv, NanAndInfinity) {
  torch::NoGradGuard no_grad;
  const ConvCase c{"special", 2, 3, 8, 8, 4, 3, 3, {1}, {1}, {1}, true};
  torch::manual_seed(6);
  const at::Tensor w = torch::randn({4, 3, 3, 3}), b = torch::randn({4});
  const int64_t native = CheckAgainstEager(c, w, b, [] {
    at::Tensor x = torch::randn({2, 3, 8, 8});
    x[0][0][2][2] = NAN;
    x[1][1][5][0] = INFINITY;
    x[1][2][7][7] = -INFINITY;
    return x;
  });
  EXPECT_EQ(native, 2);
}

// Inputs and weights the kernel does not take: the ATen call runs, with eager's result.
TEST(NativeConv, FallsBackToAtenOutsideItsForms) {
  torch::manual_seed(7);
  const ConvCase c{"plain", 2, 3, 8, 8, 4, 3, 3, {1}, {1}, {1}, true};
  const at::Tensor w = torch::randn({4, 3, 3, 3}), b = torch::randn({4});
  const auto input = [] { return torch::randn({2, 3, 8, 8}); };
  {
    torch::NoGradGuard no_grad;
    // An infinite weight: a padded position would make NaN where ATen's sum is infinite.
    at::Tensor inf_w = w.clone();
    inf_w[1][0][0][0] = INFINITY;
    EXPECT_EQ(CheckAgainstEager(c, inf_w, b, input), 0);
    // f64.
    EXPECT_EQ(CheckAgainstEager(c, w.to(at::kDouble), b.to(at::kDouble),
                                [] { return torch::randn({2, 3, 8, 8}, at::kDouble); }),
              0);
    // A channels-last input: eager's output is channels-last.
    EXPECT_EQ(CheckAgainstEager(c, w, b, [] { return torch::randn({2, 3, 8, 8}).contiguous(at::MemoryFormat::ChannelsLast); }),
              0);
    // A non-contiguous input.
    EXPECT_EQ(CheckAgainstEager(c, w, b, [] { return torch::randn({2, 3, 8, 16}).slice(3, 0, 16, 2); }), 0);
    // Beyond the kernel's limits: 128 channels times 3x3 taps; 129 output channels; 2^25
    // multiply-adds (8 * 16 * 64 * 64 * 16 * 9 = 75 million).
    EXPECT_EQ(CheckCase({"taps", 1, 128, 6, 6, 8, 3, 3, {1}, {1}, {1}, false}), 0);
    EXPECT_EQ(CheckCase({"out_channels", 1, 4, 6, 6, 129, 3, 3, {1}, {1}, {1}, false}), 0);
    EXPECT_EQ(CheckCase({"work", 8, 16, 64, 64, 16, 3, 3, {1}, {1}, {1}, false}), 0);
    EXPECT_EQ(CheckCase({"under_limits", 1, 64, 8, 8, 64, 3, 3, {1}, {1}, {1}, true}), 2);  // 2.4M, C 64
    // 16 channels in and out: 2^22 multiply-adds (8 * 16 * 16 * 16 * 16 * 9 = 4.7 million).
    EXPECT_EQ(CheckCase({"wide_work", 8, 16, 16, 16, 16, 3, 3, {1}, {1}, {1}, false}), 0);
    EXPECT_EQ(CheckCase({"narrow_work", 8, 8, 16, 16, 16, 3, 3, {1}, {1}, {1}, false}), 2);  // 2.4M, C 8
  }
  // Gradients wanted: ATen's convolution and its autograd.
  {
    const at::Tensor wg = w.clone().requires_grad_();
    const at::Tensor x = input();
    const auto op = [wg, b](const at::Tensor& t) { return at::conv2d(t, wg, b, 1, 1); };
    const at::Tensor got = HitWithoutKernel("grad", op, x);
    EXPECT_TRUE(got.requires_grad());
    ExpectClose(got.detach(), op(x).detach(), "grad");
  }
  // Groups: ATen.
  {
    torch::NoGradGuard no_grad;
    const at::Tensor wgroups = torch::randn({4, 1, 3, 3});
    const at::Tensor x = torch::randn({1, 2, 6, 6});
    const auto op = [wgroups](const at::Tensor& t) { return at::conv2d(t, wgroups, {}, 1, 1, 1, 2); };
    ExpectClose(HitWithoutKernel("groups", op, x), op(x), "groups");
  }
}

// Found by review: CPU autocast at the call site (eager casts the convolution to bfloat16). The
// guards see the autocast state (a new entry is traced under it); the kernel must decline, so the
// hit returns eager's bfloat16 result, not a float32 one.
TEST(NativeConv, DeclinesUnderAutocast) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(13);
  const at::Tensor w = torch::randn({8, 3, 3, 3}) / 5, wt = torch::randn({3, 8, 3, 3}) / 5;
  const std::vector<std::function<at::Tensor(const at::Tensor&)>> ops = {
      [w](const at::Tensor& x) { return at::conv2d(x, w, {}, 1, 1); },
      [wt](const at::Tensor& x) { return at::conv_transpose2d(x, wt, {}, 2, 1); },
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    ScopedCacheDir cache;
    const auto op = ops[i];
    CompiledFunction f = compile([op](const Args& a) -> Outputs { return {op(a[0].toTensor())}; },
                                 Cpp("autocast" + std::to_string(i)));
    const at::Tensor x = torch::randn({2, 3, 9, 9});
    warden::compat::SetAutocastCpuEnabled(true);
    const at::Tensor want = op(x);
    f({x});
    const int64_t before = codegen::NativeCallsOnThisThread();
    const Outputs got = f({x});
    const int64_t native = codegen::NativeCallsOnThisThread() - before;
    warden::compat::SetAutocastCpuEnabled(false);
    EXPECT_EQ(native, 0) << i;
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].scalar_type(), want.scalar_type()) << i;
    EXPECT_TRUE(torch::allclose(got[0].to(at::kFloat), want.to(at::kFloat), 1e-2, 1e-2)) << i;
  }
}

// Found by review: one output channel, a padding far larger than the image. 1.13's eager may
// return such an output channels-last (the next convolution then follows), and the padded copy
// would be mostly zeros: the kernel declines both, and results and strides are eager's.
TEST(NativeConv, DeclinesOneChannelAndHugePadding) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(14);
  const at::Tensor w1 = torch::randn({1, 1, 5, 5}) / 5, w2 = torch::randn({8, 1, 3, 3}) / 3;
  // ThreeCalls compares strides; the second convolution runs the kernel only when its input (the
  // first one's ATen result) is NCHW, as with 2.x.
  EXPECT_LE(ThreeCalls(
                "one_channel_chain",
                [w1, w2](const at::Tensor& x) { return at::conv2d(at::conv2d(x, w1, {}, 1, 8), w2, {}, 1, 1); },
                [] { return torch::randn({1, 1, 4, 4}); }),
            2);
  EXPECT_EQ(ThreeCalls(
                "one_channel", [w1](const at::Tensor& x) { return at::conv2d(x, w1, {}, 1, 8); },
                [] { return torch::randn({1, 1, 4, 4}); }),
            0);
  const at::Tensor w4 = torch::randn({2, 64, 1, 1}) / 8;
  EXPECT_EQ(ThreeCalls(
                "huge_padding", [w4](const at::Tensor& x) { return at::conv2d(x, w4, {}, 64, 1024); },
                [] { return torch::randn({2, 64, 1, 1}); }),
            0);
}

// Found by review: LibTorch 2.x's deconvolution multiplies some weights by padded zeros (stride 3
// or more, output padding), so an infinite weight is NaN there: the kernel declines.
TEST(NativeConvTranspose, DeclinesNonFiniteWeights) {
  torch::NoGradGuard no_grad;
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    at::Tensor w = torch::randn({1, 1, 4, 4}) / 4;
    w[0][0][0][0] = bad;
    EXPECT_EQ(ThreeCalls(
                  "nonfinite", [w](const at::Tensor& x) { return at::conv_transpose2d(x, w, {}, 3); },
                  [] { return torch::randn({1, 1, 2, 2}); }),
              0);
  }
}

// The weight is read at every call: an in-place update between calls is seen.
TEST(NativeConv, ReadsTheWeightsOfEachCall) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(8);
  const ConvCase c{"update", 1, 2, 6, 6, 3, 3, 3, {1}, {1}, {1}, true};
  at::Tensor w = torch::randn({3, 2, 3, 3}), b = torch::randn({3});
  ScopedCacheDir cache;
  CompiledFunction f = CompileConv(c, w, b);
  const at::Tensor x = torch::randn({1, 2, 6, 6});
  f({x});
  w.mul_(-2);
  b.add_(1);
  const int64_t before = codegen::NativeCallsOnThisThread();
  const Outputs got = f({x});
  EXPECT_EQ(codegen::NativeCallsOnThisThread() - before, 1);
  ASSERT_EQ(got.size(), 1u);
  ExpectClose(got[0], at::conv2d(x, w, b, 1, 1), "after update");
}

struct TransposedCase {
  std::string name;
  int64_t n, c, h, w, o, kh, kw;
  std::vector<int64_t> stride, padding, output_padding, dilation;
  bool bias;
};

// conv_transpose2d with captured weight and bias on "cpp": three calls against eager; returns the
// native kernel calls the hits made.
int64_t CheckTransposed(const TransposedCase& c, at::ScalarType dtype = at::kFloat, bool special = false) {
  torch::manual_seed(10);
  const auto opts = torch::TensorOptions().dtype(dtype);
  const at::Tensor w = torch::randn({c.c, c.o, c.kh, c.kw}, opts) / std::sqrt(static_cast<double>(c.c * c.kh * c.kw));
  const at::Tensor b = c.bias ? torch::randn({c.o}, opts) : at::Tensor();
  return ThreeCalls(
      "convt_" + c.name,
      [w, b, c](const at::Tensor& x) {
        return at::conv_transpose2d(x, w, b, c.stride, c.padding, c.output_padding, 1, c.dilation);
      },
      [c, opts, special] {
        at::Tensor x = torch::randn({c.n, c.c, c.h, c.w}, opts);
        if (special) {
          x[0][0][0][0] = NAN;
          x[c.n - 1][c.c - 1][c.h - 1][c.w - 1] = INFINITY;
        }
        return x;
      });
}

TEST(NativeConvTranspose, MatchesEagerForEveryForm) {
  torch::NoGradGuard no_grad;
  const std::vector<TransposedCase> cases = {
      {"dcgan1", 8, 16, 1, 1, 32, 4, 4, {1}, {0}, {0}, {1}, false},
      {"dcgan2", 8, 32, 4, 4, 16, 4, 4, {2}, {1}, {0}, {1}, false},
      {"dcgan3", 1, 16, 8, 8, 1, 4, 4, {2}, {1}, {0}, {1}, true},
      {"3x3_same", 2, 5, 7, 9, 3, 3, 3, {1}, {1}, {0}, {1}, true},
      {"stride2_out_pad", 2, 4, 5, 6, 6, 3, 3, {2}, {1}, {1}, {1}, true},
      {"stride3_rect", 1, 3, 4, 5, 2, 2, 5, {3, 2}, {0, 2}, {2, 1}, {1}, false},
      {"dilation", 2, 3, 6, 6, 4, 3, 3, {1}, {2}, {0}, {2}, true},
      {"dilation_out_pad", 1, 2, 5, 7, 3, 2, 3, {1, 2}, {0, 1}, {1, 0}, {2, 3}, true},
      {"wide", 1, 2, 3, 30, 5, 4, 4, {2}, {1}, {0}, {1}, true},
      {"1x1", 3, 8, 5, 5, 7, 1, 1, {1}, {0}, {0}, {1}, true},
  };
  for (const TransposedCase& c : cases) EXPECT_EQ(CheckTransposed(c), 2) << c.name;
}

TEST(NativeConvTranspose, NanAndInfinity) {
  torch::NoGradGuard no_grad;
  EXPECT_EQ(CheckTransposed({"special", 2, 3, 5, 5, 4, 4, 4, {2}, {1}, {0}, {1}, true}, at::kFloat, true), 2);
}

TEST(NativeConvTranspose, FallsBackToAtenOutsideItsForms) {
  {
    torch::NoGradGuard no_grad;
    EXPECT_EQ(CheckTransposed({"f64", 2, 3, 5, 5, 4, 4, 4, {2}, {1}, {0}, {1}, true}, at::kDouble), 0);
    // 65 * 8 * 8 columns > 4096.
    EXPECT_EQ(CheckTransposed({"columns", 1, 2, 3, 3, 65, 8, 8, {1}, {0}, {0}, {1}, false}), 0);
  }
  // Gradients wanted.
  {
    torch::manual_seed(12);
    const at::Tensor w = torch::randn({3, 4, 3, 3}).requires_grad_();
    const at::Tensor x = torch::randn({1, 3, 4, 4});
    const auto op = [w](const at::Tensor& t) { return at::conv_transpose2d(t, w, {}, 2, 1); };
    const at::Tensor got = HitWithoutKernel("grad", op, x);
    EXPECT_TRUE(got.requires_grad());
    ExpectClose(got.detach(), op(x).detach(), "grad");
  }
  // An output padding ATen rejects: ATen's error, from the replayed call as from eager.
  {
    torch::NoGradGuard no_grad;
    const at::Tensor w = torch::randn({3, 4, 3, 3});
    ScopedCacheDir cache;
    CompiledFunction f = compile(
        [w](const Args& a) -> Outputs { return {at::conv_transpose2d(a[0].toTensor(), w, {}, 1, 0, 1)}; },
        Cpp("bad_output_padding"));
    EXPECT_THROW(at::conv_transpose2d(torch::randn({1, 3, 4, 4}), w, {}, 1, 0, 1), c10::Error);
    EXPECT_ANY_THROW(f({torch::randn({1, 3, 4, 4})}));
  }
}

// The convolutional models of the suite: every conv2d / conv_transpose2d of a hit runs the kernel, and the model's
// result is eager's, at batch 1 and 8.
TEST(NativeConv, Models) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(9);
  auto resnet = models::Eval(models::ResNet(10));
  auto cnn = models::Eval(models::ConvNet());
  auto lenet = models::Eval(models::LeNet5());
  auto dcgan = models::Eval(models::DcganGenerator());
  struct Model {
    std::string name;
    std::function<at::Tensor(const at::Tensor&)> forward;
    int64_t convs;
    std::shared_ptr<torch::nn::Module> module;
  };
  const std::vector<Model> list = {
      {"resnet", [resnet](const at::Tensor& x) mutable { return resnet->forward(x); }, 6, resnet.ptr()},
      {"cnn", [cnn](const at::Tensor& x) mutable { return cnn->forward(x); }, 2, cnn.ptr()},
      {"lenet", [lenet](const at::Tensor& x) mutable { return lenet->forward(x); }, 2, lenet.ptr()},
      {"dcgan", [dcgan](const at::Tensor& x) mutable { return dcgan->forward(x); }, 3, dcgan.ptr()},
  };
  for (const Model& m : list) {
    for (int64_t batch : {1, 8}) {
      ScopedCacheDir cache;
      CompiledFunction f = compile([m](const Args& a) -> Outputs { return {m.forward(a[0].toTensor())}; },
                                   Cpp(m.name));
      f.watch(*m.module, m.name);
      const at::Tensor x = m.name == "dcgan" ? torch::randn({batch, 16, 1, 1}) : torch::randn({batch, 1, 16, 16});
      f({x});
      const int64_t before = codegen::NativeCallsOnThisThread();
      const Outputs got = f({x});
      const int64_t native = codegen::NativeCallsOnThisThread() - before;
      EXPECT_GE(native, m.convs) << m.name << " batch " << batch << "\n" << f.explain();
      // explain() names the steps that may run a native kernel.
      const std::string op = m.name == "dcgan" ? "aten::conv_transpose2d" : "aten::conv2d";
      EXPECT_NE(f.explain().find("native kernels: " + op), std::string::npos) << f.explain();
      ASSERT_EQ(got.size(), 1u);
      ExpectClose(got[0], m.forward(x), m.name + " batch " + std::to_string(batch));
    }
  }
}

}  // namespace
}  // namespace warden
