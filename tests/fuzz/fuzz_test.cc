// The CI budget of the differential fuzzer (tests/fuzz/differential.h): a fixed list of seeds, so
// a failure here reproduces with `bazel run //tools/fuzz -- --seed=S --programs=1`. Longer runs:
// README "Reliability".
#include <cstdlib>
#include <iostream>
#include <string>

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
  std::cout << s.programs << " programs, " << s.counts.calls << " checked calls (" << s.counts.eager_errors
            << " raising in eager), " << s.counts.backward << " backward, " << s.counts.reference_accepts << " float differences within the fp64 bound, " << s.counts.probes << " guard probes, " << s.failures.size()
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

FuzzSummary FuzzBackend(const std::string& backend, uint64_t seed, int64_t programs, double seconds) {
  FuzzBudget b;
  b.seed = seed;
  b.programs = programs;
  b.seconds = seconds;  // a safety net on a loaded machine; the seeds are the budget
  b.configs = ConfigsOf(backend);
  return RunFuzz(b);
}

// Backend "aten" is cheap (no compiler): more programs (~7 s here).
TEST_F(FuzzTest, AtenBackendAgreesWithEager) { Report(FuzzBackend("aten", 1000, 150, 40)); }

// Backend "cpp" runs g++ for every new kernel: fewer programs (~20-30 s here).
TEST_F(FuzzTest, CppBackendAgreesWithEager) { Report(FuzzBackend("cpp", 5000, 25, 60)); }

}  // namespace
}  // namespace warden::fuzz
