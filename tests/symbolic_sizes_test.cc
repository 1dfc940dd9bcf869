// Symbolic sizes (Note [Symbolic sizes] in tracer/tracer.cc), through the public API. From
// LibTorch 2.8 on, C++ that reads sizes with sym_size()/sym_sizes() (user code, and 2.x's
// composite kernels) gets symbolic SymInts: integers computed from them and passed to ops follow
// the call's sizes, comparisons become guards or reads. Before 2.8 the same programs read plain
// sizes, which are verified per value (Note [Verified size reads]); both must equal eager.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"
#include "tests/sweep.h"
#include "tracer/torch_compat.h"

namespace {

using ::testing::HasSubstr;

constexpr bool kSymbolic = WARDEN_TORCH_AT_LEAST(2, 8);

using warden::test_util::AutoOn;
using warden::test_util::ExpectSame;
using warden::test_util::SweepFirstDim;

// The sweep on both backends: results equal eager's and no call runs eagerly.
void SweepBothBackends(const warden::Fn& fn, int64_t max_n, const std::vector<int64_t>& rest) {
  for (const char* backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    auto f = warden::compile(fn, AutoOn(backend));
    SweepFirstDim(f, fn, max_n, rest);
    EXPECT_EQ(f.stats().eager_calls, 0);
  }
}

// C++ written with sym_size(): the view's size is the argument's at run time, so after the one
// recompile that makes the batch dynamic nothing is re-traced (before 2.8: one verification per
// new size).
TEST(SymbolicSizes, SymSizeInAViewFollowsTheBatch) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    return {x.relu().view_symint({x.sym_size(0) * 2, -1}) * 2};
  };
  for (const char* backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    auto f = warden::compile(fn, AutoOn(backend));
    SweepFirstDim(f, fn, 12, {4, 3});
    const warden::Stats s = f.stats();
    EXPECT_EQ(s.compiles, 2);
    EXPECT_EQ(s.eager_calls, 0);
    EXPECT_EQ(s.size_verifications, kSymbolic ? 0 : 10);
    EXPECT_EQ(s.cache_hits, kSymbolic ? 22 : 12);
    if (kSymbolic) {
      EXPECT_THAT(f.explain(), HasSubstr("aten::view(%0, [%arg0.size(0)*2, -1])"));
    }
  }
}

// An equality C++ tested on symbolic sizes becomes a guard (a relation between the two sizes):
// equal sizes replay one entry; unequal ones miss, with the comparison as the reason, and take
// the other branch, as eager does.
TEST(SymbolicSizes, ComparisonThatHeldIsAGuard) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const at::Tensor& y = a[1].toTensor();
    // No op relates the two sizes: only the comparison does.
    if (x.sym_size(0) == y.sym_size(0)) return {x * 2, y * 3};
    return {x.sum(0), y - 1};
  };
  auto f = warden::compile(fn, AutoOn("aten"));
  for (int64_t n : {2, 3, 4, 5, 6}) {
    auto x = torch::randn({n, 3}), y = torch::randn({n, 3});
    ExpectSame(f({x, y}), fn({x, y}));
  }
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().eager_calls, 0);
  if (kSymbolic) {
    EXPECT_EQ(f.stats().size_verifications, 0);
    EXPECT_EQ(f.stats().cache_hits, 3);
  }
  auto x = torch::randn({4, 3}), y = torch::randn({5, 3});
  ExpectSame(f({x, y}), fn({x, y}));  // the other branch
  ExpectSame(f({x, y}), fn({x, y}));
  if (kSymbolic) {
    const auto events = f.recompiles();
    ASSERT_FALSE(events.empty());
    EXPECT_THAT(events.back().reasons.at(0), HasSubstr("compared sizes"));
  }
}

// A comparison the algebra cannot decide (size > 5) reads the size: every value is traced before
// it replays, so the branch taken is always eager's.
TEST(SymbolicSizes, UndecidedComparisonReadsTheSize) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    if (x.sym_size(0) > 5) return {x * 2};
    return {x * 3};
  };
  SweepBothBackends(fn, 9, {3});
}

// Algebra decides what holds for every size: the product of the sizes equals numel, a size times
// two is never equal to itself, numel is a multiple of a size. No guard, no read, no verification.
TEST(SymbolicSizes, ComparisonsDecidedByAlgebraCostNothing) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const c10::SymInt n = x.sym_size(0);
    TORCH_CHECK(n * x.sym_size(1) == x.sym_numel(), "numel");
    TORCH_CHECK(n * 2 != n, "double");
    TORCH_CHECK(x.sym_numel() % n == 0, "multiple");
    return {x.reshape_symint({n, -1}).exp()};
  };
  auto f = warden::compile(fn, AutoOn("aten"));
  SweepFirstDim(f, fn, 8, {3});
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().eager_calls, 0);
  if (kSymbolic) {
    EXPECT_EQ(f.stats().size_verifications, 0);
  }
}

// C++ that needs a plain int from a symbolic one gets it: guard_int() reads the size (ordinary
// read), expect_int() cannot take a symbolic value, so the trace is taken again with plain sizes.
// Either way the results are eager's.
TEST(SymbolicSizes, CodeThatNeedsPlainIntsStillRuns) {
  auto guarded = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const int64_t n = x.sym_size(0).guard_int(__FILE__, __LINE__);
    return {x.view({n, -1}) + static_cast<double>(n)};
  };
  auto expecting = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const int64_t n = x.sym_size(0).expect_int();
    return {x.view({n, -1}) * static_cast<double>(n)};
  };
  for (const warden::Fn& fn : {warden::Fn(guarded), warden::Fn(expecting)}) {
    auto f = warden::compile(fn, AutoOn("aten"));
    SweepFirstDim(f, fn, 6, {2, 2});
    EXPECT_EQ(f.stats().eager_calls, 0);
  }
}

// An argument computed from a symbolic size that the op's shape rule takes as a traced integer
// (narrow's length) must not become a run-time size while the output shape stays the traced one:
// it specializes, and every length gives eager's result.
TEST(SymbolicSizes, SizeTakenAsATracedIntegerSpecializes) {
  auto y = torch::randn({12, 3});
  auto fn = [y](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
#if WARDEN_TORCH_AT_LEAST(2, 0)
    at::Tensor z = y.narrow_symint(0, 0, x.sym_size(0));
#else
    at::Tensor z = y.narrow(0, 0, x.size(0));  // 1.13 has no narrow_symint
#endif
    if (z.size(0) == 2) return {z * 2};  // a plain read of the narrowed size
    return {z * 3};
  };
  SweepBothBackends(fn, 7, {3});
}

// A size that is 1 at the traced sizes but symbolic in the graph (conv1d with kernel 4 and
// padding 1: s - 1, 1 at s = 2) is read when C++ looks at it: the branch on it is guarded, not
// baked in.
TEST(SymbolicSizes, IntermediateSizeOfOneIsRead) {
  auto w = torch::randn({2, 1, 4});
  auto fn = [w](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor y = at::conv1d(a[0].toTensor(), w, {}, 1, 1);
    if (y.sym_size(-1) == 1) return {y * 2};
    return {y * 3};
  };
  warden::Options o = AutoOn("aten");
  o.dynamic = warden::Dynamic::kDynamic;
  auto f = warden::compile(fn, o);
  for (int64_t len : {2, 10, 2, 6, 4}) {
    auto x = torch::randn({2, 1, len});
    ExpectSame(f({x}), fn({x}));
  }
  // The traced 1 was a read: the size stays static, so the other lengths are other entries.
  EXPECT_GE(f.stats().compiles, 2);
}

}  // namespace
