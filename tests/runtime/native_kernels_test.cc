// Note [Native kernels] (runtime/native_kernels.cc) through warden::compile on backend "cpp":
// max_pool2d and max_pool2d_with_indices against eager for every parameter form (ties, NaN, -inf,
// padding, dilation, ceil_mode, 3-D input, f64), gradients bit-equal to eager's through the
// kernel's autograd node, the fallbacks (non-contiguous input, integer dtype, bad parameters raise
// eager's error), and the saved-tensor version check. Each test asserts whether the kernel ran.
#include <functional>
#include <random>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/codegen_replay.h"
#include "runtime/warden.h"
#include "tests/test_env.h"

namespace warden {
namespace {

using Args = std::vector<c10::IValue>;
using test_util::ScopedCacheDir;

Options Cpp(const std::string& name) {
  Options o;
  o.name = name;
  o.backend = "cpp";
  o.dynamic = Dynamic::kStatic;
  return o;
}

// Equal as eager computes it: NaN where eager has NaN, every other element bit-equal.
void ExpectSame(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  if (want.is_floating_point()) {
    EXPECT_TRUE(torch::equal(torch::isnan(got), torch::isnan(want))) << what;
    EXPECT_TRUE(torch::equal(got.nan_to_num(0, 0, 0), want.nan_to_num(0, 0, 0)))
        << what << "\ngot\n" << got << "\nwant\n" << want;
  } else {
    EXPECT_TRUE(torch::equal(got, want)) << what << "\ngot\n" << got << "\nwant\n" << want;
  }
}

// Input with many ties (rounded values, relu's zeros), NaNs (two in one window), -inf windows.
at::Tensor TrickyInput(std::vector<int64_t> sizes, at::ScalarType dtype) {
  torch::manual_seed(3);
  at::Tensor x = torch::round(torch::randn(sizes, torch::TensorOptions().dtype(dtype)) * 2);
  at::Tensor flat = x.view({-1});
  const int64_t n = flat.numel();
  const int64_t w = sizes.back();
  flat[1] = NAN;
  flat[2] = NAN;
  flat[w] = NAN;  // with flat[1]: two NaNs in the first 2x2 window (the last one wins, as in ATen)
  flat[n / 2] = NAN;
  // A whole 2x2 window of -inf at the start of the last row pair.
  const int64_t last = n - 2 * w;
  flat[last] = -INFINITY;
  flat[last + 1] = -INFINITY;
  flat[last + w] = -INFINITY;
  flat[last + w + 1] = -INFINITY;
  return x;
}

struct PoolCase {
  std::string name;
  std::vector<int64_t> sizes;
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool ceil;
  at::ScalarType dtype = at::kFloat;
};

std::vector<PoolCase> Cases() {
  return {
      {"2x2/2", {2, 3, 8, 10}, {2}, {}, {0}, {1}, false},
      {"2x2/2 wide rows", {2, 3, 12, 40}, {2}, {}, {0}, {1}, false},
      {"2x2/2 odd sizes", {2, 3, 9, 7}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
      {"3x3/2 pad 1", {2, 2, 9, 9}, {3}, {2}, {1}, {1}, false},
      {"3x2/1 pad (1,0)", {1, 4, 6, 5}, {3, 2}, {1, 1}, {1, 0}, {1}, false},
      {"2x2/2 ceil", {2, 2, 7, 9}, {2}, {2}, {0}, {1}, true},
      {"3x3/2 pad 1 ceil", {1, 2, 8, 8}, {3}, {2}, {1}, {1}, true},
      {"3x3 dilation 2", {1, 3, 11, 12}, {3}, {1}, {1}, {2}, false},
      {"3-D input", {3, 8, 6}, {2}, {}, {0}, {1}, false},
      {"f64", {2, 3, 8, 8}, {2}, {}, {0}, {1}, false, at::kDouble},
  };
}

TEST(NativeKernels, MaxPoolMatchesEagerForEveryParameterForm) {
  ScopedCacheDir cache;
  for (const PoolCase& c : Cases()) {
    for (bool relu : {false, true}) {
      auto fn = [c, relu](const Args& a) -> std::vector<at::Tensor> {
        at::Tensor x = a[0].toTensor();
        if (relu) x = torch::relu(x);
        at::Tensor pooled = torch::max_pool2d(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil);
        auto [values, indices] = torch::max_pool2d_with_indices(x * 2, c.kernel, c.stride, c.padding, c.dilation, c.ceil);
        return {pooled, values, indices};
      };
      const std::string what = c.name + (relu ? " after relu" : "");
      CompiledFunction f = compile(fn, Cpp("pool"));
      const Args args{TrickyInput(c.sizes, c.dtype)};
      const std::vector<at::Tensor> want = fn(args);
      f(args);
      const int64_t before = codegen::NativeCallsOnThisThread();
      const std::vector<at::Tensor> got = f(args);
      EXPECT_EQ(codegen::NativeCallsOnThisThread() - before, 2) << what;
      EXPECT_NE(f.explain().find("native kernels: aten::max_pool2d at %"), std::string::npos) << f.explain();
      const std::string json = f.explain_json();
      const size_t key = json.find("\"native_kernels\"");
      EXPECT_NE(key, std::string::npos) << json;
      EXPECT_NE(json.find("\"aten::max_pool2d at %", key), std::string::npos) << json;
      ASSERT_EQ(got.size(), 3u) << what;
      for (int i = 0; i < 3; ++i) ExpectSame(got[i], want[i], what + ", output " + std::to_string(i));
      EXPECT_TRUE(got[0].is_contiguous()) << what;
    }
  }
}

TEST(NativeKernels, MaxPoolGradientsEqualEagersThroughTies) {
  ScopedCacheDir cache;
  for (const PoolCase& c : Cases()) {
    auto fn = [c](const Args& a) -> std::vector<at::Tensor> {
      at::Tensor h = torch::relu(a[0].toTensor() * a[1].toTensor());
      return {torch::max_pool2d(h, c.kernel, c.stride, c.padding, c.dilation, c.ceil)};
    };
    CompiledFunction f = compile(fn, Cpp("pool_grad"));
    at::Tensor x = TrickyInput(c.sizes, c.dtype).nan_to_num(0, 0, 0);  // finite: gradients compare exactly
    at::Tensor w = torch::ones({c.sizes.back()}, torch::TensorOptions().dtype(c.dtype));
    auto run = [&](bool compiled, int64_t* native) {
      at::Tensor wp = w.clone().requires_grad_(true);
      const int64_t before = codegen::NativeCallsOnThisThread();
      at::Tensor out = compiled ? f({x, wp})[0] : fn({x, wp})[0];
      *native = codegen::NativeCallsOnThisThread() - before;
      EXPECT_TRUE(out.requires_grad()) << c.name;
      at::Tensor weights = torch::arange(out.numel(), torch::TensorOptions().dtype(c.dtype)).view(out.sizes());
      (out * weights).sum().backward();
      return std::make_pair(out.detach(), wp.grad());
    };
    int64_t native = 0;
    const auto want = run(false, &native);
    run(true, &native);  // the trace
    const auto got = run(true, &native);
    EXPECT_EQ(native, 1) << c.name << "\n" << f.explain();
    ExpectSame(got.first, want.first, c.name + " forward");
    ExpectSame(got.second, want.second, c.name + " gradient");
  }
}

// One random case: `fn(x, w)` (w = ones over the last dim, requiring grad when `grad`) eagerly and
// twice through a compiled copy on backend cpp. Every output equals eager's (signs of zero
// included), and so does w's gradient of sum(out[0] * arange) when `grad`; where eager raises, so
// does Warden. Counts whether the hit ran a native kernel and whether eager raised.
struct RandomCounts {
  int native = 0, eager_errors = 0;
};
using PoolFn = std::function<std::vector<at::Tensor>(const Args&)>;
void CheckRandomCase(const PoolFn& fn, const at::Tensor& x, bool grad, const std::string& what, RandomCounts* counts) {
  auto run = [&](CompiledFunction* f, std::string* error) -> std::pair<std::vector<at::Tensor>, at::Tensor> {
    at::Tensor w = torch::ones({x.size(-1)}, x.options()).requires_grad_(grad);
    try {
      std::vector<at::Tensor> out = f != nullptr ? (*f)({x, w}) : fn({x, w});
      at::Tensor g;
      if (grad) {
        at::Tensor weights = torch::arange(out[0].numel(), out[0].options().requires_grad(false)).view(out[0].sizes());
        (out[0] * weights).sum().backward();
        g = w.grad();
        out[0] = out[0].detach();
      }
      return {out, g};
    } catch (const c10::Error& e) {
      *error = e.what_without_backtrace();
      return {};
    }
  };
  std::string want_error;
  const auto want = run(nullptr, &want_error);
  counts->eager_errors += !want_error.empty();
  CompiledFunction f = compile(fn, Cpp("pool_random"));
  for (int call = 0; call < 2; ++call) {
    std::string error;
    const int64_t before = codegen::NativeCallsOnThisThread();
    const auto got = run(&f, &error);
    if (call == 1) counts->native += codegen::NativeCallsOnThisThread() > before;
    if (!want_error.empty()) {
      EXPECT_FALSE(error.empty()) << what << ": eager raised " << want_error;
      continue;
    }
    ASSERT_TRUE(error.empty()) << what << ": " << error;
    ASSERT_EQ(got.first.size(), want.first.size()) << what;
    for (size_t i = 0; i < want.first.size(); ++i) {
      ExpectSame(got.first[i], want.first[i], what + " output " + std::to_string(i));
      if (want.first[i].is_floating_point()) {
        EXPECT_TRUE(torch::equal(torch::signbit(got.first[i]), torch::signbit(want.first[i]))) << what << " signs";
      }
    }
    if (grad) ExpectSame(got.second, want.second, what + " gradient");
  }
}

// Random sizes (3-D/4-D), contents (rounded for ties, NaN, +-inf, -0) and dtype.
at::Tensor RandomPoolInput(std::mt19937_64& rng, bool grad, std::vector<int64_t>* sizes) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t rank = uniform(3, 4);
  sizes->clear();
  for (int64_t d = 0; d < rank; ++d) sizes->push_back(uniform(1, d + 2 >= rank ? 12 : 3));
  const at::ScalarType dtype = uniform(0, 3) == 0 ? at::kDouble : at::kFloat;
  at::Tensor x = torch::round(torch::randn(*sizes, torch::TensorOptions().dtype(dtype)) * 4) / 2;
  at::Tensor flat = x.view({-1});
  for (int k = uniform(0, 3); k > 0; --k) {
    const double special[] = {NAN, INFINITY, -INFINITY, -0.0};
    flat[uniform(0, flat.numel() - 1)] = special[uniform(0, 3)];
  }
  return grad ? x.nan_to_num(0, 0, 0) : x;
}

// max_pool2d_with_indices: random parameters (any ATen accepts, and some it rejects), with and
// without gradients: values, indices and gradients equal eager's, errors where eager raises.
TEST(NativeKernels, RandomCasesAgreeWithEager) {
  ScopedCacheDir cache;
  std::mt19937_64 rng(20261207);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  RandomCounts counts;
  for (int iter = 0; iter < 150; ++iter) {
    const bool grad = uniform(0, 1) == 1;
    std::vector<int64_t> sizes;
    const at::Tensor x = RandomPoolInput(rng, grad, &sizes);
    const std::vector<int64_t> kernel{uniform(1, 4), uniform(1, 4)};
    const std::vector<int64_t> stride{uniform(1, 3), uniform(1, 3)};
    const std::vector<int64_t> padding{uniform(0, 2), uniform(0, 2)};  // above kernel/2 sometimes
    const std::vector<int64_t> dilation{uniform(1, 2), uniform(1, 2)};
    const bool ceil = uniform(0, 1) == 1;
    auto fn = [=](const Args& a) -> std::vector<at::Tensor> {
      auto [values, indices] = torch::max_pool2d_with_indices(a[0].toTensor() * a[1].toTensor(), kernel, stride,
                                                              padding, dilation, ceil);
      return {values, indices};
    };
    CheckRandomCase(fn, x, grad,
                    "case " + std::to_string(iter) + " sizes " + c10::str(sizes) + " k " + c10::str(kernel) + " s " +
                        c10::str(stride) + " p " + c10::str(padding) + " d " + c10::str(dilation) +
                        (ceil ? " ceil" : "") + (grad ? " grad" : ""),
                    &counts);
  }
  // Most cases are valid and run the kernel; some raise in eager and in Warden alike.
  EXPECT_GT(counts.native, 40);
  EXPECT_GT(counts.eager_errors, 5);
}

// avg_pool2d the same way, with count_include_pad, divisor_override and the 2x2/2 fast path; values
// bit-equal to eager's (the kernel sums in ATen's order and divides as it does).
TEST(NativeKernels, AvgPoolRandomCasesAgreeWithEager) {
  ScopedCacheDir cache;
  std::mt19937_64 rng(7);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  RandomCounts counts;
  for (int iter = 0; iter < 150; ++iter) {
    const bool grad = uniform(0, 1) == 1;
    std::vector<int64_t> sizes;
    const at::Tensor x = RandomPoolInput(rng, grad, &sizes);
    const bool square2 = uniform(0, 2) == 0;
    const std::vector<int64_t> kernel = square2 ? std::vector<int64_t>{2} : std::vector<int64_t>{uniform(1, 4), uniform(1, 4)};
    const std::vector<int64_t> stride = square2 ? std::vector<int64_t>{} : std::vector<int64_t>{uniform(1, 3), uniform(1, 3)};
    const std::vector<int64_t> padding = square2 ? std::vector<int64_t>{0} : std::vector<int64_t>{uniform(0, 2), uniform(0, 2)};
    const bool ceil = uniform(0, 1) == 1;
    const bool include_pad = uniform(0, 1) == 1;
    const int64_t choice = uniform(0, 3);
    const c10::optional<int64_t> divisor =
        choice == 0 ? c10::optional<int64_t>(3) : choice == 1 ? c10::optional<int64_t>(-2) : c10::nullopt;
    auto fn = [=](const Args& a) -> std::vector<at::Tensor> {
      return {torch::avg_pool2d(a[0].toTensor() * a[1].toTensor(), kernel, stride, padding, ceil, include_pad, divisor)};
    };
    CheckRandomCase(fn, x, grad,
                    "case " + std::to_string(iter) + " sizes " + c10::str(sizes) + " k " + c10::str(kernel) + " s " +
                        c10::str(stride) + " p " + c10::str(padding) + (ceil ? " ceil" : "") +
                        (include_pad ? " include_pad" : "") + " divisor " +
                        (divisor ? std::to_string(*divisor) : "none") + (grad ? " grad" : ""),
                    &counts);
  }
  EXPECT_GT(counts.native, 50);
  EXPECT_GT(counts.eager_errors, 5);
}

TEST(NativeKernels, FallsBackToATenWhereItsChecksFail) {
  ScopedCacheDir cache;
  // A transposed (non-contiguous) input and a channels-last one: ATen runs, results as eager's.
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::max_pool2d(a[0].toTensor().transpose(2, 3), 2),
            std::get<0>(torch::max_pool2d_with_indices(a[1].toTensor().contiguous(at::MemoryFormat::ChannelsLast), 2))};
  };
  CompiledFunction f = compile(fn, Cpp("pool_fallback"));
  const Args args{torch::randn({2, 3, 6, 8}), torch::randn({2, 3, 6, 8})};
  const std::vector<at::Tensor> want = fn(args);
  f(args);
  const int64_t before = codegen::NativeCallsOnThisThread();
  const std::vector<at::Tensor> got = f(args);
  EXPECT_EQ(codegen::NativeCallsOnThisThread() - before, 0);
  ExpectSame(got[0], want[0], "transposed");
  ExpectSame(got[1], want[1], "channels last");
}

TEST(NativeKernels, BadParametersRaiseEagersError) {
  ScopedCacheDir cache;
  // Padding above half the kernel: eager raises; so does every call of the compiled function.
  auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {torch::max_pool2d(a[0].toTensor(), 2, 2, 2)}; };
  const Args args{torch::randn({1, 1, 6, 6})};
  std::string eager;
  try {
    fn(args);
  } catch (const c10::Error& e) {
    eager = e.what_without_backtrace();
  }
  ASSERT_NE(eager.find("pad should be"), std::string::npos) << eager;
  CompiledFunction f = compile(fn, Cpp("pool_bad"));
  for (int i = 0; i < 2; ++i) {
    try {
      f(args);
      ADD_FAILURE() << "no error on call " << i;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("pad should be"), std::string::npos) << e.what();
    }
  }
}

// Parameters that ATen converts to a 32-bit int and rejects when they do not fit, and a zero
// divisor: every call raises as eager does (the traced call raises, so no entry is made; the
// kernel's own checks decline these too).
TEST(NativeKernels, ParametersATenRejectsRaiseAsInEager) {
  ScopedCacheDir cache;
  constexpr int64_t kHuge = int64_t{1} << 31;
  const std::vector<PoolFn> fns = {
      [](const Args& a) -> std::vector<at::Tensor> { return {torch::avg_pool2d(a[0].toTensor(), {2}, {kHuge}, {0})}; },
      [](const Args& a) -> std::vector<at::Tensor> {
        return {torch::max_pool2d(a[0].toTensor(), {2}, {kHuge}, {0}, {1})};
      },
      [](const Args& a) -> std::vector<at::Tensor> {
        return {torch::max_pool2d(a[0].toTensor(), {1}, {1}, {0}, {(int64_t{1} << 32) + 1})};
      },
      [](const Args& a) -> std::vector<at::Tensor> {
        return {torch::avg_pool2d(a[0].toTensor(), {2}, {2}, {0}, false, true, 0)};
      },
  };
  const Args args{torch::arange(36, torch::kFloat).view({1, 1, 6, 6})};
  // The first line of what a call throws ("" if it returns): a c10::Error on 1.13, a
  // std::runtime_error for the int conversion on 2.x.
  auto error_of = [&](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const std::exception& e) {
      const std::string what = e.what();
      return what.substr(0, what.find('\n'));
    }
    return "";
  };
  for (size_t i = 0; i < fns.size(); ++i) {
    const std::string eager = error_of([&] { fns[i](args); });
    ASSERT_FALSE(eager.empty()) << "case " << i;
    CompiledFunction f = compile(fns[i], Cpp("pool_rejected"));
    for (int call = 0; call < 2; ++call) {
      EXPECT_NE(error_of([&] { f(args); }).find(eager), std::string::npos) << "case " << i << ", call " << call;
    }
  }
}

TEST(NativeKernels, SavedInputIsVersionCheckedAsInEager) {
  ScopedCacheDir cache;
  // The pooled activation is written in place after the pool: backward must raise, as eager's
  // MaxPool2DWithIndicesBackward0 does for its saved input.
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor h = a[0].toTensor() * a[1].toTensor();
    at::Tensor p = torch::max_pool2d(h, 2);
    h.mul_(2);
    return {p};
  };
  CompiledFunction f = compile(fn, Cpp("pool_version"));
  const at::Tensor x = torch::randn({1, 2, 4, 4});
  for (int call = 0; call < 3; ++call) {
    at::Tensor w = torch::ones({4}).requires_grad_(true);
    const int64_t before = codegen::NativeCallsOnThisThread();
    at::Tensor out = call == 0 ? fn({x, w})[0] : f({x, w})[0];
    if (call == 2) EXPECT_EQ(codegen::NativeCallsOnThisThread() - before, 1);
    EXPECT_THROW(out.sum().backward(), c10::Error) << "call " << call;
  }
}

TEST(NativeKernels, OneChannelChannelsLastInputKeepsEagersLayout) {
  ScopedCacheDir cache;
  // NHWC storage with one channel is contiguous, but ATen's outputs follow
  // suggest_memory_format(), which says channels-last: ATen runs, and the strides are eager's.
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor().permute({0, 3, 1, 2});
    auto [values, indices] = torch::max_pool2d_with_indices(x, 2);
    return {torch::max_pool2d(x, 2), values, indices};
  };
  CompiledFunction f = compile(fn, Cpp("pool_nhwc"));
  const Args args{torch::randn({2, 6, 8, 1})};
  const std::vector<at::Tensor> want = fn(args);
  ASSERT_TRUE(args[0].toTensor().permute({0, 3, 1, 2}).is_contiguous());
  f(args);
  const int64_t before = codegen::NativeCallsOnThisThread();
  const std::vector<at::Tensor> got = f(args);
  EXPECT_EQ(codegen::NativeCallsOnThisThread() - before, 0);
  for (int i = 0; i < 3; ++i) {
    ExpectSame(got[i], want[i], "output " + std::to_string(i));
    EXPECT_EQ(got[i].strides(), want[i].strides()) << "output " << i;
  }
}

TEST(NativeKernels, BelowAutogradThreadStateRecordsNoHistory) {
  ScopedCacheDir cache;
  // Called with the autograd keys excluded on the thread, eager's pool records nothing even for an
  // input that requires grad; the kernel may run, without its autograd node.
  auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {torch::max_pool2d(a[0].toTensor(), 2)}; };
  CompiledFunction f = compile(fn, Cpp("pool_below"));
  const at::Tensor x = torch::randn({1, 2, 4, 4}).requires_grad_(true);
  at::AutoDispatchBelowADInplaceOrView below;
  const at::Tensor want = fn({x})[0];
  ASSERT_FALSE(want.requires_grad());
  for (int call = 0; call < 3; ++call) {
    const int64_t before = codegen::NativeCallsOnThisThread();
    const at::Tensor got = f({x})[0];
    if (call > 0) EXPECT_EQ(codegen::NativeCallsOnThisThread() - before, 1);
    EXPECT_EQ(got.requires_grad(), want.requires_grad()) << "call " << call;
    EXPECT_EQ(got.grad_fn(), nullptr) << "call " << call;
    ExpectSame(got, want, "call " + std::to_string(call));
  }
}

TEST(NativeKernels, BackendAtenReplaysATen) {
  ScopedCacheDir cache;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {torch::max_pool2d(a[0].toTensor(), 2)}; };
  Options o = Cpp("pool_aten");
  o.backend = "aten";
  CompiledFunction f = compile(fn, o);
  const Args args{torch::randn({1, 2, 4, 4})};
  f(args);
  const int64_t before = codegen::NativeCallsOnThisThread();
  ExpectSame(f(args)[0], fn(args)[0], "aten");
  EXPECT_EQ(codegen::NativeCallsOnThisThread() - before, 0);
}

}  // namespace
}  // namespace warden
