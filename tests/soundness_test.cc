// Soundness on what real LibTorch programs do inside a compiled function, through the public API
// and on both backends: thread-local modes set in the body (NoGradGuard, AutoGradMode,
// InferenceMode, autocast), custom autograd Functions, requires_grad_() on intermediates,
// gradients taken inside, eval-mode dropout, default dtype, verification traces. Each test failed
// (wrong result or a throw where eager works) before its fix.
#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tracer/autocast_compat.h"
#include "runtime/warden.h"

namespace {

using ::testing::HasSubstr;

class Soundness : public ::testing::TestWithParam<const char*> {
 protected:
  warden::Options Opts(const std::string& name = "fn") const {
    warden::Options o;
    o.name = name;
    o.backend = GetParam();
    return o;
  }
};

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), want.to(torch::kDouble), 1e-5, 1e-6)) << what;
}

// --- Autograd state C++ reads without an op (Note [Leaf guard] in guards/builder.cc) ----------

// `x.is_leaf()` is a C++ read of autograd state, not an op: a leaf and a tensor with history that
// both require grad must not share an entry (Warden returned the leaf's x * 2 for the other).
TEST_P(Soundness, BranchOnIsLeafOfAnArgumentIsGuarded) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    return {x.is_leaf() ? x * 2 : x * 3};
  };
  auto f = warden::compile(fn, Opts("is_leaf"));
  const at::Tensor leaf = torch::ones({2}).requires_grad_();
  const at::Tensor computed = torch::ones({2}).requires_grad_() * 1;
  ExpectClose(f({leaf})[0].detach(), fn({leaf})[0].detach(), "leaf");
  ExpectClose(f({computed})[0].detach(), fn({computed})[0].detach(), "tensor with history");
  ExpectClose(f({leaf})[0].detach(), fn({leaf})[0].detach(), "leaf again");
  ExpectClose(f({computed})[0].detach(), fn({computed})[0].detach(), "tensor with history again");
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().cache_hits, 2);
  EXPECT_THAT(f.explain(), HasSubstr("arg0.requires_grad == true (not a leaf: it has autograd history)"));
}

// --- Thread-local state set inside the function (Note [Thread modes]) --------------------------

TEST_P(Soundness, NoGradGuardInsideTheBodyIsReplayed) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    at::Tensor y;
    {
      torch::NoGradGuard no_grad;
      y = x * 2 + 1;
    }
    return {y, x * 3};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    auto x = torch::randn({4}).requires_grad_();
    auto out = f({x});
    auto want = fn({x});
    EXPECT_FALSE(out[0].requires_grad()) << "call " << call;
    EXPECT_TRUE(out[1].requires_grad()) << "call " << call;
    ExpectClose(out[0], want[0].detach(), "y");
    ExpectClose(out[1].detach(), want[1].detach(), "x * 3");
  }
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 2);
}

TEST_P(Soundness, AutoGradModeOffInsideTheBodyIsReplayed) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        torch::AutoGradMode off(false);
        return {a[0].toTensor().sin()};
      },
      Opts());
  for (int call = 0; call < 2; ++call) {
    auto out = f({torch::randn({3}).requires_grad_()});
    EXPECT_FALSE(out[0].requires_grad()) << "call " << call;
  }
  EXPECT_EQ(f.stats().cache_hits, 1);
}

TEST_P(Soundness, InferenceModeInsideTheBodyIsReplayed) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        c10::InferenceMode guard;
        return {a[0].toTensor() * 2};
      },
      Opts());
  for (int call = 0; call < 2; ++call) {
    auto out = f({torch::randn({3})});
    EXPECT_TRUE(out[0].is_inference()) << "call " << call;
  }
  EXPECT_EQ(f.stats().cache_hits, 1);
}

TEST_P(Soundness, AutocastInsideTheBodyIsReplayed) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    warden::compat::SetAutocastCpuEnabled(true);
    at::Tensor y = at::mm(a[0].toTensor(), a[1].toTensor());
    warden::compat::SetAutocastCpuEnabled(false);
    return {y, a[0].toTensor() + 1};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 2; ++call) {
    auto a = torch::randn({4, 4}), b = torch::randn({4, 4});
    auto out = f({a, b});
    EXPECT_EQ(out[0].scalar_type(), torch::kBFloat16) << "call " << call;
    EXPECT_EQ(out[1].scalar_type(), torch::kFloat) << "call " << call;
    ExpectClose(out[0], fn({a, b})[0], "mm under autocast");
  }
  EXPECT_FALSE(warden::compat::AutocastCpuEnabled());
}

TEST_P(Soundness, AutocastAtTheCallSiteIsGuarded) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        return {at::mm(a[0].toTensor(), a[0].toTensor())};
      },
      Opts());
  auto a = torch::randn({4, 4});
  EXPECT_EQ(f({a})[0].scalar_type(), torch::kFloat);
  warden::compat::SetAutocastCpuEnabled(true);
  const at::Tensor under = f({a})[0];
  warden::compat::SetAutocastCpuEnabled(false);
  EXPECT_EQ(under.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(f({a})[0].scalar_type(), torch::kFloat);
  EXPECT_EQ(f.stats().compiles, 2);
}

// An optimizer step written in the body: the update runs under NoGradGuard on a captured leaf.
TEST_P(Soundness, OptimizerStepUnderNoGradOnACapturedLeaf) {
  auto make = [] {
    torch::manual_seed(0);
    return torch::randn({5}).requires_grad_();
  };
  auto w_eager = make(), w_warden = make();
  auto step = [](at::Tensor& w) {
    return [&w](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
      const at::Tensor g = a[0].toTensor();
      {
        torch::NoGradGuard no_grad;
        w.sub_(g * 0.1);
      }
      return {w * 2};
    };
  };
  auto eager = step(w_eager);
  auto f = warden::compile(step(w_warden), Opts());
  for (int call = 0; call < 4; ++call) {
    auto g = torch::randn({5});
    auto out = f({g});
    auto want = eager({g});
    ExpectClose(out[0].detach(), want[0].detach(), "w * 2");
    EXPECT_TRUE(out[0].requires_grad());
    ExpectClose(w_warden.detach(), w_eager.detach(), "w after the step");
  }
  EXPECT_EQ(f.stats().cache_hits, 3);
}

// --- Autograd inside the trace (Note [Autograd inside the trace]) ------------------------------

struct GradReverse : public torch::autograd::Function<GradReverse> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    return {-g[0]};
  }
};

TEST_P(Soundness, CustomAutogradFunctionKeepsItsOwnBackward) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {GradReverse::apply(a[0].toTensor() * 2) + 1};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    auto x = torch::randn({4}).requires_grad_();
    auto out = f({x});
    ASSERT_TRUE(out[0].requires_grad()) << "call " << call;
    out[0].sum().backward();
    ExpectClose(x.grad(), torch::full({4}, -2.0), "gradient through the Function's backward");
  }
  EXPECT_EQ(f.stats().compiles, 0);
  EXPECT_EQ(f.stats().eager_calls, 3);
  EXPECT_THAT(f.explain(), HasSubstr("GradReverse"));
}

TEST_P(Soundness, CustomAutogradFunctionOnAnArgumentDirectly) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        return {GradReverse::apply(a[0].toTensor())};
      },
      Opts());
  for (int call = 0; call < 2; ++call) {
    auto x = torch::randn({3}).requires_grad_();
    auto out = f({x});
    ASSERT_NE(out[0].grad_fn(), nullptr);
    out[0].sum().backward();
    ExpectClose(x.grad(), torch::full({3}, -1.0), "gradient");
  }
}

TEST_P(Soundness, RequiresGradOnAnIntermediate) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        at::Tensor y = a[0].toTensor() * 2;
        y.requires_grad_(true);
        return {y, y * 3};
      },
      Opts());
  for (int call = 0; call < 3; ++call) {
    auto out = f({torch::randn({4})});
    EXPECT_TRUE(out[0].requires_grad()) << "call " << call;
    EXPECT_TRUE(out[0].is_leaf()) << "call " << call;
    ASSERT_TRUE(out[1].requires_grad()) << "call " << call;
    out[1].sum().backward();
    ASSERT_TRUE(out[0].grad().defined()) << "call " << call;
    ExpectClose(out[0].grad(), torch::full({4}, 3.0), "dz/dy");
  }
  EXPECT_EQ(f.stats().compiles, 1);
}

TEST_P(Soundness, RequiresGradReadOnAnIntermediateMatchesEager) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor y = a[0].toTensor() * 2;
    return {y.requires_grad() && !y.is_leaf() ? y + 1 : y - 1};
  };
  auto f = warden::compile(fn, Opts());
  auto x = torch::randn({3}).requires_grad_();
  ExpectClose(f({x})[0].detach(), fn({x})[0].detach(), "branch on requires_grad");
  ExpectClose(f({x})[0].detach(), fn({x})[0].detach(), "branch on requires_grad (hit)");
}

// An argument outlives the call: requires_grad_() on it is replayed even when nothing reads it
// afterwards (found by the pattern fuzzer).
TEST_P(Soundness, RequiresGradOnAnArgumentNothingReadsAfterwards) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    at::Tensor y = x * 2;
    x.requires_grad_(true);
    return {y};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    at::Tensor x = torch::ones({3});
    const auto out = f({x});
    EXPECT_TRUE(x.requires_grad()) << "call " << call;
    EXPECT_FALSE(out[0].requires_grad()) << "call " << call;
  }
  EXPECT_EQ(f.stats().cache_hits, 2);
}

// `to` a dtype the tensor has returns the tensor itself: the two names are one tensor, so
// requires_grad_() through one is seen through the other (found by the pattern fuzzer).
TEST_P(Soundness, OpReturningItsInputIsOneTensor) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor() * 2;
    at::Tensor y = x.to(torch::kDouble);
    y.requires_grad_(true);
    return {x, y * 3, torch::scalar_tensor(static_cast<double>(x.is_same(y)))};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::ones({3}, torch::kDouble);
    const auto out = f({x});
    const auto want = fn({x});
    EXPECT_TRUE(out[0].requires_grad()) << "call " << call;
    EXPECT_TRUE(out[1].requires_grad()) << "call " << call;
    ExpectClose(out[1].detach(), want[1].detach(), "y * 3");
    ExpectClose(out[2], want[2], "x.is_same(y)");
  }
  EXPECT_EQ(f.stats().cache_hits, 2);
}

// requires_grad_() on an inference tensor is only allowed inside InferenceMode: replayed there,
// although the trace notices the flag after the scope ended (found by the pattern fuzzer).
TEST_P(Soundness, RequiresGradInsideInferenceMode) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor y;
    {
      c10::InferenceMode guard;
      y = a[0].toTensor() * 2;
      y.requires_grad_(true);
    }
    return {y};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    const auto out = f({torch::ones({3})});
    EXPECT_TRUE(out[0].is_inference()) << "call " << call;
    EXPECT_TRUE(out[0].requires_grad()) << "call " << call;
    ExpectClose(out[0].detach(), torch::full({3}, 2.0), "y");
  }
  EXPECT_EQ(f.stats().cache_hits, 2);
}

// A view made under NoGradGuard of a tensor that requires grad requires grad through its base
// while its own flag is off; requires_grad_() on it makes it a leaf that gets a gradient (found by
// the pattern fuzzer: the flag was compared through requires_grad(), which hid the call).
TEST_P(Soundness, RequiresGradOnAViewMadeUnderNoGrad) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor y = a[0].toTensor() * 2;
    at::Tensor v;
    {
      torch::NoGradGuard no_grad;
      v = y.select(0, 1);
      v.requires_grad_(true);
    }
    return {v};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::ones({3, 2}).requires_grad_();
    const auto out = f({x});
    const auto want = fn({x});
    EXPECT_EQ(out[0].is_leaf(), want[0].is_leaf()) << "call " << call;
    out[0].sum().backward();
    want[0].sum().backward();
    ASSERT_TRUE(out[0].grad().defined()) << "call " << call;
    ExpectClose(out[0].grad(), want[0].grad(), "grad of the view");
  }
}

// Writing a view under NoGradGuard, then reading it there: eager never asks for the view's history
// (which would raise), and the tracer must not either (found by the pattern fuzzer).
TEST_P(Soundness, InPlaceOnAViewUnderNoGradOfALeafThatRequiresGrad) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    at::Tensor w;
    {
      torch::NoGradGuard no_grad;
      at::Tensor v = x.view({-1});
      v.add_(1);
      w = v.log_softmax(0);
    }
    return {w, x * 2};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::zeros({4}).requires_grad_(), x_eager = torch::zeros({4}).requires_grad_();
    const auto out = f({x});
    const auto want = fn({x_eager});
    ExpectClose(out[0], want[0], "log_softmax");
    ExpectClose(out[1].detach(), want[1].detach(), "x * 2");
    EXPECT_TRUE(torch::equal(x.detach(), x_eager.detach())) << "call " << call;
  }
}

// A wrapper is an inference tensor exactly when its real tensor is: requires_grad_(true) on an
// inference tensor outside InferenceMode raises in the function, as in eager (found by the pattern
// fuzzer: the trace's wrapper was a normal tensor, so the call returned).
TEST_P(Soundness, RequiresGradOnAnInferenceTensorOutsideInferenceModeRaises) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor y;
    {
      c10::InferenceMode guard;
      y = a[0].toTensor() * 2;
    }
    EXPECT_TRUE(y.is_inference());
    y.requires_grad_(true);
    return {y};
  };
  auto f = warden::compile(fn, Opts());
  const at::Tensor x = torch::ones({3});
  EXPECT_THROW(fn({x}), c10::Error);
  for (int call = 0; call < 2; ++call) {
    try {
      f({x});
      ADD_FAILURE() << "call " << call << " returned; eager raises";
    } catch (const std::exception& e) {
      EXPECT_THAT(e.what(), HasSubstr("Setting requires_grad=True on inference tensor outside InferenceMode"));
    }
  }
}

// In-place writes inside InferenceMode to an argument that requires grad and to a view of it made
// there, the argument passed twice (found by the pattern fuzzer: Warden raised "A view was created
// in inference mode ..." where eager returned).
TEST_P(Soundness, InPlaceOnAViewMadeInInferenceMode) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor(), y = a[1].toTensor();
    at::Tensor s;
    {
      c10::InferenceMode guard;
      s = y.matmul(y.t()).sum();
      y.add_(0.5);
      at::Tensor t = y.transpose(0, 1);
      t.add_(t);
    }
    return {s, x.is_same(y) ? x * 3 : x + y};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::ones({2, 3}).requires_grad_(), x_eager = torch::ones({2, 3}).requires_grad_();
    const auto out = f({x, x});
    const auto want = fn({x_eager, x_eager});
    ExpectClose(out[0], want[0], "sum");
    ExpectClose(out[1].detach(), want[1].detach(), "x * 3");
    EXPECT_TRUE(torch::equal(x.detach(), x_eager.detach())) << "call " << call;
  }
}

// requires_grad_() on an argument reaches another argument that is a view of it before the next
// op, not when the first is next used (found by the pattern fuzzer).
TEST_P(Soundness, RequiresGradOnAnArgumentAnotherArgumentViews) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.requires_grad_(true);
    return {a[1].toTensor().abs(), x};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::ones({3}), x_eager = torch::ones({3});
    const auto out = f({x, x.view({3})});
    const auto want = fn({x_eager, x_eager.view({3})});
    EXPECT_TRUE(want[0].requires_grad());
    EXPECT_EQ(out[0].requires_grad(), want[0].requires_grad()) << "call " << call;
  }
}

// Warden's own looks at autograd state must leave none behind: reading grad_fn() of a view whose
// base was written would regenerate its history and make the caller's view a non-leaf, which eager
// does not (found by the pattern fuzzer).
TEST_P(Soundness, TracingLeavesAViewArgumentALeaf) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor(), v = a[1].toTensor();
    at::Tensor s = v + x;
    v.add_(1.5);
    x.requires_grad_(true);
    return {x, s};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::ones({2}), x_eager = torch::ones({2});
    const at::Tensor v = x.view({2}), v_eager = x_eager.view({2});
    const auto out = f({x, v});
    const auto want = fn({x_eager, v_eager});
    EXPECT_TRUE(v_eager.requires_grad());
    EXPECT_EQ(v.is_leaf(), v_eager.is_leaf()) << "call " << call;
    ExpectClose(out[1], want[1], "v + x");
  }
}

TEST_P(Soundness, AutogradGradInsideTheFunction) {
  // A sampler's logp and dlogp in one function.
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor theta = a[0].toTensor();
    at::Tensor logp = -(theta * theta).sum() * 0.5;
    auto grads = torch::autograd::grad({logp}, {theta});
    return {logp.detach(), grads[0]};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    auto theta = torch::randn({5}).requires_grad_();
    auto out = f({theta});
    ExpectClose(out[0], (-(theta * theta).sum() * 0.5).detach(), "logp");
    ExpectClose(out[1], -theta.detach(), "dlogp");
  }
  EXPECT_EQ(f.stats().calls, 3);
  // Captured (Note [Captured gradients]): one graph with the backward in it, replayed on hits.
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_THAT(f.explain(), HasSubstr("gradient captured: d(%3) / d(%arg0)"));
  EXPECT_THAT(f.explain(), HasSubstr("# backward of %0"));
}

TEST_P(Soundness, GradientPenaltyWithCreateGraph) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    at::Tensor y = (x * x * x).sum();
    auto g = torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    return {(g * g).sum()};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 2; ++call) {
    auto x = torch::randn({4}).requires_grad_();
    auto out = f({x});
    auto x2 = x.detach().clone().requires_grad_();
    auto want = fn({x2});
    ExpectClose(out[0].detach(), want[0].detach(), "penalty");
    ASSERT_TRUE(out[0].requires_grad());
    out[0].backward();
    want[0].backward();
    ExpectClose(x.grad(), x2.grad(), "gradient of the penalty");
  }
}

TEST_P(Soundness, TrainingStepWithBackwardInsideTheFunction) {
  auto make = [] {
    torch::manual_seed(3);
    return torch::randn({4}).requires_grad_();
  };
  auto w_eager = make(), w_warden = make();
  auto step = [](at::Tensor& w) {
    return [&w](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
      at::Tensor loss = ((w * a[0].toTensor()).sum() - 1).pow(2);
      loss.backward();
      {
        torch::NoGradGuard no_grad;
        w.sub_(w.grad() * 0.05);
        w.mutable_grad().zero_();
      }
      return {loss.detach()};
    };
  };
  auto eager = step(w_eager);
  auto f = warden::compile(step(w_warden), Opts());
  for (int call = 0; call < 5; ++call) {
    auto x = torch::randn({4});
    ExpectClose(f({x})[0], eager({x})[0], "loss");
    ExpectClose(w_warden.detach(), w_eager.detach(), "w");
  }
}

// --- Module state: watch() (Note [Watched modules]) ---------------------------------------------

torch::nn::Sequential MakeBnNet() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6), torch::nn::Dropout(0.5));
}

warden::Fn Forward(torch::nn::Sequential net) {
  return [net](const std::vector<c10::IValue>& a) mutable -> std::vector<at::Tensor> {
    return {net->forward(a[0].toTensor())};
  };
}

// Both sides draw dropout's mask from the same seed, so train-mode outputs compare exactly.
void ExpectTwins(warden::CompiledFunction& f, torch::nn::Sequential& warden_net, torch::nn::Sequential& eager_net,
                 const at::Tensor& x, const std::string& what) {
  torch::manual_seed(11);
  const at::Tensor got = f({x})[0];
  torch::manual_seed(11);
  const at::Tensor want = eager_net->forward(x);
  ExpectClose(got.detach(), want.detach(), what + ": output");
  const auto bw = warden_net[1]->as<torch::nn::BatchNorm1d>(), be = eager_net[1]->as<torch::nn::BatchNorm1d>();
  ExpectClose(bw->running_mean, be->running_mean, what + ": running_mean");
  ExpectClose(bw->running_var, be->running_var, what + ": running_var");
}

TEST_P(Soundness, WatchedModuleSwitchingTrainAndEval) {
  auto warden_net = MakeBnNet(), eager_net = MakeBnNet();
  auto f = warden::compile(Forward(warden_net), Opts());
  f.watch(*warden_net, "model");
  auto x = torch::randn({8, 4});
  ExpectTwins(f, warden_net, eager_net, x, "train");
  ExpectTwins(f, warden_net, eager_net, x, "train (hit)");
  EXPECT_EQ(f.stats().compiles, 1);
  warden_net->eval();
  eager_net->eval();
  ExpectTwins(f, warden_net, eager_net, x, "eval");
  EXPECT_EQ(f.stats().compiles, 2);
  ASSERT_EQ(f.recompiles().size(), 1u);
  EXPECT_EQ(f.recompiles()[0].reasons[0], "module 'model' training mismatch. expected true, actual false");
  ExpectTwins(f, warden_net, eager_net, x, "eval (hit)");
  warden_net->train();
  eager_net->train();
  ExpectTwins(f, warden_net, eager_net, x, "train again (hit of the first entry)");
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().cache_hits, 3);
}

TEST_P(Soundness, WatchedSubmoduleModeSwitchNamesTheSubmodule) {
  auto net = MakeBnNet();
  auto f = warden::compile(Forward(net), Opts());
  f.watch(*net, "model");
  f({torch::randn({4, 4})});
  net[1]->eval();  // only the BatchNorm
  f({torch::randn({4, 4})});
  ASSERT_EQ(f.recompiles().size(), 1u);
  EXPECT_EQ(f.recompiles()[0].reasons[0], "module 'model.1' training mismatch. expected true, actual false");
  EXPECT_THAT(f.guards(0), ::testing::Contains(HasSubstr("module 'model.1' training == true")));
}

struct TwoLayer : torch::nn::Module {
  TwoLayer() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
    register_buffer("scale", torch::full({3}, 2.0));
  }
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x) * named_buffers()["scale"]; }
  torch::nn::Linear fc{nullptr};
};

TEST_P(Soundness, WatchedModuleReplacedSubmoduleRecompiles) {
  auto net = std::make_shared<TwoLayer>();
  auto f = warden::compile(
      [net](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> { return {net->forward(a[0].toTensor())}; },
      Opts());
  f.watch(*net, "net");
  auto x = torch::randn({2, 4});
  f({x});
  net->fc = net->replace_module("fc", torch::nn::Linear(4, 3));
  ExpectClose(f({x})[0].detach(), net->forward(x).detach(), "after replace_module");
  ASSERT_EQ(f.recompiles().size(), 1u);
  EXPECT_EQ(f.recompiles()[0].reasons[0], "module 'net' submodule 'fc' replaced");
}

// `lin->weight = t` rebinds the member LinearImpl::forward reads; the graph captured the old tensor.
TEST_P(Soundness, WatchedModuleParameterRebound) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  model->eval();
  auto fn = [model](const std::vector<c10::IValue>& a) mutable -> std::vector<at::Tensor> {
    return {model->forward(a[0].toTensor())};
  };
  auto f = warden::compile(fn, Opts());
  f.watch(*model, "model");
  const auto x = torch::randn({2, 4});
  ExpectClose(f({x})[0], fn({x})[0], "first call");
  auto lin = model[0]->as<torch::nn::Linear>();
  lin->weight = torch::ones({3, 4});
  ExpectClose(f({x})[0], fn({x})[0], "after rebinding the weight");
  ASSERT_EQ(f.recompiles().size(), 1u);
  EXPECT_EQ(f.recompiles()[0].reasons[0], "module 'model' parameter '0.weight' rebound");
  ExpectClose(f({x})[0], fn({x})[0], "hit after rebinding");
  model[1]->as<torch::nn::BatchNorm1d>()->running_mean = torch::full({3}, 2.0);
  ExpectClose(f({x})[0], fn({x})[0], "after rebinding a buffer");
  ASSERT_EQ(f.recompiles().size(), 2u);
  EXPECT_EQ(f.recompiles()[1].reasons[0], "module 'model' buffer '1.running_mean' rebound");
  EXPECT_EQ(f.stats().cache_hits, 1);
}

TEST_P(Soundness, ReplacingASubmoduleInsideTheFunctionRunsEagerly) {
  auto net = std::make_shared<TwoLayer>();
  // Built outside: a module constructed inside the trace would hold traced tensors.
  std::vector<torch::nn::Linear> spares = {torch::nn::Linear(4, 3), torch::nn::Linear(4, 3)};
  size_t next = 0;
  auto f = warden::compile(
      [net, spares, &next](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        at::Tensor y = net->forward(a[0].toTensor());
        net->fc = net->replace_module("fc", spares[next++ % spares.size()]);
        return {y};
      },
      Opts());
  f.watch(*net, "net");
  auto x = torch::randn({2, 4});
  for (int call = 0; call < 2; ++call) {
    const at::Tensor want = net->forward(x).detach();
    ExpectClose(f({x})[0].detach(), want, "output with the submodule of that call");
  }
  EXPECT_EQ(f.stats().compiles, 0);
  EXPECT_EQ(f.stats().eager_calls, 2);
  EXPECT_THAT(f.explain(), HasSubstr("registers or replaces submodules of a watched module"));
}

TEST_P(Soundness, WatchDropsExistingEntriesAndRequiresASharedModule) {
  auto net = MakeBnNet();
  auto f = warden::compile(Forward(net), Opts());
  f({torch::randn({4, 4})});
  EXPECT_THAT(f.explain(), HasSubstr("watch(module)"));
  f.watch(*net, "model");
  EXPECT_THROW(f.guards(0), warden::Error);
  f({torch::randn({4, 4})});
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_THAT(f.explain(), ::testing::Not(HasSubstr("watch(module)")));
  torch::nn::LinearImpl on_stack(2, 2);
  EXPECT_THROW(f.watch(on_stack), warden::Error);
}

// The guard describes the flags as the call found them; the switch the function makes is replayed.
TEST_P(Soundness, WatchedFlagChangedInsideTheFunction) {
  torch::nn::Dropout drop(0.5);
  auto f = warden::compile(
      [drop](const std::vector<c10::IValue>& a) mutable -> std::vector<at::Tensor> {
        at::Tensor y = drop(a[0].toTensor());
        drop->eval();
        return {y};
      },
      Opts());
  f.watch(*drop, "drop");
  auto x = torch::ones({64});
  f({x});  // enters in train mode, leaves eval
  EXPECT_FALSE(drop->is_training());
  ExpectClose(f({x})[0], x, "enters in eval: dropout is the identity");
  drop->train();
  const at::Tensor y = f({x})[0];  // the train-mode entry: draws, then leaves eval again
  EXPECT_FALSE(drop->is_training());
  EXPECT_TRUE(((y == 0) | (y == 2)).all().item<bool>());
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().cache_hits, 1);
}

TEST_P(Soundness, UnwatchedModeDependentOpIsNamedInExplain) {
  auto net = MakeBnNet();
  auto f = warden::compile(Forward(net), Opts());
  f({torch::randn({4, 4})});
  const std::string text = f.explain();
  EXPECT_THAT(text, HasSubstr("batch_norm"));
  EXPECT_THAT(text, HasSubstr("training=true"));
  EXPECT_THAT(text, HasSubstr("watch(module)"));
}

TEST_P(Soundness, OptimizerStepReadingAnArgumentsGrad) {
  auto step = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor p = a[0].toTensor();
    {
      torch::NoGradGuard no_grad;
      p.sub_(p.grad() * 0.1);
    }
    return {p * 1};
  };
  auto f = warden::compile(step, Opts());
  for (int call = 0; call < 3; ++call) {
    auto p = torch::randn({3}).requires_grad_(), q = p.detach().clone().requires_grad_();
    (p * p).sum().backward();
    (q * q).sum().backward();
    auto got = f({p});
    auto want = step({q});
    ExpectClose(got[0].detach(), want[0].detach(), "result");
    ExpectClose(p.detach(), q.detach(), "parameter after the step");
  }
}

// --- Eval-mode dropout draws nothing -------------------------------------------------------------

TEST_P(Soundness, EvalModeDropoutBeforeItemStaysCompiled) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        at::Tensor y = torch::dropout(a[0].toTensor(), 0.5, /*train=*/false);
        const double s = y.sum().item<double>();
        return {s > 0 ? y * 2 : y * 3};
      },
      Opts());
  auto x = torch::ones({4});
  for (int call = 0; call < 3; ++call) ExpectClose(f({x})[0], x * 2, "dropout(eval) then item");
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 2);
}

// --- Default dtype and verification traces --------------------------------------------------------

TEST_P(Soundness, IntegerToFloatingOpsFollowTheDefaultDtype) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor i = a[0].toTensor();
    return {i.exp(), i / (i + 1)};
  };
  auto f = warden::compile(fn, Opts());
  auto i = torch::arange(4, torch::kLong);
  EXPECT_EQ(f({i})[0].scalar_type(), torch::kFloat);
  torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
  const auto got = f({i});
  const auto want = fn({i});
  torch::set_default_dtype(caffe2::TypeMeta::Make<float>());
  ExpectClose(got[0], want[0], "exp of int64 under default double");
  ExpectClose(got[1], want[1], "int64 true division under default double");
  EXPECT_EQ(got[0].scalar_type(), torch::kDouble);
  EXPECT_EQ(f.stats().compiles, 2);
}

TEST_P(Soundness, VerificationTraceOfAMarkedScalarWritesNothing) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    const double alpha = a[1].toDouble();
    if (alpha > 0) x.add_(1);
    return {x * alpha};
  };
  auto f = warden::compile(fn, Opts());
  f.mark_dynamic(1, 0);
  auto x = torch::zeros({3});
  ExpectClose(f({x, -0.5})[0], torch::zeros({3}), "result");
  // The second trace runs with another value of alpha (0.125 > 0): it must not write x.
  EXPECT_TRUE(torch::equal(x, torch::zeros({3})));
  auto y = torch::zeros({3});
  ExpectClose(f({y, 2.0})[0], fn({torch::zeros({3}), 2.0})[0], "positive alpha");
  EXPECT_TRUE(torch::equal(y, torch::ones({3})));
}

INSTANTIATE_TEST_SUITE_P(Backends, Soundness, ::testing::Values("aten", "cpp"));

}  // namespace
