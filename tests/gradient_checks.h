// Shared by the gradient tests (captured_gradients_test.cc, compiled_backward_test.cc): a fixture
// parameterized by backend, and a tensor comparison that includes requires_grad.
#ifndef WARDEN_TESTS_GRADIENT_CHECKS_H_
#define WARDEN_TESTS_GRADIENT_CHECKS_H_

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"

namespace warden::testing {

class BackendTest : public ::testing::TestWithParam<const char*> {
 protected:
  warden::Options Opts(const std::string& name = "fn") const {
    warden::Options o;
    o.name = name;
    o.backend = GetParam();
    return o;
  }
};

// Same definedness, dtype, sizes and requires_grad, and values within (rtol, atol).
inline void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what, double rtol = 1e-5,
                        double atol = 1e-6) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_EQ(got.requires_grad(), want.requires_grad()) << what;
  EXPECT_TRUE(torch::allclose(got.detach().to(torch::kDouble), want.detach().to(torch::kDouble), rtol, atol))
      << what << "\n got " << got << "\n want " << want;
}

}  // namespace warden::testing

#endif  // WARDEN_TESTS_GRADIENT_CHECKS_H_
