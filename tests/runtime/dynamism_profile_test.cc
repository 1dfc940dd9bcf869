// Note [Dynamism profiles]: kAuto's dynamic dims persist per function in the cache directory, so a
// new function object (as in a new process: the profile on disk is the only thing shared) compiles
// a size sweep once; stale, foreign or malformed profiles are ignored with a note.
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "runtime/warden.h"
#include "tests/test_env.h"

namespace warden {
namespace {

namespace fs = std::filesystem;
using test_util::ScopedCacheDir;
using test_util::ScopedEnv;
using testing::HasSubstr;
using Args = std::vector<c10::IValue>;

std::vector<at::Tensor> Block(const Args& a) {
  const at::Tensor x = a[0].toTensor();
  return {torch::softmax(torch::tanh(x * 2 + 1), -1) * x.size(2)};
}

Options Opts(const std::string& backend) {
  Options o;
  o.name = "sweep_block";
  o.backend = backend;
  return o;
}

// Calls f on x: [1, L, 8] for L in [first, last], each checked against eager; returns compiles.
int64_t Sweep(CompiledFunction& f, int first, int last) {
  for (int len = first; len <= last; ++len) {
    const at::Tensor x = torch::randn({1, len, 8});
    const at::Tensor got = f({x})[0], want = Block({x})[0];
    EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6)) << "L=" << len;
  }
  return f.stats().compiles;
}

std::vector<std::string> Profiles(const ScopedCacheDir& cache) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(cache.root() + "/profiles", ec)) out.push_back(e.path().string());
  return out;
}

// On for these tests (tests/gtest_main.cc turns profiles off for all others).
struct ProfilesOn {
  ScopedEnv on{"WARDEN_DYNAMISM_PROFILES", "1"};
};

TEST(DynamismProfile, ASecondStartCompilesTheSweepOnce) {
  ProfilesOn on;
  for (const char* backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    ScopedCacheDir cache;
    CompiledFunction cold = compile(Block, Opts(backend));
    EXPECT_EQ(Sweep(cold, 2, 24), 2);  // static at L=2, dynamic from L=3
    ASSERT_EQ(Profiles(cache).size(), 1u);
    CompiledFunction warm = compile(Block, Opts(backend));
    EXPECT_EQ(Sweep(warm, 2, 24), 1);
    EXPECT_THAT(warm.explain(), HasSubstr("dynamism profile: arg0.size(1) dynamic from the first compile"));
    EXPECT_THAT(nlohmann::json::parse(warm.explain_json())["dynamism_profile"].get<std::string>(),
                HasSubstr("arg0.size(1)"));
    // Sizes 1 and 0 still specialize: a sweep from 1 compiles the size-1 entry first.
    CompiledFunction from_one = compile(Block, Opts(backend));
    EXPECT_EQ(Sweep(from_one, 1, 12), 2);
  }
}

TEST(DynamismProfile, OptOutAndOtherFunctionsAreUnaffected) {
  ProfilesOn on;
  ScopedCacheDir cache;
  CompiledFunction cold = compile(Block, Opts("aten"));
  EXPECT_EQ(Sweep(cold, 2, 10), 2);
  {
    ScopedEnv off("WARDEN_DYNAMISM_PROFILES", "0");
    CompiledFunction warm = compile(Block, Opts("aten"));
    EXPECT_EQ(Sweep(warm, 2, 10), 2);
  }
  // Another name, another callable of the same name, or another signature, starts cold.
  auto same_body = [](const Args& a) { return Block(a); };
  CompiledFunction lambda = compile(same_body, Opts("aten"));
  EXPECT_EQ(Sweep(lambda, 2, 10), 2);
  Options other = Opts("aten");
  other.name = "another_function";
  CompiledFunction f = compile(Block, other);
  EXPECT_EQ(Sweep(f, 2, 10), 2);
  auto with_scale = [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor() * a[1].toDouble()}; };
  CompiledFunction g = compile(with_scale, Opts("aten"));
  const at::Tensor x = torch::randn({1, 5, 8});
  EXPECT_TRUE(torch::equal(g({x, 2.0})[0], x * 2.0));
  EXPECT_THAT(g.explain(), testing::Not(HasSubstr("dynamism profile")));
  // kStatic never reads profiles.
  Options fixed = Opts("aten");
  fixed.dynamic = Dynamic::kStatic;
  CompiledFunction s = compile(Block, fixed);
  EXPECT_EQ(Sweep(s, 2, 5), 4);
}

TEST(DynamismProfile, StaleOrMalformedProfilesAreIgnoredWithANote) {
  ProfilesOn on;
  ScopedCacheDir cache;
  CompiledFunction cold = compile(Block, Opts("aten"));
  EXPECT_EQ(Sweep(cold, 2, 8), 2);
  const std::vector<std::string> files = Profiles(cache);
  ASSERT_EQ(files.size(), 1u);
  nlohmann::json j = nlohmann::json::parse(test_util::ReadFile(files[0]));
  const struct {
    const char* what;
    std::string contents;
    const char* note;
  } cases[] = {
      {"garbage", "{not json", "ignored: malformed"},
      {"a field of the wrong type", [&] {
         nlohmann::json k = j;
         k["version"] = "1";
         k["name"] = 7;
         return k.dump();
       }(), "ignored: malformed"},
      {"a dim the arguments lack", [&] {
         nlohmann::json k = j;
         k["dims"] = {{0, 7}};
         return k.dump();
       }(), "names arg0.size(7), which the arguments do not have"},
      {"another function's", [&] {
         nlohmann::json k = j;
         k["name"] = "someone_else";
         return k.dump();
       }(), "written for another function"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    {
      std::ofstream out(files[0], std::ios::trunc);
      out << c.contents;
    }
    fs::permissions(files[0], fs::perms::owner_read | fs::perms::owner_write);
    testing::internal::CaptureStderr();
    CompiledFunction f = compile(Block, Opts("aten"));
    EXPECT_EQ(Sweep(f, 2, 8), 2);
    EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr(c.note));
    EXPECT_THAT(f.explain(), HasSubstr(c.note));
    // The recompile rewrote it: the next start compiles once again.
    CompiledFunction next = compile(Block, Opts("aten"));
    EXPECT_EQ(Sweep(next, 2, 8), 1);
  }
}

}  // namespace
}  // namespace warden
