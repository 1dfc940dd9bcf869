// The hit path enforces every guard kind, through the public API only: a warmed function (one
// entry, or several that the lookup tells apart by a size) is called with one guarded property
// changed at a time. Such a call must not be a cache hit, and its result must equal eager's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/DefaultDtype.h>

#include "runtime/warden.h"

namespace {

warden::Options Opts(const std::string& name, warden::Dynamic dynamic = warden::Dynamic::kStatic) {
  warden::Options o;
  o.name = name;
  o.backend = "aten";
  o.dynamic = dynamic;
  o.cache_size_limit = 64;
  return o;
}

using Args = std::vector<c10::IValue>;
using Fn = std::function<std::vector<at::Tensor>(const Args&)>;

void ExpectSame(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << what;
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << what;
    EXPECT_EQ(got[i].requires_grad(), want[i].requires_grad()) << what;
    EXPECT_TRUE(torch::allclose(got[i].detach().to_dense(), want[i].detach().to_dense())) << what;
  }
}

// Warms `f` with `base` (compile, then a hit; `extra_entries` more entries first, for sizes of
// arg 0 dim 0 that the lookup must tell apart), then checks that `changed` is not a hit.
void ExpectNotAHit(const std::string& what, const Fn& fn, const Args& base, const Args& changed,
                   warden::Dynamic dynamic = warden::Dynamic::kStatic, int extra_entries = 0) {
  SCOPED_TRACE(what + (extra_entries > 0 ? " (with more entries)" : ""));
  warden::CompiledFunction f = warden::compile(fn, Opts(what, dynamic));
  for (int e = 0; e < extra_entries; ++e) {
    Args other = base;
    const at::Tensor t = base[0].toTensor();
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes[0] += 10 + e;
    other[0] = torch::randn(sizes, t.options());
    f(other);
  }
  f(base);
  f(base);
  const warden::Stats before = f.stats();
  ASSERT_EQ(before.cache_hits, 1);
  const std::vector<at::Tensor> got = f(changed);
  const warden::Stats after = f.stats();
  EXPECT_EQ(after.cache_hits, before.cache_hits) << "the changed call was a cache hit";
  ExpectSame(got, fn(changed), what);
  // The original arguments still hit.
  f(base);
  EXPECT_EQ(f.stats().cache_hits, after.cache_hits + 1);
}

std::vector<at::Tensor> Scale(const Args& a) { return {a[0].toTensor() * 2 + a[1].toTensor()}; }

TEST(HitPath, EveryTensorPropertyIsEnforced) {
  const at::Tensor x = torch::randn({3, 4}), y = torch::randn({4});
  const std::vector<std::pair<std::string, Args>> changes = {
      {"dtype", {x.to(torch::kDouble), y}},
      {"requires_grad", {x.clone().requires_grad_(), y}},
      {"rank", {torch::randn({2, 3, 4}), y}},
      {"size", {torch::randn({5, 4}), y}},
      {"last size", {torch::randn({3, 4}), torch::randn({1})}},
      {"arg count", {x, y, y}},
  };
  for (int extra : {0, 3}) {
    for (const auto& [what, args] : changes) ExpectNotAHit(what, Scale, {x, y}, args, warden::Dynamic::kStatic, extra);
  }
}

TEST(HitPath, LayoutAndDeviceAreEnforced) {
  const auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor() * 2}; };
  const at::Tensor x = torch::randn({3, 4});
  ExpectNotAHit("layout", fn, {x}, {x.to_sparse()});
  warden::CompiledFunction f = warden::compile(fn, Opts("device"));
  f({x});
  f({x});
  const at::Tensor meta = torch::empty({3, 4}, torch::TensorOptions().device(torch::kMeta));
  const std::vector<at::Tensor> out = f({meta});
  EXPECT_EQ(f.stats().cache_hits, 1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device().type(), c10::DeviceType::Meta);
}

TEST(HitPath, DynamicBoundsAreEnforced) {
  const at::Tensor x = torch::randn({3, 4}), y = torch::randn({4});
  ExpectNotAHit(">= 2", Scale, {x, y}, {torch::randn({1, 4}), y}, warden::Dynamic::kDynamic);
  ExpectNotAHit("empty", Scale, {x, y}, {torch::randn({0, 4}), y}, warden::Dynamic::kDynamic);
}

TEST(HitPath, StridesAreEnforcedWhereRead) {
  const auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor t = a[0].toTensor();
    return {t * static_cast<double>(t.stride(0))};  // reads strides: guarded
  };
  ExpectNotAHit("stride", fn, {torch::randn({4, 4})}, {torch::randn({4, 4}).t()});
}

TEST(HitPath, ScalarValuesAreEnforced) {
  const auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor t = a[0].toTensor();
    return {a[1].isInt() ? t * a[1].toInt() : a[1].isDouble() ? t * a[1].toDouble() : t * (a[1].toBool() ? 1 : -1)};
  };
  const at::Tensor x = torch::randn({3, 4});
  ExpectNotAHit("int", fn, {x, int64_t{2}}, {x, int64_t{3}});
  ExpectNotAHit("double", fn, {x, 0.5}, {x, 0.25});
  ExpectNotAHit("-0.0", fn, {x, 0.0}, {x, -0.0});
  ExpectNotAHit("bool", fn, {x, true}, {x, false});
  ExpectNotAHit("type", fn, {x, int64_t{2}}, {x, 2.0});
  for (int extra : {0, 2}) ExpectNotAHit("int with entries", fn, {x, int64_t{2}}, {x, int64_t{5}}, warden::Dynamic::kStatic, extra);
}

TEST(HitPath, GlobalStateIsEnforced) {
  const at::Tensor x = torch::randn({3, 4}), y = torch::randn({4});
  warden::CompiledFunction f = warden::compile(Scale, Opts("grad_mode"));
  f({x, y});
  f({x, y});
  {
    torch::NoGradGuard no_grad;
    f({x, y});
  }
  EXPECT_EQ(f.stats().cache_hits, 1);
  {
    c10::InferenceMode inference;
    f({x, y});
  }
  EXPECT_EQ(f.stats().cache_hits, 1);
  f({x, y});
  EXPECT_EQ(f.stats().cache_hits, 2);

  // A factory op reads the default dtype.
  const auto zeros = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + torch::zeros({4})};
  };
  warden::CompiledFunction g = warden::compile(zeros, Opts("default_dtype"));
  g({y});
  g({y});
  EXPECT_EQ(g.stats().cache_hits, 1);
  const caffe2::TypeMeta previous = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  const std::vector<at::Tensor> out = g({y});
  c10::set_default_dtype(previous);
  EXPECT_EQ(g.stats().cache_hits, 1);
  EXPECT_EQ(out[0].scalar_type(), at::kDouble);
}

TEST(HitPath, AliasingIsEnforcedWhenAnArgumentIsWritten) {
  const auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor t = a[0].toTensor();
    t.add_(1);
    return {a[1].toTensor() * 2};
  };
  const at::Tensor x = torch::zeros({4}), y = torch::zeros({4});
  warden::CompiledFunction f = warden::compile(fn, Opts("aliasing"));
  f({x.clone(), y.clone()});
  f({x.clone(), y.clone()});
  ASSERT_EQ(f.stats().cache_hits, 1);
  const at::Tensor shared = torch::zeros({4});
  const std::vector<at::Tensor> out = f({shared, shared});
  EXPECT_EQ(f.stats().cache_hits, 1);
  EXPECT_TRUE(torch::equal(out[0], torch::full({4}, 2.0)));  // eager: the write is seen through y
}

TEST(HitPath, RelationsAreEnforced) {
  // x: [s0, 4], y: [s1]; x.size(0) == y.size(0) is required by the broadcast x.t() + y.
  const auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor().t() + a[1].toTensor()}; };
  warden::CompiledFunction f = warden::compile(fn, Opts("relation", warden::Dynamic::kDynamic));
  f({torch::randn({3, 4}), torch::randn({3})});
  f({torch::randn({5, 4}), torch::randn({5})});
  ASSERT_EQ(f.stats().cache_hits, 1);
  EXPECT_THROW(f({torch::randn({5, 4}), torch::randn({6})}), std::exception);  // eager raises too
  EXPECT_EQ(f.stats().cache_hits, 1);
}

}  // namespace
