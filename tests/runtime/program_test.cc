// Straight-line programs of backend "cpp" (Note [Straight-line programs] in
// runtime/codegen_pointwise.h), through warden::compile: each test checks that a program really
// ran (explain_json's "programs", no fallback) and that every output equals eager's, including
// what eager makes observable besides values: which outputs share storage, views' offsets,
// requires_grad, writes to arguments, and the error of an index out of range.
#include <atomic>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "bench/radon.h"
#include "runtime/codegen_artifact.h"
#include "runtime/warden.h"
#include "tests/test_env.h"

namespace warden {
namespace {

using ::testing::HasSubstr;
using Args = std::vector<c10::IValue>;
using Outputs = std::vector<at::Tensor>;
using json = nlohmann::json;
using test_util::ScopedCacheDir;

Options Cpp(const std::string& name) {
  Options o;
  o.name = name;
  o.backend = "cpp";
  o.dynamic = Dynamic::kStatic;
  return o;
}

// The programs of entry 0 ("%a..%b" each).
std::vector<std::string> Programs(const CompiledFunction& f) {
  return json::parse(f.explain_json())["entries"][0]["programs"].get<std::vector<std::string>>();
}

void ExpectSame(const Outputs& got, const Outputs& want, double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "output " << i);
    ASSERT_EQ(got[i].sizes(), want[i].sizes());
    ASSERT_EQ(got[i].scalar_type(), want[i].scalar_type());
    EXPECT_EQ(got[i].strides(), want[i].strides());
    EXPECT_EQ(got[i].requires_grad(), want[i].requires_grad());
    if (want[i].is_floating_point()) {
      EXPECT_TRUE(torch::allclose(got[i], want[i], tol, tol, /*equal_nan=*/true)) << got[i] << "\n" << want[i];
    } else {
      EXPECT_TRUE(torch::equal(got[i], want[i])) << got[i] << "\n" << want[i];
    }
  }
}

// Runs f and fn on the same arguments `calls` times (the first call traces) and compares; fails if
// a program's run-time check sent it back to replay.
void ExpectProgramMatches(CompiledFunction& f, const std::function<Outputs(const Args&)>& fn,
                          const std::function<Args(int)>& args, int calls = 3, double tol = 1e-12) {
  for (int c = 0; c < calls; ++c) {
    const Args a = args(c);
    const int64_t fallbacks = CodegenRegionFallbacks();
    const Outputs got = f(a);
    if (c > 0) {
      EXPECT_EQ(CodegenRegionFallbacks(), fallbacks) << "a program was replayed";
    }
    ExpectSame(got, fn(a), tol);
  }
  EXPECT_EQ(f.stats().compiles, 1) << f.explain();
  EXPECT_EQ(f.stats().eager_calls, 0) << f.explain();
  EXPECT_FALSE(Programs(f).empty()) << f.explain();
}

// The radon log-density: ~60 ops on 0-dim, [85] and [919] tensors, one program; and with its
// gradient captured inside (Note [Captured gradients]): ~150 ops, still one program.
TEST(Programs, RadonLogpIsOneProgram) {
  ScopedCacheDir dir;
  const bench::RadonData data = bench::MakeRadonData();
  auto fn = [&data](const Args& a) -> Outputs { return {bench::RadonLogp(a[0].toTensor(), data)}; };
  CompiledFunction f = compile(fn, Cpp("radon"));
  ExpectProgramMatches(f, fn, [&](int c) { return Args{bench::RadonTheta(data) + 0.1 * c}; }, 4, 1e-11);
  const auto programs = Programs(f);
  ASSERT_EQ(programs.size(), 1u);
  EXPECT_EQ(programs[0], "%0..%58") << f.explain();
  EXPECT_THAT(f.explain(), HasSubstr("1 straight-line program: %0..%58"));
}

TEST(Programs, RadonLogpAndGradientIsOneProgram) {
  ScopedCacheDir dir;
  const bench::RadonData data = bench::MakeRadonData();
  auto fn = [&data](const Args& a) -> Outputs {
    const at::Tensor theta = a[0].toTensor().detach().requires_grad_(true);
    const at::Tensor logp = bench::RadonLogp(theta, data);
    return {logp.detach(), torch::autograd::grad({logp}, {theta})[0]};
  };
  CompiledFunction f = compile(fn, Cpp("radon_grad"));
  ExpectProgramMatches(f, fn, [&](int c) { return Args{bench::RadonTheta(data) - 0.1 * c}; }, 4, 1e-10);
  ASSERT_EQ(Programs(f).size(), 1u) << f.explain();
  // Every node is in it: the gradient graph's 150 nodes.
  const json entry = json::parse(f.explain_json())["entries"][0];
  EXPECT_EQ(Programs(f)[0], "%0..%" + std::to_string(entry["num_nodes"].get<int>() - 1)) << f.explain();
}

// An index out of range at run time: the program stops before publishing anything, its nodes are
// replayed and ATen raises eager's error; a good index afterwards runs the program again.
TEST(Programs, IndexOutOfRangeRaisesEagersError) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor(), idx = a[1].toTensor();
    const at::Tensor g = x.index_select(0, idx) * 2 + x.sum();
    at::Tensor acc = at::zeros_like(x);
    return {g.exp(), acc.index_add(0, idx, g)};
  };
  CompiledFunction f = compile(fn, Cpp("gather"));
  const at::Tensor x = torch::randn({6}, torch::kDouble);
  const at::Tensor good = torch::tensor({0, 5, 2, 2}, torch::kLong);
  ExpectProgramMatches(f, fn, [&](int) { return Args{x, good}; });
  for (const at::Tensor& bad : {torch::tensor({0, 6, 1, 1}, torch::kLong), torch::tensor({0, -1, 1, 1}, torch::kLong)}) {
    std::string eager_error, warden_error;
    try {
      fn({x, bad});
    } catch (const c10::Error& e) {
      eager_error = e.what_without_backtrace();
    }
    const int64_t fallbacks = CodegenRegionFallbacks();
    try {
      f({x, bad});
    } catch (const c10::Error& e) {
      warden_error = e.what_without_backtrace();
    }
    ASSERT_FALSE(eager_error.empty());
    EXPECT_EQ(warden_error, eager_error);
    EXPECT_EQ(CodegenRegionFallbacks(), fallbacks + 1);
  }
  ExpectSame(f({x, good}), fn({x, good}));
}

// In-place ops on arrays the program made, a value read after the program together with an
// in-place result on it (one tensor in eager: the outputs share storage here too), a detach of an
// array that is its only escaping value.
TEST(Programs, InPlaceOnItsOwnArraysAndAliasingOutputs) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor();
    at::Tensor z = at::zeros_like(x);
    at::Tensor w = z.add_(x * 2);  // w is z
    z.mul_(x.select(0, 1));
    z.select(0, 0).fill_(7);
    const at::Tensor t = (z.sum(1) + 1).exp();
    return {z, w, t.detach(), z.narrow(0, 1, 2).sum()};
  };
  CompiledFunction f = compile(fn, Cpp("inplace"));
  ExpectProgramMatches(f, fn, [](int c) { return Args{torch::randn({4, 3}, torch::kDouble) + c}; });
  const Outputs got = f({torch::randn({4, 3}, torch::kDouble)});
  EXPECT_TRUE(got[0].is_same(got[1]));  // z and the result of z.add_ are one tensor, as in eager
}

// A view read after the program stays a view of what the program made (replayed on its output),
// with eager's offset and strides; a view of an argument returned stays outside too.
TEST(Programs, ViewsReadAfterTheProgramAreRealViews) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor();
    const at::Tensor t = x * 2 + x.sum();
    const at::Tensor s = t.sum(0) * x.select(1, 0).exp().mean();
    return {t.narrow(0, 1, 2), s, x.select(0, 1), t.t()};
  };
  CompiledFunction f = compile(fn, Cpp("views"));
  ExpectProgramMatches(f, fn, [](int c) { return Args{torch::randn({3, 5}) * (c + 1)}; }, 3, 1e-5);
  const at::Tensor x = torch::randn({3, 5});
  const Outputs got = f({x}), want = fn({x});
  EXPECT_EQ(got[0].storage_offset(), want[0].storage_offset());
  EXPECT_TRUE(got[0].is_view());
  EXPECT_EQ(got[2].data_ptr(), x.select(0, 1).data_ptr());  // a view of the argument, as in eager
  EXPECT_EQ(got[3].data_ptr(), got[0].data_ptr<float>() - got[0].storage_offset());
}

// requires_grad_ on a tensor the function returns changes that tensor: it stays an ATen call (the
// returned tensor requires grad, as in eager); on a detached copy nobody sees, it may be part of
// the program.
TEST(Programs, RequiresGradOnAReturnedTensorIsKept) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor();
    at::Tensor t = x * 2 + x.select(0, 0);
    t.requires_grad_(true);
    at::Tensor hidden = (x.narrow(0, 1, 2) * 3).detach();
    hidden.requires_grad_(true);
    return {t, hidden.detach().sum() + x.mean(), x.sum(0)};
  };
  CompiledFunction f = compile(fn, Cpp("requires_grad"));
  for (int c = 0; c < 3; ++c) {
    const at::Tensor x = torch::randn({3, 4});
    ExpectSame(f({x}), fn({x}), 1e-5);
  }
  EXPECT_EQ(f.stats().eager_calls, 0) << f.explain();
  EXPECT_TRUE(f({torch::randn({3, 4})})[0].requires_grad());
}

// The layers of small eval-mode models: embedding, linear (addmm), matmul/bmm, batch_norm with
// running statistics, eval dropout, softmax/log_softmax over any dim, layer_norm: one program at
// batch 1 and at batch 4, equal to eager within float rounding (sums in another order).
TEST(Programs, SmallModelLayersInEval) {
  ScopedCacheDir dir;
  torch::manual_seed(3);
  auto emb = torch::nn::Embedding(20, 8);
  auto lin = torch::nn::Linear(8, 12);
  auto bn = torch::nn::BatchNorm1d(12);
  auto ln = torch::nn::LayerNorm(torch::nn::LayerNormOptions({12}));
  auto drop = torch::nn::Dropout(0.3);
  for (torch::nn::Module* mod : std::vector<torch::nn::Module*>{emb.get(), lin.get(), bn.get(), ln.get(), drop.get()}) {
    mod->eval();
  }
  bn->running_mean.uniform_(-1, 1);
  bn->running_var.uniform_(0.5, 2);
  auto fn = [&](const Args& a) -> Outputs {
    const at::Tensor tokens = a[0].toTensor();              // [B, T] i64
    const at::Tensor e = emb->forward(tokens);              // [B, T, 8]
    const at::Tensor h = lin->forward(e.select(1, 0));      // [B, 12] (addmm)
    const at::Tensor nrm = torch::relu(bn->forward(h));     // eval batch_norm
    const at::Tensor q = drop->forward(nrm).unsqueeze(1);   // [B, 1, 12]
    const at::Tensor att = torch::softmax(torch::bmm(q, q.transpose(1, 2)) * 0.5, -1);  // [B, 1, 1]
    const at::Tensor mixed = torch::matmul(e, e.transpose(1, 2));                        // [B, T, T]
    return {torch::log_softmax(mixed, 1), ln->forward(nrm + att.squeeze(-1)), torch::mm(h, h.t())};
  };
  torch::NoGradGuard no_grad;
  for (int64_t b : {1, 4}) {
    CompiledFunction f = compile(fn, Cpp("layers_b" + std::to_string(b)));
    ExpectProgramMatches(f, fn, [&](int c) { return Args{torch::randint(20, {b, 3}, torch::kLong) * (c % 2)}; }, 3, 1e-5);
    const auto programs = Programs(f);
    const json entry = json::parse(f.explain_json())["entries"][0];
    ASSERT_EQ(programs.size(), 1u) << f.explain();
    EXPECT_EQ(programs[0], "%0..%" + std::to_string(entry["num_nodes"].get<int>() - 1)) << f.explain();
    // A token out of range: eager's error, through the replayed nodes.
    std::string eager_error, warden_error;
    const at::Tensor bad = torch::full({b, 3}, 20, torch::kLong);
    try {
      fn({bad});
    } catch (const c10::Error& e) {
      eager_error = e.what_without_backtrace();
    }
    try {
      f({bad});
    } catch (const c10::Error& e) {
      warden_error = e.what_without_backtrace();
    }
    EXPECT_FALSE(eager_error.empty());
    EXPECT_EQ(warden_error, eager_error);
  }
}

// batch_norm in training mode updates its running statistics: never part of a program; the
// statistics after three calls equal eager's.
TEST(Programs, TrainingBatchNormStaysOutside) {
  ScopedCacheDir dir;
  auto make = [] {
    torch::manual_seed(5);
    auto bn = torch::nn::BatchNorm1d(6);
    bn->train();
    return bn;
  };
  auto bn_a = make(), bn_b = make();
  auto body = [](torch::nn::BatchNorm1d& bn, const at::Tensor& x) -> Outputs {
    return {torch::softmax(bn->forward(x.select(1, 0) * 2), -1).sum(0)};
  };
  torch::NoGradGuard no_grad;
  CompiledFunction f = compile([&](const Args& a) { return body(bn_a, a[0].toTensor()); }, Cpp("bn_train"));
  for (int c = 0; c < 3; ++c) {
    const at::Tensor x = torch::randn({5, 2, 6});
    ExpectSame(f({x}), body(bn_b, x), 1e-5);
  }
  EXPECT_TRUE(torch::allclose(bn_a->running_mean, bn_b->running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(bn_a->running_var, bn_b->running_var, 1e-6, 1e-6));
}

// Writes to an argument are never part of a program: the argument is written as in eager.
TEST(Programs, WritesToArgumentsStayOutside) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    at::Tensor x = a[0].toTensor();
    const at::Tensor y = x.select(0, 0) * 3 + x.sum();
    x.add_(1);
    return {y, (x * y).sum(0), x.mean()};
  };
  CompiledFunction f = compile(fn, Cpp("writes"));
  for (int c = 0; c < 3; ++c) {
    const at::Tensor x0 = torch::randn({4, 2}, torch::kDouble);
    at::Tensor a = x0.clone(), b = x0.clone();
    ExpectSame(f({a}), fn({b}));
    EXPECT_TRUE(torch::equal(a, b));
  }
  EXPECT_EQ(f.stats().eager_calls, 0);
}

// ATen's type promotion across 0-dim and dim tensors of f32/f64/i64/b8, conversions, copy_,
// comparisons and where, reductions over some dims (keepdim or not), means, scatters and
// expand/transpose/permute/unsqueeze views.
TEST(Programs, DtypesReductionsScattersAndViews) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor(), d = a[1].toTensor(), i = a[2].toTensor();
    const at::Tensor y = x * d + i;                         // f32 [2,3,4] * f64 0-dim + i64 [4]: f32
    const at::Tensor m = y.gt(0.5).logical_not();           // b8
    const at::Tensor w = at::where(m, y, y.permute({2, 0, 1}).transpose(0, 1).transpose(1, 2) * 2);
    const at::Tensor r1 = w.sum(1), r2 = w.sum(at::IntArrayRef{0, 2}, true), r3 = w.mean(-1), r4 = w.mean();
    const at::Tensor c = w.to(torch::kDouble).clone() + d;  // f64
    at::Tensor e = at::empty({2, 3, 4}, torch::kDouble);
    e.copy_(w.unsqueeze(0).squeeze(0));
    const at::Tensor s1 = at::select_scatter(c, r1.to(torch::kDouble), 1, -1);
    const at::Tensor s2 = at::slice_scatter(c, e.narrow(2, 0, 2) * 3, 2, 1, 4, 2);
    const at::Tensor ex = r3.unsqueeze(-1).expand({2, 3, 4}) - w;
    const at::Tensor k = (i * 3 - 2).sum() + i.max();  // i.max() is not in the program
    return {r2, r4, s1, s2, ex, k, m.sum()};
  };
  CompiledFunction f = compile(fn, Cpp("mixed"));
  ExpectProgramMatches(
      f, fn,
      [](int c) {
        return Args{torch::randn({2, 3, 4}), torch::tensor(1.5 + c, torch::kDouble), torch::arange(4, torch::kLong) - c};
      },
      3, 1e-5);
}

// History: with an argument that requires grad, nodes whose results carry history are not in a
// program; the backward outside matches eager's.
TEST(Programs, ResultsThatNeedHistoryKeepIt) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor();
    const at::Tensor c = a[1].toTensor();
    const at::Tensor k = (c.select(0, 0) * 2 + c.sum()).exp();  // no history: may be a program
    return {(x * k).sum() + x.select(0, 1), k};
  };
  CompiledFunction f = compile(fn, Cpp("history"));
  const at::Tensor c = torch::randn({5}, torch::kDouble);
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x0 = torch::randn({5}, torch::kDouble);
    const at::Tensor xa = x0.clone().requires_grad_(true), xb = x0.clone().requires_grad_(true);
    const Outputs got = f({xa, c}), want = fn({xb, c});
    ExpectSame(got, want);
    got[0].backward();
    want[0].backward();
    EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-12, 1e-12));
  }
  EXPECT_EQ(f.stats().eager_calls, 0);
}

// Inputs with other strides than traced: the program's check replays its nodes (or a guard
// recompiles); either way eager's values.
TEST(Programs, OtherStridesAtRunTime) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor();
    return {(x.select(1, 0) * 2 + x.sum(1)).exp() - x.mean()};
  };
  CompiledFunction f = compile(fn, Cpp("strides"));
  const at::Tensor x = torch::randn({4, 4});
  ExpectSame(f({x}), fn({x}), 1e-5);
  ExpectSame(f({x}), fn({x}), 1e-5);
  EXPECT_FALSE(Programs(f).empty());
  ExpectSame(f({x.t()}), fn({x.t()}), 1e-5);
  ExpectSame(f({x.t()}), fn({x.t()}), 1e-5);
}

// Programs use a per-thread scratch buffer: concurrent callers get their own.
TEST(Programs, ConcurrentCallers) {
  ScopedCacheDir dir;
  const bench::RadonData data = bench::MakeRadonData();
  auto fn = [&data](const Args& a) -> Outputs { return {bench::RadonLogp(a[0].toTensor(), data)}; };
  CompiledFunction f = compile(fn, Cpp("radon_threads"));
  f({bench::RadonTheta(data)});
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < 50; ++c) {
        const at::Tensor theta = bench::RadonTheta(data) + 0.01 * (t * 50 + c);
        if (!torch::allclose(f({theta})[0], fn({theta})[0], 1e-11, 1e-11)) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(f.stats().compiles, 1);
}


// The error eager raises for `fn(args)`, or "" (compiled: `f(args)`).
template <typename F>
std::string ErrorOf(F&& call) {
  try {
    call();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// requires_grad_ through a view that returns its self (contiguous) changes that tensor, here an
// argument: it stays an ATen call, so the argument requires grad afterwards, as in eager.
TEST(Programs, RequiresGradThroughContiguousReachesTheArgument) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor(), w = a[1].toTensor(), idx = a[2].toTensor();
    x.contiguous().requires_grad_(true);
    return {w.index_select(0, idx).mul(2) + w.sum()};
  };
  CompiledFunction f = compile(fn, Cpp("rg_contiguous"));
  const at::Tensor w = torch::randn({5, 3}), idx = torch::tensor({4, 0}, torch::kLong);
  for (int c = 0; c < 3; ++c) {
    const at::Tensor xa = torch::randn({4}), xb = xa.clone();
    ExpectSame(f({xa, w, idx}), fn({xb, w, idx}), 1e-6);
    EXPECT_EQ(xa.requires_grad(), xb.requires_grad());
  }
}

// An in-place result on a detach of an array, returned beside the array: two tensors sharing
// storage in eager, two here.
TEST(Programs, InPlaceOnADetachIsItsOwnTensor) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor(), idx = a[1].toTensor();
    const at::Tensor b = x.index_select(0, idx) + 1;
    const at::Tensor w = b.detach().mul_(2);
    return {b, w};
  };
  CompiledFunction f = compile(fn, Cpp("detach_inplace"));
  const at::Tensor idx = torch::tensor({2, 0, 2}, torch::kLong);
  for (int c = 0; c < 3; ++c) {
    const at::Tensor x = torch::randn({4, 2});
    const Outputs got = f({x, idx}), want = fn({x, idx});
    ExpectSame(got, want, 1e-6);
    EXPECT_EQ(got[0].is_same(got[1]), want[0].is_same(want[1]));
    EXPECT_EQ(got[0].data_ptr() == got[1].data_ptr(), want[0].data_ptr() == want[1].data_ptr());
    EXPECT_EQ(got[1]._version(), want[1]._version());
  }
}

// Every index is checked as ATen checks it, even when the gathered result is empty.
TEST(Programs, IndexCheckedWhenTheResultIsEmpty) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor(), idx = a[1].toTensor();
    return {x.index_select(0, idx).add(1), x.sum() * 2};
  };
  CompiledFunction f = compile(fn, Cpp("empty_gather"));
  const at::Tensor x = torch::randn({5, 0});
  const at::Tensor good = torch::tensor({4, 0, 0}, torch::kLong), bad = torch::tensor({7, 0, 0}, torch::kLong);
  ExpectSame(f({x, good}), fn({x, good}));
  ExpectSame(f({x, good}), fn({x, good}));
  const std::string eager = ErrorOf([&] { fn({x, bad}); });
  EXPECT_FALSE(eager.empty());
  EXPECT_EQ(ErrorOf([&] { f({x, bad}); }), eager);
}

// Sums over some dims of float32 accumulate in double: within ATen's own rounding of a long row.
TEST(Programs, PartialFloatSumsAreAccurate) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor(), idx = a[1].toTensor();
    const at::Tensor g = x.index_select(0, idx);
    return {g.sum(1), g.mean(1, true), g.sum(0)};
  };
  CompiledFunction f = compile(fn, Cpp("long_rows"));
  const at::Tensor idx = torch::tensor({1, 0}, torch::kLong);
  for (int c = 0; c < 3; ++c) {
    const at::Tensor x = torch::full({2, 16384}, 0.1f) + 0.01f * c;
    ExpectProgramMatches(f, fn, [&](int) { return Args{x, idx}; }, 1, 1e-6);
  }
}

// Note [Column reductions] and Note [Constant factories]: reductions that keep the innermost dim
// (a bias gradient's sum over rows, a mean over leading dims, an integer column sum, a middle dim)
// accumulate per result element in the input's order, and the relu-backward pattern
// where(x <= 0, zeros_like(g), g) is one loop with the zeros as a constant; all equal eager.
TEST(Programs, ColumnReductionsAndConstantFactories) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor(), g = a[1].toTensor(), k = a[2].toTensor(), v = a[3].toTensor();
    const at::Tensor masked = at::where(x.le(0), at::zeros_like(g), g);
    return {masked,
            masked.sum(0),
            (x * 2).mean(at::IntArrayRef{0}, /*keepdim=*/true),
            (k + 1).sum(0),
            (v - 1).sum(1),
            (v * 3).sum(at::IntArrayRef{0, 1}, /*keepdim=*/true),
            (v + 0.5).mean(at::IntArrayRef{0, 2})};
  };
  CompiledFunction f = compile(fn, Cpp("columns"));
  ExpectProgramMatches(
      f, fn,
      [](int c) {
        torch::manual_seed(40 + c);
        return Args{torch::randn({32, 24}), torch::randn({32, 24}), torch::randint(-50, 50, {9, 5}, torch::kLong),
                    torch::randn({4, 5, 6}, torch::kDouble)};
      },
      3, 1e-6);
  const std::string source = json::parse(f.explain_json())["entries"][0]["generated_source"].get<std::string>();
  // masked.sum(0), the keepdim mean over dim 0, the integer column sum, the middle-dim sum and the
  // sum over the two leading dims keep their innermost dim; the mean over dims 0 and 2 does not.
  size_t columns = 0;
  for (size_t at = source.find("(column form)"); at != std::string::npos; at = source.find("(column form)", at + 1)) {
    ++columns;
  }
  EXPECT_EQ(columns, 5u) << source;
  EXPECT_THAT(source, HasSubstr("= aten::zeros_like\n")) << source;  // a constant inside the loop
  EXPECT_EQ(source.find("= aten::zeros_like\n  {"), std::string::npos) << "zeros_like got its own loop\n" << source;
}

// index_add with a 0-dim source (ATen takes it for a 1-D self) is not a program, and still
// equals eager.
TEST(Programs, IndexAddOfAZeroDimSource) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor(), i = a[1].toTensor(), v = a[2].toTensor();
    return {x.index_add(0, i, v).mul(2) + x.select(0, 1)};
  };
  CompiledFunction f = compile(fn, Cpp("index_add_0d"));
  const at::Tensor x = torch::randn({5}), i = torch::tensor({3}, torch::kLong), v = torch::tensor(2.5f);
  if (!ErrorOf([&] { fn({x, i, v}); }).empty()) GTEST_SKIP() << "this LibTorch refuses a 0-dim source";
  for (int c = 0; c < 3; ++c) ExpectSame(f({x, i, v}), fn({x, i, v}), 1e-6);
}

// batch_norm with statistics that are not 1-D [C]: whatever ATen does with them, the compiled
// function does the same.
TEST(Programs, BatchNormStatisticsOfAnotherShape) {
  ScopedCacheDir dir;
  const at::Tensor w = torch::rand({3}) + 0.5, b = torch::randn({3});
  const at::Tensor rm = torch::randn({3, 1}), rv = torch::rand({3, 1}) + 0.5;
  auto fn = [&](const Args& a) -> Outputs {
    const at::Tensor x = a[0].toTensor();
    return {torch::relu(at::batch_norm(x * 2, w, b, rm, rv, false, 0.1, 1e-5, false)).sum(0)};
  };
  torch::NoGradGuard no_grad;
  CompiledFunction f = compile(fn, Cpp("bn_shapes"));
  const at::Tensor x = torch::randn({4, 3, 2, 2});
  const std::string eager = ErrorOf([&] { fn({x}); });
  if (!eager.empty()) {
    EXPECT_EQ(ErrorOf([&] { f({x}); }), eager);
    return;
  }
  for (int c = 0; c < 3; ++c) ExpectSame(f({x}), fn({x}), 1e-5);
}

}  // namespace
}  // namespace warden
