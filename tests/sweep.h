// Helpers for the dynamic-shape tests: kAuto options, results equal eager's, a sweep over the
// first dim.
#ifndef WARDEN_TESTS_SWEEP_H_
#define WARDEN_TESTS_SWEEP_H_

#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"

namespace warden::test_util {

// kAuto on `backend`, named "fn".
inline warden::Options AutoOn(const char* backend) {
  warden::Options o;
  o.name = "fn";
  o.backend = backend;
  o.dynamic = warden::Dynamic::kAuto;
  return o;
}

inline void ExpectSame(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].sizes(), want[i].sizes());
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-5, 1e-6, true));
  }
}

// Calls `f` and `fn` on randn({n, rest...}) for n = 1..max_n, twice, expecting equal results.
inline void SweepFirstDim(warden::CompiledFunction& f, const warden::Fn& fn, int64_t max_n,
                          const std::vector<int64_t>& rest) {
  for (int round = 0; round < 2; ++round) {
    for (int64_t n = 1; n <= max_n; ++n) {
      std::vector<int64_t> sizes = {n};
      sizes.insert(sizes.end(), rest.begin(), rest.end());
      auto x = torch::randn(sizes);
      ExpectSame(f({x}), fn({x}));
    }
  }
}

}  // namespace warden::test_util

#endif  // WARDEN_TESTS_SWEEP_H_
