// The CI budget of the differential fuzzer (tests/fuzz/differential.h): a fixed list of seeds, so
// a failure here reproduces with `bazel run //tools/fuzz -- --seed=S --programs=1`. Longer runs:
// README "Reliability".
#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "tests/fuzz/differential.h"
#include "tests/fuzz/program.h"

namespace warden::fuzz {
namespace {

class FuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/warden-fuzz-cache";
    setenv("WARDEN_CACHE_DIR", dir.c_str(), 1);
  }
};

void Report(const FuzzSummary& s) {
  std::cout << s.programs << " programs (" << s.with_patterns << " with patterns), " << s.counts.calls << " checked calls (" << s.counts.eager_errors
            << " raising in eager), " << s.counts.backward << " backward, " << s.counts.grads_inside << " with gradients inside, " << s.counts.reference_accepts << " float differences within the fp64 bound, " << s.counts.probes << " guard probes, " << s.counts.limitations << " documented refusals, " << s.failures.size()
            << " failures in " << s.seconds << " s\n";
  for (size_t i = 0; i < s.failures.size() && i < 5; ++i) ADD_FAILURE() << s.failures[i];
  EXPECT_TRUE(s.failures.empty()) << s.failures.size() << " failures";
}

TEST_F(FuzzTest, GeneratorIsDeterministicAndPrintsPrograms) {
  const Program a = Generate(42), b = Generate(42);
  EXPECT_EQ(a.ToString(), b.ToString());
  EXPECT_NE(a.ToString(), Generate(43).ToString());
  EXPECT_NE(a.ToString().find("program seed 42"), std::string::npos);
  // The same value seed gives identical tensors, strides included.
  const auto x = MakeArgs(a.args, 3), y = MakeArgs(a.args, 3);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i].isTensor()) continue;
    EXPECT_EQ(x[i].toTensor().strides(), y[i].toTensor().strides());
    EXPECT_TRUE(x[i].toTensor().equal(y[i].toTensor()) || x[i].toTensor().isnan().any().item<bool>());
  }
}

// Every pattern is reachable from the seeded generator, forced or not (Note [Patterns]).
TEST_F(FuzzTest, GeneratorReachesEveryPattern) {
  for (const bool forced : {false, true}) {
    bool modes = false, autocast = false, nested = false, requires_grad = false, function = false, alias = false,
         same_branch = false, model = false;
    int with_patterns = 0;
    const int n = forced ? 40 : 300;
    for (uint64_t seed = 1; seed <= static_cast<uint64_t>(n); ++seed) {
      const Program p = Generate(seed, forced);
      if (seed <= 20) {
        EXPECT_EQ(p.ToString(), Generate(seed, forced).ToString());
      }
      with_patterns += HasPatterns(p);
      modes |= !p.regions.empty();
      nested |= p.regions.size() > 1;
      for (const Region& r : p.regions) autocast |= r.mode == Mode::kAutocast;
      alias |= p.alias_b >= 0;
      model |= p.model.in > 0;
      for (const Step& s : p.steps) {
        requires_grad |= s.op == Op::kDetachRequiresGrad || s.op == Op::kRequiresGrad;
        function |= s.op == Op::kGradReverse || s.op == Op::kGradScale || s.op == Op::kSquareFn;
        same_branch |= s.op == Op::kIsSameBranch || s.op == Op::kIsAliasBranch;
      }
    }
    EXPECT_TRUE(modes && autocast && nested && requires_grad && function && alias && same_branch && model)
        << "forced " << forced;
    if (forced) {
      EXPECT_GE(with_patterns, n * 9 / 10);
    } else {
      // Modest: the CI seeds mostly run what they ran before patterns existed.
      EXPECT_LE(with_patterns, n * 2 / 5);
      EXPECT_GE(with_patterns, n / 10);
    }
  }
}

FuzzSummary FuzzBackend(const std::string& backend, uint64_t seed, int64_t programs, double seconds,
                        bool force_patterns = false, bool grad_inside = false) {
  FuzzBudget b;
  b.seed = seed;
  b.programs = programs;
  b.seconds = seconds;  // a safety net on a loaded machine; the seeds are the budget
  b.configs = grad_inside ? GradInsideConfigsOf(backend) : ConfigsOf(backend);
  b.force_patterns = force_patterns;
  return RunFuzz(b);
}

// Backend "aten" is cheap (no compiler): more programs (~7 s here).
TEST_F(FuzzTest, AtenBackendAgreesWithEager) { Report(FuzzBackend("aten", 1000, 150, 40)); }

// Backend "cpp" runs g++ for every new kernel: fewer programs (~20-30 s here).
TEST_F(FuzzTest, CppBackendAgreesWithEager) { Report(FuzzBackend("cpp", 5000, 25, 60)); }

// Programs with the patterns forced (Note [Patterns] in program.cc): mode regions, requires_grad_
// on intermediates, custom autograd Functions, aliased arguments, a watched model; 40 per backend,
// eight of each pattern (~10 s here: many run eagerly, a custom Function or is_alias_of).
TEST_F(FuzzTest, PatternsAgreeWithEager) {
  Report(FuzzBackend("aten", 9000, 40, 40, /*force_patterns=*/true));
  Report(FuzzBackend("cpp", 9000, 40, 60, /*force_patterns=*/true));
}

// Gradients taken inside the compiled function (Note [Gradients inside] in differential.cc): the
// program's outputs and d(weighted sum)/d(arguments that require grad), static and auto.
TEST_F(FuzzTest, GradientsInsideAgreeWithEager) {
  for (const auto& [backend, programs, seconds] :
       std::vector<std::tuple<std::string, int64_t, double>>{{"aten", 80, 40}, {"cpp", 20, 60}}) {
    const FuzzSummary s = FuzzBackend(backend, 12000, programs, seconds, /*force_patterns=*/false, /*grad_inside=*/true);
    Report(s);
    // Not vacuous: a good share of the calls took gradients inside.
    EXPECT_GE(s.counts.grads_inside, s.counts.calls / 10) << backend;
  }
  // With the patterns forced: aliased arguments (a view of another argument has history from
  // outside: Note [Outside history]), custom Functions, mode regions, a watched model.
  const FuzzSummary p = FuzzBackend("aten", 40000, 60, 40, /*force_patterns=*/true, /*grad_inside=*/true);
  Report(p);
  EXPECT_GE(p.counts.grads_inside, p.counts.calls / 10);
}

}  // namespace
}  // namespace warden::fuzz
