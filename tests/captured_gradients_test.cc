// Gradients taken inside a compiled function (Note [Captured gradients] in tracer/tracer.cc):
// captured into the graph, compiled by both backends, equal to eager's; everything Warden cannot
// capture runs eagerly with the reason, and raises where eager raises.
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "bench/radon.h"
#include "ops/derivatives.h"
#include "runtime/codegen_replay.h"
#include "runtime/warden.h"
#include "tests/gradient_checks.h"

namespace {

using ::testing::HasSubstr;
using Args = std::vector<c10::IValue>;
using Fn = std::function<std::vector<at::Tensor>(const Args&)>;

using CapturedGradients = warden::testing::BackendTest;
using warden::testing::ExpectClose;

void ExpectCaptured(const warden::CompiledFunction& f) {
  EXPECT_EQ(f.stats().eager_calls, 0) << f.explain();
  EXPECT_THAT(f.explain(), HasSubstr("gradient captured")) << f.explain();
}

// The sampler's call: logp and its gradient in one function, the position made a leaf inside.
TEST_P(CapturedGradients, RadonLogpAndGradientInOneGraph) {
  const warden::bench::RadonData data = warden::bench::MakeRadonData();
  auto fn = [&data](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor theta = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor logp = warden::bench::RadonLogp(theta, data);
    const at::Tensor grad = torch::autograd::grad({logp}, {theta})[0];
    return {logp.detach(), grad};
  };
  auto f = warden::compile(fn, Opts("radon"));
  for (int call = 0; call < 4; ++call) {
    const at::Tensor theta = warden::bench::RadonTheta(data) + 0.05 * call;
    const auto got = f({theta});
    const auto want = fn({theta});
    ExpectClose(got[0], want[0], "logp", 1e-10, 1e-10);
    ExpectClose(got[1], want[1], "dlogp", 1e-10, 1e-10);
  }
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 3);
  ExpectCaptured(f);
  EXPECT_THAT(f.explain(), HasSubstr("backward of"));
  if (const char* flag = std::getenv("TWIN_EXPLAIN"); flag != nullptr && *flag == '1') std::cerr << f.explain();
}

// theta passed in requiring grad, logp returned with its history: the forward keeps autograd (a
// backward outside works), the captured gradient has none.
TEST_P(CapturedGradients, GradientOfAnArgumentThatRequiresGrad) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    const at::Tensor y = (x.exp() * x).sum() + x.sin().sum();
    return {y, torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true)[0]};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({6}).requires_grad_(), x2 = x.detach().clone().requires_grad_();
    auto got = f({x});
    auto want = fn({x2});
    ExpectClose(got[0], want[0], "y");
    ExpectClose(got[1], want[1], "dy/dx");
    got[0].backward();
    want[0].backward();
    ExpectClose(x.grad(), x2.grad(), "x.grad after a backward outside");
  }
  ExpectCaptured(f);
}

// An op that returns its input as itself (to() its own dtype, contiguous() of a contiguous tensor)
// gives the tracer a second value for one autograd variable; the gradient with respect to that
// variable must include the paths through both (it used to follow only the later value's uses:
// d/dx of exp(x + 0) + sin(x.to(float)) came back as cos(x)). Arguments and captured tensors.
TEST_P(CapturedGradients, TensorReturnedAsItselfKeepsEveryPathOfItsGradient) {
  const at::Tensor w0 = torch::randn({4});
  at::Tensor w = w0.clone().requires_grad_(), w2 = w0.clone().requires_grad_();
  auto step = [](at::Tensor& param) {
    return [&param](const Args& a) -> std::vector<at::Tensor> {
      const at::Tensor x = a[0].toTensor();
      const at::Tensor y = (x + 0.0).exp().sum() + x.to(at::kFloat).sin().sum() +
                           (x.contiguous() * param).sum() + (param * 2).pow(2).sum() +
                           param.contiguous().tanh().sum();
      const auto g = torch::autograd::grad({y}, {x, param}, {}, /*retain_graph=*/false);
      return {y.detach(), g[0], g[1]};
    };
  };
  auto f = warden::compile(step(w), Opts("returned_as_itself"));
  auto reference = step(w2);
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({4}).requires_grad_(), x2 = x.detach().clone().requires_grad_();
    const auto got = f({x});
    const auto want = reference({x2});
    ExpectClose(got[0], want[0], "y");
    ExpectClose(got[1], want[1], "dy/dx");
    ExpectClose(got[2], want[2], "dy/dparam");
  }
  ExpectCaptured(f);
}

// Note [Outside history] in tracer/tracer.cc: an argument that is a view of another one (made by
// the caller, so its history is outside the function) carries gradient into it in eager; the
// entry traced with two independent leaves must not be replayed for it, and its own trace runs
// eagerly. Independent leaves again hit the captured entry.
TEST_P(CapturedGradients, ArgumentWithHistoryFromOutsideIsNotReplayed) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor(), y = a[1].toTensor();
    const at::Tensor loss = (x * 3).sum() + y.exp().sum();
    const auto g = torch::autograd::grad({loss}, {x, y});
    return {g[0], g[1]};
  };
  auto f = warden::compile(fn, Opts("outside_history"));
  auto check = [&](const at::Tensor& x, const at::Tensor& y, const at::Tensor& x2, const at::Tensor& y2,
                   const std::string& what) {
    const auto got = f({x, y});
    const auto want = fn({x2, y2});
    ExpectClose(got[0], want[0], "dx, " + what);
    ExpectClose(got[1], want[1], "dy, " + what);
  };
  const at::Tensor base = torch::randn({4});
  at::Tensor x = base.clone().requires_grad_(), x2 = base.clone().requires_grad_();
  const at::Tensor y0 = torch::randn({4});
  check(x, y0.clone().requires_grad_(), x2, y0.clone().requires_grad_(), "independent leaves");
  {
    // y = x.view(...): dx is 3 + exp(x) in eager.
    const at::Tensor y = x.view({4}), y2 = x2.view({4});
    ASSERT_FALSE(y.is_leaf());
    check(x, y, x2, y2, "y a view of x");
  }
  const at::Tensor y = torch::randn({4});
  check(x, y.clone().requires_grad_(), x2, y.clone().requires_grad_(), "independent leaves again");
}

// An MLP's loss gradient with respect to its parameters (captured tensors), as a hand-written
// training step computes it before an optimizer update.
TEST_P(CapturedGradients, MlpParameterGradientsMatchEagerOverTrainingSteps) {
  torch::manual_seed(5);
  torch::nn::Sequential eager(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 3));
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 16),
                              torch::nn::Tanh(), torch::nn::Linear(16, 3));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < eager->parameters().size(); ++i) model->parameters()[i].copy_(eager->parameters()[i]);
  }
  auto step_fn = [](torch::nn::Sequential& m) {
    return [&m](const Args& a) -> std::vector<at::Tensor> {
      const at::Tensor x = a[0].toTensor(), target = a[1].toTensor();
      const at::Tensor logits = m->forward(x);
      const at::Tensor loss = torch::log_softmax(logits, 1).mul(target).sum().neg() / 4.0 +
                              (logits * logits).mean() * 0.01;
      std::vector<at::Tensor> out = torch::autograd::grad({loss}, m->parameters());
      out.insert(out.begin(), loss.detach());
      return out;
    };
  };
  auto f = warden::compile(step_fn(model), Opts("mlp_step"));
  auto reference = step_fn(eager);
  torch::optim::SGD opt_model(model->parameters(), 0.1), opt_eager(eager->parameters(), 0.1);
  for (int step = 0; step < 20; ++step) {
    torch::manual_seed(100 + step);
    const at::Tensor x = torch::randn({4, 8});
    const at::Tensor target = torch::one_hot(torch::randint(3, {4}), 3).to(torch::kFloat);
    const auto got = f({x, target});
    const auto want = reference({x, target});
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ExpectClose(got[i], want[i], "output " + std::to_string(i), 1e-4, 1e-5);
    for (size_t i = 0; i + 1 < got.size(); ++i) {
      model->parameters()[i].mutable_grad() = got[i + 1];
      eager->parameters()[i].mutable_grad() = want[i + 1];
    }
    opt_model.step();
    opt_eager.step();
  }
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    ExpectClose(model->parameters()[i], eager->parameters()[i], "parameter " + std::to_string(i), 1e-4, 1e-5);
  }
  EXPECT_EQ(f.stats().compiles, 1) << f.explain();
  ExpectCaptured(f);
}

// WGAN-GP's gradient penalty on an MLP critic: create_graph, then backward outside through it.
TEST_P(CapturedGradients, GradientPenaltyWithCreateGraphBackpropagatesOutside) {
  torch::manual_seed(9);
  torch::nn::Sequential critic(torch::nn::Linear(6, 12), torch::nn::Tanh(), torch::nn::Linear(12, 1));
  auto fn = [&critic](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor interp = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor score = critic->forward(interp);
    const at::Tensor grad = torch::autograd::grad({score.sum()}, {interp}, {}, /*retain_graph=*/true,
                                                  /*create_graph=*/true)[0];
    const at::Tensor penalty = ((grad * grad).sum(1).sqrt() - 1).pow(2).mean();
    return {penalty};
  };
  auto f = warden::compile(fn, Opts("penalty"));
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({5, 6});
    for (auto& p : critic->parameters()) p.mutable_grad() = at::Tensor();
    const auto got = f({x});
    ASSERT_TRUE(got[0].requires_grad());
    got[0].backward();
    std::vector<at::Tensor> got_grads;
    // The last layer's bias does not reach the penalty: its grad stays undefined, as in eager.
    for (auto& p : critic->parameters()) got_grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    for (auto& p : critic->parameters()) p.mutable_grad() = at::Tensor();
    const auto want = fn({x});
    want[0].backward();
    ExpectClose(got[0], want[0], "penalty");
    for (size_t i = 0; i < got_grads.size(); ++i) {
      ExpectClose(got_grads[i], critic->parameters()[i].grad(), "critic parameter grad " + std::to_string(i));
    }
  }
  EXPECT_THAT(f.explain(), HasSubstr("create_graph"));
  ExpectCaptured(f);
}

// A batch sweep: the captured backward follows the batch like the forward (no compile per size).
TEST_P(CapturedGradients, BatchSweepDoesNotRecompilePerSize) {
  torch::manual_seed(2);
  const at::Tensor w = torch::randn({5, 3}).requires_grad_();
  auto fn = [&w](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor y = torch::sigmoid(x.mm(w)).sum();
    auto g = torch::autograd::grad({y}, {x, w});
    return {g[0], g[1]};
  };
  auto f = warden::compile(fn, Opts("sweep"));
  for (int64_t b = 2; b <= 9; ++b) {
    const at::Tensor x = torch::randn({b, 5});
    const auto got = f({x});
    const auto want = fn({x});
    ExpectClose(got[0], want[0], "dx at batch " + std::to_string(b));
    ExpectClose(got[1], want[1], "dw at batch " + std::to_string(b));
  }
  EXPECT_LE(f.stats().compiles, 2) << f.explain();
  ExpectCaptured(f);
}

// ---------------------------------------------------------------------------------------------
// A derivative fuzz: each rule against autograd, through a compiled function, random inputs,
// with broadcasting where the op allows it.
struct RuleCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;  // inputs (all differentiated)
  std::function<at::Tensor(const std::vector<at::Tensor>&)> op;
  bool positive = false;  // inputs in (0.5, 1.5)
};

std::vector<RuleCase> RuleCases() {
  using V = std::vector<at::Tensor>;
  return {
      {"add_broadcast", {{3, 4}, {4}}, [](const V& v) { return v[0] + v[1] * 2; }},
      {"sub_alpha", {{3, 1}, {1, 4}}, [](const V& v) { return at::sub(v[0], v[1], 3); }},
      {"rsub", {{3, 4}}, [](const V& v) { return 2 - v[0]; }},
      {"mul_div", {{2, 3}, {3}}, [](const V& v) { return v[0] * v[1] / (v[1] * v[1] + 1); }, true},
      {"unary", {{7}}, [](const V& v) { return v[0].exp() + v[0].log() + v[0].sqrt() + v[0].rsqrt() + v[0].reciprocal(); }, true},
      {"unary2", {{7}}, [](const V& v) { return v[0].tanh() + v[0].sigmoid() + v[0].relu() + at::silu(v[0]) + v[0].abs(); }},
      {"trig_pow", {{6}}, [](const V& v) { return v[0].sin() * v[0].cos() + v[0].pow(3) + v[0].square() + v[0].log1p() + v[0].expm1(); }, true},
      {"clamp", {{9}}, [](const V& v) { return v[0].clamp_min(-0.2) + v[0].clamp_max(0.3); }},
      {"reductions", {{3, 4, 5}}, [](const V& v) { return v[0].sum(1) * 2 + v[0].mean(std::vector<int64_t>{0, 2}).sum() + v[0].mean() + v[0].sum(std::vector<int64_t>{1}, true).squeeze(1); }},
      {"views", {{2, 3, 4}}, [](const V& v) { return v[0].view({6, 4}).t().reshape({2, 12}).permute({1, 0}).transpose(0, 1).unsqueeze(0).expand({3, 2, 12}); }},
      {"select_slice", {{5, 6}}, [](const V& v) { return v[0].select(0, 2) * 3 + v[0].narrow(0, 1, 3).sum(0) + v[0].slice(1, 0, 6, 2).sum(); }},
      {"index", {{6, 3}}, [](const V& v) { return v[0].index_select(0, torch::tensor({0, 2, 2, 5})) + v[0].gather(1, torch::tensor({{0}, {2}, {1}, {1}})).sum(); }},
      {"matmuls", {{4, 5}, {5, 3}, {3}}, [](const V& v) { return at::addmm(v[2], v[0], v[1], 0.5, 2.0) + v[0].mm(v[1]) + v[0].matmul(v[1]).mv(v[2]).unsqueeze(1); }},
      {"bmm_dot", {{2, 3, 4}, {2, 4, 2}, {5}}, [](const V& v) { return v[0].bmm(v[1]).sum() + v[2].dot(v[2]); }},
      {"softmaxes", {{3, 5}}, [](const V& v) { return torch::softmax(v[0], 1) * torch::log_softmax(v[0], 0); }},
      {"where_masked", {{4, 4}, {4}}, [](const V& v) { return at::where(v[0] > 0, v[0], v[1]) + v[0].masked_fill(v[0] < -0.5, 2.0); }},
      {"cat_stack", {{2, 3}, {4, 3}}, [](const V& v) { return at::cat({v[0], v[1] * 2}, 0).sum(0) + at::stack({v[0].sum(0), v[1].sum(0)}).sum(0); }},
      {"to_dtype", {{5}}, [](const V& v) { return v[0].to(torch::kDouble).exp().to(torch::kFloat) * v[0].clone(); }},
      {"conv2d", {{2, 3, 6, 6}, {4, 3, 3, 3}, {4}}, [](const V& v) { return torch::conv2d(v[0], v[1], v[2], {2, 1}, {1, 0}); }},
      {"conv1d_groups", {{2, 4, 7}, {4, 2, 3}}, [](const V& v) { return torch::conv1d(v[0], v[1], {}, 1, 1, 1, 2); }},
      {"pools", {{2, 3, 6, 6}}, [](const V& v) { return torch::max_pool2d(v[0], {2, 2}).sum(1) + torch::adaptive_avg_pool2d(v[0], {3, 3}).sum(1) + torch::adaptive_avg_pool2d(v[0], {1, 1}).sum(); }},
      {"conv_transpose2d", {{2, 4, 3, 3}, {4, 3, 3, 3}, {6}}, [](const V& v) {
         return torch::conv_transpose2d(v[0], v[1], v[2], {2, 1}, {1, 0}, {1, 0}, 2);
       }},
      {"conv_transpose1d", {{2, 3, 5}, {3, 2, 4}}, [](const V& v) { return torch::conv_transpose1d(v[0], v[1], {}, 2, 1); }},
      {"avg_pools", {{2, 3, 7, 6}}, [](const V& v) {
         return torch::avg_pool2d(v[0], {3, 2}, {2, 2}, {1, 1}, true, false).sum(1) + torch::avg_pool2d(v[0], {2, 2}).sum() +
                torch::avg_pool1d(v[0].flatten(2), 3, 2, 1).sum() + torch::max_pool1d(v[0].flatten(2), 3, 2, 1).sum();
       }},
      {"batch_norm_eval", {{4, 3, 2, 2}, {3}, {3}}, [](const V& v) {
         return torch::batch_norm(v[0], v[1], v[2], torch::linspace(-0.5, 0.5, 3), torch::linspace(0.5, 2, 3), false, 0.1, 1e-5, false);
       }},
      {"batch_norm_batch_stats", {{5, 3, 2}, {3}, {3}}, [](const V& v) { return torch::batch_norm(v[0], v[1], v[2], {}, {}, true, 0.1, 1e-5, false); }},
      {"layer_norm", {{3, 4, 5}, {5}, {5}}, [](const V& v) { return torch::layer_norm(v[0], {5}, v[1], v[2]); }},
      {"nll_cross_entropy", {{4, 5}}, [](const V& v) {
         const at::Tensor target = torch::tensor({0, 4, 2, 2});
         return torch::nll_loss(torch::log_softmax(v[0], 1), target) + at::cross_entropy_loss(v[0] * 2, target) +
                at::cross_entropy_loss(v[0], target, {}, at::Reduction::Sum);
       }},
      {"embedding", {{6, 3}}, [](const V& v) { return torch::embedding(v[0], torch::tensor({{0, 2}, {5, 2}})); }},
  };
}

TEST_P(CapturedGradients, EveryRuleMatchesAutograd) {
  for (const RuleCase& rc : RuleCases()) {
    SCOPED_TRACE(rc.name);
    auto fn = [&rc](const Args& a) -> std::vector<at::Tensor> {
      std::vector<at::Tensor> inputs;
      for (const c10::IValue& v : a) inputs.push_back(v.toTensor().detach().requires_grad_(true));
      const at::Tensor out = rc.op(inputs);
      const at::Tensor weights = torch::linspace(-1, 2, out.numel()).view(out.sizes());
      std::vector<at::Tensor> grads = torch::autograd::grad({(out * weights).sum()}, inputs);
      grads.push_back(out.detach());
      return grads;
    };
    auto f = warden::compile(fn, Opts(rc.name));
    for (int call = 0; call < 3; ++call) {
      torch::manual_seed(40 + call);
      Args args;
      for (const auto& shape : rc.shapes) {
        at::Tensor t = rc.positive ? torch::rand(shape) + 0.5 : torch::randn(shape);
        args.emplace_back(t);
      }
      std::vector<at::Tensor> got, want;
      try {
        got = f(args);
        want = fn(args);
      } catch (const std::exception& e) {
        ADD_FAILURE() << rc.name << ": " << e.what();
        break;
      }
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) ExpectClose(got[i], want[i], rc.name + " output " + std::to_string(i), 1e-4, 1e-5);
    }
    EXPECT_EQ(f.stats().compiles, 1) << f.explain();
    ExpectCaptured(f);
  }
}

// ---------------------------------------------------------------------------------------------
// What is not captured runs eagerly, says why, and behaves exactly as eager (results or errors).
TEST_P(CapturedGradients, OpWithoutARuleRunsEagerlyWithTheReason) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor y = x.atan().sum();
    return {torch::autograd::grad({y}, {x})[0]};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 2; ++call) {
    const at::Tensor x = torch::randn({4});
    ExpectClose(f({x})[0], fn({x})[0], "datan");
  }
  EXPECT_EQ(f.stats().eager_calls, 2);
  EXPECT_THAT(f.explain(), HasSubstr("aten::atan at %"));
  EXPECT_THAT(f.explain(), HasSubstr("has no derivative rule"));
}

TEST_P(CapturedGradients, InPlaceWriteToASavedTensorRaisesLikeEager) {
  const at::Tensor buf = torch::ones({3});
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    at::Tensor b = a[1].toTensor().clone();
    const at::Tensor y = (x * b).sum();
    b.add_(1);  // autograd saved b for x's gradient
    return {torch::autograd::grad({y}, {x})[0]};
  };
  EXPECT_THROW(fn({torch::randn({3}), buf}), c10::Error);
  auto f = warden::compile(fn, Opts());
  EXPECT_THROW(f({torch::randn({3}), buf}), c10::Error);
  EXPECT_THROW(f({torch::randn({3}), buf}), c10::Error);
}

TEST_P(CapturedGradients, SecondPassWithoutRetainGraphRaisesLikeEager) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor y = (x.exp() * 2).sum();
    at::Tensor g1 = torch::autograd::grad({y}, {x})[0];
    at::Tensor g2 = torch::autograd::grad({y}, {x})[0];
    return {g1 + g2};
  };
  EXPECT_THROW(fn({torch::randn({3})}), c10::Error);
  auto f = warden::compile(fn, Opts());
  EXPECT_THROW(f({torch::randn({3})}), c10::Error);
}

TEST_P(CapturedGradients, RetainGraphAllowsASecondPass) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor y = (x.exp() * 2).sum();
    at::Tensor g1 = torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true)[0];
    at::Tensor g2 = torch::autograd::grad({y * 3}, {x})[0];
    return {g1, g2};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 2; ++call) {
    const at::Tensor x = torch::randn({3});
    const auto got = f({x});
    const auto want = fn({x});
    ExpectClose(got[0], want[0], "g1");
    ExpectClose(got[1], want[1], "g2");
  }
  ExpectCaptured(f);
}

TEST_P(CapturedGradients, UnusedInputFollowsAllowUnused) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor z = a[1].toTensor().detach().requires_grad_(true);
    const at::Tensor y = (x * x).sum();
    auto g = torch::autograd::grad({y}, {x, z}, {}, c10::nullopt, false, /*allow_unused=*/true);
    return {g[0], g[1].defined() ? g[1] : torch::full({1}, -7.0)};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 2; ++call) {
    const at::Tensor x = torch::randn({3}), z = torch::randn({2});
    const auto got = f({x, z});
    const auto want = fn({x, z});
    ExpectClose(got[0], want[0], "dx");
    ExpectClose(got[1], want[1], "dz (unused)");
  }
  auto strict = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor z = a[1].toTensor().detach().requires_grad_(true);
    return {torch::autograd::grad({(x * x).sum()}, {x, z})[0]};
  };
  auto g = warden::compile(strict, Opts("strict"));
  EXPECT_THROW(g({torch::randn({3}), torch::randn({2})}), c10::Error);
}

TEST_P(CapturedGradients, ExplicitGradOutputs) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor y = x.tanh() * 3;
    return {torch::autograd::grad({y}, {x}, {a[1].toTensor()})[0]};
  };
  auto f = warden::compile(fn, Opts());
  for (int call = 0; call < 2; ++call) {
    const at::Tensor x = torch::randn({2, 3}), v = torch::randn({2, 3});
    ExpectClose(f({x, v})[0], fn({x, v})[0], "vjp");
  }
  ExpectCaptured(f);
}

// Note [Gradient results]: on a hit, a captured gradient is the tensor the backward computed, as
// eager's autograd::grad returns it (no replayed detach making a second TensorImpl), with eager's
// values and autograd state.
TEST_P(CapturedGradients, GradientResultsAreTheComputedTensorsAsInEager) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor y = (x.mm(a[1].toTensor()).tanh() * x.sum(1, true)).sum();
    return {torch::autograd::grad({y}, {x})[0]};
  };
  auto f = warden::compile(fn, Opts("gradient_results"));
  for (int call = 0; call < 4; ++call) {
    const at::Tensor x = torch::randn({8, 16}), w = torch::randn({16, 16});
    const int64_t before = warden::codegen::PassThroughCallsOnThisThread();
    at::Tensor got = f({x, w})[0];
    const int64_t passed = warden::codegen::PassThroughCallsOnThisThread() - before;
    at::Tensor want = fn({x, w})[0];
    ExpectClose(got, want, "dy/dx at call " + std::to_string(call), 1e-4, 1e-5);
    EXPECT_FALSE(got.requires_grad());
    EXPECT_TRUE(got.is_leaf());
    if (call == 0) continue;  // the trace
    // On cpp the whole graph is one generated program, whose results are its own buffers.
    if (std::string(GetParam()) == "aten") {
      EXPECT_EQ(passed, 1) << f.explain();
    }
  }
  ExpectCaptured(f);
  EXPECT_EQ(f.stats().compiles, 1);
}

// Note [Transposed twice]: a linear layer's gradients read t(t(W)) and t(t(mm(...))); the replay
// reads W and the matmul's result instead and does not run the transposes. A t(t(x)) the function
// returns stays a view, as in eager.
TEST_P(CapturedGradients, TransposesOfTransposesAreNotReplayed) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor w = a[1].toTensor().detach().requires_grad_(true);
    const at::Tensor y = x.mm(w.t()).tanh().sum();
    const auto g = torch::autograd::grad({y}, {x, w});
    return {g[0], g[1], a[1].toTensor().t().t()};
  };
  auto f = warden::compile(fn, Opts("transposed_twice"));
  const bool aten = std::string(GetParam()) == "aten";
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({8, 16}), w = torch::randn({4, 16});
    const int64_t steps_before = warden::codegen::ReplayStepsOnThisThread();
    const auto got = f({x, w});
    const int64_t steps = warden::codegen::ReplayStepsOnThisThread() - steps_before;
    const auto want = fn({x, w});
    ExpectClose(got[0], want[0], "dy/dx", 1e-4, 1e-5);
    ExpectClose(got[1], want[1], "dy/dw", 1e-4, 1e-5);
    ExpectClose(got[2], want[2], "w.t().t()");
    EXPECT_EQ(got[2].is_view(), want[2].is_view());
    EXPECT_TRUE(got[2].is_view());
    EXPECT_TRUE(got[2]._base().is_same(w)) << "a returned t(t(w)) is a view of w";
    if (call == 0 || !aten) continue;
    // Every node of the graph is a replay step on aten; the skipped ones are not run.
    const std::string text = f.explain();
    int64_t nodes = 0;
    for (size_t pos = text.find(" = aten::"); pos != std::string::npos; pos = text.find(" = aten::", pos + 1)) ++nodes;
    EXPECT_LE(steps, nodes - 3) << text;
  }
  ExpectCaptured(f);
}

TEST(DerivativeRules, CoverTheOpsRealModelsDifferentiate) {
  const std::vector<std::string> ops = warden::ops::DerivativeOps();
  for (const char* op : {"aten::addmm", "aten::mm", "aten::relu", "aten::_log_softmax", "aten::index_select",
                         "aten::sum.dim_IntList", "aten::where.self"}) {
    EXPECT_NE(warden::ops::FindDerivative(op), nullptr) << op;
  }
  EXPECT_EQ(warden::ops::FindDerivative("aten::atan"), nullptr);
  EXPECT_GE(ops.size(), 50u);
}

INSTANTIATE_TEST_SUITE_P(Backends, CapturedGradients, ::testing::Values("aten", "cpp"));

}  // namespace
