// Tests of runtime/trace_log (WARDEN_TRACE_DIR): a compiled function writes one JSON-lines file
// per process with the expected events and call indexes, the cap truncates it, and nothing is
// written when the variable is unset.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "runtime/trace_log.h"
#include "runtime/warden.h"

namespace warden {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Args = std::vector<c10::IValue>;
using json = nlohmann::json;

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name).find(".jsonl") != std::string::npos) out.push_back(dir + "/" + e->d_name);
    }
    closedir(d);
  }
  return out;
}

std::vector<json> Events(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

// Calls of the events of one type, in file order.
std::vector<int64_t> CallsOf(const std::vector<json>& events, const std::string& type) {
  std::vector<int64_t> calls;
  for (const json& e : events) {
    if (e["event"] == type) calls.push_back(e["call"].get<int64_t>());
  }
  return calls;
}

Options Static(const std::string& name, int limit) {
  Options o;
  o.name = name;
  o.backend = "aten";
  o.dynamic = Dynamic::kStatic;
  o.cache_size_limit = limit;
  return o;
}

TEST(TraceLog, WritesCompilesRecompilesAndTheCacheLimit) {
  const std::string dir = TempDir("trace_events");
  setenv("WARDEN_TRACE_DIR", dir.c_str(), 1);
  {
    CompiledFunction f = compile(
        [](const Args& a) -> std::vector<at::Tensor> { return {torch::relu(a[0].toTensor() * a[1].toDouble())}; },
        Static("scaled", 3));
    f({torch::ones({2, 3}), 0.5});  // 0: compile
    f({torch::ones({2, 3}), 0.5});  // 1: hit
    f({torch::ones({2, 3}), 1.5});  // 2: alpha changed
    f({torch::ones({4, 3}), 1.5});  // 3: size changed
    f({torch::ones({5, 3}), 2.5});  // 4: limit (3 entries): eager
  }
  unsetenv("WARDEN_TRACE_DIR");

  const std::vector<std::string> files = Files(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_THAT(files[0], HasSubstr("/warden-" + std::to_string(getpid()) + ".jsonl"));
  const std::vector<json> events = Events(files[0]);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0]["event"], "trace_start");
  EXPECT_EQ(events[1]["event"], "function");
  EXPECT_EQ(events[1]["fn"], "scaled");
  EXPECT_EQ(events[1]["dynamic"], "static");
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i]["seq"], i);

  EXPECT_THAT(CallsOf(events, "compile_start"), ElementsAre(0, 2, 3));
  EXPECT_THAT(CallsOf(events, "compile_end"), ElementsAre(0, 2, 3));
  EXPECT_THAT(CallsOf(events, "recompile"), ElementsAre(2, 3));
  EXPECT_THAT(CallsOf(events, "cache_limit"), ElementsAre(4));

  for (const json& e : events) {
    if (e["event"] == "compile_end") {
      EXPECT_EQ(e["fn"], "scaled");
      EXPECT_THAT(e["graph"].get<std::string>(), HasSubstr("aten::relu"));
      EXPECT_GE(e["ms"]["total"].get<double>(), 0.0);
      ASSERT_FALSE(e["guards"].empty());
      for (const json& g : e["guards"]) EXPECT_FALSE(g["provenance"].get<std::string>().empty());
    }
    if (e["event"] == "recompile" && e["call"] == 2) {
      EXPECT_EQ(e["action"], "recompiled");
      EXPECT_EQ(e["closest"]["entry"], e["reasons"][0]["entry"]);
      ASSERT_EQ(e["closest"]["failing"].size(), 1u);
      EXPECT_EQ(e["closest"]["failing"][0]["kind"], "double_value");
      EXPECT_EQ(e["closest"]["failing"][0]["reason"], "scalar 'arg1' value mismatch. expected 0.5, actual 1.5");
      EXPECT_EQ(e["args"][1]["value"], 1.5);
    }
    if (e["event"] == "cache_limit") {
      EXPECT_EQ(e["limit"], 3);
      EXPECT_EQ(e["reasons"].size(), 3u);
      EXPECT_THAT(e["action"].get<std::string>(), HasSubstr("ran eagerly"));
    }
  }
  const json& end = events.back();
  EXPECT_EQ(end["event"], "function_end");
  EXPECT_EQ(end["calls"], 5);
  EXPECT_EQ(end["cache_hits"], 1);
  EXPECT_EQ(end["compiles"], 3);
  EXPECT_EQ(end["eager_calls"], 1);
  EXPECT_EQ(end["entries"].size(), 3u);
}

TEST(TraceLog, RecordsAnEagerFallback) {
  const std::string dir = TempDir("trace_eager");
  setenv("WARDEN_TRACE_DIR", dir.c_str(), 1);
  {
    CompiledFunction f = compile(
        [](const Args& a) -> std::vector<at::Tensor> {
          at::Tensor x = a[0].toTensor();
          x.add_(1);
          return {x * x.sum().item<double>()};
        },
        Static("eager_only", 8));
    testing::internal::CaptureStderr();
    f({torch::ones({2})});
    f({torch::ones({2})});
    testing::internal::GetCapturedStderr();
  }
  unsetenv("WARDEN_TRACE_DIR");
  const std::vector<std::string> files = Files(dir);
  ASSERT_EQ(files.size(), 1u);
  const std::vector<json> events = Events(files[0]);
  EXPECT_THAT(CallsOf(events, "eager_fallback"), ElementsAre(0));
  EXPECT_THAT(CallsOf(events, "compile_end"), ElementsAre());
  for (const json& e : events) {
    if (e["event"] == "eager_fallback") EXPECT_THAT(e["reason"].get<std::string>(), HasSubstr("data-dependent"));
  }
  EXPECT_EQ(events.back()["event"], "function_end");
  EXPECT_EQ(events.back()["eager_calls"], 2);
}

TEST(TraceLog, RecordsTheEndOfABackgroundCompile) {
  const std::string dir = TempDir("trace_async");
  setenv("WARDEN_TRACE_DIR", dir.c_str(), 1);
  setenv("WARDEN_CACHE_DIR", TempDir("trace_async_kernels").c_str(), 1);
  {
    Options o;
    o.name = "async";
    o.async_compile = true;  // backend "cpp"
    CompiledFunction f = compile(
        [](const Args& a) -> std::vector<at::Tensor> { return {(a[0].toTensor() * 2).tanh()}; }, o);
    f({torch::ones({8})});
    // Destruction would drop a job still queued (Note [Compile pool]): wait for it to finish.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (f.explain().find(": backend cpp, created") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  unsetenv("WARDEN_TRACE_DIR");
  const std::vector<std::string> files = Files(dir);
  ASSERT_EQ(files.size(), 1u);
  const std::vector<json> events = Events(files[0]);
  EXPECT_THAT(CallsOf(events, "background_compile_end"), ElementsAre(0));
  for (const json& e : events) {
    if (e["event"] != "background_compile_end") continue;
    EXPECT_EQ(e["fn"], "async");
    EXPECT_EQ(e["backend"], "cpp");
    EXPECT_EQ(e["note"], "");
    EXPECT_GE(e["ms"].get<double>(), 0.0);
    EXPECT_TRUE(e["entry"].get<std::string>().find("/0") != std::string::npos);
  }
}

TEST(TraceLog, StopsAtTheSizeCapWithOneTruncatedEvent) {
  const std::string dir = TempDir("trace_capped");
  setenv("WARDEN_TRACE_DIR", dir.c_str(), 1);
  setenv("WARDEN_TRACE_MAX_BYTES", "6000", 1);
  {
    CompiledFunction f = compile(
        [](const Args& a) -> std::vector<at::Tensor> { return {torch::relu(a[0].toTensor() + 1)}; },
        Static("many_shapes", 100));
    for (int n = 2; n < 40; ++n) f({torch::ones({n})});
  }
  unsetenv("WARDEN_TRACE_DIR");
  unsetenv("WARDEN_TRACE_MAX_BYTES");
  const std::vector<std::string> files = Files(dir);
  ASSERT_EQ(files.size(), 1u);
  std::ifstream in(files[0], std::ios::ate);
  EXPECT_LE(static_cast<int64_t>(in.tellg()), 6000 + 512);  // the cap plus the one "truncated" line
  const std::vector<json> events = Events(files[0]);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back()["event"], "truncated");
  EXPECT_EQ(events.back()["max_bytes"], 6000);
  EXPECT_LT(CallsOf(events, "compile_end").size(), 38u);
}

// The trace directory may be shared (like /tmp): a symlink planted at the log's name, pointing at
// another file, is never followed; the log goes to a fresh mkstemp name instead, mode 0600.
TEST(TraceLog, NeverWritesThroughAPlantedSymlink) {
  const std::string dir = TempDir("trace_planted");
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  const std::string victim = TempDir("trace_planted_victim.txt");
  { std::ofstream(victim) << "precious"; }
  const std::string planted = dir + "/warden-" + std::to_string(getpid()) + ".jsonl";
  ASSERT_EQ(symlink(victim.c_str(), planted.c_str()), 0);
  setenv("WARDEN_TRACE_DIR", dir.c_str(), 1);
  {
    CompiledFunction f = compile(
        [](const Args& a) -> std::vector<at::Tensor> { return {torch::relu(a[0].toTensor() + 1)}; },
        Static("planted", 8));
    f({torch::ones({3})});
  }
  unsetenv("WARDEN_TRACE_DIR");
  std::ifstream in(victim);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious") << "the trace log was written through a planted symlink";
  int logs = 0;
  for (const std::string& path : Files(dir)) {
    struct stat st;
    ASSERT_EQ(lstat(path.c_str(), &st), 0);
    if (S_ISLNK(st.st_mode)) continue;
    ++logs;
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_THAT(CallsOf(Events(path), "compile_end"), ::testing::ElementsAre(0));
  }
  EXPECT_EQ(logs, 1);
}

TEST(TraceLog, OffWhenTheVariableIsUnset) {
  unsetenv("WARDEN_TRACE_DIR");
  EXPECT_EQ(runtime::TraceLog::FromEnv(), nullptr);
  setenv("WARDEN_TRACE_DIR", "", 1);
  EXPECT_EQ(runtime::TraceLog::FromEnv(), nullptr);
  unsetenv("WARDEN_TRACE_DIR");
}

}  // namespace
}  // namespace warden
