// Soundness of the guards against state C++ code can observe but the tracer cannot: identity
// between tensor arguments (Note [Argument identity]) and the metadata of tensors the function
// captured (Note [Captured tensors]). Through the public API, for both backends; every test here
// returned a result eager would not before these guards existed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"

namespace {

using Args = std::vector<c10::IValue>;
using ::testing::HasSubstr;

class Soundness : public ::testing::TestWithParam<std::string> {
 protected:
  warden::Options Opts(const std::string& name) const {
    warden::Options o;
    o.name = name;
    o.backend = GetParam();
    o.dynamic = warden::Dynamic::kStatic;
    return o;
  }
};

void ExpectSame(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << "output " << i;
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << "output " << i;
    if (got[i].sizes() == want[i].sizes() && got[i].scalar_type() == want[i].scalar_type()) {
      EXPECT_TRUE(torch::allclose(got[i], want[i])) << "output " << i << "\n" << got[i] << "\n" << want[i];
    }
  }
}

// The last recompile event's reasons, joined.
std::string LastReasons(const warden::CompiledFunction& f) {
  const std::vector<warden::RecompileEvent> events = f.recompiles();
  if (events.empty()) return "";
  std::string out;
  for (const std::string& r : events.back().reasons) out += r + "\n";
  return out;
}

std::vector<at::Tensor> SameOrSum(const Args& args) {
  const at::Tensor a = args[0].toTensor(), b = args[1].toTensor();
  return {a.is_same(b) ? a * 3 : a + b};
}

TEST_P(Soundness, ArgumentIdentitySameThenDistinct) {
  warden::CompiledFunction f = warden::compile(SameOrSum, Opts("identity"));
  const at::Tensor x = torch::randn({4}), y = torch::randn({4});
  ExpectSame(f({x, x}), SameOrSum({x, x}));
  ExpectSame(f({x, y}), SameOrSum({x, y}));
  EXPECT_THAT(LastReasons(f), HasSubstr("tensor 'arg1' identity mismatch. expected the same tensor as 'arg0', "
                                        "actual a distinct tensor"));
  ExpectSame(f({x, x}), SameOrSum({x, x}));
  ExpectSame(f({y, y}), SameOrSum({y, y}));
  EXPECT_EQ(f.stats().compiles, 2) << f.explain();
}

TEST_P(Soundness, ArgumentIdentityDistinctThenSame) {
  warden::CompiledFunction f = warden::compile(SameOrSum, Opts("identity"));
  const at::Tensor x = torch::randn({4}), y = torch::randn({4});
  ExpectSame(f({x, y}), SameOrSum({x, y}));
  ExpectSame(f({x, x}), SameOrSum({x, x}));
  EXPECT_THAT(LastReasons(f), HasSubstr("tensor 'arg1' identity mismatch. expected a distinct tensor, "
                                        "actual the same tensor as 'arg0'"));
}

// An in-place write through one argument that is the other: eager reads the written values.
TEST_P(Soundness, ArgumentIdentityWithWrite) {
  const auto fn = [](const Args& args) -> std::vector<at::Tensor> {
    at::Tensor a = args[0].toTensor();
    const at::Tensor b = args[1].toTensor();
    a.mul_(2);
    return {b + 1};
  };
  warden::CompiledFunction f = warden::compile(fn, Opts("identity_write"));
  at::Tensor x = torch::ones({3}), y = torch::ones({3});
  at::Tensor x_eager = torch::ones({3});
  ExpectSame(f({x, y}), fn({x_eager, torch::ones({3})}));
  ExpectSame(f({x, x}), fn({x_eager, x_eager}));
  EXPECT_TRUE(torch::equal(x, x_eager));
  ExpectSame(f({x, x}), fn({x_eager, x_eager}));
  EXPECT_TRUE(torch::equal(x, x_eager));
}

// Any number of tensor arguments: more than the pairwise fast path handles, and more than fit the
// sorted one's typical sizes. The function counts how many arguments are the first one.
std::vector<at::Tensor> CountSame(const Args& args) {
  const at::Tensor first = args[0].toTensor();
  int64_t same = 0;
  at::Tensor sum = torch::zeros({2});
  for (const c10::IValue& a : args) {
    same += a.toTensor().is_same(first);
    sum = sum + a.toTensor();
  }
  return {sum * same};
}

TEST_P(Soundness, ArgumentIdentityManyArguments) {
  for (int n : {5, 17, 40}) {
    SCOPED_TRACE(n);
    warden::CompiledFunction f = warden::compile(CountSame, Opts("identity_many"));
    Args distinct, repeated;
    for (int i = 0; i < n; ++i) distinct.push_back(torch::full({2}, static_cast<double>(i)));
    repeated = distinct;
    repeated[n - 1] = repeated[0];
    repeated[n / 2] = repeated[0];
    ExpectSame(f(distinct), CountSame(distinct));
    ExpectSame(f(distinct), CountSame(distinct));
    ExpectSame(f(repeated), CountSame(repeated));
    ExpectSame(f(repeated), CountSame(repeated));
    ExpectSame(f(distinct), CountSame(distinct));
    EXPECT_EQ(f.stats().compiles, 2) << f.explain();
    EXPECT_EQ(f.stats().cache_hits, 3) << f.explain();
    // Another pattern of the same size (a different argument repeated) is a third entry.
    Args other = distinct;
    other[n - 1] = other[1];
    ExpectSame(f(other), CountSame(other));
    EXPECT_EQ(f.stats().compiles, 3) << f.explain();
  }
}

std::vector<at::Tensor> AliasOrSum(const Args& args) {
  const at::Tensor a = args[0].toTensor(), b = args[1].toTensor();
  return {a.is_alias_of(b) ? a * 3 : a + b};
}

TEST_P(Soundness, ArgumentStorageSharing) {
  warden::CompiledFunction f = warden::compile(AliasOrSum, Opts("sharing"));
  const at::Tensor x = torch::randn({4}), y = torch::randn({4});
  ExpectSame(f({x, y}), AliasOrSum({x, y}));
  const at::Tensor v = x.view({4});
  ExpectSame(f({x, v}), AliasOrSum({x, v}));
}

TEST_P(Soundness, CapturedTensorResized) {
  at::Tensor w = torch::ones({3});
  const auto fn = [&](const Args& args) -> std::vector<at::Tensor> {
    const at::Tensor x = args[0].toTensor();
    return {x.narrow(0, 0, w.size(0)) + w.sum()};
  };
  warden::CompiledFunction f = warden::compile(fn, Opts("captured"));
  const at::Tensor x = torch::arange(8, torch::kFloat);
  ExpectSame(f({x}), fn({x}));
  ExpectSame(f({x}), fn({x}));
  w.resize_({5});
  w.fill_(1);
  ExpectSame(f({x}), fn({x}));
  EXPECT_THAT(LastReasons(f), HasSubstr("captured tensor %c0 size mismatch at index 0. expected 3, actual 5"));
  ExpectSame(f({x}), fn({x}));
  EXPECT_EQ(f.stats().cache_hits, 2) << f.explain();
  EXPECT_THAT(f.explain(), HasSubstr("%c0 (captured): Float[5] strides [1] offset 0"));
}

// Module::to() changes its parameters in place (set_data): the captured weight's dtype changes.
TEST_P(Soundness, CapturedModuleConverted) {
  torch::manual_seed(0);
  torch::nn::Linear lin(4, 3);
  const auto fn = [&](const Args& args) -> std::vector<at::Tensor> {
    return {lin(args[0].toTensor().to(lin->weight.scalar_type()))};
  };
  warden::CompiledFunction f = warden::compile(fn, Opts("converted"));
  const at::Tensor x = torch::randn({2, 4});
  ExpectSame(f({x}), fn({x}));
  lin->to(torch::kDouble);
  ExpectSame(f({x}), fn({x}));
  EXPECT_THAT(LastReasons(f), HasSubstr("dtype mismatch. expected Float, actual Double"));
  ExpectSame(f({x}), fn({x}));
}

// A view's window moved by set_ (same sizes, another storage offset).
TEST_P(Soundness, CapturedTensorOffsetMoved) {
  const at::Tensor base = torch::arange(10, torch::kFloat);
  at::Tensor w = base.narrow(0, 0, 3).clone();
  const auto fn = [&](const Args& args) -> std::vector<at::Tensor> {
    return {args[0].toTensor().narrow(0, w.storage_offset(), 3) * w};
  };
  warden::CompiledFunction f = warden::compile(fn, Opts("offset"));
  const at::Tensor x = torch::arange(10, torch::kFloat);
  ExpectSame(f({x}), fn({x}));
  w.set_(base.storage(), /*storage_offset=*/4, {3}, {1});
  ExpectSame(f({x}), fn({x}));
  EXPECT_THAT(LastReasons(f), HasSubstr("captured tensor %c0 storage offset mismatch. expected 0, actual 4"));
}

TEST_P(Soundness, CapturedTensorRequiresGradChanged) {
  at::Tensor w = torch::full({3}, 2.0);
  const auto fn = [&](const Args& args) -> std::vector<at::Tensor> {
    const at::Tensor x = args[0].toTensor();
    return {(w.requires_grad() ? x * 10 : x) * w.detach()};
  };
  warden::CompiledFunction f = warden::compile(fn, Opts("captured_grad"));
  const at::Tensor x = torch::ones({3});
  ExpectSame(f({x}), fn({x}));
  w.requires_grad_(true);
  ExpectSame(f({x}), fn({x}));
  EXPECT_THAT(LastReasons(f), HasSubstr("captured tensor %c0 requires_grad mismatch. expected false, actual true"));
}

// torch::from_blob over a local buffer inside the function: the graph would keep a tensor over
// freed (or refilled) memory. The function runs eagerly, with the reason.
TEST_P(Soundness, FromBlobOverLocalMemoryRunsEagerly) {
  int calls = 0;
  const auto fn = [&](const Args& args) -> std::vector<at::Tensor> {
    std::vector<float> buffer(3, static_cast<float>(++calls));
    return {args[0].toTensor() + torch::from_blob(buffer.data(), {3})};
  };
  warden::CompiledFunction f = warden::compile(fn, Opts("from_blob"));
  const at::Tensor x = torch::zeros({3});
  for (int call = 1; call <= 3; ++call) {
    // fn and f share `calls`: each f call sees call * 2 - 1, each fn call call * 2.
    EXPECT_TRUE(torch::equal(f({x})[0], torch::full({3}, 2.0 * call - 1))) << "call " << call;
    fn({x});
  }
  EXPECT_EQ(f.stats().eager_calls, 3) << "the traced call counts too";
  EXPECT_EQ(f.stats().cache_hits, 0);
  EXPECT_THAT(f.explain(), HasSubstr("torch::from_blob without a deleter"));
}

// Memory the caller keeps alive, lent with a deleter: captured like any tensor, and its values
// are read on every call.
TEST_P(Soundness, FromBlobWithADeleterIsCaptured) {
  static float weights[3] = {1, 2, 3};
  const at::Tensor w = torch::from_blob(weights, {3}, [](void*) {});
  const auto fn = [&](const Args& args) -> std::vector<at::Tensor> { return {args[0].toTensor() * w}; };
  warden::CompiledFunction f = warden::compile(fn, Opts("from_blob_deleter"));
  const at::Tensor x = torch::ones({3});
  ExpectSame(f({x}), fn({x}));
  weights[1] = 20;
  ExpectSame(f({x}), fn({x}));
  EXPECT_EQ(f.stats().cache_hits, 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, Soundness, ::testing::Values("aten", "cpp"),
                         [](const auto& info) { return info.param; });

}  // namespace
