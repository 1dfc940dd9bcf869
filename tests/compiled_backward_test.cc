// The backward of a compiled forward (Note [Compiled backward] in runtime/compiled_backward.cc):
// `loss.backward()` outside the function runs a compiled backward graph; gradients, parameters
// over a training loop, errors and fallbacks match eager.
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "bench/radon.h"
#include "runtime/codegen_replay.h"
#include "runtime/warden.h"
#include "tests/gradient_checks.h"

namespace {

using ::testing::HasSubstr;
using Args = std::vector<c10::IValue>;

using CompiledBackwardTest = warden::testing::BackendTest;
using warden::testing::ExpectClose;

// Identical twins: same architecture, same weights.
torch::nn::Sequential MakeMlp(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(10, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
                               torch::nn::Tanh(), torch::nn::Linear(32, 4));
}

TEST_P(CompiledBackwardTest, MlpTrainingLoopWithBackwardOutsideMatchesEager) {
  auto model = MakeMlp(11), eager = MakeMlp(11);
  auto loss_of = [](torch::nn::Sequential& m) {
    return [&m](const Args& a) -> std::vector<at::Tensor> {
      const at::Tensor logits = m->forward(a[0].toTensor());
      return {torch::log_softmax(logits, 1).mul(a[1].toTensor()).sum().neg() / 8.0};
    };
  };
  auto f = warden::compile(loss_of(model), Opts("mlp_loss"));
  auto reference = loss_of(eager);
  torch::optim::Adam opt(model->parameters(), 1e-2), opt_eager(eager->parameters(), 1e-2);
  for (int step = 0; step < 25; ++step) {
    torch::manual_seed(300 + step);
    const at::Tensor x = torch::randn({8, 10});
    const at::Tensor y = torch::one_hot(torch::randint(4, {8}), 4).to(torch::kFloat);
    opt.zero_grad();
    opt_eager.zero_grad();
    const at::Tensor loss = f({x, y})[0];
    const at::Tensor want = reference({x, y})[0];
    ASSERT_TRUE(loss.requires_grad());
    ExpectClose(loss, want, "loss at step " + std::to_string(step), 1e-4, 1e-5);
    loss.backward();
    want.backward();
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      ExpectClose(model->parameters()[i].grad(), eager->parameters()[i].grad(),
                  "grad " + std::to_string(i) + " at step " + std::to_string(step), 1e-4, 1e-5);
    }
    opt.step();
    opt_eager.step();
  }
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    ExpectClose(model->parameters()[i], eager->parameters()[i], "parameter " + std::to_string(i), 1e-4, 1e-5);
  }
  if (std::string(GetParam()) == "cpp") {
    // Matmuls are saved by the forward, not recomputed (Note [Saved outputs]); the rest is recomputed.
    // Note [Saved activations]: and the activations the matmuls read, and log_softmax's result.
    EXPECT_THAT(f.explain(), HasSubstr("saves the outputs of 6 ops (aten::addmm at %1, aten::relu at %2, aten::addmm at "
                                       "%4, aten::tanh at %5, aten::addmm at %7, aten::log_softmax.int at %8), "
                                       "recomputes the rest"))
        << f.explain();
    EXPECT_THAT(f.explain(), HasSubstr("aten::alias(%arg3)")) << f.explain();  // the backward reads the saved output
    EXPECT_THAT(f.explain(), HasSubstr(", 0 eager)")) << f.explain();
  } else {
    // Replayed op by op, the backward would be slower than autograd: autograd runs, and says so.
    EXPECT_THAT(f.explain(), HasSubstr("backward: LibTorch's autograd over the replayed forward (aten::addmm"))
        << f.explain();
  }
  EXPECT_EQ(f.stats().compiles, 1);
}

// Note [Saved outputs]: a matmul's output can be saved only if nothing writes it later and the
// caller never gets it; otherwise LibTorch's autograd runs, says why, and gradients match eager.
TEST_P(CompiledBackwardTest, MatmulOutputsThatCannotBeSavedKeepAutograd) {
  torch::manual_seed(13);
  const at::Tensor w0 = torch::randn({6, 5});
  for (const bool in_place : {true, false}) {
    at::Tensor w = w0.clone().requires_grad_(), we = w0.clone().requires_grad_();
    auto fn_of = [in_place](at::Tensor& weight) {
      return [&weight, in_place](const Args& a) -> std::vector<at::Tensor> {
        at::Tensor h = torch::mm(a[0].toTensor(), weight);
        if (in_place) return {h.relu_().pow(2).sum()};
        return {torch::relu(h).pow(2).sum(), h};  // the matmul's output is returned
      };
    };
    auto f = warden::compile(fn_of(w), Opts(in_place ? "relu_inplace" : "returns_matmul"));
    auto reference = fn_of(we);
    for (int call = 0; call < 3; ++call) {
      const at::Tensor x = torch::randn({4, 6});
      f({x})[0].backward();
      reference({x})[0].backward();
      ExpectClose(w.grad(), we.grad(), "grad at call " + std::to_string(call));
    }
    if (std::string(GetParam()) == "cpp") {
      EXPECT_THAT(f.explain(), HasSubstr(in_place ? "has its output written in place later"
                                                  : "has its output returned by the function"))
          << f.explain();
    }
    EXPECT_THAT(f.explain(), HasSubstr("backward: LibTorch's autograd over the replayed forward")) << f.explain();
  }
}

// A pointwise model (per-feature affine, tanh, squared error): the compiled backward over a
// 25-step SGD loop, parameters equal to an eager twin's.
TEST_P(CompiledBackwardTest, PointwiseModelTrainingLoopUsesTheCompiledBackward) {
  torch::manual_seed(21);
  const at::Tensor a0 = torch::randn({16}), b0 = torch::randn({16});
  at::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  at::Tensor ea = a0.clone().requires_grad_(), eb = b0.clone().requires_grad_();
  auto loss_of = [](at::Tensor& pa, at::Tensor& pb) {
    return [&pa, &pb](const Args& args) -> std::vector<at::Tensor> {
      const at::Tensor x = args[0].toTensor(), y = args[1].toTensor();
      return {(torch::tanh(x * pa + pb) - y).pow(2).mean() + (pa * pa).sum() * 1e-3};
    };
  };
  auto f = warden::compile(loss_of(a, b), Opts("pointwise_loss"));
  auto reference = loss_of(ea, eb);
  torch::optim::SGD opt({a, b}, 0.5), opt_eager({ea, eb}, 0.5);
  for (int step = 0; step < 25; ++step) {
    torch::manual_seed(500 + step);
    const at::Tensor x = torch::randn({8, 16}), y = torch::rand({8, 16});
    opt.zero_grad();
    opt_eager.zero_grad();
    const at::Tensor loss = f({x, y})[0];
    const at::Tensor want = reference({x, y})[0];
    ExpectClose(loss, want, "loss at step " + std::to_string(step));
    loss.backward();
    want.backward();
    ExpectClose(a.grad(), ea.grad(), "grad a at step " + std::to_string(step));
    ExpectClose(b.grad(), eb.grad(), "grad b at step " + std::to_string(step));
    opt.step();
    opt_eager.step();
  }
  ExpectClose(a, ea, "a after training");
  ExpectClose(b, eb, "b after training");
  const std::string explain = f.explain();
  EXPECT_THAT(explain, HasSubstr("backward: compiled: function 'pointwise_loss.backward'")) << explain;
  EXPECT_THAT(explain, HasSubstr(", 0 eager)")) << explain;
  EXPECT_THAT(explain, HasSubstr("|   gradient captured: d(")) << explain;  // the backward graph, nested
  EXPECT_EQ(f.stats().compiles, 1);
}

// The sampler's other form: logp compiled, the gradient taken outside.
TEST_P(CompiledBackwardTest, RadonGradientOutside) {
  const warden::bench::RadonData data = warden::bench::MakeRadonData();
  auto logp = [&data](const Args& a) -> std::vector<at::Tensor> { return {warden::bench::RadonLogp(a[0].toTensor(), data)}; };
  auto f = warden::compile(logp, Opts("radon"));
  for (int call = 0; call < 4; ++call) {
    const at::Tensor theta = (warden::bench::RadonTheta(data) + 0.03 * call).requires_grad_(true);
    const at::Tensor theta2 = theta.detach().clone().requires_grad_(true);
    const at::Tensor got = f({theta})[0];
    const at::Tensor want = logp({theta2})[0];
    ExpectClose(got, want, "logp", 1e-10, 1e-10);
    ExpectClose(torch::autograd::grad({got}, {theta})[0], torch::autograd::grad({want}, {theta2})[0], "dlogp", 1e-10,
                1e-10);
  }
  EXPECT_THAT(f.explain(), HasSubstr("backward: compiled")) << f.explain();
}

TEST_P(CompiledBackwardTest, WriteBetweenForwardAndBackwardRaisesLikeEager) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor(), w = a[1].toTensor();
    return {(x * w).sum()};
  };
  auto f = warden::compile(fn, Opts("write"));
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({4}), w = torch::randn({4}).requires_grad_();
    const at::Tensor y = f({x, w})[0];
    x.add_(1);  // saved for w's gradient
    EXPECT_THROW(y.backward(), c10::Error) << "call " << call;
  }
}

// A captured parameter or buffer written between the call and its backward (optimizer.step()
// before loss.backward()): eager's saved variable raises; the compiled backward, which recomputes
// the forward from the captured tensor, must raise too rather than use the new values.
TEST_P(CompiledBackwardTest, CapturedTensorWrittenBetweenForwardAndBackwardRaisesLikeEager) {
  for (const bool param : {true, false}) {
    at::Tensor w = torch::randn({4});
    if (param) w.requires_grad_();
    auto fn = [&w](const Args& a) -> std::vector<at::Tensor> { return {torch::tanh(a[0].toTensor() * w).sum()}; };
    auto f = warden::compile(fn, Opts(param ? "captured_param" : "captured_buffer"));
    for (int call = 0; call < 3; ++call) {
      const at::Tensor x = torch::randn({4}).requires_grad_();
      const at::Tensor eager = fn({x})[0];
      const at::Tensor y = f({x})[0];
      {
        torch::NoGradGuard no_grad;
        w.mul_(2);  // saved by mul for x's gradient
      }
      EXPECT_THROW(eager.backward(), c10::Error) << "eager, call " << call;
      try {
        y.backward();
        ADD_FAILURE() << "no error at call " << call << " (param " << param << "): x.grad " << x.grad();
      } catch (const c10::Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("modified by an inplace operation")) << e.what();
      }
    }
    EXPECT_THAT(f.explain(), HasSubstr("backward: compiled")) << f.explain();
  }
}

TEST_P(CompiledBackwardTest, DropoutInTrainingModeKeepsEagerAutogradAndSaysWhy) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::dropout(a[0].toTensor() * 2, 0.5, /*train=*/true).sum()};
  };
  auto f = warden::compile(fn, Opts("dropout"));
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({64}).requires_grad_();
    torch::manual_seed(call);
    const at::Tensor y = f({x})[0];
    torch::manual_seed(call);
    const at::Tensor x2 = x.detach().clone().requires_grad_();
    const at::Tensor want = fn({x2})[0];
    ExpectClose(y, want, "dropout sum");
    y.backward();
    want.backward();
    ExpectClose(x.grad(), x2.grad(), "dropout grad");
  }
  EXPECT_THAT(f.explain(), HasSubstr("backward: LibTorch's autograd over the replayed forward"));
  EXPECT_THAT(f.explain(), HasSubstr("draws random numbers"));
}

TEST_P(CompiledBackwardTest, DoubleBackwardThroughACompiledForward) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    return {(x.tanh() * x).sum()};
  };
  auto f = warden::compile(fn, Opts("double"));
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({5}).requires_grad_(), x2 = x.detach().clone().requires_grad_();
    const at::Tensor g = torch::autograd::grad(f({x}), {x}, {}, true, /*create_graph=*/true)[0];
    const at::Tensor g2 = torch::autograd::grad(fn({x2}), {x2}, {}, true, /*create_graph=*/true)[0];
    ExpectClose(g, g2, "first derivative");
    ASSERT_TRUE(g.requires_grad());
    ExpectClose(torch::autograd::grad({g.sum()}, {x})[0], torch::autograd::grad({g2.sum()}, {x2})[0],
                "second derivative");
  }
}

TEST_P(CompiledBackwardTest, UnusedOutputsAndRetainGraph) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    return {x.exp(), x.sin() * 3, x.sum()};
  };
  auto f = warden::compile(fn, Opts("multi"));
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({3}).requires_grad_(), x2 = x.detach().clone().requires_grad_();
    const auto got = f({x});
    const auto want = fn({x2});
    got[1].sum().backward(/*gradient=*/{}, /*retain_graph=*/true);
    want[1].sum().backward({}, true);
    ExpectClose(x.grad(), x2.grad(), "only output 1");
    got[1].sum().backward();
    want[1].sum().backward();
    ExpectClose(x.grad(), x2.grad(), "output 1 twice (retain_graph)");
    (got[0].sum() + got[2]).backward();
    (want[0].sum() + want[2]).backward();
    ExpectClose(x.grad(), x2.grad(), "outputs 0 and 2");
  }
  EXPECT_THAT(f.explain(), HasSubstr("backward: compiled"));
}

// Note [Undefined outputs] in runtime/compiled_backward.cc: an undefined output beside outputs
// that require grad (the process used to end inside LibTorch's Function machinery), and a gradient
// taken inside with allow_unused, whose unused gradient is undefined.
TEST_P(CompiledBackwardTest, UndefinedOutputsBesideDifferentiableOnes) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor(), w = a[1].toTensor();
    const at::Tensor y = (x * w).tanh();
    const auto g = torch::autograd::grad({y.sum()}, {x, w, a[2].toTensor()}, {}, /*retain_graph=*/true,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    return {at::Tensor(), y * 2, g[0], g[2], y.sum()};
  };
  auto f = warden::compile(fn, Opts("undefined_outputs"));
  for (int call = 0; call < 3; ++call) {
    torch::manual_seed(40 + call);
    const at::Tensor x = torch::randn({5}).requires_grad_(), w = torch::randn({5}).requires_grad_();
    const at::Tensor unused = torch::randn({2}).requires_grad_();
    const at::Tensor x2 = x.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_();
    const at::Tensor unused2 = unused.detach().clone().requires_grad_();
    const auto got = f({x, w, unused});
    const auto want = fn({x2, w2, unused2});
    ASSERT_EQ(got.size(), want.size());
    EXPECT_FALSE(got[0].defined());
    EXPECT_FALSE(got[3].defined());
    ExpectClose(got[1], want[1], "y * 2");
    ExpectClose(got[2], want[2], "gradient inside");
    ASSERT_TRUE(got[1].requires_grad());
    (got[1].sum() + got[4]).backward();
    (want[1].sum() + want[4]).backward();
    ExpectClose(x.grad(), x2.grad(), "x.grad");
    ExpectClose(w.grad(), w2.grad(), "w.grad");
    EXPECT_FALSE(unused.grad().defined());
  }
}

// The same tensor passed in two positions (Note [Argument identity]): the compiled backward's body
// must use one copy of it in both, or the gradient counts one use of two (x + x gave cos(2x), not
// 2 cos(2x)).
TEST_P(CompiledBackwardTest, SameTensorInTwoPositionsCountsBothUses) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {(a[0].toTensor() + a[1].toTensor()).sin() * 3};
  };
  auto f = warden::compile(fn, Opts("same_twice"));
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({5}).requires_grad_(), x2 = x.detach().clone().requires_grad_();
    const auto got = f({x, x});
    const auto want = fn({x2, x2});
    ExpectClose(got[0], want[0], "forward");
    got[0].sum().backward();
    want[0].sum().backward();
    ExpectClose(x.grad(), x2.grad(), "x.grad at call " + std::to_string(call));
  }
  EXPECT_THAT(f.explain(), HasSubstr("backward: compiled"));
}

TEST_P(CompiledBackwardTest, ForwardWithoutADerivativeRuleSwitchesToEagerAutograd) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor().atan().sum()}; };
  auto f = warden::compile(fn, Opts("atan"));
  for (int call = 0; call < 4; ++call) {
    const at::Tensor x = torch::randn({6}).requires_grad_(), x2 = x.detach().clone().requires_grad_();
    f({x})[0].backward();
    fn({x2})[0].backward();
    ExpectClose(x.grad(), x2.grad(), "datan at call " + std::to_string(call));
  }
  EXPECT_THAT(f.explain(), HasSubstr("switched off"));
  EXPECT_THAT(f.explain(), HasSubstr("aten::atan"));
}

TEST_P(CompiledBackwardTest, BatchSweepCompilesTheBackwardOncePerForwardEntry) {
  torch::manual_seed(4);
  const at::Tensor w = torch::randn({6}).requires_grad_();
  auto fn = [&w](const Args& a) -> std::vector<at::Tensor> { return {torch::sigmoid(a[0].toTensor() * w).pow(2).mean()}; };
  auto f = warden::compile(fn, Opts("sweep"));
  for (int64_t b = 2; b <= 10; ++b) {
    const at::Tensor x = torch::randn({b, 6});
    w.mutable_grad() = at::Tensor();
    f({x})[0].backward();
    const at::Tensor got = w.grad().clone();
    w.mutable_grad() = at::Tensor();
    fn({x})[0].backward();
    ExpectClose(got, w.grad(), "dw at batch " + std::to_string(b));
  }
  EXPECT_LE(f.stats().compiles, 2) << f.explain();
  EXPECT_THAT(f.explain(), HasSubstr("backward: compiled"));
}

TEST_P(CompiledBackwardTest, OutputsSharingStorageKeepAutograd) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor y = a[0].toTensor().exp();
    return {y, y.view({-1}), y};
  };
  auto f = warden::compile(fn, Opts("shared"));
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({2, 3}).requires_grad_(), x2 = x.detach().clone().requires_grad_();
    const auto got = f({x});
    const auto want = fn({x2});
    (got[0].sum() + got[1].sum() * 2 + got[2].sum()).backward();
    (want[0].sum() + want[1].sum() * 2 + want[2].sum()).backward();
    ExpectClose(x.grad(), x2.grad(), "grad through three aliased outputs");
  }
  EXPECT_THAT(f.explain(), HasSubstr("two outputs are the same tensor or views of one storage"));
}

// Note [Below autograd]: inside the compiled backward (its forward and its backward graph), a
// replayed view of a parameter that nothing else can observe (t(W) read by a matmul or a product)
// runs below the autograd and view-tracking keys; gradients, parameter versions and a view the
// function returns stay as in eager.
TEST_P(CompiledBackwardTest, ReplayedViewsInsideTheCompiledBackwardSkipTheAutogradKeys) {
  const bool cpp = std::string(GetParam()) == "cpp";
  torch::manual_seed(5);
  const at::Tensor w0 = torch::randn({64, 64}) * 0.1, b0 = torch::randn({64});
  // On cpp a matmul graph gets the compiled backward (the matmul's t(W) is replayed); on aten only
  // a graph without matmuls does (t(W) feeds a product).
  auto body = [cpp](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    return cpp ? (x.mm(w.t()) + b).relu().sum() : (x * w.t() + b).tanh().sum();
  };
  const at::Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  const at::Tensor we = w0.clone().requires_grad_(), be = b0.clone().requires_grad_();
  auto f = warden::compile([&](const Args& a) -> std::vector<at::Tensor> { return {body(a[0].toTensor(), w, b)}; },
                           Opts("below_autograd"));
  for (int step = 0; step < 4; ++step) {
    const at::Tensor x = torch::randn({cpp ? 16 : 64, 64});
    const int64_t before = warden::codegen::BelowAutogradCallsOnThisThread();
    const at::Tensor loss = f({x})[0];
    loss.backward();
    const int64_t below = warden::codegen::BelowAutogradCallsOnThisThread() - before;
    const at::Tensor want = body(x, we, be);
    want.backward();
    ExpectClose(loss, want, "loss at step " + std::to_string(step), 1e-4, 1e-5);
    ExpectClose(w.grad(), we.grad(), "w.grad at step " + std::to_string(step), 1e-4, 1e-5);
    ExpectClose(b.grad(), be.grad(), "b.grad at step " + std::to_string(step), 1e-4, 1e-5);
    EXPECT_EQ(w._version(), we._version());
    EXPECT_EQ(b._version(), be._version());
    if (step > 0) EXPECT_GT(below, 0) << "no step ran below the autograd keys\n" << f.explain();
  }
  EXPECT_THAT(f.explain(), HasSubstr(", 0 eager)")) << f.explain();

  // Views of an intermediate that the function returns (a view of a view: its base is the root,
  // made with every key) inside an entry that has the compiled backward: the same bases, sizes and
  // gradients as eager.
  const at::Tensor v0 = torch::randn({32, 64});
  const at::Tensor v = v0.clone().requires_grad_(), ve = v0.clone().requires_grad_();
  auto views = [](const at::Tensor& x, const at::Tensor& p) -> std::vector<at::Tensor> {
    const at::Tensor h = x * p.t();  // [64, 32]
    return {h.tanh().sum(), h.t().t()};
  };
  auto g = warden::compile([&](const Args& a) { return views(a[0].toTensor(), v); }, Opts("returned_views"));
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({64, 32});
    const auto out = g({x});
    const auto want = views(x, ve);
    ASSERT_EQ(out[1].is_view(), want[1].is_view());
    ASSERT_TRUE(out[1].is_view());
    EXPECT_EQ(out[1]._base().sizes(), want[1]._base().sizes());
    EXPECT_EQ(out[1]._base().is_view(), want[1]._base().is_view());
    ExpectClose(out[1], want[1], "returned view");
    out[0].backward();
    want[0].backward();
    ExpectClose(v.grad(), ve.grad(), "grad through a returned view's graph");
  }
  EXPECT_THAT(g.explain(), HasSubstr("backward: compiled")) << g.explain();
}

// Note [Gradient results] and Note [Below autograd] in the backward graph of a function without a
// matmul (nothing saved: the backward recomputes the forward): the gradients the backward graph
// returns are its computed tensors (no replayed detach), its replayed steps run below the autograd
// keys, and parameters follow eager over a few SGD steps.
TEST_P(CompiledBackwardTest, PointwiseBackwardGraphPassesItsGradientsThrough) {
  torch::manual_seed(9);
  const at::Tensor w0 = torch::randn({32, 16}) * 0.2, b0 = torch::randn({16}) * 0.2;
  auto body = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    return ((x * w + b).tanh() * w.sum(0)).sum();
  };
  const at::Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  const at::Tensor we = w0.clone().requires_grad_(), be = b0.clone().requires_grad_();
  auto f = warden::compile([&](const Args& a) -> std::vector<at::Tensor> { return {body(a[0].toTensor(), w, b)}; },
                           Opts("pass_through"));
  torch::optim::SGD opt({w, b}, 0.05), opt_e({we, be}, 0.05);
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = torch::randn({32, 16});
    opt.zero_grad();
    opt_e.zero_grad();
    const at::Tensor loss = f({x})[0];
    const int64_t passed_before = warden::codegen::PassThroughCallsOnThisThread();
    const int64_t below_before = warden::codegen::BelowAutogradCallsOnThisThread();
    loss.backward();
    const int64_t passed = warden::codegen::PassThroughCallsOnThisThread() - passed_before;
    const int64_t below = warden::codegen::BelowAutogradCallsOnThisThread() - below_before;
    const at::Tensor want = body(x, we, be);
    want.backward();
    ExpectClose(loss, want, "loss at step " + std::to_string(step), 1e-4, 1e-5);
    ExpectClose(w.grad(), we.grad(), "w.grad at step " + std::to_string(step), 1e-4, 1e-4);
    ExpectClose(b.grad(), be.grad(), "b.grad at step " + std::to_string(step), 1e-4, 1e-4);
    opt.step();
    opt_e.step();
    if (step < 2) continue;  // the forward's trace, then the backward's
    // On cpp the backward graph is one generated program, whose results are its own buffers.
    if (std::string(GetParam()) == "aten") {
      EXPECT_GT(passed, 0) << "no gradient passed through\n" << f.explain();
      EXPECT_GT(below, 0) << "the backward graph ran every step with its keys\n" << f.explain();
    }
  }
  ExpectClose(w, we, "w after 5 steps", 1e-4, 1e-5);
  ExpectClose(b, be, "b after 5 steps", 1e-4, 1e-5);
  EXPECT_THAT(f.explain(), HasSubstr("backward: compiled")) << f.explain();
  EXPECT_THAT(f.explain(), HasSubstr(", 0 eager)")) << f.explain();
}

// Note [Transposed twice] and Note [Saved activations] in a training step the size of the bench's
// (its backward graph is not one program): the backward's replay runs neither the transposes of
// transposes, nor the aliases of saved outputs its steps read, nor the recomputed loss; the
// parameters follow eager's over SGD steps.
TEST_P(CompiledBackwardTest, TrainingStepBackwardSkipsWhatItDoesNotNeed) {
  if (std::string(GetParam()) != "cpp") GTEST_SKIP() << "matmul graphs get the compiled backward on cpp";
  auto make = [] {
    torch::manual_seed(21);
    return torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::ReLU(), torch::nn::Linear(128, 128),
                                 torch::nn::ReLU(), torch::nn::Linear(128, 10));
  };
  auto model = make(), eager = make();
  auto loss_of = [](torch::nn::Sequential& m) {
    return [&m](const Args& a) -> std::vector<at::Tensor> {
      return {torch::nll_loss(torch::log_softmax(m->forward(a[0].toTensor()), 1), a[1].toTensor())};
    };
  };
  auto f = warden::compile(loss_of(model), Opts("skips"));
  auto eager_fn = loss_of(eager);
  torch::optim::SGD opt(model->parameters(), 0.1), opt_eager(eager->parameters(), 0.1);
  int64_t steps = -1;
  for (int step = 0; step < 6; ++step) {
    const at::Tensor x = torch::randn({32, 64}), y = torch::randint(10, {32});
    opt.zero_grad();
    opt_eager.zero_grad();
    const at::Tensor loss = f({x, y})[0];
    const int64_t before = warden::codegen::ReplayStepsOnThisThread();
    loss.backward();
    steps = warden::codegen::ReplayStepsOnThisThread() - before;
    const at::Tensor want = eager_fn({x, y})[0];
    want.backward();
    ExpectClose(loss, want, "loss at step " + std::to_string(step), 1e-4, 1e-5);
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      ExpectClose(model->parameters()[i].grad(), eager->parameters()[i].grad(),
                  "grad " + std::to_string(i) + " at step " + std::to_string(step), 1e-4, 1e-5);
    }
    opt.step();
    opt_eager.step();
  }
  const std::string text = f.explain();
  EXPECT_THAT(text, HasSubstr("aten::relu at %2")) << text;  // saved, not recomputed
  EXPECT_THAT(text, HasSubstr(", 0 eager)")) << text;
  // Of the backward graph's nodes, count what its replay must run: every node but the `t`s of `t`s
  // (and the `t`s they read), the aliases and the recomputed loss.
  const size_t backward_graph = text.find("graph(", text.find("entry ", text.find("skips.backward")));
  ASSERT_NE(backward_graph, std::string::npos) << text;
  const std::string graph = text.substr(backward_graph, text.find("return (", backward_graph) - backward_graph);
  auto count = [&graph](const std::string& what) {
    int64_t n = 0;
    for (size_t pos = graph.find(what); pos != std::string::npos; pos = graph.find(what, pos + 1)) ++n;
    return n;
  };
  const int64_t nodes = count(" = aten::"), transposes = count(" = aten::t("), aliases = count(" = aten::alias(");
  std::cerr << "backward graph: " << nodes << " nodes, " << transposes << " t, " << aliases << " alias; replay steps "
            << steps << "\n";
  EXPECT_LE(steps, nodes - (transposes - 3) - aliases - 1) << text;
}

INSTANTIATE_TEST_SUITE_P(Backends, CompiledBackwardTest, ::testing::Values("aten", "cpp"));

}  // namespace
