// Tests of Trace() (tracer/tracer.cc): what the dispatcher fallback records for ordinary LibTorch
// code — op names, constants, factory and random ops, mutation and views, decomposition of
// composite ops, metadata reads, data-dependent reads — and how errors and escaping tensors behave.
#include "tracer/tracer.h"

#include <algorithm>
#include <stdexcept>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "ops/registry.h"
#include "tracer/error.h"

namespace warden::tracer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using Args = std::vector<c10::IValue>;

// A composite op defined only here (so ops/ can never give it a rule) that reads a size.
at::Tensor Rows(const at::Tensor& x) { return x.reshape({x.size(0), -1}).relu(); }

TORCH_LIBRARY(warden_tracer_test, m) { m.def("rows(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(warden_tracer_test, CompositeImplicitAutograd, m) { m.impl("rows", &Rows); }

at::Tensor CallRows(const at::Tensor& x) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("warden_tracer_test::rows", "")
                       .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

std::vector<std::string> DefaultNames(size_t n) {
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) names.push_back("arg" + std::to_string(i));
  return names;
}

TraceResult TraceIt(const TracedFn& fn, const Args& args) {
  return Trace(fn, args, DefaultNames(args.size()));
}

std::vector<std::string> Ops(const Graph& g) {
  std::vector<std::string> ops;
  for (const Node& n : g.nodes) ops.push_back(n.op);
  return ops;
}

// Runs `fn` eagerly on clones of the tensor arguments (the trace may have mutated the originals).
std::vector<at::Tensor> Eager(const TracedFn& fn, const Args& args) {
  Args copy;
  for (const c10::IValue& a : args) {
    copy.push_back(a.isTensor() && a.toTensor().defined() ? c10::IValue(a.toTensor().clone()) : a);
  }
  return fn(copy);
}

void ExpectSame(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << "output " << i;
    if (!want[i].defined()) continue;
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << "output " << i;
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << "output " << i;
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-5, 1e-6, /*equal_nan=*/true)) << "output " << i;
  }
}

// The traced outputs are real tensors, never wrappers: they print, copy and compute normally.
void ExpectRealTensors(const std::vector<at::Tensor>& outs) {
  for (const at::Tensor& t : outs) {
    if (!t.defined()) continue;
    EXPECT_FALSE(t.key_set().has(c10::DispatchKey::DeferredInit));
    EXPECT_TRUE(t.has_storage());
  }
}

int CountKind(const Graph& g, ValueKind kind) {
  return static_cast<int>(std::count_if(g.values.begin(), g.values.end(),
                                        [&](const Value& v) { return v.kind == kind; }));
}

// --- Ops ----------------------------------------------------------------------------------------

TEST(Trace, RecordsEachAtenOpWithItsSchemaName) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor(), y = a[1].toTensor();
    at::Tensor s = (x + y).sin();
    return {s.sum(1), s * 2.5};
  };
  const Args args{torch::randn({2, 3}), torch::randn({3})};
  TraceResult r = TraceIt(fn, args);
  const Graph& g = *r.graph;
  EXPECT_THAT(Ops(g), ElementsAre("aten::add.Tensor", "aten::sin", "aten::sum.dim_IntList",
                                  "aten::mul.Scalar"));
  for (const Node& n : g.nodes) {
    EXPECT_EQ(n.kind, NodeKind::kRule) << n.op;
    ASSERT_TRUE(n.handle.has_value()) << n.op;
    EXPECT_FALSE(n.mutates || n.random || n.factory) << n.op;
  }
  EXPECT_EQ(g.nodes[0].handle->schema().name(), "aten::add");
  EXPECT_EQ(g.nodes[0].handle->schema().overload_name(), "Tensor");
  // add(x, y, alpha=1): tensors by value, the scalar as a constant, in schema order.
  ASSERT_EQ(g.nodes[0].args.size(), 3u);
  EXPECT_EQ(g.nodes[0].args[0].kind, NodeArg::Kind::kValue);
  EXPECT_EQ(g.nodes[0].args[0].value, g.arg_values[0]);
  EXPECT_EQ(g.nodes[0].args[1].value, g.arg_values[1]);
  EXPECT_EQ(g.nodes[0].args[2].kind, NodeArg::Kind::kConstant);
  EXPECT_EQ(g.nodes[0].args[2].constant.toInt(), 1);
  EXPECT_EQ(g.nodes[3].args[1].constant.toDouble(), 2.5);
  // Each node consumes the previous node's result.
  EXPECT_EQ(g.nodes[1].args[0].value, g.nodes[0].returns[0].values[0]);
  EXPECT_EQ(g.value(g.nodes[2].returns[0].values[0]).meta.sizes, (std::vector<int64_t>{2}));
  EXPECT_THAT(g.outputs, ElementsAre(g.nodes[2].returns[0].values[0], g.nodes[3].returns[0].values[0]));
  EXPECT_THAT(r.reads, IsEmpty()) << "nothing but Warden read metadata";
  EXPECT_THAT(r.rule_mismatches, IsEmpty());
  EXPECT_TRUE(r.untraceable.empty());
  ExpectRealTensors(r.outputs);
  ExpectSame(r.outputs, Eager(fn, args));
}

TEST(Trace, ArgumentKindsAndNames) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() * a[2].toInt() + a[3].toDouble()};
  };
  TraceResult r = Trace(fn, {torch::ones({2}), at::Tensor(), int64_t{3}, 0.5, false},
                        {"x", "u", "n", "d", "b"});
  const Graph& g = *r.graph;
  EXPECT_THAT(g.arg_kinds, ElementsAre(ArgKind::kTensor, ArgKind::kUndefinedTensor, ArgKind::kInt,
                                       ArgKind::kDouble, ArgKind::kBool));
  ASSERT_EQ(g.arg_values.size(), 5u);
  EXPECT_EQ(g.value(g.arg_values[0]).kind, ValueKind::kInput);
  EXPECT_EQ(g.value(g.arg_values[0]).arg_index, 0);
  for (int i = 1; i < 5; ++i) EXPECT_EQ(g.arg_values[i], kNoValue) << i;
  EXPECT_THAT(g.arg_names, ElementsAre("x", "u", "n", "d", "b"));
  // C++ turned the scalars into op constants.
  EXPECT_EQ(g.nodes.at(0).args.at(1).constant.toInt(), 3);
  EXPECT_EQ(g.nodes.at(1).args.at(1).constant.toDouble(), 0.5);
}

TEST(Trace, UnsupportedArgumentTypeIsAWardenError) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor()}; };
  try {
    Trace(fn, {torch::ones({1}), c10::IValue(std::string("s"))}, {"x", "label"});
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "warden: argument 'label' has unsupported type String; expected Tensor, int, "
                 "double or bool");
  }
  EXPECT_FALSE(IsTracing());
}

TEST(Trace, IsTracingOnlyInsideTheTracedFunction) {
  bool inside = false;
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    inside = IsTracing();
    return {a[0].toTensor() + 1};
  };
  EXPECT_FALSE(IsTracing());
  TraceIt(fn, {torch::ones({1})});
  EXPECT_TRUE(inside);
  EXPECT_FALSE(IsTracing());
}

TEST(Trace, MultiOutputOpsRecordEveryResult) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    auto [values, indices] = x.max(1);
    std::vector<at::Tensor> parts = x.chunk(3, 1);
    return {values, indices, parts[2]};
  };
  const Args args{torch::randn({2, 6})};
  TraceResult r = TraceIt(fn, args);
  const Graph& g = *r.graph;
  ASSERT_THAT(Ops(g), ElementsAre("aten::max.dim", "aten::chunk"));
  const Node& max = g.nodes[0];
  ASSERT_EQ(max.returns.size(), 2u);
  EXPECT_EQ(max.returns[0].kind, NodeReturn::Kind::kTensor);
  EXPECT_EQ(g.value(max.returns[1].values[0]).meta.dtype, at::kLong);
  const Node& chunk = g.nodes[1];
  ASSERT_EQ(chunk.returns.size(), 1u);
  EXPECT_EQ(chunk.returns[0].kind, NodeReturn::Kind::kTensorList);
  ASSERT_EQ(chunk.returns[0].values.size(), 3u);
  EXPECT_EQ(g.value(chunk.returns[0].values[2]).output_index, 2);
  EXPECT_EQ(g.outputs[2], chunk.returns[0].values[2]);
  ExpectSame(r.outputs, Eager(fn, args));
}

// --- Constants ----------------------------------------------------------------------------------

TEST(Trace, CapturedTensorsAreConstantsByReference) {
  at::Tensor w = torch::randn({3});
  at::Tensor b = torch::randn({3});
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    at::Tensor y = x * w;
    at::Tensor z = y + b;
    return {z - w, w};
  };
  const Args args{torch::randn({3})};
  TraceResult r = TraceIt(fn, args);
  const Graph& g = *r.graph;
  ASSERT_EQ(CountKind(g, ValueKind::kConstant), 2) << "w is used three times but captured once";
  const ValueId wc = g.nodes[0].args[1].value;
  const ValueId bc = g.nodes[1].args[1].value;
  EXPECT_EQ(g.value(wc).kind, ValueKind::kConstant);
  EXPECT_EQ(g.value(wc).constant.unsafeGetTensorImpl(), w.unsafeGetTensorImpl());
  EXPECT_EQ(g.value(bc).constant.unsafeGetTensorImpl(), b.unsafeGetTensorImpl());
  EXPECT_EQ(g.nodes[2].args[1].value, wc);
  EXPECT_EQ(g.outputs[1], wc);
  EXPECT_TRUE(r.outputs[1].is_same(w)) << "a returned closure tensor is the tensor itself";
  EXPECT_EQ(g.value(wc).meta.sizes, (std::vector<int64_t>{3}));
  // By reference: a later in-place update of w is visible through the graph.
  w.fill_(7);
  EXPECT_TRUE(torch::equal(g.value(wc).constant, torch::full({3}, 7.0)));
}

// --- Factory and random ops ---------------------------------------------------------------------

TEST(Trace, FactoryOpsAreNodesFlaggedFactoryAndRandom) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor noise = torch::randn({3});
    at::Tensor zeros = torch::zeros({3});
    at::Tensor range = torch::arange(3);
    return {a[0].toTensor() + noise, zeros, range};
  };
  const Args args{torch::ones({3})};
  torch::manual_seed(11);
  TraceResult r = TraceIt(fn, args);
  const Graph& g = *r.graph;
  ASSERT_THAT(Ops(g), ElementsAre("aten::randn", "aten::zeros", "aten::arange", "aten::add.Tensor"));
  EXPECT_EQ(CountKind(g, ValueKind::kConstant), 0) << "factory results must not be folded";
  EXPECT_TRUE(g.nodes[0].factory);
  EXPECT_TRUE(g.nodes[0].random);
  EXPECT_TRUE(g.nodes[1].factory);
  EXPECT_FALSE(g.nodes[1].random);
  EXPECT_TRUE(g.nodes[2].factory);
  EXPECT_FALSE(g.nodes[2].random);
  EXPECT_FALSE(g.nodes[3].factory);
  EXPECT_FALSE(g.nodes[3].random);
  EXPECT_EQ(g.value(g.outputs[2]).meta.dtype, at::kLong);
  EXPECT_THAT(g.outputs, ElementsAre(g.nodes[3].returns[0].values[0], g.nodes[1].returns[0].values[0],
                                     g.nodes[2].returns[0].values[0]));
  torch::manual_seed(11);
  ExpectSame(r.outputs, Eager(fn, args));
}

// --- Mutation and views -------------------------------------------------------------------------

TEST(Trace, InPlaceOpsAreFlaggedMutatingAndRepointTheWrapper) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.mul_(2);
    return {x.sin(), x};
  };
  at::Tensor x = torch::ones({3});
  TraceResult r = TraceIt(fn, {x});
  const Graph& g = *r.graph;
  ASSERT_THAT(Ops(g), ElementsAre("aten::mul_.Scalar", "aten::sin"));
  const Node& mul = g.nodes[0];
  EXPECT_TRUE(mul.mutates);
  EXPECT_FALSE(g.nodes[1].mutates);
  const ValueId input = g.arg_values[0];
  const ValueId written = mul.returns[0].values[0];
  EXPECT_NE(written, input) << "the in-place result is a new version of the value";
  EXPECT_EQ(mul.args[0].value, input);
  EXPECT_EQ(g.value(written).alias_of, input);
  // User code kept using `x` after mul_: it must now name the new version.
  EXPECT_EQ(g.nodes[1].args[0].value, written);
  EXPECT_EQ(g.outputs[1], written);
  EXPECT_THAT(g.MutatedArgs(), ElementsAre(0));
  EXPECT_TRUE(g.HasMutation());
  // The trace ran eagerly on the real argument, and returned it (not a copy).
  EXPECT_TRUE(torch::equal(x, torch::full({3}, 2.0)));
  EXPECT_TRUE(r.outputs[1].is_same(x));
  EXPECT_TRUE(torch::allclose(r.outputs[0], torch::full({3}, 2.0).sin()));
}

TEST(Trace, ViewsRecordAliasOfAndBaseArg) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor(), y = a[1].toTensor();
    at::Tensor flat = x.view({-1});
    at::Tensor row = flat.unsqueeze(0);
    at::Tensor fresh = y + 1;
    at::Tensor fresh_view = fresh.t();
    return {row, fresh_view};
  };
  at::Tensor x = torch::randn({2, 3}), y = torch::randn({2, 2});
  TraceResult r = TraceIt(fn, {x, y});
  const Graph& g = *r.graph;
  ASSERT_THAT(Ops(g), ElementsAre("aten::view", "aten::unsqueeze", "aten::add.Scalar", "aten::t"));
  const ValueId flat = g.nodes[0].returns[0].values[0];
  const ValueId row = g.nodes[1].returns[0].values[0];
  const ValueId fresh = g.nodes[2].returns[0].values[0];
  const ValueId fresh_view = g.nodes[3].returns[0].values[0];
  EXPECT_EQ(g.value(flat).alias_of, g.arg_values[0]);
  EXPECT_EQ(g.value(row).alias_of, flat);
  EXPECT_EQ(g.value(fresh).alias_of, kNoValue);
  EXPECT_EQ(g.value(fresh_view).alias_of, fresh);
  EXPECT_EQ(g.BaseArg(g.arg_values[1]), 1);
  EXPECT_EQ(g.BaseArg(flat), 0);
  EXPECT_EQ(g.BaseArg(row), 0) << "BaseArg follows alias_of transitively";
  EXPECT_EQ(g.BaseArg(fresh), -1);
  EXPECT_EQ(g.BaseArg(fresh_view), -1);
  EXPECT_EQ(g.BaseArg(kNoValue), -1);
  EXPECT_EQ(g.RootOf(row), g.arg_values[0]);
  EXPECT_EQ(g.RootOf(fresh_view), fresh);
  EXPECT_EQ(g.RootOf(fresh), fresh);
  EXPECT_THAT(g.MutatedArgs(), IsEmpty());
  EXPECT_FALSE(g.HasMutation());
  // The real results alias as in eager.
  EXPECT_TRUE(r.outputs[0].is_alias_of(x));
  EXPECT_FALSE(r.outputs[1].is_alias_of(y));
}

TEST(Trace, WritingThroughAViewMutatesTheBaseArgument) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor(), y = a[1].toTensor(), z = a[2].toTensor();
    y.select(0, 1).add_(x);  // writes arg1 through a view
    at::Tensor tmp = z * 2;
    tmp.relu_();  // writes a fresh intermediate: no argument is mutated by it
    return {y + tmp};
  };
  at::Tensor y = torch::zeros({2, 3});
  TraceResult r = TraceIt(fn, {torch::ones({3}), y, torch::ones({3})});
  const Graph& g = *r.graph;
  ASSERT_THAT(Ops(g), ElementsAre("aten::select.int", "aten::add_.Tensor", "aten::mul.Scalar",
                                  "aten::relu_", "aten::add.Tensor"));
  EXPECT_TRUE(g.nodes[1].mutates);
  EXPECT_TRUE(g.nodes[3].mutates);
  EXPECT_THAT(g.MutatedArgs(), ElementsAre(1));
  EXPECT_TRUE(torch::equal(y[1], torch::ones({3})));
  EXPECT_TRUE(torch::equal(y[0], torch::zeros({3})));
}

TEST(Trace, MutatingTwoArgumentsListsBoth) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    a[2].toTensor().zero_();
    a[0].toTensor().view({-1}).fill_(1);
    return {a[1].toTensor() * 2};
  };
  TraceResult r = TraceIt(fn, {torch::randn({2, 2}), torch::randn({2}), torch::randn({2})});
  EXPECT_THAT(r.graph->MutatedArgs(), ElementsAre(0, 2));
}

// --- Composite ops ------------------------------------------------------------------------------

TEST(Trace, CompositeOpWithoutRuleIsDecomposedAndItsReadsAttributed) {
  ASSERT_EQ(ops::Registry::Global().Find("warden_tracer_test::rows"), nullptr);
  auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {CallRows(a[0].toTensor())}; };
  const Args args{torch::randn({2, 3, 4})};
  TraceResult r = TraceIt(fn, args);
  const Graph& g = *r.graph;
  // The composite body ran on the wrappers: its inner ops are the nodes, the op itself is not.
  ASSERT_THAT(Ops(g), ElementsAre("aten::reshape", "aten::relu"));
  EXPECT_EQ(g.nodes[0].args[1].constant.toIntVector(), (std::vector<int64_t>{2, -1}));
  // x.size(0) inside the composite kernel is a specialization attributed to the composite.
  ASSERT_EQ(r.reads.size(), 1u);
  EXPECT_EQ(r.reads[0].value, g.arg_values[0]);
  EXPECT_EQ(r.reads[0].what, MetadataRead::What::kSizes);
  EXPECT_EQ(r.reads[0].by, "warden_tracer_test::rows (composite)");
  ExpectSame(r.outputs, Eager(fn, args));
}

// An ATen composite op that has no rule in ops/ right now. ops/ keeps growing, so the op is chosen
// at run time from candidates; each is CompositeImplicitAutograd in LibTorch 1.13.
struct CompositeCandidate {
  const char* name;
  const char* overload;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> call;
};

TEST(Trace, AtenCompositeOpWithoutRuleIsDecomposed) {
  const std::vector<CompositeCandidate> candidates = {
      {"aten::cosine_similarity", "", [](const at::Tensor& a, const at::Tensor& b) { return at::cosine_similarity(a, b); }},
      {"aten::pairwise_distance", "", [](const at::Tensor& a, const at::Tensor& b) { return at::pairwise_distance(a, b); }},
      {"aten::kron", "", [](const at::Tensor& a, const at::Tensor& b) { return at::kron(a, b); }},
      {"aten::einsum", "", [](const at::Tensor& a, const at::Tensor& b) { return at::einsum("ij,ij->i", {a, b}); }},
      {"aten::diff", "", [](const at::Tensor& a, const at::Tensor&) { return at::diff(a); }},
  };
  const CompositeCandidate* chosen = nullptr;
  for (const CompositeCandidate& c : candidates) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(c.name, c.overload);
    ASSERT_TRUE(op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) << c.name;
    if (ops::Registry::Global().Find(c.name) == nullptr) {
      chosen = &c;
      break;
    }
  }
  if (chosen == nullptr) GTEST_SKIP() << "every candidate composite op has a rule now";
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    return {chosen->call(a[0].toTensor(), a[1].toTensor())};
  };
  const Args args{torch::randn({2, 3}), torch::randn({2, 3})};
  TraceResult r = TraceIt(fn, args);
  const std::vector<std::string> ops = Ops(*r.graph);
  EXPECT_THAT(ops, ::testing::Not(::testing::Contains(chosen->name))) << chosen->name;
  EXPECT_GE(ops.size(), 2u) << chosen->name << " should have become its inner ops";
  ExpectSame(r.outputs, Eager(fn, args));
}

TEST(Trace, RegisteredCompositeOpsStayOneNode) {
  ASSERT_NE(ops::Registry::Global().Find("aten::matmul"), nullptr);
  ASSERT_NE(ops::Registry::Global().Find("aten::linear"), nullptr);
  at::Tensor w = torch::randn({5, 4}), bias = torch::randn({5});
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    return {torch::matmul(x, a[1].toTensor()), torch::linear(x, w, bias)};
  };
  const Args args{torch::randn({2, 3, 4}), torch::randn({4, 6})};
  TraceResult r = TraceIt(fn, args);
  EXPECT_THAT(Ops(*r.graph), ElementsAre("aten::matmul", "aten::linear"));
  for (const Node& n : r.graph->nodes) EXPECT_EQ(n.kind, NodeKind::kRule) << n.op;
  // matmul's composite kernel reads sizes of a 3-D input; run as one node, it reads nothing.
  EXPECT_THAT(r.reads, IsEmpty());
  EXPECT_THAT(r.rule_mismatches, IsEmpty());
  ExpectSame(r.outputs, Eager(fn, args));
}

// --- Metadata reads -----------------------------------------------------------------------------

struct ReadCase {
  const char* name;
  std::function<void(const at::Tensor&)> read;
  MetadataRead::What what;
  int dim;  // -1: every dim
};

TEST(Trace, SizeAndStrideReadsByUserCodeAreRecorded) {
  const std::vector<ReadCase> cases = {
      {"size(0)", [](const at::Tensor& x) { (void)x.size(0); }, MetadataRead::What::kSizes, 0},
      {"size(-1)", [](const at::Tensor& x) { (void)x.size(-1); }, MetadataRead::What::kSizes, 1},
      {"sizes()", [](const at::Tensor& x) { (void)x.sizes(); }, MetadataRead::What::kSizes, -1},
      {"dim()", [](const at::Tensor& x) { (void)x.dim(); }, MetadataRead::What::kRank, -1},
      {"numel()", [](const at::Tensor& x) { (void)x.numel(); }, MetadataRead::What::kSizes, -1},
      {"is_contiguous()", [](const at::Tensor& x) { (void)x.is_contiguous(); },
       MetadataRead::What::kStrides, -1},
      {"strides()", [](const at::Tensor& x) { (void)x.strides(); }, MetadataRead::What::kStrides, -1},
      {"stride(1)", [](const at::Tensor& x) { (void)x.stride(1); }, MetadataRead::What::kStrides, -1},
  };
  for (const ReadCase& c : cases) {
    auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
      c.read(a[1].toTensor());
      return {a[0].toTensor() + 1};
    };
    TraceResult r = TraceIt(fn, {torch::randn({2}), torch::randn({3, 4})});
    ASSERT_EQ(r.reads.size(), 1u) << c.name;
    EXPECT_EQ(r.reads[0].value, r.graph->arg_values[1]) << c.name;
    EXPECT_EQ(r.reads[0].what, c.what) << c.name;
    EXPECT_EQ(r.reads[0].dim, c.dim) << c.name;
    EXPECT_EQ(r.reads[0].by, "user code") << c.name;
  }
}

TEST(Trace, ReadsAreDeduplicatedPerValueKindAndDim) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    at::Tensor y = x * 2;
    int64_t n = x.size(0) + x.size(1) + x.sizes()[0];
    (void)x.strides();
    (void)x.is_contiguous();
    n += y.size(0);
    return {y + n};
  };
  TraceResult r = TraceIt(fn, {torch::randn({2, 3})});
  // x.size(0) (twice), x.size(1), x.sizes(), x's strides (twice), y.size(0).
  ASSERT_EQ(r.reads.size(), 5u);
  const ValueId x = r.graph->arg_values[0];
  const ValueId y = r.graph->nodes[0].returns[0].values[0];
  int x_sizes = 0, x_strides = 0, y_sizes = 0;
  for (const MetadataRead& m : r.reads) {
    EXPECT_EQ(m.by, "user code");
    x_sizes += m.value == x && m.what == MetadataRead::What::kSizes;
    x_strides += m.value == x && m.what == MetadataRead::What::kStrides;
    y_sizes += m.value == y && m.what == MetadataRead::What::kSizes;
  }
  EXPECT_EQ(x_sizes, 3);
  EXPECT_EQ(x_strides, 1);
  EXPECT_EQ(y_sizes, 1) << "reads of intermediates name the intermediate value";
  // The read value was baked into the graph as a constant: 2 + 3 + 2 + 2 = 9.
  EXPECT_EQ(r.graph->nodes[1].args[1].constant.toInt(), 9);
}

TEST(Trace, ReadsAfterTheTraceAreNotRecorded) {
  at::Tensor kept;
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    kept = a[0].toTensor();  // a wrapper
    return {a[0].toTensor().neg()};
  };
  TraceResult r = TraceIt(fn, {torch::randn({4, 5})});
  EXPECT_THAT(r.reads, IsEmpty());
  // Metadata of an escaped wrapper stays readable (it is the real tensor's) and is not recorded.
  EXPECT_EQ(kept.sizes(), c10::IntArrayRef({4, 5}));
  EXPECT_EQ(kept.dim(), 2);
  EXPECT_TRUE(kept.is_contiguous());
  EXPECT_THAT(r.reads, IsEmpty());
}

// --- Data-dependent reads -----------------------------------------------------------------------

TEST(Trace, ItemIsADataDependentNodeWithTheTracedValue) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    const double s = x.sum().item<double>();
    return {x * s};
  };
  const Args args{torch::full({3}, 2.0)};
  TraceResult r = TraceIt(fn, args);
  const Graph& g = *r.graph;
  ASSERT_THAT(Ops(g), ElementsAre("aten::sum", "aten::_local_scalar_dense", "aten::mul.Scalar"));
  const Node& item = g.nodes[1];
  EXPECT_EQ(item.kind, NodeKind::kDataDependent);
  ASSERT_EQ(item.returns.size(), 1u);
  EXPECT_EQ(item.returns[0].kind, NodeReturn::Kind::kScalar);
  const Value& v = g.value(item.returns[0].values[0]);
  EXPECT_FALSE(v.is_tensor);
  EXPECT_EQ(v.traced_scalar.toDouble(), 6.0);
  // The value went on into the graph as a constant, which is why it must be value-guarded.
  EXPECT_EQ(g.nodes[2].args[1].constant.toDouble(), 6.0);
  EXPECT_TRUE(r.untraceable.empty()) << r.untraceable;
  ExpectSame(r.outputs, Eager(fn, args));
}

TEST(Trace, DataDependentShapeOpIsDataDependent) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor().nonzero()}; };
  TraceResult r = TraceIt(fn, {torch::tensor({0.0, 1.0, 2.0})});
  ASSERT_THAT(Ops(*r.graph), ElementsAre("aten::nonzero"));
  EXPECT_EQ(r.graph->nodes[0].kind, NodeKind::kDataDependent);
  EXPECT_EQ(r.graph->value(r.graph->outputs[0]).meta.sizes, (std::vector<int64_t>{2, 1}));
  EXPECT_TRUE(r.untraceable.empty());
}

TEST(Trace, ItemAfterAnInPlaceOpIsUntraceable) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.add_(1);
    return {x * x.sum().item<double>()};
  };
  at::Tensor x = torch::ones({3});
  TraceResult r = TraceIt(fn, {x});
  EXPECT_EQ(r.untraceable,
            "data-dependent aten::_local_scalar_dense at %2 follows a mutation or random op, so a "
            "value-guard failure could not be undone");
  // The call itself still ran eagerly and correctly.
  EXPECT_TRUE(torch::allclose(r.outputs.at(0), torch::full({3}, 12.0)));
  EXPECT_TRUE(torch::equal(x, torch::full({3}, 2.0)));
}

TEST(Trace, ItemAfterARandomOpIsUntraceable) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor noise = torch::rand({3});
    return {a[0].toTensor() * noise.sum().item<double>()};
  };
  TraceResult r = TraceIt(fn, {torch::ones({3})});
  EXPECT_THAT(r.untraceable, HasSubstr("data-dependent aten::_local_scalar_dense at %2"));
}

TEST(Trace, ItemBeforeAnInPlaceOpIsTraceable) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    const double s = x.sum().item<double>();
    x.add_(s);
    return {x};
  };
  TraceResult r = TraceIt(fn, {torch::ones({3})});
  EXPECT_TRUE(r.untraceable.empty()) << r.untraceable;
  EXPECT_TRUE(r.graph->HasMutation());
}

TEST(Trace, ItemAfterWritingOnlyAFreshIntermediateIsTraceable) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor t = a[0].toTensor() * 2;
    t.add_(1);  // nothing outside the trace can observe this write
    return {t * t.sum().item<double>()};
  };
  TraceResult r = TraceIt(fn, {torch::ones({3})});
  EXPECT_TRUE(r.untraceable.empty()) << r.untraceable;
  EXPECT_TRUE(r.graph->HasMutation());
  EXPECT_THAT(r.graph->MutatedArgs(), IsEmpty());
}

TEST(Trace, ItemAfterWritingACapturedTensorIsUntraceable) {
  at::Tensor counter = torch::zeros({1});
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    counter.add_(1);
    return {a[0].toTensor() * a[0].toTensor().sum().item<double>()};
  };
  TraceResult r = TraceIt(fn, {torch::ones({3})});
  EXPECT_THAT(r.untraceable, HasSubstr("follows a mutation or random op"));
  EXPECT_EQ(counter.item<float>(), 1.0f) << "the trace ran the write once, eagerly";
}

// --- Raw data access ----------------------------------------------------------------------------

constexpr char kRawDataReason[] =
    "reads raw data of a traced tensor (data_ptr(), accessor(), printing); only item() and ATen "
    "ops are traceable";

TEST(Trace, RawDataAccessStopsTheTraceAndAsksForAnEagerRerun) {
  int calls = 0;
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    ++calls;
    at::Tensor x = a[0].toTensor();
    at::Tensor y = x + 1;
    const float first = x.data_ptr<float>()[0];
    return {y * first};
  };
  TraceResult r = TraceIt(fn, {torch::ones({3})});
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r.untraceable, kRawDataReason);
  EXPECT_TRUE(r.rerun_eagerly);
  EXPECT_THAT(r.outputs, IsEmpty()) << "the function did not return";
  EXPECT_FALSE(IsTracing());
}

TEST(Trace, AccessorIsRawDataAccessToo) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    auto acc = x.accessor<float, 1>();
    return {x * acc[0]};
  };
  TraceResult r = TraceIt(fn, {torch::ones({3})});
  EXPECT_EQ(r.untraceable, kRawDataReason);
  EXPECT_TRUE(r.rerun_eagerly);
}

TEST(Trace, RawDataAccessAfterWritingAFreshIntermediateCanStillRerun) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor t = a[0].toTensor().clone();
    t.mul_(2);
    return {t * t.data_ptr<float>()[0]};
  };
  at::Tensor x = torch::ones({3});
  TraceResult r = TraceIt(fn, {x});
  EXPECT_TRUE(r.rerun_eagerly);
  EXPECT_TRUE(torch::equal(x, torch::ones({3})));
}

TEST(Trace, RawDataAccessAfterWritingAnArgumentIsAWardenError) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.add_(1);
    return {x * x.data_ptr<float>()[0]};
  };
  try {
    TraceIt(fn, {torch::ones({3})});
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              std::string("warden: the function ") + kRawDataReason +
                  ", after it had already written an argument or captured tensor, so it cannot be "
                  "re-run eagerly; move the raw access before the in-place op or call the function "
                  "without warden");
  }
  EXPECT_FALSE(IsTracing());
}

TEST(Trace, OtherAtenErrorsAreNotMistakenForRawDataAccess) {
  auto bad_dim = [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor().sum(5)}; };
  EXPECT_THROW(TraceIt(bad_dim, {torch::ones({3})}), c10::IndexError);
  // LibTorch 1.13 raises a plain std::runtime_error for a bad view, 2.x a c10::Error; either must
  // arrive unchanged.
  auto bad_view = [](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor().view({7})}; };
  try {
    TraceIt(bad_view, {torch::ones({3})});
    FAIL() << "expected the eager error";
  } catch (const Error& e) {
    FAIL() << "became a warden::Error: " << e.what();
  } catch (const c10::Error& e) {
    EXPECT_STREQ(e.what_without_backtrace(), "shape '[7]' is invalid for input of size 3");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "shape '[7]' is invalid for input of size 3");
  }
}

// --- requires_grad ------------------------------------------------------------------------------

TEST(Trace, RequiresGradIsVisibleToUserCode) {
  bool seen = false, seen_plain = true;
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    seen = a[0].toTensor().requires_grad();
    seen_plain = a[1].toTensor().requires_grad();
    return {a[0].toTensor() * a[1].toTensor()};
  };
  at::Tensor x = torch::ones({2}, torch::requires_grad());
  TraceResult r = TraceIt(fn, {x, torch::ones({2})});
  EXPECT_TRUE(seen);
  EXPECT_FALSE(seen_plain);
  EXPECT_TRUE(r.graph->value(r.graph->arg_values[0]).meta.requires_grad);
  ASSERT_TRUE(r.outputs[0].requires_grad()) << "the eager result is differentiable";
  r.outputs[0].sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones({2})));
}

// --- Errors -------------------------------------------------------------------------------------

TEST(Trace, EagerErrorsPropagateUnchanged) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + a[1].toTensor()};
  };
  try {
    TraceIt(fn, {torch::ones({3}), torch::ones({4})});
    FAIL() << "expected c10::Error";
  } catch (const Error& e) {
    FAIL() << "eager errors must not become warden::Error: " << e.what();
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(),
                HasSubstr("The size of tensor a (3) must match the size of tensor b (4) at "
                          "non-singleton dimension 0"));
  }
  EXPECT_FALSE(IsTracing());
  // The next trace is unaffected.
  TraceResult r = TraceIt(fn, {torch::ones({3}), torch::ones({3})});
  EXPECT_THAT(Ops(*r.graph), ElementsAre("aten::add.Tensor"));
}

struct HostError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(Trace, ExceptionsOfTheFunctionPropagateUnchanged) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor y = a[0].toTensor() * 2;
    if (y.size(0) == 3) throw HostError("host says no");
    return {y};
  };
  try {
    TraceIt(fn, {torch::ones({3})});
    FAIL() << "expected HostError";
  } catch (const HostError& e) {
    EXPECT_STREQ(e.what(), "host says no");
  }
  EXPECT_FALSE(IsTracing());
  TraceResult r = TraceIt(fn, {torch::ones({2})});
  EXPECT_THAT(Ops(*r.graph), ElementsAre("aten::mul.Scalar"));
}

at::Tensor escaped;  // a traced tensor that the traced function smuggles out

TEST(Trace, EscapedTracedTensorIsAWardenErrorNotACrash) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor y = a[0].toTensor() * 2;
    escaped = y;
    return {y + 1};
  };
  TraceResult r = TraceIt(fn, {torch::ones({3})});
  ASSERT_TRUE(escaped.defined());
  ExpectSame(r.outputs, {torch::full({3}, 3.0)});
  try {
    at::Tensor z = escaped + 1;
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "warden: aten::add.Scalar was called on a traced tensor after its trace ended; "
                 "traced tensors must not escape the traced function");
  }
  EXPECT_THROW(escaped.clone(), Error);
  EXPECT_THROW(escaped.item<float>(), Error);
  EXPECT_THROW(torch::ones({3}).mul(escaped), Error);
  // Used inside a later trace, it is an error too (its trace state is gone).
  auto uses_escaped = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + escaped};
  };
  try {
    TraceIt(uses_escaped, {torch::ones({3})});
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("a tensor from another (finished) trace was used while tracing"));
    EXPECT_THAT(e.what(), HasSubstr("must not escape the traced function"));
  }
  // Passed back in as an argument, it is rejected up front (not mistaken for raw data access).
  try {
    TraceIt([](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor() + 1}; },
            {escaped});
    FAIL() << "expected warden::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "warden: argument 'arg0' is a traced tensor of another trace; traced tensors "
                 "must not escape the traced function");
  }
  EXPECT_FALSE(IsTracing());
  escaped.reset();
}

}  // namespace
}  // namespace warden::tracer

namespace warden::tracer {
namespace {

TEST(Trace, MissingArgumentNamesDefaultToArgN) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + a[1].toTensor()};
  };
  TraceResult r = Trace(fn, {torch::randn({2}), torch::randn({2})}, {"x"});
  EXPECT_EQ(r.graph->arg_names, (std::vector<std::string>{"x", "arg1"}));
  EXPECT_NE(r.graph->ToString().find("%arg1: f32[2]"), std::string::npos) << r.graph->ToString();
}

}  // namespace
}  // namespace warden::tracer
