// Note [Conv epilogues] (runtime/native_conv.cc) through warden::compile on backend "cpp": a
// convolution with the eval-mode batch_norm, residual add and relu after it runs as one native
// call. Every form against eager; the parameters read on each call (a batch_norm's weights and
// running statistics changed in place between calls); the fallbacks, each run step by step with
// eager's result: non-finite folded values, gradients wanted, an intermediate that is returned, a
// write in place between the convolution and its epilogue.
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/codegen_replay.h"
#include "runtime/conv_epilogues.h"
#include "runtime/warden.h"
#include "tests/models/models.h"
#include "tests/test_env.h"

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

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_EQ(got.strides(), want.strides()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_EQ(got.requires_grad(), want.requires_grad()) << what;
  EXPECT_EQ(got._version(), want._version()) << what;  // add_ and relu_ bump it
  EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-5, /*equal_nan=*/true))
      << what << " max diff " << (got - want).abs().nan_to_num(0).max().item<float>();
}

// A batch_norm in eval mode whose running statistics and affine parameters are far from the
// identity, so that a fold that ignored any of them would be visible.
torch::nn::BatchNorm2d EvalBatchNorm(int64_t channels, bool affine = true) {
  torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(channels).affine(affine));
  torch::NoGradGuard no_grad;
  bn->running_mean.copy_(torch::randn({channels}));
  bn->running_var.copy_(torch::rand({channels}) * 2 + 0.25);
  if (affine) {
    bn->weight.copy_(torch::randn({channels}));
    bn->bias.copy_(torch::randn({channels}));
  }
  bn->eval();
  return bn;
}

struct Outcome {
  int64_t fused = 0;  // fused calls of the hits
  std::string explain;
};

// Compiles `fn` on "cpp" and calls it `calls` times on inputs(call) against eager (the same fn on
// the same inputs, run first, so that writes in place see the same tensors); `between` runs before
// each call after the first.
Outcome Check(const std::string& name, const std::function<Outputs(const Args&)>& fn,
          const std::function<Args(int)>& inputs, int calls = 3, const std::function<void()>& between = nullptr) {
  ScopedCacheDir cache;
  CompiledFunction f = compile(fn, Cpp(name));
  Outcome run;
  for (int call = 0; call < calls; ++call) {
    if (call > 0 && between) between();
    const Args eager_args = inputs(call), warden_args = inputs(call);
    const Outputs want = fn(eager_args);
    const int64_t before = codegen::native::FusedConvCallsOnThisThread();
    const Outputs got = f(warden_args);
    if (call > 0) run.fused += codegen::native::FusedConvCallsOnThisThread() - before;
    EXPECT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      ExpectClose(got[i], want[i], name + " call " + std::to_string(call) + " output " + std::to_string(i));
    }
  }
  EXPECT_EQ(f.stats().compiles, 1) << name << "\n" << f.explain();
  run.explain = f.explain();
  return run;
}

// Fresh random tensors of the given sizes (seeded by the call, so that eager and Warden get equal
// ones).
std::function<Args(int)> Randn(std::vector<std::vector<int64_t>> sizes) {
  return [sizes](int call) {
    torch::manual_seed(100 + call);
    Args args;
    for (const auto& s : sizes) args.push_back(torch::randn(s));
    return args;
  };
}

at::Tensor Weight(int64_t o, int64_t c, int64_t k) {
  return torch::randn({o, c, k, k}) / std::sqrt(static_cast<double>(c * k * k));
}

TEST(ConvEpilogue, EveryFormMatchesEagerInOneCall) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  // Channel counts that are and are not a multiple of 4 and widths that are and are not a multiple
  // of 8 (the residual's loads of a row's last vector are masked).
  for (const auto& [c, o, hw] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{3, 8, 16}, {4, 6, 13}, {8, 5, 7}}) {
    const std::string tag = std::to_string(c) + "x" + std::to_string(o) + "x" + std::to_string(hw);
    const at::Tensor w = Weight(o, c, 3), b = torch::randn({o});
    auto bn = EvalBatchNorm(o);
    auto plain = EvalBatchNorm(o, /*affine=*/false);
    const auto in = Randn({{2, c, hw, hw}, {2, o, hw, hw}});
    struct Form {
      std::string name;
      std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> body;
      std::string ops;  // what explain() lists after the convolution
    };
    const std::vector<Form> forms = {
        {"bn_add_relu", [&](auto x, auto r) { return torch::relu(bn->forward(at::conv2d(x, w, {}, 1, 1)) + r); },
         "batch_norm + add + relu"},
        {"bn_relu", [&](auto x, auto) { return torch::relu(bn->forward(at::conv2d(x, w, b, 1, 1))); },
         "batch_norm + relu"},
        {"bn", [&](auto x, auto) { return bn->forward(at::conv2d(x, w, b, 1, 1)); }, "batch_norm"},
        {"bn_no_affine", [&](auto x, auto) { return torch::relu(plain->forward(at::conv2d(x, w, b, 1, 1))); },
         "batch_norm + relu"},
        {"relu", [&](auto x, auto) { return torch::relu(at::conv2d(x, w, b, 1, 1)); }, "relu"},
        {"residual_first", [&](auto x, auto r) { return r + at::conv2d(x, w, b, 1, 1); }, "add"},
        {"in_place", [&](auto x, auto r) {
           at::Tensor y = bn->forward(at::conv2d(x, w, {}, 1, 1));
           y += r;
           return y.relu_();
         },
         "batch_norm + add_ + relu_"},
    };
    for (const Form& form : forms) {
      const std::string name = form.name + "_" + tag;
      const Outcome run = Check(
          name, [&form](const Args& a) -> Outputs { return {form.body(a[0].toTensor(), a[1].toTensor())}; }, in);
      EXPECT_EQ(run.fused, 2) << name << "\n" << run.explain;
      EXPECT_NE(run.explain.find("native kernels: aten::conv2d at %0 + " + form.ops + " ("), std::string::npos) << name << "\n" << run.explain;
    }
  }
}

TEST(ConvEpilogue, TransposedConvolutionWithBatchNormAndRelu) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  for (const auto& [c, o, stride] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 12, 2}, {8, 3, 1}}) {
    const at::Tensor w = torch::randn({c, o, 4, 4}) / 8.0, b = torch::randn({o});
    auto bn = EvalBatchNorm(o);
    const std::string name = "transposed_" + std::to_string(o);
    const Outcome run = Check(
        name,
        [&](const Args& a) -> Outputs {
          return {torch::relu(bn->forward(at::conv_transpose2d(a[0].toTensor(), w, b, stride, 1)) + a[1].toTensor())};
        },
        [&](int call) {
          torch::manual_seed(200 + call);
          const at::Tensor x = torch::randn({2, c, 5, 5});
          const int64_t out = (5 - 1) * stride - 2 + 4;
          return Args{x, torch::randn({2, o, out, out})};
        });
    EXPECT_EQ(run.fused, 2) << name << "\n" << run.explain;
    EXPECT_NE(run.explain.find("native kernels: aten::conv_transpose2d.input at %0 + batch_norm + add + relu ("), std::string::npos)
        << run.explain;
  }
}

// The fold is per call: a batch_norm's parameters and statistics changed in place between calls
// (a fine-tuning step, load_state_dict, a running-statistics update) change the next result
// without a recompile, as the captured-tensor guards check metadata, not values.
TEST(ConvEpilogue, ReadsTheBatchNormOfEachCall) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  const at::Tensor w = Weight(8, 4, 3);
  auto bn = EvalBatchNorm(8);
  int step = 0;
  const Outcome run = Check(
      "per_call", [&](const Args& a) -> Outputs { return {torch::relu(bn->forward(at::conv2d(a[0].toTensor(), w)))}; },
      Randn({{2, 4, 10, 10}}), 4, [&] {
        ++step;
        if (step == 1) bn->running_mean.add_(0.5);
        if (step == 2) bn->running_var.mul_(3);
        if (step == 3) {
          bn->weight.mul_(-2);
          bn->bias.sub_(1);
        }
      });
  EXPECT_EQ(run.fused, 3) << run.explain;
}

// Whatever the fused kernel cannot do exactly as eager, the steps do one by one.
TEST(ConvEpilogue, NonFiniteFoldsRunStepByStep) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  const at::Tensor w = Weight(8, 4, 3);
  auto bn = EvalBatchNorm(8);
  auto fn = [&](const Args& a) -> Outputs { return {torch::relu(bn->forward(at::conv2d(a[0].toTensor(), w)))}; };
  // A negative variance: alpha is NaN. Eager's result has NaN channels; so must Warden's.
  bn->running_var[2] = -1.0f;
  Outcome run = Check("nan_alpha", fn, Randn({{2, 4, 10, 10}}));
  EXPECT_EQ(run.fused, 0) << run.explain;
  // Huge weights times a huge alpha: a folded weight would overflow to infinity, where eager's
  // products of tiny inputs stay finite before its batch_norm scales them (to ~1e20, finite).
  bn->running_var.fill_(1.0f);
  bn->weight.fill_(1e30f);
  const at::Tensor big = w * 1e20f;
  auto fn_big = [&](const Args& a) -> Outputs { return {bn->forward(at::conv2d(a[0].toTensor(), big))}; };
  auto tiny = [](int call) {
    torch::manual_seed(300 + call);
    return Args{torch::randn({2, 4, 10, 10}) * 1e-30f};
  };
  run = Check("overflow", fn_big, tiny);
  EXPECT_EQ(run.fused, 0) << run.explain;
}

// ATen's relu keeps NaN (and the residual's NaN reaches it): so does the epilogue, in full and
// partial vectors.
TEST(ConvEpilogue, NanSurvivesTheEpilogue) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  const at::Tensor w = Weight(8, 4, 3);
  auto bn = EvalBatchNorm(8);
  const Outcome run = Check(
      "nan",
      [&](const Args& a) -> Outputs {
        return {torch::relu(bn->forward(at::conv2d(a[0].toTensor(), w, {}, 1, 1)) + a[1].toTensor())};
      },
      [](int call) {
        torch::manual_seed(400 + call);
        at::Tensor x = torch::randn({2, 4, 11, 11}), r = torch::randn({2, 8, 11, 11});
        x[0][1][4][4] = std::numeric_limits<float>::quiet_NaN();
        r[1][3][10][9] = std::numeric_limits<float>::quiet_NaN();    // a row's last, partial vector
        r[1][5][2][1] = -std::numeric_limits<float>::infinity();
        return Args{x, r};
      });
  EXPECT_EQ(run.fused, 2) << run.explain;
}

TEST(ConvEpilogue, NoGroupWhereAnIntermediateIsSeen) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  const at::Tensor w = Weight(8, 4, 3);
  auto bn = EvalBatchNorm(8);
  // The batch_norm's result is returned too: only the convolution and batch_norm fuse.
  Outcome run = Check(
      "returned",
      [&](const Args& a) -> Outputs {
        at::Tensor y = bn->forward(at::conv2d(a[0].toTensor(), w));
        return {y, torch::relu(y)};
      },
      Randn({{2, 4, 10, 10}}));
  EXPECT_NE(run.explain.find("native kernels: aten::conv2d at %0 + batch_norm ("), std::string::npos) << run.explain;
  // The convolution's result read twice: nothing fuses.
  run = Check(
      "read_twice",
      [&](const Args& a) -> Outputs {
        at::Tensor y = at::conv2d(a[0].toTensor(), w);
        return {torch::relu(y) + y};
      },
      Randn({{2, 4, 10, 10}}));
  EXPECT_EQ(run.fused, 0) << run.explain;
  EXPECT_EQ(run.explain.find(" + "), std::string::npos) << run.explain;
}

// The group runs where its last node was; a write in place between the convolution and its
// epilogue to the convolution's input would be read too late.
TEST(ConvEpilogue, NoGroupAcrossAWriteInPlace) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(8);
  const at::Tensor w = Weight(8, 4, 3);
  auto bn = EvalBatchNorm(8);
  const Outcome run = Check(
      "write_between",
      [&](const Args& a) -> Outputs {
        at::Tensor x = a[0].toTensor();
        at::Tensor y = at::conv2d(x, w);
        x.mul_(-3);
        return {torch::relu(bn->forward(y)), x};
      },
      Randn({{2, 4, 10, 10}}));
  EXPECT_EQ(run.fused, 0) << run.explain;
}

// Two convolutions' chains meeting at one add (a ResNet block written relu(bn2(conv2(h)) +
// bn_s(conv_s(x)))): the add joins the first group; the second ends before it.
TEST(ConvEpilogue, TwoChainsMeetAtOneAdd) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(12);
  const at::Tensor w1 = Weight(8, 4, 3), w2 = Weight(8, 4, 1);
  auto bn1 = EvalBatchNorm(8), bn2 = EvalBatchNorm(8);
  Outcome run = Check(
      "plain_sum",
      [&](const Args& a) -> Outputs {
        return {torch::relu(at::conv2d(a[0].toTensor(), w1, {}, 1, 1) + at::conv2d(a[0].toTensor(), w2))};
      },
      Randn({{2, 4, 10, 10}}));
  EXPECT_EQ(run.fused, 2) << run.explain;
  EXPECT_NE(run.explain.find("native kernels: aten::conv2d at %0 + add + relu, aten::conv2d at %1 ("),
            std::string::npos)
      << run.explain;
  run = Check(
      "resnet_style",
      [&](const Args& a) -> Outputs {
        const at::Tensor x = a[0].toTensor();
        return {torch::relu(bn1->forward(at::conv2d(x, w1, {}, 1, 1)) + bn2->forward(at::conv2d(x, w2)))};
      },
      Randn({{2, 4, 10, 10}}));
  EXPECT_EQ(run.fused, 4) << run.explain;
  EXPECT_NE(run.explain.find("aten::conv2d at %0 + batch_norm + add + relu, aten::conv2d at %2 + batch_norm ("),
            std::string::npos)
      << run.explain;
}

// A batch_norm in training mode updates its running statistics in place without saying so in its
// schema: a group whose batch_norm reads them may not run after it.
TEST(ConvEpilogue, NoGroupAcrossATrainingBatchNorm) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(13);
  const at::Tensor w = Weight(8, 4, 3);
  const at::Tensor rm = torch::randn({8}), rv = torch::rand({8}) + 0.5, gamma = torch::randn({8}),
                   beta = torch::randn({8});
  auto fn = [&](const Args& a) -> Outputs {
    const at::Tensor y = at::batch_norm(at::conv2d(a[0].toTensor(), w), gamma, beta, rm, rv, /*training=*/false,
                                        0.1, 1e-5, false);
    at::batch_norm(a[1].toTensor(), gamma, beta, rm, rv, /*training=*/true, 0.5, 1e-5, false);
    return {torch::relu(y)};
  };
  ScopedCacheDir cache;
  CompiledFunction f = compile(fn, Cpp("training_between"));
  for (int call = 0; call < 3; ++call) {
    const Args args = Randn({{2, 4, 10, 10}, {2, 8, 5, 5}})(call);
    const at::Tensor rm0 = rm.clone(), rv0 = rv.clone();
    const Outputs want = fn(args);
    const at::Tensor rm1 = rm.clone(), rv1 = rv.clone();
    rm.copy_(rm0);
    rv.copy_(rv0);
    const Outputs got = f(args);
    ASSERT_EQ(got.size(), 1u);
    ExpectClose(got[0], want[0], "call " + std::to_string(call));
    EXPECT_TRUE(torch::allclose(rm, rm1) && torch::allclose(rv, rv1)) << "call " << call;
  }
  // The convolution and the eval batch_norm still fuse (they run before the update); the relu not.
  EXPECT_NE(f.explain().find("native kernels: aten::conv2d at %0 + batch_norm ("), std::string::npos) << f.explain();
}

// Eval mode with grad mode on and parameters that require grad (a model put in eval() without a
// NoGradGuard): the result requires grad, so no group is made and the steps run with autograd;
// backward works. Where the result is detached, the nodes are history-free (Note [History-free
// nodes]) and the group runs, with grad mode off.
TEST(ConvEpilogue, GradientsWantedRunStepByStep) {
  torch::manual_seed(9);
  auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3).padding(1));
  auto bn = EvalBatchNorm(8);
  ScopedCacheDir cache;
  CompiledFunction f = compile(
      [&](const Args& a) -> Outputs { return {torch::relu(bn->forward(conv->forward(a[0].toTensor())))}; },
      Cpp("grad_wanted"));
  const at::Tensor x = torch::randn({2, 4, 8, 8});
  for (int call = 0; call < 2; ++call) {
    const int64_t before = codegen::native::FusedConvCallsOnThisThread();
    const Outputs got = f({x});
    EXPECT_EQ(codegen::native::FusedConvCallsOnThisThread(), before);
    const at::Tensor want = torch::relu(bn->forward(conv->forward(x)));
    ASSERT_EQ(got.size(), 1u);
    ExpectClose(got[0], want, "grad_wanted");
    conv->zero_grad();
    got[0].sum().backward();
    const at::Tensor g_warden = conv->weight.grad().clone();
    conv->zero_grad();
    want.sum().backward();
    EXPECT_TRUE(torch::allclose(g_warden, conv->weight.grad(), 1e-4, 1e-5));
  }
  EXPECT_EQ(f.explain().find(" + "), std::string::npos) << f.explain();
  const Outcome run = Check(
      "detached", [&](const Args& a) -> Outputs { return {torch::relu(bn->forward(conv->forward(a[0].toTensor()))).detach()}; },
      Randn({{2, 4, 8, 8}}));
  EXPECT_EQ(run.fused, 2) << run.explain;
}

// Random convolutions with random epilogues against eager: sizes, strides, paddings, dilations,
// bias or not, a batch_norm with or without affine parameters, the residual on either side or added
// in place, relu or relu_, plain and transposed. A random shape may fall outside the kernel's limits
// (then nothing fuses); the result must be eager's either way, and most chains must fuse (all 48 did).
TEST(ConvEpilogue, RandomChainsMatchEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(14);
  std::mt19937 rng(2026);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int64_t fused = 0, trials = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const bool transposed = trial % 4 == 3;
    const int64_t n = pick(1, 3), c = pick(1, 9), o = pick(2, 13), k = pick(1, 4), dil = pick(1, 2);
    const int64_t stride = pick(1, 3), pad = transposed ? 0 : pick(0, k / 2 + 1);
    const int64_t h = pick(dil * (k - 1) + 1, 14), w = pick(dil * (k - 1) + 1, 14);
    const int bn_kind = static_cast<int>(pick(0, 2)), residual = static_cast<int>(pick(0, 3));
    const int relu = static_cast<int>(pick(0, 2));
    const at::Tensor weight = transposed ? torch::randn({c, o, k, k}) / static_cast<double>(k * std::sqrt(c))
                                         : Weight(o, c, k);
    const at::Tensor bias = pick(0, 1) ? torch::randn({o}) : at::Tensor();
    const at::Tensor gamma = bn_kind == 1 ? torch::randn({o}) : at::Tensor();
    const at::Tensor beta = bn_kind == 1 ? torch::randn({o}) : at::Tensor();
    const at::Tensor mean = torch::randn({o}), var = torch::rand({o}) + 0.2;
    auto conv = [=](const at::Tensor& x) {
      return transposed ? at::conv_transpose2d(x, weight, bias, stride, pad, 0, 1, dil)
                        : at::conv2d(x, weight, bias, stride, pad, dil);
    };
    const std::vector<int64_t> in = {n, c, h, w};
    const std::vector<int64_t> out = conv(torch::zeros(in)).sizes().vec();
    auto fn = [=](const Args& a) -> Outputs {
      at::Tensor y = conv(a[0].toTensor());
      if (bn_kind > 0) y = at::batch_norm(y, gamma, beta, mean, var, /*training=*/false, 0.1, 1e-5, false);
      const at::Tensor r = a[1].toTensor();
      if (residual == 1) y = y + r;
      if (residual == 2) y = r + y;
      if (residual == 3) y.add_(r);
      if (relu == 1) y = torch::relu(y);
      if (relu == 2) y.relu_();
      return {y};
    };
    const std::string name = "random_" + std::to_string(trial);
    const Outcome run = Check(name, fn, Randn({in, out}));
    SCOPED_TRACE(name + "\n" + run.explain);
    if (run.explain.find(" + ") != std::string::npos) {
      EXPECT_EQ(run.fused, 2);  // a group planned from the traced shapes runs on every hit
      fused += run.fused / 2;
    }
    trials += bn_kind > 0 || residual > 0 || relu > 0;
  }
  EXPECT_GE(fused, trials * 3 / 4) << fused << " of " << trials << " chains fused";
}

// The models of tests/models/models.h: every convolution followed by a batch_norm, relu or residual
// add runs fused, and the result is eager's.
TEST(ConvEpilogue, Models) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(10);
  auto resnet = models::Eval(models::ResNet(10));
  auto cnn = models::Eval(models::ConvNet());
  auto dcgan = models::Eval(models::DcganGenerator());
  struct Model {
    std::string name;
    std::function<at::Tensor(const at::Tensor&)> forward;
    int64_t groups;
    std::vector<int64_t> input;
  };
  const std::vector<Model> list = {
      // stem; block 1: conv1, conv2 (+ add_ + relu); block 2: conv1, conv2 (+ add_ + relu), shortcut
      {"resnet", [resnet](const at::Tensor& x) mutable { return resnet->forward(x); }, 6, {1, 16, 16}},
      {"cnn", [cnn](const at::Tensor& x) mutable { return cnn->forward(x); }, 1, {1, 16, 16}},
      {"dcgan", [dcgan](const at::Tensor& x) mutable { return dcgan->forward(x); }, 2, {16, 1, 1}},
  };
  for (const Model& m : list) {
    for (int64_t batch : {1, 8}) {
      std::vector<int64_t> sizes = {batch};
      sizes.insert(sizes.end(), m.input.begin(), m.input.end());
      const Outcome run = Check(m.name + "_b" + std::to_string(batch),
                            [m](const Args& a) -> Outputs { return {m.forward(a[0].toTensor())}; }, Randn({sizes}));
      EXPECT_EQ(run.fused, 2 * m.groups) << m.name << " batch " << batch << "\n" << run.explain;
    }
  }
}

}  // namespace
}  // namespace warden
