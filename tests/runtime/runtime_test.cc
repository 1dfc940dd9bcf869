// Tests of runtime/ (compile(), CompiledFunction, the backend registry, WARDEN_LOGS, explain):
// host-registered backends, error paths (code and message), explain_json's document, reset(),
// and the graph/guards logs.
#include <atomic>
#include <cstdlib>
#include <functional>
#include <stdexcept>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "absl/strings/str_join.h"
#include "runtime/backend.h"
#include "runtime/codegen_replay.h"
#include "runtime/logging.h"
#include "runtime/warden.h"

namespace warden {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Args = std::vector<c10::IValue>;
using json = nlohmann::json;

Options Static(const std::string& name = "fn", const std::string& backend = "aten") {
  Options o;
  o.name = name;
  o.backend = backend;
  o.dynamic = Dynamic::kStatic;
  return o;
}

std::vector<at::Tensor> AddRelu(const Args& a) {
  return {torch::relu(a[0].toTensor() + a[1].toTensor())};
}

void ExpectSame(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << "output " << i;
    EXPECT_TRUE(torch::allclose(got[i], want[i])) << "output " << i;
  }
}

// A function's id (F in "F/E") as explain_json reports it.
int FunctionId(const CompiledFunction& f) { return json::parse(f.explain_json())["id"].get<int>(); }

// --- Host-registered backends -------------------------------------------------------------------

struct Counts {
  std::atomic<int> compiles{0};
  std::atomic<int> runs{0};
};
Counts counting;

// Wraps "aten" and counts what the runtime asks of it.
class CountingArtifact final : public Artifact {
 public:
  explicit CountingArtifact(std::unique_ptr<Artifact> inner) : inner_(std::move(inner)) {}
  bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
           std::string* value_guard_failure) const override {
    counting.runs.fetch_add(1);
    return inner_->Run(args, outputs, value_guard_failure);
  }

 private:
  std::unique_ptr<Artifact> inner_;
};

class CountingBackend final : public Backend {
 public:
  std::string name() const override { return "counting"; }
  absl::StatusOr<std::unique_ptr<Artifact>> Compile(
      std::shared_ptr<const tracer::Graph> graph) override {
    counting.compiles.fetch_add(1);
    auto inner = MakeBackend("aten")->Compile(std::move(graph));
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<Artifact>(new CountingArtifact(*std::move(inner)));
  }
};

// An artifact that ignores the graph: proves that hits return what the artifact computes.
class FixedArtifact final : public Artifact {
 public:
  bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
           std::string* value_guard_failure) const override {
    *outputs = {torch::full({1}, 42.0)};
    return true;
  }
};

class FixedBackend final : public Backend {
 public:
  std::string name() const override { return "fixed"; }
  absl::StatusOr<std::unique_ptr<Artifact>> Compile(std::shared_ptr<const tracer::Graph>) override {
    return std::unique_ptr<Artifact>(new FixedArtifact());
  }
};

class FailingBackend final : public Backend {
 public:
  std::string name() const override { return "failing"; }
  absl::StatusOr<std::unique_ptr<Artifact>> Compile(std::shared_ptr<const tracer::Graph>) override {
    return absl::UnavailableError("no compiler here");
  }
};

TEST(Backend, HostRegisteredBackendIsUsedAndItsArtifactRunsOnHits) {
  RegisterBackend("counting", [] { return std::unique_ptr<Backend>(new CountingBackend()); });
  EXPECT_THAT(BackendNames(), ::testing::IsSupersetOf({"aten", "counting"}));
  counting.compiles = 0;
  counting.runs = 0;
  int user_calls = 0;
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    ++user_calls;
    return AddRelu(a);
  };
  CompiledFunction f = compile(fn, Static("counted", "counting"));
  const at::Tensor y = torch::randn({4});
  for (int i = 0; i < 4; ++i) {
    const at::Tensor x = torch::randn({3, 4});
    ExpectSame(f({x, y}), AddRelu({x, y}));
  }
  EXPECT_EQ(user_calls, 1) << "traced once";
  EXPECT_EQ(counting.compiles.load(), 1);
  EXPECT_EQ(counting.runs.load(), 3) << "the first call returns the trace's eager results";
  EXPECT_EQ(f.stats().cache_hits, 3);
  // A new signature compiles through the same backend.
  f({torch::randn({2, 4}), y});
  EXPECT_EQ(counting.compiles.load(), 2);
  const json doc = json::parse(f.explain_json());
  for (const json& e : doc["entries"]) {
    EXPECT_EQ(e["backend"], "counting");
    EXPECT_EQ(e["backend_note"], "");
  }
  EXPECT_THAT(f.explain(), HasSubstr("backend counting"));
}

TEST(Backend, HitsReturnWhatTheArtifactComputes) {
  RegisterBackend("fixed", [] { return std::unique_ptr<Backend>(new FixedBackend()); });
  CompiledFunction f = compile(
      [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor() * 2}; },
      Static("fixed_fn", "fixed"));
  const at::Tensor x = torch::ones({1});
  EXPECT_TRUE(torch::equal(f({x})[0], torch::full({1}, 2.0))) << "miss: the traced eager result";
  EXPECT_TRUE(torch::equal(f({x})[0], torch::full({1}, 42.0))) << "hit: the artifact's result";
}

TEST(Backend, FailingBackendFallsBackToAtenWithANote) {
  RegisterBackend("failing", [] { return std::unique_ptr<Backend>(new FailingBackend()); });
  CompiledFunction f = compile(AddRelu, Static("fails", "failing"));
  const at::Tensor x = torch::randn({3}), y = torch::randn({3});
  testing::internal::CaptureStderr();
  ExpectSame(f({x, y}), AddRelu({x, y}));
  ExpectSame(f({x, y}), AddRelu({x, y}));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("warden: function 'fails': backend 'failing' failed (no compiler here); "
                             "using 'aten'"));
  EXPECT_EQ(f.stats().cache_hits, 1);
  const json doc = json::parse(f.explain_json());
  ASSERT_EQ(doc["entries"].size(), 1u);
  EXPECT_EQ(doc["entries"][0]["backend"], "aten");
  EXPECT_EQ(doc["entries"][0]["backend_note"],
            "backend 'failing' failed (no compiler here); using 'aten'");
}

TEST(Backend, UnknownBackendIsAWardenErrorNamingIt) {
  Options o = Static("unknown", "no_such_backend");
  try {
    compile(AddRelu, o);
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown backend 'no_such_backend'"));
    EXPECT_THAT(e.what(), HasSubstr("registered: "));
    EXPECT_THAT(e.what(), HasSubstr("aten"));
  }
  EXPECT_EQ(MakeBackend("no_such_backend"), nullptr);
}

// --- compile() and CompiledFunction error paths -------------------------------------------------

TEST(Compile, RejectsAnEmptyFunctionAndANegativeCacheLimit) {
  try {
    compile(Fn(), Static());
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "warden::compile: fn is empty");
  }
  Options o = Static();
  o.cache_size_limit = -1;
  try {
    compile(AddRelu, o);
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "warden::compile: options.cache_size_limit must be >= 0, got -1");
  }
}

TEST(CompiledFunction, MarkDynamicAndStaticRejectNegativeIndices) {
  CompiledFunction f = compile(AddRelu, Static());
  try {
    f.mark_dynamic(-1, 0);
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "warden: mark_dynamic(-1, 0): arg and dim must be non-negative");
  }
  try {
    f.mark_static(0, -2);
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "warden: mark_static(0, -2): arg and dim must be non-negative");
  }
  EXPECT_EQ(&f.mark_dynamic(0, 0).mark_static(1, 0), &f) << "hints chain";
}

TEST(CompiledFunction, GuardsOfABadEntryIsAWardenError) {
  CompiledFunction f = compile(AddRelu, Static("g"));
  try {
    f.guards(0);
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "warden: guards(0): function 'g' has no cache entry 0 (it has 0)");
  }
  f({torch::randn({2}), torch::randn({2})});
  EXPECT_FALSE(f.guards(0).empty());
  try {
    f.guards(3);
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "warden: guards(3): function 'g' has no cache entry 3 (it has 1)");
  }
  EXPECT_THROW(f.guards(-1), Error);
}

TEST(CompiledFunction, GuardsListDescriptionsWithProvenanceAndArgNames) {
  Options o = Static();
  o.arg_names = {"x", "bias"};
  CompiledFunction f = compile(AddRelu, o);
  f({torch::randn({3, 4}), torch::randn({4})});
  const std::vector<std::string> lines = f.guards(0);
  EXPECT_THAT(lines, ::testing::Contains("x.size(0) == 3  # used by aten::add.Tensor at %0 (static shapes)"));
  EXPECT_THAT(lines, ::testing::Contains("bias.dim() == 1  # used by aten::add.Tensor at %0"));
  EXPECT_THAT(lines, ::testing::Contains("len(args) == 2  # the function was traced with this many arguments"));
  EXPECT_THAT(lines, ::testing::Contains("x.dtype == Float  # tensor metadata is not observable to the tracer: always guarded"));
  EXPECT_THAT(lines, ::testing::Not(::testing::Contains(HasSubstr("stride"))));
}

// --- Value guards inside the artifact -----------------------------------------------------------

TEST(CompiledFunction, ValueGuardFailureIsTheRecompileReason) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    if (x.sum().item<int64_t>() > 0) return {x * 2};
    return {x - 1};
  };
  CompiledFunction f = compile(fn, Static());
  const at::Tensor one = torch::tensor({1, 0, 0}), zero = torch::zeros({3}, torch::kLong);
  ExpectSame(f({one}), fn({one}));
  ExpectSame(f({zero}), fn({zero}));
  const std::vector<RecompileEvent> events = f.recompiles();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].reasons,
              ElementsAre("value of aten::_local_scalar_dense at %1 changed: expected 1, actual 0"));
  EXPECT_EQ(events[0].action, "recompiled");
}

// --- Exceptions and the cache lookup ------------------------------------------------------------

struct HostError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(CompiledFunction, ExceptionsPropagateAndLeaveNoEntry) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    if (x.size(0) == 5) throw HostError("five is not allowed");
    return {x.cos()};
  };
  CompiledFunction f = compile(fn, Static("throws"));
  EXPECT_THROW(f({torch::randn({5})}), HostError);
  EXPECT_EQ(f.stats().compiles, 0);
  EXPECT_TRUE(f.recompiles().empty()) << "a failed first compile is not a recompilation";
  f({torch::randn({3})});
  try {
    f({torch::randn({5})});
    FAIL() << "expected HostError";
  } catch (const HostError& e) {
    EXPECT_STREQ(e.what(), "five is not allowed");
  }
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_THROW(f.guards(1), Error) << "no entry was added";
  const std::vector<RecompileEvent> events = f.recompiles();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].call_index, 2);
  EXPECT_EQ(events[0].action, "retraced: the function raised an exception (no entry added)");
  EXPECT_THAT(events[0].reasons, ElementsAre("tensor 'arg0' size mismatch at index 0. expected 3, actual 5"));
  // The function keeps working for good inputs.
  const at::Tensor x = torch::randn({3});
  ExpectSame(f({x}), {x.cos()});
  EXPECT_EQ(f.stats().cache_hits, 1);
}

at::Tensor smuggled;  // a traced tensor that escaped its trace

TEST(CompiledFunction, AnEscapedTracedTensorArgumentIsAnErrorAndDoesNotDisableTracing) {
  CompiledFunction leaky = compile(
      [](const Args& a) -> std::vector<at::Tensor> {
        smuggled = a[0].toTensor() * 2;
        return {smuggled + 1};
      },
      Static("leaky"));
  leaky({torch::ones({2})});
  ASSERT_TRUE(smuggled.defined());
  CompiledFunction f = compile(
      [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor() + 1}; }, Static("victim"));
  try {
    f({smuggled});
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("traced tensors must not escape the traced function"));
  }
  // One bad call must not make the function eager for good.
  const at::Tensor x = torch::ones({2});
  ExpectSame(f({x}), {x + 1});
  ExpectSame(f({x}), {x + 1});
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 1);
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_EQ(json::parse(f.explain_json())["eager_reason"], "");
  // On a cache hit the artifact meets the escaped tensor: still a warden::Error, not a crash.
  EXPECT_THROW(f({smuggled}), Error);
  smuggled.reset();
}

TEST(CompiledFunction, EntriesWithTheSameSignatureButDifferentStridesBothHit) {
  // Strides are not part of the signature hash, so both entries land in one bucket; the guard
  // programs must still tell them apart.
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    return {x.is_contiguous() ? x * 2 : x * 3};
  };
  CompiledFunction f = compile(fn, Static("strided"));
  const at::Tensor contiguous = torch::ones({3, 4});
  const at::Tensor transposed = torch::ones({4, 3}).t();
  ExpectSame(f({contiguous}), {contiguous * 2});
  ExpectSame(f({transposed}), {transposed * 3});
  EXPECT_EQ(f.stats().compiles, 2);
  for (int i = 0; i < 2; ++i) {
    ExpectSame(f({torch::ones({3, 4})}), {contiguous * 2});
    ExpectSame(f({torch::ones({4, 3}).t()}), {transposed * 3});
  }
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().cache_hits, 4);
  const json doc = json::parse(f.explain_json());
  for (const json& e : doc["entries"]) EXPECT_EQ(e["hits"], 2) << e["id"];
}

TEST(CompiledFunction, ManyEntriesEachHitTheirOwn) {
  Options o = Static("many");
  o.cache_size_limit = 16;
  CompiledFunction f = compile(
      [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor() * a[1].toInt()}; }, o);
  for (int64_t k = 0; k < 10; ++k) f({torch::ones({2}), k});
  EXPECT_EQ(f.stats().compiles, 10);
  for (int64_t k = 9; k >= 0; --k) {
    const std::vector<at::Tensor> out = f({torch::ones({2}), k});
    EXPECT_TRUE(torch::equal(out[0], torch::full({2}, static_cast<double>(k)))) << k;
  }
  EXPECT_EQ(f.stats().compiles, 10);
  EXPECT_EQ(f.stats().cache_hits, 10);
}

// Note [Building outputs]: a hit returns each output as eager does, whether it is an intermediate
// returned more than once (copied, then moved out of its slot at its last return), an argument
// (repeated, or alone: the arguments are not consumed) or a captured tensor, on both backends.
TEST(CompiledFunction, HitOutputsRepeatIntermediatesArgumentsAndConstants) {
  const at::Tensor w = torch::randn({3});
  const std::vector<std::function<std::vector<at::Tensor>(const Args&)>> fns = {
      [](const Args& a) -> std::vector<at::Tensor> {
        const at::Tensor y = a[0].toTensor() * 2;
        return {y, a[0].toTensor(), y, a[1].toTensor(), y};
      },
      [](const Args& a) -> std::vector<at::Tensor> { return {a[1].toTensor(), a[0].toTensor(), a[1].toTensor()}; },
      [w](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor(), w, a[1].toTensor(), w}; },
      [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor(), at::Tensor(), a[1].toTensor()}; },
  };
  for (const std::string backend : {"aten", "cpp"}) {
    for (size_t k = 0; k < fns.size(); ++k) {
      SCOPED_TRACE(testing::Message() << backend << ", function " << k);
      CompiledFunction f = compile(fns[k], Static("outputs", backend));
      const at::Tensor x = torch::randn({3}), z = torch::randn({3});
      f({x, z});
      for (int call = 0; call < 2; ++call) {
        const Args in = {x, z};
        const std::vector<at::Tensor> got = f(in), want = fns[k](in);
        // The caller's arguments are not consumed.
        ASSERT_TRUE(in[0].isTensor() && in[0].toTensor().is_same(x) && in[1].isTensor() && in[1].toTensor().is_same(z));
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(got[i].defined(), want[i].defined()) << "output " << i;
          if (want[i].defined()) EXPECT_TRUE(torch::equal(got[i], want[i])) << "output " << i;
          for (size_t j = 0; j < want.size(); ++j) {
            if (!want[i].defined() || !want[j].defined()) continue;
            EXPECT_EQ(got[i].is_same(got[j]), want[i].is_same(want[j])) << "outputs " << i << ", " << j;
          }
          // An argument or captured tensor comes back as that very tensor.
          if (want[i].is_same(x) || want[i].is_same(z) || want[i].is_same(w)) EXPECT_TRUE(got[i].is_same(want[i]));
        }
      }
      EXPECT_EQ(f.stats().compiles, 1);
      EXPECT_EQ(f.stats().cache_hits, 2);
    }
  }
}

// Note [Building outputs] with a compiled backward: an intermediate that is returned (moved out of
// its slot at its return) and that the backward also saves (tanh saves its result) reaches both
// intact; outputs and gradients match eager on every hit. (Returning one tensor twice makes the
// entry's backward LibTorch's autograd: HitOutputsRepeatIntermediatesArgumentsAndConstants.)
TEST(CompiledFunction, HitOutputsSavedForTheBackwardAreReturnedIntact) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor y = torch::tanh(a[0].toTensor() * a[1].toTensor());
    return {y * 2, y};
  };
  for (const std::string backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    CompiledFunction f = compile(fn, Static("saved_outputs", backend));
    const at::Tensor w = torch::randn({5});
    for (int call = 0; call < 3; ++call) {
      const at::Tensor x = torch::randn({5}, torch::requires_grad());
      const at::Tensor x_eager = x.detach().clone().requires_grad_();
      const std::vector<at::Tensor> got = f({x, w}), want = fn({x_eager, w});
      ASSERT_EQ(got.size(), 2u);
      ASSERT_TRUE(got[0].defined() && got[1].defined());
      for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(torch::allclose(got[i], want[i])) << "output " << i;
      (got[0] + got[1] * 3).sum().backward();
      (want[0] + want[1] * 3).sum().backward();
      ASSERT_TRUE(x.grad().defined());
      EXPECT_TRUE(torch::allclose(x.grad(), x_eager.grad(), 1e-5, 1e-6)) << "call " << call;
    }
    EXPECT_EQ(f.stats().compiles, 1);
    EXPECT_EQ(f.stats().cache_hits, 2);
    // The entry's backward is the compiled one (Note [Compiled backward]), not autograd over a replay.
    EXPECT_THAT(f.explain(), HasSubstr("backward: "));
    EXPECT_THAT(f.explain(), ::testing::Not(HasSubstr("LibTorch's autograd over the replayed forward")));
  }
}

// --- LogTopics ----------------------------------------------------------------------------------

TEST(LogTopics, Parse) {
  using runtime::LogTopics;
  auto topics = [](const std::string& spec) {
    const LogTopics t = LogTopics::Parse(spec);
    return std::vector<bool>{t.recompiles, t.graph, t.guards};
  };
  EXPECT_THAT(topics(""), ElementsAre(false, false, false));
  EXPECT_THAT(topics("recompiles"), ElementsAre(true, false, false));
  EXPECT_THAT(topics("graph"), ElementsAre(false, true, false));
  EXPECT_THAT(topics("graph_code"), ElementsAre(false, true, false));
  EXPECT_THAT(topics("guards"), ElementsAre(false, false, true));
  EXPECT_THAT(topics("graph,guards"), ElementsAre(false, true, true));
  EXPECT_THAT(topics(" +Recompiles , GUARDS ,"), ElementsAre(true, false, true));
  EXPECT_THAT(topics("all"), ElementsAre(true, true, true));
  EXPECT_THAT(topics("dynamo,bytecode"), ElementsAre(false, false, false)) << "unknown topics ignored";
  EXPECT_THAT(topics("recompile"), ElementsAre(false, false, false)) << "no prefix matching";
}

TEST(LogTopics, FromEnvReadsWardenLogs) {
  setenv("WARDEN_LOGS", "guards,recompiles", 1);
  const runtime::LogTopics t = runtime::LogTopics::FromEnv();
  unsetenv("WARDEN_LOGS");
  EXPECT_TRUE(t.guards);
  EXPECT_TRUE(t.recompiles);
  EXPECT_FALSE(t.graph);
  const runtime::LogTopics none = runtime::LogTopics::FromEnv();
  EXPECT_FALSE(none.guards || none.recompiles || none.graph);
}

// --- WARDEN_LOGS=graph,guards -------------------------------------------------------------------

std::vector<at::Tensor> Sin(const Args& a) { return {a[0].toTensor().sin()}; }

TEST(Logs, GraphAndGuardsArePrintedOnStderrAtCompile) {
  setenv("WARDEN_LOGS", "graph,guards", 1);
  CompiledFunction f = compile(Sin, Static("logged"));
  unsetenv("WARDEN_LOGS");
  testing::internal::CaptureStderr();
  f({torch::randn({3})});
  const std::string first = testing::internal::GetCapturedStderr();
  const std::string id = std::to_string(FunctionId(f));
  const std::string expected =
      "warden: graph of logged entry " + id + "/0:\n"
      "graph(%arg0: f32[3]):\n"
      "  %0 = aten::sin(%arg0) : f32[3]\n"
      "  return (%0)\n"
      "warden: guards of logged entry " + id + "/0:\n  " +
      absl::StrJoin(f.guards(0), "\n  ") + "\n";
  EXPECT_EQ(first, expected);
  EXPECT_THAT(first, HasSubstr("\n  arg0.size(0) == 3  # used by aten::sin at %0 (static shapes)\n"));
  EXPECT_THAT(first, ::testing::Not(HasSubstr("Recompiling"))) << "recompiles was not asked for";

  testing::internal::CaptureStderr();
  f({torch::randn({3})});
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "a hit logs nothing";

  testing::internal::CaptureStderr();
  f({torch::randn({5})});
  const std::string second = testing::internal::GetCapturedStderr();
  EXPECT_THAT(second, HasSubstr("warden: graph of logged entry " + id + "/1:\ngraph(%arg0: f32[5]):\n"));
  EXPECT_THAT(second, HasSubstr("warden: guards of logged entry " + id + "/1:\n"));
}

TEST(Logs, GraphOfADynamicEntryShowsSymbolicShapes) {
  setenv("WARDEN_LOGS", "graph", 1);
  Options o = Static("sym");
  o.dynamic = Dynamic::kDynamic;
  CompiledFunction f = compile(Sin, o);
  unsetenv("WARDEN_LOGS");
  testing::internal::CaptureStderr();
  f({torch::randn({3})});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "warden: graph of sym entry " + std::to_string(FunctionId(f)) +
                     "/0:\n"
                     "graph(%arg0: f32[s0]):\n"
                     "  %0 = aten::sin(%arg0) : f32[s0]\n"
                     "  return (%0)\n");
  const json doc = json::parse(f.explain_json());
  EXPECT_EQ(doc["entries"][0]["graph"], "graph(%arg0: f32[s0]):\n  %0 = aten::sin(%arg0) : f32[s0]\n  return (%0)\n");
  f({torch::randn({7})});
  EXPECT_EQ(f.stats().cache_hits, 1);
}

TEST(Logs, WardenLogsIsReadWhenTheFunctionIsCompiled) {
  unsetenv("WARDEN_LOGS");
  CompiledFunction quiet = compile(Sin, Static("quiet"));
  setenv("WARDEN_LOGS", "all", 1);
  testing::internal::CaptureStderr();
  quiet({torch::randn({2})});
  quiet({torch::randn({4})});
  const std::string err = testing::internal::GetCapturedStderr();
  unsetenv("WARDEN_LOGS");
  EXPECT_EQ(err, "");
}

// --- explain_json -------------------------------------------------------------------------------

TEST(Explain, JsonHasEntriesGuardsAndRecompilesWithTheirFields) {
  CompiledFunction f = compile(AddRelu, Static("explained"));
  const at::Tensor y = torch::randn({4});
  f({torch::randn({3, 4}), y});  // call 0: entry 0
  f({torch::randn({2, 4}), y});  // call 1: entry 1 (recompile)
  f({torch::randn({2, 4}), y});  // call 2: hit on entry 1
  const json doc = json::parse(f.explain_json());
  const int id = doc["id"].get<int>();
  EXPECT_EQ(doc["function"], "explained");
  EXPECT_EQ(doc["options"]["backend"], "aten");
  EXPECT_EQ(doc["options"]["dynamic"], "static");
  EXPECT_EQ(doc["options"]["cache_size_limit"], 8);
  EXPECT_EQ(doc["options"]["fail_on_cache_limit"], false);
  EXPECT_EQ(doc["stats"]["calls"], 3);
  EXPECT_EQ(doc["stats"]["cache_hits"], 1);
  EXPECT_EQ(doc["stats"]["compiles"], 2);
  EXPECT_EQ(doc["stats"]["eager_calls"], 0);
  EXPECT_EQ(doc["eager_reason"], "");
  EXPECT_EQ(doc["dropped_recompiles"], 0);

  const json& entries = doc["entries"];
  ASSERT_TRUE(entries.is_array());
  ASSERT_EQ(entries.size(), 2u);
  // Most recently used first.
  const json& e1 = entries[0];
  const json& e0 = entries[1];
  EXPECT_EQ(e1["index"], 1);
  EXPECT_EQ(e1["id"], std::to_string(id) + "/1");
  EXPECT_EQ(e1["created_at_call"], 1);
  EXPECT_EQ(e1["hits"], 1);
  EXPECT_EQ(e0["index"], 0);
  EXPECT_EQ(e0["id"], std::to_string(id) + "/0");
  EXPECT_EQ(e0["created_at_call"], 0);
  EXPECT_EQ(e0["hits"], 0);
  for (const json* e : {&e0, &e1}) {
    EXPECT_EQ((*e)["backend"], "aten");
    EXPECT_EQ((*e)["backend_note"], "");
    EXPECT_EQ((*e)["num_nodes"], 2);
    EXPECT_TRUE((*e)["rule_mismatches"].is_array());
    EXPECT_TRUE((*e)["rule_mismatches"].empty());
    EXPECT_THAT((*e)["graph"].get<std::string>(), HasSubstr("aten::add.Tensor(%arg0, %arg1, 1)"));
  }
  EXPECT_THAT(e0["graph"].get<std::string>(), HasSubstr("graph(%arg0: f32[3, 4], %arg1: f32[4]):\n"));

  // Guards: one object per guard, the same as guards(entry) renders.
  const std::vector<std::string> lines = f.guards(0);
  ASSERT_EQ(e0["guards"].size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& g = e0["guards"][i];
    ASSERT_TRUE(g.contains("kind") && g.contains("text") && g.contains("provenance"));
    EXPECT_EQ(g["text"].get<std::string>() + "  # " + g["provenance"].get<std::string>(), lines[i]);
  }
  EXPECT_THAT(e0["guards"], ::testing::Contains(json{{"kind", "size"},
                                                     {"text", "arg0.size(0) == 3"},
                                                     {"provenance", "used by aten::add.Tensor at %0 (static shapes)"}}));

  const json& events = doc["recompiles"];
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["call_index"], 1);
  EXPECT_EQ(events[0]["action"], "recompiled");
  EXPECT_EQ(events[0]["reasons"],
            json::array({"tensor 'arg0' size mismatch at index 0. expected 3, actual 2"}));
}

TEST(Explain, JsonReportsAnUntraceableFunction) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.add_(1);
    return {x * x.sum().item<double>()};
  };
  CompiledFunction f = compile(fn, Static("eager_only"));
  testing::internal::CaptureStderr();
  f({torch::ones({2})});
  f({torch::ones({2})});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("warden: function 'eager_only' not traceable (data-dependent"));
  const json doc = json::parse(f.explain_json());
  EXPECT_THAT(doc["eager_reason"].get<std::string>(),
              HasSubstr("data-dependent aten::_local_scalar_dense at %2 follows a mutation"));
  EXPECT_TRUE(doc["entries"].empty());
  EXPECT_EQ(doc["stats"]["eager_calls"], 2);
  ASSERT_EQ(doc["recompiles"].size(), 1u);
  EXPECT_THAT(doc["recompiles"][0]["action"].get<std::string>(),
              HasSubstr("runs eagerly from now on"));
}

// --- reset --------------------------------------------------------------------------------------

TEST(CompiledFunction, ResetDropsEntriesAndEvents) {
  int user_calls = 0;
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    ++user_calls;
    return AddRelu(a);
  };
  CompiledFunction f = compile(fn, Static("resettable"));
  const at::Tensor y = torch::randn({4});
  f({torch::randn({3, 4}), y});
  f({torch::randn({2, 4}), y});
  ASSERT_EQ(f.recompiles().size(), 1u);
  ASSERT_EQ(user_calls, 2);

  f.reset();
  EXPECT_TRUE(f.recompiles().empty());
  EXPECT_THROW(f.guards(0), Error);
  EXPECT_THROW(f.guards(1), Error);
  json doc = json::parse(f.explain_json());
  EXPECT_TRUE(doc["entries"].empty());
  EXPECT_TRUE(doc["recompiles"].empty());
  EXPECT_THAT(f.explain(), HasSubstr("0 cache entries"));

  // The next call traces again, into entry 0, and is not a recompilation.
  const at::Tensor x = torch::randn({3, 4});
  ExpectSame(f({x, y}), AddRelu({x, y}));
  EXPECT_EQ(user_calls, 3);
  EXPECT_EQ(f.stats().compiles, 3);
  EXPECT_TRUE(f.recompiles().empty());
  EXPECT_THAT(f.guards(0), ::testing::Contains(HasSubstr("arg0.size(0) == 3")));
  f({torch::randn({3, 4}), y});
  EXPECT_EQ(user_calls, 3) << "hit after reset";
}


// Note [Unboxed replay]: the ops real models spend their calls in replay through their ATen
// functions, not boxed. Every op below is in the unboxed table (one call each per hit on backend
// aten: the count equals the graph's nodes), and results and gradients equal eager's, with grad
// mode on and off, on both backends, including a view whose size is read at run time.
TEST(UnboxedReplay, TableOpsReplayUnboxedAndMatchEager) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& img = a[0].toTensor();  // [n, 2, 8, 8]
    const at::Tensor& w = a[1].toTensor();    // [3, 2, 3, 3]
    const at::Tensor& tokens = a[2].toTensor();
    at::Tensor x = at::conv2d(img, w, {}, {1, 1}, {1, 1}, {1, 1}, 1);
    x = at::batch_norm(x, {}, {}, at::zeros({3}), at::ones({3}), false, 0.1, 1e-5, false);
    x = at::max_pool2d(at::relu(x), {2, 2}, {2, 2}, {0, 0}, {1, 1}, false);
    x = at::conv_transpose2d(x, w, {}, {2, 2}, {0, 0}, {1, 1}, 1, {1, 1});
    x = at::adaptive_avg_pool2d(at::leaky_relu(x, 0.1), {4, 4});
    at::Tensor flat = at::flatten(x, 1);                  // [n, 32]
    at::Tensor v = x.view({x.size(0), -1});               // the same, through a read size
    at::Tensor h = at::linear(flat, w.reshape({6, 9}).repeat({1, 4}).narrow(1, 0, 32), {});
    h = at::addmm(at::sigmoid(h), at::tanh(h), at::t(at::mm(at::t(h), h)), 0.5, 2);
    h = at::layer_norm(at::gelu(h, "tanh"), {6}, {}, {}, 1e-5, true);
    at::Tensor e = at::embedding(at::exp(h).t().contiguous().view({-1}).narrow(0, 0, 8).view({2, 4}), tokens, -1,
                                 false, false);
    at::Tensor att = at::softmax(at::bmm(e, at::transpose(e, 1, 2)), -1, c10::nullopt);
    at::Tensor out = at::matmul(att, e);
    out = at::dropout(at::log_softmax(out, 1, c10::nullopt), 0.5, false);
    // The divisor is (flat + 1)^2 + 2 when v == flat: never near 0 (with + 1 it was 0 for flat
    // near -1, and 0 / 0 in one rounding against 0 / tiny in the other made the test flaky).
    return {at::div(at::mul(at::sub(flat, v, 1), 3.0), at::add(flat * flat, v, 2) + 3), h, out};
  };
  for (const bool grad : {false, true}) {
    for (const char* backend : {"aten", "cpp"}) {
      SCOPED_TRACE(std::string(backend) + (grad ? ", grad" : ", no grad"));
      c10::AutoGradMode mode(grad);
      Options o;
      o.backend = backend;
      o.dynamic = Dynamic::kAuto;
      CompiledFunction f = compile(fn, o);
      for (int64_t n : {2, 3, 3, 4}) {
        const at::Tensor img = torch::randn({n, 2, 8, 8}), w = torch::randn({3, 2, 3, 3}).requires_grad_(grad);
        const at::Tensor tokens = torch::randint(2, {3, 5}, torch::kLong);
        const int64_t before = codegen::UnboxedCallsOnThisThread();
        const std::vector<at::Tensor> got = f({img, w, tokens});
        const int64_t unboxed = codegen::UnboxedCallsOnThisThread() - before;
        const std::vector<at::Tensor> want = fn({img, w, tokens});
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-5)) << i;
          EXPECT_EQ(got[i].requires_grad(), want[i].requires_grad()) << i;
        }
        if (grad) {
          const at::Tensor gw = torch::autograd::grad({got[1].sum() + got[2].sum()}, {w})[0];
          const at::Tensor ew = torch::autograd::grad({want[1].sum() + want[2].sum()}, {w})[0];
          EXPECT_TRUE(torch::allclose(gw, ew, 1e-3, 1e-4));
        }
        if (std::string(backend) == "aten" && f.stats().cache_hits > 0 && n == 3) {
          EXPECT_GE(unboxed, 25) << "most of the graph's ops ran unboxed";
        }
      }
    }
  }
}

}  // namespace
}  // namespace warden
