// Hostile inputs and kernel-cache faults through the public API only (runtime/warden.h): Warden
// must raise a clear warden::Error or the c10::Error eager raises, never crash and never return
// what eager would not; a broken cache directory or compiler costs speed, never correctness.
// (Truncated/foreign cached libraries: tests/runtime/cpp_backend_test.cc, CorruptCachedLibraryIsRebuilt.)
#include <malloc.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <future>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::vector<at::Tensor> AddMul(const std::vector<c10::IValue>& a) {
  return {(a[0].toTensor() + a[1].toTensor()) * 2};
}

warden::Options Opts(const std::string& backend, warden::Dynamic d = warden::Dynamic::kAuto) {
  warden::Options o;
  o.backend = backend;
  o.dynamic = d;
  return o;
}

std::string CacheRoot(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/hostile-" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

void ExpectEqual(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type());
    EXPECT_EQ(got[i].sizes(), want[i].sizes());
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-5, 1e-6, /*equal_nan=*/true));
  }
}

// Calls f and eager on the same arguments: both must return equal results, or both raise (the
// same message when eager's error is a c10::Error).
void ExpectSameAsEager(warden::CompiledFunction& f, const warden::Fn& fn, const std::vector<c10::IValue>& args) {
  std::string eager_error;
  std::vector<at::Tensor> want;
  try {
    want = fn(args);
  } catch (const c10::Error& e) {
    eager_error = e.what_without_backtrace();
  }
  if (eager_error.empty()) {
    ExpectEqual(f(args), want);
    return;
  }
  try {
    f(args);
    ADD_FAILURE() << "eager raised \"" << eager_error << "\", Warden returned";
  } catch (const c10::Error& e) {
    EXPECT_EQ(e.what_without_backtrace(), eager_error);
  }
}

class Hostile : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { cache_ = std::make_unique<ScopedEnv>("WARDEN_CACHE_DIR", CacheRoot("param")); }
  std::unique_ptr<ScopedEnv> cache_;
};

TEST_P(Hostile, WrongArgumentCountIsAClearErrorOrEagersError) {
  auto f = warden::compile(AddMul, Opts(GetParam()));
  const at::Tensor x = torch::randn({3}), y = torch::randn({3});
  ExpectEqual(f({x, y}), AddMul({x, y}));
  // One argument: the user function indexes past the end; std::vector::operator[] would be UB in
  // eager too, so the function itself is written defensively here and must raise its own error.
  auto g = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        if (a.size() != 2) throw std::invalid_argument("expected 2 arguments");
        return AddMul(a);
      },
      Opts(GetParam()));
  ExpectEqual(g({x, y}), AddMul({x, y}));
  EXPECT_THROW(g({x}), std::invalid_argument);
  EXPECT_THROW(g({x, y, x}), std::invalid_argument);
  EXPECT_THROW(g({}), std::invalid_argument);
  ExpectEqual(g({x, y}), AddMul({x, y}));  // still served from the cache
  EXPECT_EQ(g.stats().cache_hits, 1);
}

TEST_P(Hostile, UnsupportedArgumentTypesAreWardenErrors) {
  auto f = warden::compile(AddMul, Opts(GetParam()));
  const at::Tensor x = torch::randn({3});
  for (const c10::IValue& bad : {c10::IValue("text"), c10::IValue(std::vector<int64_t>{1, 2}),
                                 c10::IValue(c10::List<at::Tensor>({x})), c10::IValue()}) {
    try {
      f({x, bad});
      ADD_FAILURE() << "no error for " << bad.tagKind();
    } catch (const warden::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("arg1")) << bad.tagKind();
    } catch (const c10::Error& e) {
      // Also acceptable if eager raises the same (None passed to toTensor()).
      EXPECT_THAT(e.what_without_backtrace(), HasSubstr("Tensor")) << bad.tagKind();
    }
  }
  EXPECT_EQ(f.stats().compiles, 0);
}

TEST_P(Hostile, UndefinedTensorRaisesAsEager) {
  warden::Fn fn = AddMul;
  auto f = warden::compile(fn, Opts(GetParam()));
  const at::Tensor x = torch::randn({3});
  ExpectSameAsEager(f, fn, {x, at::Tensor()});
  ExpectSameAsEager(f, fn, {x, torch::randn({3})});
  ExpectSameAsEager(f, fn, {at::Tensor(), x});
}

TEST_P(Hostile, SparseAndQuantizedTensors) {
  warden::Fn fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() * 2};
  };
  auto f = warden::compile(fn, Opts(GetParam()));
  const at::Tensor dense = torch::randn({3, 3});
  ExpectSameAsEager(f, fn, {dense});
  const at::Tensor sparse = dense.to_sparse();
  std::vector<at::Tensor> got;
  try {
    got = f({sparse});
  } catch (const std::exception& e) {
    SUCCEED() << "sparse raised: " << e.what();
    return;
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(torch::allclose(got[0].to_dense(), (sparse * 2).to_dense()));
  const at::Tensor q = torch::quantize_per_tensor(dense, 0.1, 0, at::kQUInt8);
  try {
    auto out = f({q});
    EXPECT_TRUE(torch::allclose(out[0].dequantize(), (q * 2).dequantize()));
  } catch (const std::exception& e) {
    SUCCEED() << "quantized raised: " << e.what();
  }
  ExpectSameAsEager(f, fn, {torch::randn({3, 3})});
}

TEST_P(Hostile, HugeRankZeroSizeNanInf) {
  warden::Fn fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    return {(x.exp() + 1).sum(-1), x.amax(-1), torch::softmax(x, -1)};
  };
  auto f = warden::compile(fn, Opts(GetParam()));
  std::vector<int64_t> rank25(25, 1);
  rank25[24] = 3;
  ExpectSameAsEager(f, fn, {torch::randn(rank25)});
  std::vector<int64_t> rank64(64, 1);  // ATen's limit for some kernels; eager decides
  ExpectSameAsEager(f, fn, {torch::randn(rank64)});
  ExpectSameAsEager(f, fn, {torch::randn({0, 4})});
  ExpectSameAsEager(f, fn, {torch::randn({4, 0})});  // amax over an empty dim raises in eager
  const double inf = std::numeric_limits<double>::infinity();
  ExpectSameAsEager(f, fn, {torch::tensor({std::nan(""), 1.0, 2.0})});
  ExpectSameAsEager(f, fn, {torch::tensor({inf, -inf, 0.0})});
  ExpectSameAsEager(f, fn, {torch::tensor({-inf, -inf, -inf})});
  ExpectSameAsEager(f, fn, {torch::tensor({std::nan(""), std::nan(""), std::nan("")})});
}

TEST_P(Hostile, OtherDtypesAndLayoutsMissAndMatchEager) {
  warden::Fn fn = AddMul;
  auto f = warden::compile(fn, Opts(GetParam()));
  const at::Tensor x = torch::randn({4, 4});
  ExpectSameAsEager(f, fn, {x, x});
  ExpectSameAsEager(f, fn, {x.t(), x});
  ExpectSameAsEager(f, fn, {x.to(at::kHalf), x});
  ExpectSameAsEager(f, fn, {x.to(at::kBFloat16), x.to(at::kBFloat16)});
  ExpectSameAsEager(f, fn, {x.to(at::kComplexFloat), x});
  ExpectSameAsEager(f, fn, {x.to(at::kByte), x.to(at::kBool)});
  ExpectSameAsEager(f, fn, {x.to(at::kBool), x.to(at::kBool)});
  ExpectSameAsEager(f, fn, {x.contiguous(at::MemoryFormat::Contiguous).expand({2, 4, 4}), x});
  ExpectSameAsEager(f, fn, {x, torch::randn({5, 4})});  // broadcast error in eager
}

// Tensors with other dispatch keys than the entry was built for (Note [Dispatch keys] in
// guards/builder.cc): a ZeroTensor (no data), a negative-bit view, a conjugate view and a nested
// tensor (whose sizes() throws) after an entry for plain tensors. Each must miss, never reach a
// fused kernel or a throwing accessor on the hit path, and give eager's result or error; under
// every Dynamic mode, since dynamic entries hash and bound sizes differently.
TEST_P(Hostile, TensorsWithOtherDispatchKeysMiss) {
  for (warden::Dynamic d : {warden::Dynamic::kStatic, warden::Dynamic::kAuto, warden::Dynamic::kDynamic}) {
    SCOPED_TRACE(static_cast<int>(d));
    warden::Fn fn = AddMul;
    auto f = warden::compile(fn, Opts(GetParam(), d));
    const at::Tensor x = torch::randn({4, 4}), y = torch::randn({4, 4});
    ExpectSameAsEager(f, fn, {x, y});
    ExpectSameAsEager(f, fn, {torch::randn({5, 4}), torch::randn({5, 4})});
    ExpectSameAsEager(f, fn, {at::_efficientzerotensor({4, 4}), y});
    ExpectSameAsEager(f, fn, {x, at::_efficientzerotensor({4, 4})});
    ExpectSameAsEager(f, fn, {at::_neg_view(x), y});
    const at::Tensor c = torch::randn({4, 4}, at::kComplexFloat);
    ExpectSameAsEager(f, fn, {c, c});
    ExpectSameAsEager(f, fn, {c.conj(), c});
    const at::Tensor nested = at::_nested_tensor_from_tensor_list({torch::randn({4}), torch::randn({4})});
    for (int i = 0; i < 2; ++i) {
      try {
        f({nested, nested});
      } catch (const std::exception& e) {
        SUCCEED() << "raised: " << e.what();
      }
    }
    ExpectSameAsEager(f, fn, {x, y});
  }
}

// Sizes whose element count times the item size overflows (an expand to [2^60 + 2^18, 4]) under
// a dynamic entry: eager raises "Storage size calculation overflowed"; so must Warden, instead of
// allocating a wrapped byte count and writing past it.
TEST_P(Hostile, SizeOverflowRaisesAsEager) {
  warden::Fn fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {(a[0].toTensor() + 1).tanh()};
  };
  auto f = warden::compile(fn, Opts(GetParam(), warden::Dynamic::kDynamic));
  const at::Tensor one = torch::randn({1, 1});
  ExpectSameAsEager(f, fn, {one.expand({3, 4})});
  ExpectSameAsEager(f, fn, {one.expand({5, 4})});
  const int64_t huge = (int64_t{1} << 60) + (int64_t{1} << 18);
  ExpectSameAsEager(f, fn, {one.expand({huge, 4})});
  ExpectSameAsEager(f, fn, {one.expand({huge, 4})});
  ExpectSameAsEager(f, fn, {one.expand({7, 4})});
}

// Tensors with keys of their own made inside the function (a ZeroTensor has no data; a
// negative-bit view's memory holds the un-negated values): no fused kernel reads them as dense.
TEST_P(Hostile, UnusualIntermediatesNeverReachKernels) {
  warden::Fn fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const at::Tensor z = at::_efficientzerotensor(x.sizes(), x.options());
    const at::Tensor n = at::_neg_view(x * 3);
    return {((x + z) * 2 + n).tanh(), (z * x + 1).sigmoid()};
  };
  auto f = warden::compile(fn, Opts(GetParam()));
  for (int i = 0; i < 3; ++i) ExpectSameAsEager(f, fn, {torch::randn({16, 8})});
}

// Runs `body` on another thread and fails (ending the process: a deadlocked thread cannot be
// joined) if it does not finish within `seconds`.
void WithinSeconds(int seconds, const std::function<void()>& body, const std::string& what) {
  auto done = std::async(std::launch::async, body);
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "%s: did not finish within %d s (deadlock)\n", what.c_str(), seconds);
    std::fflush(stderr);
    std::quick_exit(1);
  }
  done.get();
}

// Note [No lock around user code]: the function's own body may call its CompiledFunction's
// explain(), recompiles(), guards(), mark_dynamic() and reset(), and may wait for a thread that
// calls the function; none of that may deadlock, and results stay eager's.
TEST_P(Hostile, ReentrantCallsFromTheBodyDoNotDeadlock) {
  WithinSeconds(60, [&] {
    warden::CompiledFunction* self = nullptr;
    std::atomic<int> helper_calls{0};
    warden::Fn fn = [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
      const at::Tensor x = a[0].toTensor();
      if (a[1].toBool() && self != nullptr) {
        EXPECT_FALSE(self->explain().empty());
        self->recompiles();
        if (self->stats().compiles > 0) self->guards(0);
        self->mark_dynamic(0, 0);
        // A helper thread that calls this function while it is being traced, joined here.
        std::thread helper([&] {
          const at::Tensor h = torch::ones({3});
          EXPECT_TRUE(torch::equal((*self)({h, false})[0], h * 2 + 1));
          ++helper_calls;
        });
        helper.join();
      }
      return {x * 2 + 1};
    };
    warden::CompiledFunction f = warden::compile(fn, Opts(GetParam(), warden::Dynamic::kStatic));
    self = &f;
    for (int i = 0; i < 3; ++i) {
      const at::Tensor x = torch::randn({2 + i});
      EXPECT_TRUE(torch::allclose(f({x, true})[0], x * 2 + 1));
    }
    EXPECT_GE(helper_calls.load(), 1);
    const warden::Stats s = f.stats();
    EXPECT_EQ(s.cache_hits + s.compiles + s.eager_calls, s.calls);
    // reset() from inside the body.
    warden::Fn resetting = [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
      self->reset();
      return {a[0].toTensor() + 1};
    };
    warden::CompiledFunction g = warden::compile(resetting, Opts(GetParam(), warden::Dynamic::kStatic));
    self = &g;
    const at::Tensor y = torch::randn({4});
    EXPECT_TRUE(torch::equal(g({y})[0], y + 1));
    EXPECT_TRUE(torch::equal(g({y})[0], y + 1));
  }, "re-entrant calls");
}

// A first trace that takes longer than a stalled trace may (here 2.5 s, an op every 50 ms, like a
// big model's first trace on a loaded machine) keeps a concurrent miss waiting: it then hits the
// entry the trace made instead of running eagerly.
TEST_P(Hostile, AConcurrentMissWaitsForASlowTraceThatProgresses) {
  WithinSeconds(120, [&] {
    std::atomic<bool> started{false};
    warden::Fn fn = [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
      started = true;
      at::Tensor x = a[0].toTensor();
      for (int i = 0; i < 50; ++i) {
        x = x + 1;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      return {x};
    };
    warden::CompiledFunction f = warden::compile(fn, Opts(GetParam(), warden::Dynamic::kStatic));
    const at::Tensor x = torch::randn({4});
    std::thread tracer([&] { EXPECT_TRUE(torch::allclose(f({x})[0], x + 50)); });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(torch::allclose(f({x})[0], x + 50));
    tracer.join();
    const warden::Stats s = f.stats();
    EXPECT_EQ(s.calls, 2);
    EXPECT_EQ(s.compiles, 1);
    EXPECT_EQ(s.eager_calls, 0) << f.explain();
    EXPECT_EQ(s.cache_hits, 1);
  }, "slow trace");
}

// A function or argument name with control characters cannot forge log lines: names are escaped
// (\xNN) wherever they appear, stderr included.
TEST(HostileNames, ControlCharactersInNamesAreEscaped) {
  ScopedEnv logs("WARDEN_LOGS", "recompiles");
  warden::Options o = Opts("aten", warden::Dynamic::kStatic);
  o.name = "evil\nwarden: forged line\x1b[2J";
  o.arg_names = {"x\ny", "z"};
  auto f = warden::compile(AddMul, o);
  testing::internal::CaptureStderr();
  f({torch::randn({2}), torch::randn({2})});
  f({torch::randn({3}), torch::randn({3})});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("evil\\x0awarden: forged line\\x1b[2J"));
  EXPECT_THAT(err, ::testing::Not(HasSubstr("\nwarden: forged line"))) << err;
  EXPECT_EQ(err.find('\x1b'), std::string::npos) << err;
  EXPECT_THAT(f.explain(), HasSubstr("evil\\x0awarden: forged line"));
  EXPECT_THAT(f.recompiles().at(0).reasons.at(0), HasSubstr("tensor 'x\\x0ay'"));
}

// Another device: meta tensors (shapes without storage, the only non-CPU device a CPU build of
// LibTorch has) after a CPU entry must miss, never run a CPU kernel on them, and give eager's
// meta result; a mix of devices raises as eager does.
TEST_P(Hostile, MetaDeviceTensorsMissAndMatchEager) {
  warden::Fn fn = AddMul;
  auto f = warden::compile(fn, Opts(GetParam()));
  const at::Tensor x = torch::randn({4, 4}), y = torch::randn({4, 4});
  ExpectSameAsEager(f, fn, {x, y});
  ExpectSameAsEager(f, fn, {x, y});
  const int64_t hits = f.stats().cache_hits;
  for (int i = 0; i < 2; ++i) {
    const std::vector<at::Tensor> got = f({x.to(at::kMeta), y.to(at::kMeta)});
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(got[0].is_meta());
    EXPECT_EQ(got[0].sizes(), x.sizes());
    EXPECT_EQ(got[0].scalar_type(), at::kFloat);
  }
  EXPECT_EQ(f.stats().cache_hits, hits + 1) << "the first meta call must miss, the second hit its own entry";
  ExpectSameAsEager(f, fn, {x, y});
  std::string eager_error;
  try {
    fn({x, y.to(at::kMeta)});
  } catch (const c10::Error& e) {
    eager_error = e.what_without_backtrace();
  }
  if (eager_error.empty()) {
    EXPECT_TRUE(f({x, y.to(at::kMeta)})[0].is_meta());
  } else {
    try {
      f({x, y.to(at::kMeta)});
      ADD_FAILURE() << "eager raised \"" << eager_error << "\", Warden returned";
    } catch (const c10::Error& e) {
      EXPECT_EQ(e.what_without_backtrace(), eager_error);
    }
  }
  ExpectSameAsEager(f, fn, {x, y});
}

// Note [Exceptions during tracing]: the user's exception reaches the caller unchanged and leaves
// no entry behind; a later call that does not throw compiles normally.
TEST_P(Hostile, ExceptionDuringTracingLeavesNoEntry) {
  struct Custom : std::exception {
    const char* what() const noexcept override { return "custom failure"; }
  };
  int calls = 0;
  warden::Fn fn = [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    ++calls;
    const at::Tensor y = a[0].toTensor() + 1;
    if (a[1].toInt() == 1) throw Custom();
    if (a[1].toInt() == 2) throw std::runtime_error("runtime failure");
    if (a[1].toInt() == 3) TORCH_CHECK(false, "torch check failure");
    return {y * 2};
  };
  auto f = warden::compile(fn, Opts(GetParam()));
  const at::Tensor x = torch::randn({3});
  EXPECT_THROW(f({x, int64_t{1}}), Custom);
  try {
    f({x, int64_t{2}});
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "runtime failure");
  }
  try {
    f({x, int64_t{3}});
    ADD_FAILURE();
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("torch check failure"));
  }
  EXPECT_EQ(f.stats().compiles, 0);
  EXPECT_THAT(f.explain(), HasSubstr("0 cache entries"));
  ExpectEqual(f({x, int64_t{0}}), {(x + 1) * 2});
  ExpectEqual(f({x, int64_t{0}}), {(x + 1) * 2});
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 1);
  EXPECT_THROW(f({x, int64_t{1}}), Custom);  // a miss again: traced, thrown, nothing added
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.guards(0).empty(), false);
}

// Many threads, one function, shapes that hit and shapes that miss: one compile per signature,
// stats that add up, eager's results (the acceptance suite does the same for "aten").
TEST_P(Hostile, ConcurrentCallersWithHitsAndMisses) {
  auto f = warden::compile(AddMul, Opts(GetParam(), warden::Dynamic::kStatic));
  const at::Tensor y = torch::randn({8});
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const at::Tensor x = torch::randn({1 + (i * 7 + t) % 4, 8});
        if (!torch::allclose(f({x, y})[0], AddMul({x, y})[0])) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  const warden::Stats s = f.stats();
  EXPECT_EQ(s.calls, 160);
  EXPECT_EQ(s.compiles, 4) << "one compile per signature, never duplicated";
  EXPECT_EQ(s.cache_hits + s.compiles + s.eager_calls, s.calls);
}

INSTANTIATE_TEST_SUITE_P(Backends, Hostile, ::testing::Values("aten", "cpp"),
                         [](const auto& info) { return info.param; });

// --- Kernel-cache faults (backend "cpp"): the function keeps returning eager's results. ---

int64_t CountFiles(const std::string& dir, const std::string& suffix) {
  int64_t n = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string p = it->path().string();
    if (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0) ++n;
  }
  return n;
}

void ExpectServesCorrectly() {
  auto f = warden::compile(AddMul, Opts("cpp"));
  for (int i = 0; i < 3; ++i) {
    const at::Tensor x = torch::randn({64}), y = torch::randn({64});
    ExpectEqual(f({x, y}), AddMul({x, y}));
  }
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 2);
}

TEST(CacheFaults, CacheDirectoryIsAFile) {
  const std::string root = CacheRoot("file");
  std::ofstream(root + "/kernels") << "not a directory";
  ScopedEnv env("WARDEN_CACHE_DIR", root);
  ExpectServesCorrectly();
}

TEST(CacheFaults, CacheDirectoryUnwritable) {
  const std::string root = CacheRoot("readonly");
  fs::create_directories(root + "/kernels");
  chmod((root + "/kernels").c_str(), 0500);
  chmod(root.c_str(), 0500);
  if (access((root + "/kernels").c_str(), W_OK) == 0) {
    // Root ignores permissions: use a path under a regular file instead (ENOTDIR).
    chmod(root.c_str(), 0700);
    std::ofstream(root + "/blocker") << "x";
    ScopedEnv env("WARDEN_CACHE_DIR", root + "/blocker/below");
    ExpectServesCorrectly();
    return;
  }
  ScopedEnv env("WARDEN_CACHE_DIR", root);
  ExpectServesCorrectly();
  chmod(root.c_str(), 0700);
  chmod((root + "/kernels").c_str(), 0700);
}

// Writes fail (a /proc directory stands in for a full or read-only disk: creating any file
// there fails, whoever runs the test): the directory cannot be created, or, reached through a
// symlink, is refused (Note [Private files]); either way kernels go to a private directory.
TEST(CacheFaults, CacheDirectoryRejectsWrites) {
  {
    ScopedEnv env("WARDEN_CACHE_DIR", "/proc/self/fdinfo");
    ExpectServesCorrectly();
  }
  const std::string root = CacheRoot("rejects");
  fs::create_directory_symlink("/proc/self/fdinfo", root + "/kernels");
  ScopedEnv env("WARDEN_CACHE_DIR", root);
  ExpectServesCorrectly();
}

// A full disk: every write past 4 KiB fails (RLIMIT_FSIZE with SIGXFSZ ignored makes write()
// return EFBIG, in this process and in the compiler it spawns), so kernel sources and libraries
// cannot be written whole. Warden must serve eager's results and leave no partial library.
TEST(CacheFaults, DiskFullDuringCompile) {
  const std::string root = CacheRoot("full");
  ScopedEnv env("WARDEN_CACHE_DIR", root);
  {
    // Restores the limit and the signal on every way out, so later tests can write files.
    struct FileSizeLimit {
      struct rlimit old {};
      struct sigaction old_action {};
      FileSizeLimit() {
        getrlimit(RLIMIT_FSIZE, &old);
        struct sigaction ignore {};
        ignore.sa_handler = SIG_IGN;
        sigaction(SIGXFSZ, &ignore, &old_action);
        struct rlimit small = old;
        small.rlim_cur = 4096;
        EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
      }
      ~FileSizeLimit() {
        setrlimit(RLIMIT_FSIZE, &old);
        sigaction(SIGXFSZ, &old_action, nullptr);
      }
    } full;
    ExpectServesCorrectly();
  }
  EXPECT_EQ(CountFiles(root, ".so"), 0) << "a partial library was left where a later process would load it";
  // With room again, a fresh function compiles and serves kernels normally.
  ExpectServesCorrectly();
  EXPECT_EQ(CountFiles(root, ".so"), 1);
}

// A compiler that is killed (SIGKILL) mid-compile after writing half an output file.
TEST(CacheFaults, CompilerKilledMidCompile) {
  const std::string root = CacheRoot("killed");
  const std::string fake = root + "/killed-cxx";
  std::ofstream(fake) << "#!/bin/sh\n"
                         "if [ \"$1\" = --version ]; then exec g++ --version; fi\n"
                         "for a in \"$@\"; do if [ \"$prev\" = -o ]; then out=\"$a\"; fi; prev=\"$a\"; done\n"
                         "printf '\\177ELF half a library' > \"$out\"\n"
                         "kill -9 $$\n";
  fs::permissions(fake, fs::perms::owner_all);
  ScopedEnv env("WARDEN_CACHE_DIR", root);
  ScopedEnv cxx("WARDEN_CXX", fake);
  ExpectServesCorrectly();
  EXPECT_EQ(CountFiles(root, ".so"), 0) << "a partial library was left where a later process would load it";
  // With the real compiler, a fresh function compiles and serves kernels normally.
  ScopedEnv real("WARDEN_CXX", "g++");
  ExpectServesCorrectly();
  EXPECT_EQ(CountFiles(root, ".so"), 1);
}

int ThreadCount() {
  int n = 0;
  std::error_code ec;
  for (fs::directory_iterator it("/proc/self/task", ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

// async_compile runs its jobs on a bounded pool (Note [Compile pool]), not one thread per entry:
// twelve entries whose compiles each take a second never run more than its workers at once.
TEST(Resources, AsyncCompileUsesABoundedPool) {
  const std::string root = CacheRoot("async-pool");
  ScopedEnv env("WARDEN_CACHE_DIR", root);
  const std::string slow = root + "/slow-cxx";
  std::ofstream(slow) << "#!/bin/sh\nsleep 1\nexec g++ \"$@\"\n";
  fs::permissions(slow, fs::perms::owner_all);
  ScopedEnv cxx("WARDEN_CXX", slow);
  {
    // Threads the runtime starts on first use come first: LibTorch's, OpenMP's, and
    // ThreadSanitizer's background thread, which it starts at the process's first pthread_create.
    std::thread([] {}).join();
    auto warm = warden::compile(AddMul, Opts("cpp", warden::Dynamic::kStatic));
    const at::Tensor x = torch::randn({100000}), y = torch::randn({100000});
    for (int i = 0; i < 3; ++i) ExpectEqual(warm({x, y}), AddMul({x, y}));
  }
  warden::Options o = Opts("cpp", warden::Dynamic::kStatic);
  o.async_compile = true;
  o.cache_size_limit = 64;
  const int before = ThreadCount();
  int most = before;
  {
    auto f = warden::compile(AddMul, o);
    for (int n = 1; n <= 12; ++n) {
      const at::Tensor x = torch::randn({n}), y = torch::randn({n});
      ExpectEqual(f({x, y}), AddMul({x, y}));
      most = std::max(most, ThreadCount());
    }
    for (int i = 0; i < 50; ++i) {
      most = std::max(most, ThreadCount());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int n = 1; n <= 12; ++n) {
      const at::Tensor x = torch::randn({n}), y = torch::randn({n});
      ExpectEqual(f({x, y}), AddMul({x, y}));
    }
    EXPECT_EQ(f.stats().compiles, 12);
  }  // destruction drops the queued compiles and waits for the running ones
  EXPECT_LE(most - before, 2) << "background compiles ran on " << most - before << " new threads";
}

// Bytes glibc's allocator has handed out (0 under a sanitizer's allocator).
int64_t HeapInUse() { return static_cast<int64_t>(mallinfo2().uordblks); }

// Replaced snapshots are freed once no reader holds them (Note [Reclaiming snapshots]): a
// compile-and-reset loop does not grow (it grew 16-25 KB per cycle while every snapshot was kept).
TEST(Resources, ResetLoopsStayBounded) {
  auto f = warden::compile(AddMul, Opts("aten", warden::Dynamic::kStatic));
  const at::Tensor x = torch::randn({8}), y = torch::randn({8});
  for (int i = 0; i < 50; ++i) {
    f({x, y});
    f.reset();
  }
  const int64_t before = HeapInUse();
  constexpr int kCycles = 400;
  for (int i = 0; i < kCycles; ++i) {
    ExpectEqual(f({x, y}), AddMul({x, y}));
    f.reset();
  }
  const int64_t growth = HeapInUse() - before;
  std::cout << "heap growth over " << kCycles << " compile+reset cycles: " << growth << " bytes\n";
  EXPECT_LT(growth, kCycles * 1024) << "memory grows with every reset";
}

// Entries that no snapshot holds any more are freed: after 200 compiles and a reset() the heap is
// back where it started. (While every snapshot was kept, each one held the entries it listed, so
// nothing compiled was ever freed and the snapshots themselves grew quadratically.)
TEST(Resources, ResetFreesEveryEntry) {
  warden::Options o = Opts("aten", warden::Dynamic::kStatic);
  o.cache_size_limit = 1000;
  auto f = warden::compile(AddMul, o);
  auto compile_entries = [&](int count) {
    for (int n = 1; n <= count; ++n) {
      const at::Tensor x = torch::randn({n}), y = torch::randn({n});
      f({x, y});
    }
  };
  compile_entries(20);  // warm up the allocator's pools
  f.reset();
  const int64_t before = HeapInUse();
  compile_entries(200);
  const int64_t with_entries = HeapInUse() - before;
  f.reset();
  const int64_t after_reset = HeapInUse() - before;
  std::cout << "heap: 200 entries +" << with_entries << " bytes, after reset() +" << after_reset << " bytes\n";
  EXPECT_EQ(f.stats().compiles, 220);
  EXPECT_LT(after_reset, 256 * 1024) << "entries or snapshots outlive reset()";
}

// Hot-path readers race with publications that free what they replaced: readers on four
// threads, a fifth thread resetting and recompiling. Every result equals eager; under ASan/TSan a
// read of a freed snapshot, entry or artifact fails the run.
TEST(Resources, ReadersNeverSeeAFreedSnapshot) {
  for (const char* backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    const std::string root = CacheRoot(std::string("readers-") + backend);
    ScopedEnv env("WARDEN_CACHE_DIR", root);
    auto f = warden::compile(AddMul, Opts(backend, warden::Dynamic::kStatic));
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0}, calls{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 4; ++t) {
      readers.emplace_back([&, t] {
        const at::Tensor x = torch::randn({4 + t % 2}), y = torch::randn({4 + t % 2});
        const at::Tensor want = AddMul({x, y})[0];
        while (!stop.load()) {
          if (!torch::allclose(f({x, y})[0], want)) ++bad;
          ++calls;
        }
      });
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(800);
    int resets = 0;
    while (std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      f.reset();
      ++resets;
    }
    stop = true;
    for (auto& r : readers) r.join();
    EXPECT_EQ(bad.load(), 0);
    EXPECT_GT(calls.load(), 0);
    std::cout << backend << ": " << calls.load() << " calls, " << resets << " resets, " << f.stats().compiles
              << " compiles\n";
  }
}

// Two processes compiling the same kernel into one cache at the same time.
TEST(CacheFaults, ChildProcessCompilesConcurrently) {
  if (std::getenv("WARDEN_HOSTILE_CHILD") == nullptr) GTEST_SKIP() << "only run as a child process";
  ExpectServesCorrectly();
}

TEST(CacheFaults, TwoProcessesCompileTheSameKernel) {
  if (std::getenv("WARDEN_HOSTILE_CHILD") != nullptr) GTEST_SKIP();
  const std::string root = CacheRoot("two-processes");
  ScopedEnv env("WARDEN_CACHE_DIR", root);
  ScopedEnv child("WARDEN_HOSTILE_CHILD", "1");
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=CacheFaults.ChildProcessCompilesConcurrently";
  // The children must not write the parent's Bazel/gtest result files.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string s = *e;
    if (s.rfind("XML_OUTPUT_FILE=", 0) == 0 || s.rfind("GTEST_OUTPUT=", 0) == 0 ||
        s.rfind("TEST_PREMATURE_EXIT_FILE=", 0) == 0 || s.rfind("TEST_SHARD_STATUS_FILE=", 0) == 0) {
      continue;
    }
    env_strings.push_back(s);
  }
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<char*> argv = {self.data(), filter.data(), nullptr};
  pid_t pids[2];
  for (pid_t& pid : pids) ASSERT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()), 0);
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "a child process failed (its output is above)";
  }
  EXPECT_EQ(CountFiles(root, ".so"), 1);
  EXPECT_EQ(CountFiles(root, ".tmp."), 0);
  unsetenv("WARDEN_HOSTILE_CHILD");
  ExpectServesCorrectly();  // and this process loads what they built
}

}  // namespace

namespace {

// Found by //tests/fuzz (program seed 280, backend aten, every Dynamic mode). reshape(-1) copies
// a non-contiguous input and views a contiguous one. The entry traced with a transposed input
// (add_ writes a copy, so the later item() is an ordinary value guard) had no stride guard, so a
// contiguous input hit it; its add_ wrote the argument, the value guard failed, and the retrace
// wrote the argument a second time. Now the write reads the strides of reshape's input
// (Note [View or copy] in tracer/tracer.cc) and the contiguous input misses.
TEST(HostileRegression, ReshapeViewOrCopyThenInPlaceThenItem) {
  warden::Fn fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor v = a[0].toTensor().reshape(-1);
    v.add_(v);
    if (v.sum().item<double>() > 0) return {v * 2};
    return {v - 1};
  };
  auto f = warden::compile(fn, Opts("aten", warden::Dynamic::kStatic));
  f({torch::ones({2, 5}).t()});  // traced: reshape copies, value guard sum > 0
  const at::Tensor x1 = -torch::ones({5, 2}), x2 = -torch::ones({5, 2});
  const auto want = fn({x1});
  const auto got = f({x2});
  ExpectEqual(got, want);
  EXPECT_TRUE(torch::equal(x1, x2)) << "argument written " << x2.sum().item<double>() / -10 << " times, not 2";
  EXPECT_EQ(f.stats().cache_hits, 0);
  EXPECT_THAT(f.explain(), HasSubstr("aten::reshape at %0 (view or copy, written by aten::add_.Tensor at %1)"));
}

}  // namespace
