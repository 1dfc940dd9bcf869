// Golden tests of the canonical printer (Graph::ToString) and the value-naming helpers of
// tracer/graph.cc. Graphs come from real traces; the one op that must stay opaque is a custom op
// defined here, so the golden text does not change when ops/ gains rules.
#include "tracer/graph.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "tracer/tracer.h"

namespace warden::tracer {
namespace {

// An op with only a CPU kernel and no rule: the tracer must record it as one opaque node.
at::Tensor OpaqueTriple(const at::Tensor& x) { return x * 3; }

TORCH_LIBRARY(warden_graph_test, m) { m.def("opaque_triple(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(warden_graph_test, CPU, m) { m.impl("opaque_triple", &OpaqueTriple); }

at::Tensor CallOpaqueTriple(const at::Tensor& x) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("warden_graph_test::opaque_triple", "")
                       .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

TEST(GraphToString, GoldenArgumentsConstantsMultiOutputDataAndOpaque) {
  const at::Tensor w = torch::ones({4});
  auto fn = [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor y = (a[0].toTensor() + w).relu();
    std::vector<at::Tensor> parts = y.split(2, /*dim=*/1);
    const double s = parts[1].sum().item<double>();
    at::Tensor out = CallOpaqueTriple(parts[0]);
    if (s > 0) out = out * a[1].toDouble();
    return {out, parts[1]};
  };
  TraceResult r = Trace(fn, {torch::ones({3, 4}), 0.5, true}, {"x", "alpha", "flag"});
  EXPECT_EQ(r.graph->ToString(),
            "graph(%x: f32[3, 4], %alpha: Double, %flag: Bool):\n"
            "  %c0 = constant f32[4]\n"
            "  %0 = aten::add.Tensor(%x, %c0, 1) : f32[3, 4]\n"
            "  %1 = aten::relu(%0) : f32[3, 4]\n"
            "  %2.0, %2.1 = aten::split.Tensor(%1, 2, 1) : f32[3, 2], f32[3, 2]\n"
            "  %3 = aten::sum(%2.1, None) : f32[]\n"
            "  %4 = aten::_local_scalar_dense(%3) : scalar = 12.  # data\n"
            "  %5 = warden_graph_test::opaque_triple(%2.0) : f32[3, 2]  # opaque\n"
            "  %6 = aten::mul.Scalar(%5, 0.5) : f32[3, 2]\n"
            "  return (%6, %2.1)\n");
}

TEST(GraphToString, GoldenViewInPlaceFactoryAndUndefinedOutput) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    at::Tensor v = x.view({-1});
    v.mul_(a[2].toInt());
    at::Tensor z = torch::zeros({2, 3});
    return {x.add(z), v, at::Tensor()};
  };
  TraceResult r = Trace(fn, {torch::ones({2, 3}), at::Tensor(), int64_t{2}}, {"x", "unused", "n"});
  // The int argument became a constant of mul_; the in-place result is a new value (%1) that the
  // caller's `v` now names, while `x` itself still names the input.
  EXPECT_EQ(r.graph->ToString(),
            "graph(%x: f32[2, 3], %unused: UndefinedTensor, %n: Int):\n"
            "  %0 = aten::view(%x, [-1]) : f32[6]\n"
            "  %1 = aten::mul_.Scalar(%0, 2) : f32[6]\n"
            "  %2 = aten::zeros([2, 3], None, None, None, None) : f32[2, 3]  # mode: below autograd\n"
            "  %3 = aten::add.Tensor(%x, %2, 1) : f32[2, 3]\n"
            "  return (%3, %1, None)\n");
}

TEST(GraphToString, ConstantsAreNumberedInOrderOfFirstUseAndDeduplicated) {
  const at::Tensor a = torch::ones({2}), b = torch::full({2}, 2.0, torch::kDouble);
  auto fn = [&](const std::vector<c10::IValue>& args) -> std::vector<at::Tensor> {
    at::Tensor xa = args[0].toTensor() * a;
    at::Tensor ba = b * a;
    return {xa + ba, a};
  };
  TraceResult r = Trace(fn, {torch::ones({2})}, {"arg0"});
  EXPECT_EQ(r.graph->ToString(),
            "graph(%arg0: f32[2]):\n"
            "  %c0 = constant f32[2]\n"
            "  %c1 = constant f64[2]\n"
            "  %0 = aten::mul.Tensor(%arg0, %c0) : f32[2]\n"
            "  %1 = aten::mul.Tensor(%c1, %c0) : f64[2]\n"
            "  %2 = aten::add.Tensor(%0, %1, 1) : f64[2]\n"
            "  return (%2, %c0)\n");
}

TEST(GraphToString, TensorListArgumentsAndIntegerDtypes) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor(), y = a[1].toTensor();
    return {torch::cat({x, y, x}, 0).gt(0)};
  };
  TraceResult r = Trace(fn, {torch::ones({2}, torch::kLong), torch::ones({3}, torch::kLong)},
                        {"x", "y"});
  EXPECT_EQ(r.graph->ToString(),
            "graph(%x: i64[2], %y: i64[3]):\n"
            "  %0 = aten::cat([%x, %y, %x], 0) : i64[7]\n"
            "  %1 = aten::gt.Scalar(%0, 0) : b8[7]\n"
            "  return (%1)\n");
}

TEST(GraphToString, ReturningAnArgumentUnchangedHasNoNodes) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor()};
  };
  TraceResult r = Trace(fn, {torch::ones({1}, torch::kBool)}, {"m"});
  EXPECT_EQ(r.graph->ToString(), "graph(%m: b8[1]):\n  return (%m)\n");
}

// The printer on a hand-built graph: a node without results and an optional tensor list with a
// None entry, which ordinary traces rarely produce.
TEST(GraphToString, HandBuiltNodeWithoutResultsAndOptionalList) {
  Graph g;
  g.arg_names = {"a"};
  g.arg_kinds = {ArgKind::kTensor};
  Value in;
  in.kind = ValueKind::kInput;
  in.arg_index = 0;
  in.meta.dtype = at::kFloat;
  in.meta.sizes = {5};
  g.arg_values = {g.AddValue(in)};
  Node n;
  n.index = 0;
  n.op = "test::sink";
  n.kind = NodeKind::kOpaque;
  NodeArg list;
  list.kind = NodeArg::Kind::kOptValueList;
  list.values = {g.arg_values[0], kNoValue};
  NodeArg flag;
  flag.constant = c10::IValue(false);
  n.args = {list, flag};
  g.nodes.push_back(n);
  EXPECT_EQ(g.ToString(),
            "graph(%a: f32[5]):\n"
            "  _ = test::sink([%a, None], false) :   # opaque\n"
            "  return ()\n");
  EXPECT_EQ(g.ValueName(kNoValue), "None");
  EXPECT_EQ(g.ValueName(g.arg_values[0]), "%a");
}

TEST(GraphToString, ShapeOfOverloadReplacesTensorShapesButNotConstants) {
  const at::Tensor w = torch::ones({3});
  auto fn = [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {(a[0].toTensor() * w).sum(0)};
  };
  TraceResult r = Trace(fn, {torch::ones({2, 3})}, {"x"});
  auto shape_of = [](ValueId id) { return "<v" + std::to_string(id) + ">"; };
  // Constants keep their (always static) shape; arguments and node results ask shape_of.
  EXPECT_EQ(r.graph->ToString(shape_of),
            "graph(%x: f32<v0>):\n"
            "  %c0 = constant f32[3]\n"
            "  %0 = aten::mul.Tensor(%x, %c0) : f32<v2>\n"
            "  %1 = aten::sum.dim_IntList(%0, [0], false, None) : f32<v3>\n"
            "  return (%1)\n");
  EXPECT_EQ(r.graph->ToString(nullptr), r.graph->ToString());
}

TEST(GraphToString, IsIdenticalForIdenticalTraces) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor().softmax(-1).tanh()};
  };
  const std::string first = Trace(fn, {torch::randn({2, 3})}, {"arg0"}).graph->ToString();
  const std::string second = Trace(fn, {torch::randn({2, 3})}, {"arg0"}).graph->ToString();
  EXPECT_EQ(first, second);
  EXPECT_NE(first, Trace(fn, {torch::randn({2, 4})}, {"arg0"}).graph->ToString());
}

TEST(GraphHelpers, IValueString) {
  EXPECT_EQ(IValueString(c10::IValue()), "None");
  EXPECT_EQ(IValueString(true), "true");
  EXPECT_EQ(IValueString(int64_t{-3}), "-3");
  EXPECT_EQ(IValueString(0.5), "0.5");
  EXPECT_EQ(IValueString(2.0), "2.");
  EXPECT_EQ(IValueString(1e-16), "1e-16");
  EXPECT_EQ(IValueString(-0.0), "-0.");
  EXPECT_EQ(IValueString(0.0), "0.");
  EXPECT_EQ(IValueString(std::nan("")), "nan");
  EXPECT_EQ(IValueString(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(IValueString(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(IValueString(std::vector<int64_t>{2, -1}), "[2, -1]");
  EXPECT_EQ(IValueString(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(IValueString(c10::List<double>({0.5, 1.0})), "[0.5, 1]");
  EXPECT_EQ(IValueString(c10::List<bool>({true, false})), "[true, false]");
  EXPECT_EQ(IValueString(std::string("mean")), "\"mean\"");
  EXPECT_EQ(IValueString(c10::Device(c10::kCPU)), "cpu");
}

TEST(GraphHelpers, DtypeShortAndShapeString) {
  EXPECT_EQ(DtypeShort(at::kFloat), "f32");
  EXPECT_EQ(DtypeShort(at::kDouble), "f64");
  EXPECT_EQ(DtypeShort(at::kHalf), "f16");
  EXPECT_EQ(DtypeShort(at::kBFloat16), "bf16");
  EXPECT_EQ(DtypeShort(at::kLong), "i64");
  EXPECT_EQ(DtypeShort(at::kInt), "i32");
  EXPECT_EQ(DtypeShort(at::kByte), "u8");
  EXPECT_EQ(DtypeShort(at::kBool), "b8");
  EXPECT_EQ(DtypeShort(at::kComplexFloat), "c64");
  EXPECT_EQ(DtypeShort(at::ScalarType::Undefined), "undef");
  EXPECT_EQ(ShapeString({}), "[]");
  EXPECT_EQ(ShapeString({3, 0, 1}), "[3, 0, 1]");
}

TEST(GraphHelpers, KindNames) {
  EXPECT_STREQ(NodeKindName(NodeKind::kRule), "rule");
  EXPECT_STREQ(NodeKindName(NodeKind::kOpaque), "opaque");
  EXPECT_STREQ(NodeKindName(NodeKind::kDataDependent), "data");
  EXPECT_STREQ(ValueKindName(ValueKind::kInput), "input");
  EXPECT_STREQ(ValueKindName(ValueKind::kConstant), "constant");
  EXPECT_STREQ(ValueKindName(ValueKind::kNode), "node");
  EXPECT_STREQ(ArgKindName(ArgKind::kUndefinedTensor), "UndefinedTensor");
  EXPECT_STREQ(ArgKindName(ArgKind::kDouble), "Double");
}

TEST(GraphHelpers, TensorMetaOf) {
  const at::Tensor t = torch::zeros({2, 3}, torch::kDouble).t();
  const TensorMeta m = TensorMeta::Of(t);
  EXPECT_EQ(m.dtype, at::kDouble);
  EXPECT_EQ(m.sizes, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(m.strides, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(m.device.is_cpu());
  EXPECT_FALSE(m.requires_grad);
  EXPECT_EQ(TensorMeta::Of(at::Tensor()).dtype, at::ScalarType::Undefined);
  EXPECT_TRUE(TensorMeta::Of(torch::ones({1}, torch::requires_grad())).requires_grad);
}

}  // namespace
}  // namespace warden::tracer
