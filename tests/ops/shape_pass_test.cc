// The symbolic shape pass on traced graphs: symbolic shapes per value, requirements with the op
// that needs them, specializations with who caused them, 0/1 specialization, fixpoint rounds.
#include "ops/shape_pass.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace warden::ops {
namespace {

using ::testing::HasSubstr;

struct Traced {
  tracer::TraceResult trace;
  ShapePassResult pass;
  std::string Shape(tracer::ValueId id) const { return tracer::SymShapeString(pass.shapes.at(id)); }
  std::string Output(size_t i) const { return Shape(trace.graph->outputs.at(i)); }
};

Traced TraceAndPropagate(const tracer::TracedFn& fn, const std::vector<c10::IValue>& args,
           const std::set<std::pair<int, int>>& dynamic) {
  std::vector<std::string> names;
  for (size_t i = 0; i < args.size(); ++i) names.push_back("arg" + std::to_string(i));
  Traced t;
  t.trace = tracer::Trace(fn, args, names);
  t.pass = PropagateShapes(*t.trace.graph, t.trace.reads, dynamic);
  return t;
}

TEST(ShapePassTest, PointwiseChainKeepsSymbols) {
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 return {(a[0].toTensor().exp() * 2).relu()};
               },
               {torch::randn({3, 4})}, {{0, -1}});
  ASSERT_EQ(t.pass.symbols.size(), 2u);
  EXPECT_EQ(t.Output(0), "[s0, s1]");
  EXPECT_TRUE(t.pass.requirements.empty());
  EXPECT_TRUE(t.pass.specialized.empty());
}

TEST(ShapePassTest, BroadcastRequiresEqualityOnlyWhereNeeded) {
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 return {a[0].toTensor() + a[1].toTensor()};
               },
               {torch::randn({3, 4}), torch::randn({4})}, {{0, -1}, {1, -1}});
  EXPECT_EQ(t.Output(0), "[s0, s1]");
  ASSERT_EQ(t.pass.requirements.size(), 1u);
  EXPECT_EQ((t.pass.requirements[0].lhs - t.pass.requirements[0].rhs).ToString(), "s1 - s2");
  EXPECT_EQ(t.pass.requirements[0].why, "required by aten::add.Tensor at %0");
}

TEST(ShapePassTest, SizesZeroAndOneNeverBecomeSymbols) {
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 return {a[0].toTensor() * 2};
               },
               {torch::randn({1, 0, 5})}, {{0, -1}});
  ASSERT_EQ(t.pass.symbols.size(), 1u);
  EXPECT_EQ(t.pass.symbols[0].dim, 2);
  EXPECT_EQ(t.Output(0), "[1, 0, s0]");
}

TEST(ShapePassTest, CatAddsSizesAndMatmulRelatesInnerDims) {
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 auto c = torch::cat({a[0].toTensor(), a[1].toTensor()}, 0);
                 return {c, torch::matmul(c, a[2].toTensor())};
               },
               {torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({3, 5})},
               {{0, 0}, {1, 0}, {2, 0}, {2, 1}});
  EXPECT_EQ(t.Output(0), "[s0 + s1, 3]");
  EXPECT_EQ(t.Output(1), "[s0 + s1, s3]");
  ASSERT_EQ(t.pass.requirements.size(), 1u);
  EXPECT_THAT(t.pass.requirements[0].why, HasSubstr("aten::matmul"));
}

TEST(ShapePassTest, UserSizeReadSpecializesWithProvenance) {
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 at::Tensor x = a[0].toTensor();
                 return {x.view({x.size(0) * x.size(1)})};
               },
               {torch::randn({3, 4})}, {{0, -1}});
  ASSERT_EQ(t.pass.specialized.size(), 2u);
  EXPECT_EQ(t.pass.specialized.at(0), "%arg0.size(0) read by user code");
  EXPECT_EQ(t.pass.specialized.at(1), "%arg0.size(1) read by user code");
  EXPECT_EQ(t.Output(0), "[12]");
  EXPECT_GE(t.pass.iterations, 2);
}

TEST(ShapePassTest, ReadingOneDimSpecializesOnlyThatDim) {
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 at::Tensor x = a[0].toTensor();
                 return {x * static_cast<double>(x.size(-1)), x.sum(x.dim() - 1)};
               },
               {torch::randn({3, 4})}, {{0, -1}});
  ASSERT_EQ(t.pass.specialized.size(), 1u);
  EXPECT_EQ(t.pass.specialized.at(1), "%arg0.size(1) read by user code");
  EXPECT_EQ(t.Output(0), "[s0, 4]");
  EXPECT_EQ(t.Output(1), "[s0]");
}

TEST(ShapePassTest, ReshapeSolvesMinusOne) {
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 return {a[0].toTensor().reshape({-1, 4}), a[0].toTensor().reshape({-1})};
               },
               {torch::randn({6, 8})}, {{0, 0}});
  EXPECT_EQ(t.Output(0), "[2*s0, 4]");
  EXPECT_EQ(t.Output(1), "[8*s0]");
  EXPECT_TRUE(t.pass.specialized.empty());
}

TEST(ShapePassTest, OpaqueOpSpecializesItsInputs) {
  // An op with a CPU kernel (not composite) and no registered rule: recorded as opaque.
  ASSERT_EQ(Registry::Global().Find("aten::histc"), nullptr) << "pick another unregistered op";
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 return {torch::histc(a[0].toTensor(), 10) + 1};
               },
               {torch::randn({3, 4})}, {{0, -1}});
  EXPECT_EQ(t.pass.specialized.size(), 2u);
  EXPECT_THAT(t.pass.specialized.at(0), HasSubstr("which has no symbolic shape rule"));
  EXPECT_EQ(t.Output(0), "[10]");
}

TEST(ShapePassTest, SymbolNames) {
  EXPECT_EQ(SymbolName({1, 2, 7}, {"x", "y"}), "y.size(2)");
  EXPECT_EQ(SymbolName({3, 0, 7}, {"x"}), "arg3.size(0)");
}

}  // namespace
}  // namespace warden::ops
