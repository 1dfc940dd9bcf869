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

// A tutorial-style CNN (conv -> batch_norm -> relu -> max_pool -> conv with stride -> adaptive
// pool -> flatten -> linear): the batch dim stays symbolic through every layer, spatial sizes
// are constants, and nothing is specialized.
TEST(ShapePassTest, ConvolutionalLayersKeepTheBatchSymbolic) {
  torch::manual_seed(0);
  const at::Tensor w1 = torch::randn({8, 3, 3, 3}), w2 = torch::randn({4, 8, 3, 3}), fc = torch::randn({10, 4});
  const at::Tensor mean = torch::zeros({8}), var = torch::ones({8});
  auto t = TraceAndPropagate([&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 at::Tensor x = torch::conv2d(a[0].toTensor(), w1, {}, 1, 1);
                 x = torch::batch_norm(x, {}, {}, mean, var, false, 0.1, 1e-5, false).relu();
                 x = torch::max_pool2d(x, 2);
                 x = torch::conv2d(x, w2, {}, 2);
                 x = torch::adaptive_avg_pool2d(x, {1, 1});
                 return {torch::linear(torch::flatten(x, 1), fc), torch::conv_transpose2d(x, w2)};
               },
               {torch::randn({5, 3, 12, 12})}, {{0, 0}});
  ASSERT_EQ(t.pass.symbols.size(), 1u);
  EXPECT_TRUE(t.pass.specialized.empty()) << t.pass.specialized.begin()->second;
  EXPECT_EQ(t.Output(0), "[s0, 10]");
  EXPECT_EQ(t.Output(1), "[s0, 8, 3, 3]");
}

// A spatial size under a stride that does not divide it specializes, naming the op.
TEST(ShapePassTest, StridedConvolutionOverASymbolicWidthSpecializesIt) {
  const at::Tensor w = torch::randn({4, 3, 3, 3});
  auto t = TraceAndPropagate([&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 return {torch::conv2d(a[0].toTensor(), w, {}, 2)};
               },
               {torch::randn({2, 3, 9, 9})}, {{0, 0}, {0, 3}});
  ASSERT_EQ(t.pass.symbols.size(), 2u);
  ASSERT_EQ(t.pass.specialized.size(), 1u);
  EXPECT_EQ(t.pass.specialized.begin()->first, 1);
  EXPECT_THAT(t.pass.specialized.begin()->second, HasSubstr("aten::conv2d"));
  EXPECT_EQ(t.Output(0), "[s0, 4, 4, 4]");
}

// aten::lstm over a sequence and aten::lstm_cell: batch and time stay symbolic.
TEST(ShapePassTest, RecurrentLayersKeepBatchAndTimeSymbolic) {
  torch::manual_seed(0);
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(3, 4));
  torch::nn::LSTMCell cell(3, 4);
  auto t = TraceAndPropagate([&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 const at::Tensor& x = a[0].toTensor();  // [T, B, 3]
                 const at::Tensor& h = a[1].toTensor();  // [1, B, 4]
                 // The ops themselves (nn::LSTM's forward reads input.size(1) in C++ to check hx).
                 auto out = std::get<0>(torch::lstm(x, {h, h}, lstm->all_weights(), true, 1, 0.0, false, false, false));
                 auto hc = torch::lstm_cell(x[0], {h[0], h[0]}, cell->weight_ih, cell->weight_hh, cell->bias_ih,
                                            cell->bias_hh);
                 return {out, std::get<0>(hc)};
               },
               {torch::randn({6, 5, 3}), torch::randn({1, 5, 4})}, {{0, 0}, {0, 1}, {1, 1}});
  ASSERT_EQ(t.pass.symbols.size(), 3u);
  EXPECT_TRUE(t.pass.specialized.empty()) << t.pass.specialized.begin()->second;
  EXPECT_EQ(t.Output(0), "[s0, s1, 4]");
  EXPECT_EQ(t.Output(1), "[s2, 4]");  // h's batch, required equal to the input's
  ASSERT_EQ(t.pass.requirements.size(), 2u);
  EXPECT_EQ((t.pass.requirements[0].lhs - t.pass.requirements[0].rhs).ToString(), "-s1 + s2");
}

// reshape(-1, 12) of [s0, 1, s1, s2] with every dim dynamic: giving up the trailing symbols
// (3 * 4 = 12) keeps the batch symbolic; giving up one of them alone would not divide.
TEST(ShapePassTest, ReshapeGivesUpTrailingSymbolsBeforeTheBatch) {
  auto t = TraceAndPropagate([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 return {a[0].toTensor().view({-1, 12})};
               },
               {torch::randn({5, 1, 3, 4})}, {{0, -1}});
  ASSERT_EQ(t.pass.symbols.size(), 3u);
  EXPECT_EQ(t.Output(0), "[s0, 12]");
  EXPECT_EQ(t.pass.specialized.count(0), 0u);
  EXPECT_EQ(t.pass.specialized.count(1), 1u);
  EXPECT_EQ(t.pass.specialized.count(2), 1u);
}

// batch_norm asks whether its input is empty dim by dim: after a 3x3 convolution the spatial
// sizes (s - 2) could be 0 and specialize, the batch (>= 2) never does.
TEST(ShapePassTest, BatchNormAfterAConvolutionKeepsTheBatchSymbolic) {
  const at::Tensor w = torch::randn({4, 3, 3, 3}), mean = torch::zeros({4}), var = torch::ones({4});
  auto t = TraceAndPropagate([&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                 return {torch::batch_norm(torch::conv2d(a[0].toTensor(), w), {}, {}, mean, var, false, 0.1, 1e-5,
                                           false)};
               },
               {torch::randn({5, 3, 8, 8})}, {{0, -1}});
  ASSERT_EQ(t.pass.symbols.size(), 4u);
  EXPECT_EQ(t.pass.specialized.count(0), 0u) << t.pass.specialized.at(0);
  EXPECT_THAT(t.Output(0), testing::StartsWith("[s0, 4, "));
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
