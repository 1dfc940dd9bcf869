// Tests of guards/builder.cc on real traces: which guards a traced call gets (Note [Which guards]),
// with which expected values and provenance, and Dedupe.
#include "guards/builder.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <c10/core/DefaultDtype.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "guards/evaluator.h"
#include "ops/shape_pass.h"
#include "tracer/tracer.h"

namespace warden::guards {
namespace {

using ::testing::HasSubstr;
using Args = std::vector<c10::IValue>;

struct Built {
  tracer::TraceResult trace;
  std::vector<Guard> guards;
  std::vector<std::string> names;
};

Built Build(const tracer::TracedFn& fn, const Args& args, std::vector<std::string> names = {}) {
  for (size_t i = names.size(); i < args.size(); ++i) names.push_back("arg" + std::to_string(i));
  Built b;
  b.names = names;
  b.trace = tracer::Trace(fn, args, names);
  EXPECT_TRUE(b.trace.untraceable.empty()) << b.trace.untraceable;
  BuildInput in{b.trace.graph.get(), &b.trace.reads, &args};
  b.guards = BuildGuards(in);
  return b;
}

// The same with the symbolic shape pass over the (arg, dim) pairs in `dynamic` (dim -1: all).
Built BuildDynamic(const tracer::TracedFn& fn, const Args& args,
                   const std::set<std::pair<int, int>>& dynamic) {
  Built b;
  for (size_t i = 0; i < args.size(); ++i) b.names.push_back("arg" + std::to_string(i));
  b.trace = tracer::Trace(fn, args, b.names);
  EXPECT_TRUE(b.trace.untraceable.empty()) << b.trace.untraceable;
  const ops::ShapePassResult shapes = ops::PropagateShapes(*b.trace.graph, b.trace.reads, dynamic);
  BuildInput in{b.trace.graph.get(), &b.trace.reads, &args};
  in.shapes = &shapes;
  b.guards = BuildGuards(in);
  return b;
}

std::vector<std::string> Texts(const Built& b, GuardKind kind) {
  std::vector<std::string> out;
  for (const Guard& g : b.guards) {
    if (g.kind == kind) out.push_back(Describe(g, b.names) + "  # " + g.provenance);
  }
  return out;
}

std::vector<const Guard*> All(const std::vector<Guard>& guards, GuardKind kind, int arg = -2) {
  std::vector<const Guard*> out;
  for (const Guard& g : guards) {
    if (g.kind == kind && (arg == -2 || g.arg == arg)) out.push_back(&g);
  }
  return out;
}

const Guard* Find(const std::vector<Guard>& guards, GuardKind kind, int arg = -1, int dim = -1) {
  for (const Guard& g : guards) {
    if (g.kind == kind && g.arg == arg && g.dim == dim) return &g;
  }
  return nullptr;
}

// Every guard as "describe  # provenance", for readable failure messages.
std::string Dump(const Built& b) {
  std::string out;
  for (const Guard& g : b.guards) out += Describe(g, b.names) + "  # " + g.provenance + "\n";
  return out;
}

std::vector<at::Tensor> ExpOfFirst(const Args& a) { return {a[0].toTensor().exp()}; }

TEST(BuildGuards, AlwaysGuardsGlobalStateArgumentCountAndTypes) {
  const Args args{torch::zeros({2}), int64_t{1}, at::Tensor()};
  Built b = Build(ExpOfFirst, args);
  const Guard* grad = Find(b.guards, GuardKind::kGradMode);
  ASSERT_NE(grad, nullptr) << Dump(b);
  EXPECT_EQ(grad->expected, 1);
  const Guard* inference = Find(b.guards, GuardKind::kInferenceMode);
  ASSERT_NE(inference, nullptr);
  EXPECT_EQ(inference->expected, 0);
  const Guard* count = Find(b.guards, GuardKind::kArgCount);
  ASSERT_NE(count, nullptr);
  EXPECT_EQ(count->expected, 3);
  ASSERT_EQ(All(b.guards, GuardKind::kArgType).size(), 3u);
  EXPECT_EQ(Find(b.guards, GuardKind::kArgType, 0)->expected, static_cast<int64_t>(ArgType::kTensor));
  EXPECT_EQ(Find(b.guards, GuardKind::kArgType, 1)->expected, static_cast<int64_t>(ArgType::kInt));
  EXPECT_EQ(Find(b.guards, GuardKind::kArgType, 2)->expected,
            static_cast<int64_t>(ArgType::kUndefinedTensor));
  // An undefined tensor has nothing else to guard.
  for (const Guard& g : b.guards) {
    if (g.arg == 2) {
      EXPECT_EQ(g.kind, GuardKind::kArgType) << Dump(b);
    }
  }
  // The built guards hold for the call they were built from.
  EXPECT_TRUE(GuardProgram(b.guards).Check(args)) << Dump(b);
}

TEST(BuildGuards, GradModeIsGuardedAtItsTracedValue) {
  torch::NoGradGuard no_grad;
  Built b = Build(ExpOfFirst, {torch::zeros({2})});
  ASSERT_NE(Find(b.guards, GuardKind::kGradMode), nullptr);
  EXPECT_EQ(Find(b.guards, GuardKind::kGradMode)->expected, 0);
}

TEST(BuildGuards, UnusedTensorGetsMetadataButNoShapeGuards) {
  const Args args{torch::zeros({3, 4}), torch::zeros({5, 6}, torch::kDouble)};
  Built b = Build(ExpOfFirst, args);
  ASSERT_NE(Find(b.guards, GuardKind::kDtype, 1), nullptr) << Dump(b);
  EXPECT_EQ(Find(b.guards, GuardKind::kDtype, 1)->expected, static_cast<int64_t>(at::kDouble));
  EXPECT_NE(Find(b.guards, GuardKind::kDevice, 1), nullptr);
  EXPECT_NE(Find(b.guards, GuardKind::kLayout, 1), nullptr);
  EXPECT_NE(Find(b.guards, GuardKind::kRequiresGrad, 1), nullptr);
  EXPECT_TRUE(All(b.guards, GuardKind::kRank, 1).empty()) << Dump(b);
  EXPECT_TRUE(All(b.guards, GuardKind::kSize, 1).empty()) << Dump(b);
  EXPECT_TRUE(All(b.guards, GuardKind::kStride, 1).empty()) << Dump(b);
  // So any shape of the unused argument passes the program.
  const GuardProgram program(b.guards);
  EXPECT_TRUE(program.Check({torch::zeros({3, 4}), torch::zeros({1, 2, 3}, torch::kDouble)}));
  EXPECT_FALSE(program.Check({torch::zeros({3, 4}), torch::zeros({5, 6})})) << "dtype still guarded";
}

TEST(BuildGuards, UsedTensorGetsRankAndEverySize) {
  Built b = Build(ExpOfFirst, {torch::zeros({3, 4, 5})});
  const Guard* rank = Find(b.guards, GuardKind::kRank, 0);
  ASSERT_NE(rank, nullptr) << Dump(b);
  EXPECT_EQ(rank->expected, 3);
  EXPECT_EQ(rank->provenance, "used by aten::exp at %0");
  ASSERT_EQ(All(b.guards, GuardKind::kSize, 0).size(), 3u) << Dump(b);
  for (int d = 0; d < 3; ++d) {
    const Guard* size = Find(b.guards, GuardKind::kSize, 0, d);
    ASSERT_NE(size, nullptr) << d;
    EXPECT_EQ(size->expected, 3 + d);
    EXPECT_EQ(size->provenance, "used by aten::exp at %0 (static shapes)");
  }
  EXPECT_TRUE(All(b.guards, GuardKind::kStride).empty()) << "strides were never read\n" << Dump(b);
  // A non-contiguous input of the same shape passes: replay handles any layout.
  EXPECT_TRUE(GuardProgram(b.guards).Check({torch::zeros({5, 4, 3}).permute({2, 1, 0})}));
}

TEST(BuildGuards, ProvenanceNamesTheFirstUsingOpAndNode) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor().sin().cos();
    return {x + a[1].toTensor(), a[2].toTensor()};
  };
  Built b = Build(fn, {torch::zeros({2}), torch::zeros({2}), torch::zeros({3})}, {"x", "bias", "z"});
  EXPECT_EQ(Find(b.guards, GuardKind::kRank, 0)->provenance, "used by aten::sin at %0");
  EXPECT_EQ(Find(b.guards, GuardKind::kRank, 1)->provenance, "used by aten::add.Tensor at %2");
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 1, 0)->provenance,
            "used by aten::add.Tensor at %2 (static shapes)");
  EXPECT_EQ(Find(b.guards, GuardKind::kRank, 2)->provenance, "returned as an output");
}

TEST(BuildGuards, SizeReadByUserCodeGuardsAnOtherwiseUnusedTensor) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() * a[1].toTensor().size(1)};
  };
  Built b = Build(fn, {torch::zeros({2}), torch::zeros({7, 8})});
  const Guard* rank = Find(b.guards, GuardKind::kRank, 1);
  ASSERT_NE(rank, nullptr) << Dump(b);
  EXPECT_EQ(rank->provenance, "read by user code");
  ASSERT_NE(Find(b.guards, GuardKind::kSize, 1, 1), nullptr);
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 1, 1)->expected, 8);
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 1, 0)->expected, 7);
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 1, 0)->provenance, "read by user code (static shapes)");
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 0, 0)->provenance,
            "used by aten::mul.Scalar at %0 (static shapes)");
}

TEST(BuildGuards, StridesAreGuardedOnlyWhenRead) {
  auto reads = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    return {x.is_contiguous() ? x + 1 : x - 1, a[1].toTensor() * 2};
  };
  const at::Tensor x = torch::zeros({4, 3}).t();  // strides [1, 3]
  Built b = Build(reads, {x, torch::zeros({2, 2})});
  ASSERT_EQ(All(b.guards, GuardKind::kStride, 0).size(), 2u) << Dump(b);
  EXPECT_EQ(Find(b.guards, GuardKind::kStride, 0, 0)->expected, 1);
  EXPECT_EQ(Find(b.guards, GuardKind::kStride, 0, 1)->expected, 3);
  EXPECT_EQ(Find(b.guards, GuardKind::kStride, 0, 0)->provenance, "read by user code");
  EXPECT_TRUE(All(b.guards, GuardKind::kStride, 1).empty()) << "arg1's strides were not read";
  // The same layout hits; a contiguous input of the same shape does not.
  const GuardProgram program(b.guards);
  EXPECT_TRUE(program.Check({torch::ones({4, 3}).t(), torch::zeros({2, 2})}));
  EXPECT_FALSE(program.Check({torch::ones({3, 4}), torch::zeros({2, 2})}));
  EXPECT_TRUE(program.Check({torch::ones({4, 3}).t(), torch::zeros({2, 2}).t()}));
}

TEST(BuildGuards, StrideReadOnAnIntermediateGuardsEveryUsedArgument) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor t = a[0].toTensor() + a[1].toTensor();
    return {t.is_contiguous() ? t : t.contiguous()};
  };
  Built b = Build(fn, {torch::zeros({2, 3}), torch::zeros({3}), torch::zeros({5})});
  ASSERT_EQ(All(b.guards, GuardKind::kStride, 0).size(), 2u) << Dump(b);
  ASSERT_EQ(All(b.guards, GuardKind::kStride, 1).size(), 1u) << Dump(b);
  EXPECT_EQ(Find(b.guards, GuardKind::kStride, 1, 0)->provenance,
            "strides of %0 read by user code");
  EXPECT_TRUE(All(b.guards, GuardKind::kStride, 2).empty()) << "arg2 is unused\n" << Dump(b);
}

TEST(BuildGuards, StrideReadOfAnUnusedTensorGuardsRankAndStridesOnly) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const int64_t s = a[1].toTensor().stride(0);
    return {a[0].toTensor() * s};
  };
  Built b = Build(fn, {torch::zeros({2}), torch::zeros({3, 5})});
  ASSERT_NE(Find(b.guards, GuardKind::kRank, 1), nullptr) << Dump(b);
  EXPECT_EQ(Find(b.guards, GuardKind::kRank, 1)->expected, 2);
  EXPECT_EQ(Find(b.guards, GuardKind::kStride, 1, 0)->expected, 5);
  EXPECT_EQ(Find(b.guards, GuardKind::kStride, 1, 1)->expected, 1);
  EXPECT_TRUE(All(b.guards, GuardKind::kSize, 1).empty()) << Dump(b);
}

TEST(BuildGuards, ScalarsGetValueGuards) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    return {a[3].toBool() ? x * a[1].toInt() : x + a[2].toDouble()};
  };
  Built b = Build(fn, {torch::zeros({2}), int64_t{3}, -0.0, true, 2.5});
  const Guard* i = Find(b.guards, GuardKind::kIntValue, 1);
  ASSERT_NE(i, nullptr) << Dump(b);
  EXPECT_EQ(i->expected, 3);
  EXPECT_EQ(i->provenance, "scalar arguments are specialized (static)");
  const Guard* d = Find(b.guards, GuardKind::kDoubleValue, 2);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(std::signbit(d->expected_double));
  EXPECT_EQ(d->expected_double, 0.0);
  const Guard* flag = Find(b.guards, GuardKind::kBoolValue, 3);
  ASSERT_NE(flag, nullptr);
  EXPECT_EQ(flag->expected, 1);
  // A scalar the code never looked at is guarded too: C++ can branch on it invisibly.
  ASSERT_NE(Find(b.guards, GuardKind::kDoubleValue, 4), nullptr);
  EXPECT_EQ(Find(b.guards, GuardKind::kDoubleValue, 4)->expected_double, 2.5);
  // Scalars get no tensor guards.
  for (const Guard& g : b.guards) {
    if (g.arg >= 1) {
      EXPECT_TRUE(g.kind == GuardKind::kArgType || g.kind == GuardKind::kIntValue ||
                  g.kind == GuardKind::kDoubleValue || g.kind == GuardKind::kBoolValue)
          << Dump(b);
    }
  }
  const GuardProgram program(b.guards);
  EXPECT_TRUE(program.Check({torch::ones({2}), int64_t{3}, -0.0, true, 2.5}));
  EXPECT_FALSE(program.Check({torch::ones({2}), int64_t{3}, 0.0, true, 2.5}));
  EXPECT_FALSE(program.Check({torch::ones({2}), int64_t{4}, -0.0, true, 2.5}));
  EXPECT_FALSE(program.Check({torch::ones({2}), int64_t{3}, -0.0, false, 2.5}));
  EXPECT_FALSE(program.Check({torch::ones({2}), 3.0, -0.0, true, 2.5}));
}

TEST(BuildGuards, NoAliasingGuardsWithoutMutation) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + a[1].toTensor()};
  };
  const at::Tensor t = torch::zeros({3});
  Built b = Build(fn, {t, torch::zeros({3})});
  EXPECT_TRUE(All(b.guards, GuardKind::kAliasing).empty()) << Dump(b);
  EXPECT_TRUE(GuardProgram(b.guards).Check({t, t.view({3})})) << "storage sharing does not matter here";
  // Identity does (Note [Argument identity]): C++ code may have compared the two.
  EXPECT_FALSE(GuardProgram(b.guards).Check({t, t})) << Dump(b);
  ASSERT_EQ(All(b.guards, GuardKind::kArgIdentity).size(), 1u) << Dump(b);
}

TEST(BuildGuards, CapturedTensorsAreGuardedAsTheTraceFirstSawThem) {
  at::Tensor w = torch::ones({2, 3});
  auto fn = [&](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor y = a[0].toTensor() * w;
    w.resize_({4});  // after the graph read it: the guard keeps the metadata it was read with
    return {y};
  };
  Built b = Build(fn, {torch::ones({2, 3})});
  const std::vector<const Guard*> captured = All(b.guards, GuardKind::kCapturedTensor);
  ASSERT_EQ(captured.size(), 1u) << Dump(b);
  EXPECT_EQ(captured[0]->captured->sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Describe(*captured[0], {}), "%c0 (captured): Float[2, 3] strides [3, 1] offset 0 on cpu, requires_grad false");
  EXPECT_FALSE(GuardProgram(b.guards).Check({torch::ones({2, 3})})) << "w is [4] now";
  w.resize_({2, 3});
  EXPECT_TRUE(GuardProgram(b.guards).Check({torch::ones({2, 3})}));
  EXPECT_TRUE(All(b.guards, GuardKind::kArgIdentity).empty()) << "one tensor argument: nothing to compare";
}

TEST(BuildGuards, MutatedArgumentIsGuardedAgainstAliasingWithUsedTensors) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.add_(1);
    return {x * a[1].toTensor() * a[3].toInt()};
  };
  const Args args{torch::zeros({3}), torch::zeros({3}), torch::zeros({3}), int64_t{2}};
  Built b = Build(fn, args, {"x", "y", "unused", "n"});
  const std::vector<const Guard*> alias = All(b.guards, GuardKind::kAliasing);
  ASSERT_EQ(alias.size(), 1u) << "only (x, y): 'unused' is unused and 'n' is a scalar\n" << Dump(b);
  EXPECT_EQ(alias[0]->arg, 0);
  EXPECT_EQ(alias[0]->other_arg, 1);
  EXPECT_EQ(alias[0]->expected, 0);
  EXPECT_EQ(alias[0]->provenance, "the graph writes 'x'");
  EXPECT_EQ(Describe(*alias[0], b.names), "!shares_storage(x, y)");
  const GuardProgram program(b.guards);
  const at::Tensor z = torch::zeros({3});
  EXPECT_FALSE(program.Check({z, z, torch::zeros({3}), int64_t{2}}));
  EXPECT_EQ(program.FirstFailure({z, z, torch::zeros({3}), int64_t{2}}, b.names),
            "tensor 'x' aliasing mismatch with 'y'. expected distinct storage, actual shared storage");
}

TEST(BuildGuards, AliasingGuardRecordsSharedStorageAtTraceTimeAndOrdersThePair) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    a[1].toTensor().view({-1}).mul_(2);  // writes arg1 through a view
    return {a[0].toTensor() + 1};
  };
  const at::Tensor base = torch::ones({2, 2});
  Built b = Build(fn, {base.select(0, 0), base});
  const std::vector<const Guard*> alias = All(b.guards, GuardKind::kAliasing);
  ASSERT_EQ(alias.size(), 1u) << Dump(b);
  EXPECT_EQ(alias[0]->arg, 0) << "the pair is stored low index first";
  EXPECT_EQ(alias[0]->other_arg, 1);
  EXPECT_EQ(alias[0]->expected, 1);
  EXPECT_EQ(alias[0]->provenance, "the graph writes 'arg1'");
}

TEST(BuildGuards, MutatingOnlyAnIntermediateNeedsNoAliasingGuard) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor t = a[0].toTensor() * 2;
    t.relu_();
    return {t + a[1].toTensor()};
  };
  Built b = Build(fn, {torch::zeros({3}), torch::zeros({3})});
  EXPECT_TRUE(b.trace.graph->HasMutation());
  EXPECT_TRUE(All(b.guards, GuardKind::kAliasing).empty()) << Dump(b);
}

TEST(BuildGuards, DefaultDtypeOnlyWithAFactoryOpOrAFloatScalar) {
  auto pure = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + a[0].toTensor() * 2};
  };
  auto factory = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + torch::zeros({2})};
  };
  auto random = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + torch::randn({2})};
  };
  auto float_scalar = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() * 0.5};
  };
  const Args ints{torch::ones({2}, torch::kLong)};
  EXPECT_EQ(Find(Build(pure, ints).guards, GuardKind::kDefaultDtype), nullptr);
  for (const auto& fn : {tracer::TracedFn(factory), tracer::TracedFn(random), tracer::TracedFn(float_scalar)}) {
    Built b = Build(fn, ints);
    const Guard* g = Find(b.guards, GuardKind::kDefaultDtype);
    ASSERT_NE(g, nullptr) << Dump(b);
    EXPECT_EQ(g->expected, static_cast<int64_t>(at::kFloat));
    EXPECT_EQ(g->provenance, "a factory op or a floating-point scalar may have taken the default dtype");
  }
}

TEST(BuildGuards, DefaultDtypeGuardHasTheTracedDefault) {
  auto factory = [](const Args& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + torch::ones({2})};
  };
  const caffe2::TypeMeta previous = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  Built b = Build(factory, {torch::ones({2}, torch::kDouble)});
  c10::set_default_dtype(previous);
  const Guard* g = Find(b.guards, GuardKind::kDefaultDtype);
  ASSERT_NE(g, nullptr) << Dump(b);
  EXPECT_EQ(g->expected, static_cast<int64_t>(at::kDouble));
  EXPECT_FALSE(GuardProgram(b.guards).Check({torch::ones({2}, torch::kDouble)}))
      << "the default dtype is Float again";
}

TEST(BuildGuards, ResultIsDeduplicated) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    (void)x.size(0);
    return {x + x, x};
  };
  Built b = Build(fn, {torch::zeros({2, 3})});
  EXPECT_EQ(All(b.guards, GuardKind::kRank, 0).size(), 1u) << Dump(b);
  EXPECT_EQ(All(b.guards, GuardKind::kSize, 0).size(), 2u) << Dump(b);
  EXPECT_EQ(Find(b.guards, GuardKind::kRank, 0)->provenance, "read by user code");
}

// --- With the symbolic shape pass ----------------------------------------------------------------

std::vector<at::Tensor> AddTwice(const Args& a) {
  at::Tensor x = a[0].toTensor(), y = a[1].toTensor();
  return {(x + y) + y};
}

TEST(BuildGuardsDynamic, BroadcastBecomesRelationsAndSymbolsGetAtLeastTwo) {
  Built b = BuildDynamic(AddTwice, {torch::zeros({3, 4}), torch::zeros({3, 4})}, {{0, -1}, {1, -1}});
  EXPECT_TRUE(All(b.guards, GuardKind::kSize).empty()) << Dump(b);
  EXPECT_THAT(Texts(b, GuardKind::kSizeAtLeast),
              ::testing::ElementsAre("arg0.size(0) >= 2  # dynamic dim (sizes 0 and 1 always specialize)",
                                     "arg0.size(1) >= 2  # dynamic dim (sizes 0 and 1 always specialize)"));
  // Both adds require y's dims to equal x's; the second requirement is implied by the first and
  // yields no second guard.
  EXPECT_THAT(Texts(b, GuardKind::kSizeRelation),
              ::testing::ElementsAre("arg1.size(0) == arg0.size(0)  # required by aten::add.Tensor at %0",
                                     "arg1.size(1) == arg0.size(1)  # required by aten::add.Tensor at %0"));
  const GuardProgram program(b.guards);
  EXPECT_TRUE(program.Check({torch::zeros({5, 6}), torch::zeros({5, 6})}));
  EXPECT_FALSE(program.Check({torch::zeros({5, 6}), torch::zeros({5, 1})})) << "broadcast differs";
  EXPECT_FALSE(program.Check({torch::zeros({1, 6}), torch::zeros({1, 6})})) << "size 1 specializes";
  EXPECT_EQ(program.FirstFailure({torch::zeros({5, 6}), torch::zeros({5, 1})}, b.names),
            "arg1.size(1) == arg0.size(1) failed: 1 vs 6 (required by aten::add.Tensor at %0)");
}

TEST(BuildGuardsDynamic, SizeOneAndReadSizesStayStatic) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    return {x.sin() * x.size(1), a[1].toTensor().cos()};
  };
  Built b = BuildDynamic(fn, {torch::zeros({1, 5, 6}), torch::zeros({1, 7})}, {{0, -1}, {1, -1}});
  // Size 1 never becomes a symbol.
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 0, 0)->expected, 1);
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 1, 0)->expected, 1);
  // A size read specializes exactly the dim that was read.
  ASSERT_NE(Find(b.guards, GuardKind::kSize, 0, 1), nullptr) << Dump(b);
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 0, 1)->expected, 5);
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 0, 1)->provenance, "%arg0.size(1) read by user code");
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 0, 2), nullptr) << Dump(b);
  ASSERT_NE(Find(b.guards, GuardKind::kSizeAtLeast, 0, 2), nullptr) << Dump(b);
  EXPECT_EQ(Find(b.guards, GuardKind::kSizeAtLeast, 0, 2)->expected, 2);
  // The other argument's free dim stays dynamic.
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 1, 1), nullptr) << Dump(b);
  ASSERT_NE(Find(b.guards, GuardKind::kSizeAtLeast, 1, 1), nullptr) << Dump(b);
  const GuardProgram program(b.guards);
  EXPECT_TRUE(program.Check({torch::zeros({1, 5, 6}), torch::zeros({1, 70})}));
  EXPECT_TRUE(program.Check({torch::zeros({1, 5, 7}), torch::zeros({1, 7})})) << "dim 2 was not read";
  EXPECT_FALSE(program.Check({torch::zeros({1, 4, 6}), torch::zeros({1, 7})})) << "dim 1 was read";
  EXPECT_FALSE(program.Check({torch::zeros({1, 5, 6}), torch::zeros({2, 7})}));
}

TEST(BuildGuardsDynamic, RelationOverASum) {
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::cat({a[0].toTensor(), a[1].toTensor()}, 0) + a[2].toTensor()};
  };
  Built b = BuildDynamic(fn, {torch::zeros({2, 3}), torch::zeros({4, 3}), torch::zeros({6, 3})},
                         {{0, 0}, {1, 0}, {2, 0}});
  EXPECT_THAT(Texts(b, GuardKind::kSizeRelation),
              ::testing::ElementsAre(
                  "arg2.size(0) == arg0.size(0) + arg1.size(0)  # required by aten::add.Tensor at %1"));
  EXPECT_EQ(Find(b.guards, GuardKind::kSize, 2, 0), nullptr) << Dump(b);
  const GuardProgram program(b.guards);
  EXPECT_TRUE(program.Check({torch::zeros({3, 3}), torch::zeros({5, 3}), torch::zeros({8, 3})}));
  EXPECT_FALSE(program.Check({torch::zeros({3, 3}), torch::zeros({5, 3}), torch::zeros({9, 3})}));
}

TEST(BuildGuardsDynamic, WithoutDynamicDimsMatchesTheStaticBuilder) {
  const Args args{torch::zeros({3, 4}), torch::zeros({3, 4})};
  Built dynamic = BuildDynamic(AddTwice, args, {});
  Built fixed = Build(AddTwice, args);
  std::vector<std::string> a, b;
  for (const Guard& g : dynamic.guards) a.push_back(Describe(g, dynamic.names) + " # " + g.provenance);
  for (const Guard& g : fixed.guards) b.push_back(Describe(g, fixed.names) + " # " + g.provenance);
  EXPECT_EQ(a, b);
}

TEST(Dedupe, DropsExactDuplicatesKeepingTheFirstProvenance) {
  Guard a{GuardKind::kSize, 0, 1, -1, 4, 0, "first"};
  Guard a_again{GuardKind::kSize, 0, 1, -1, 4, 0, "second"};
  Guard other_dim{GuardKind::kSize, 0, 0, -1, 4, 0, "dim 0"};
  Guard other_value{GuardKind::kSize, 0, 1, -1, 5, 0, "value 5"};
  Guard zero{GuardKind::kDoubleValue, 1, -1, -1, 0, 0.0, "+0"};
  Guard negative_zero{GuardKind::kDoubleValue, 1, -1, -1, 0, -0.0, "-0"};
  Guard zero_again{GuardKind::kDoubleValue, 1, -1, -1, 0, 0.0, "+0 again"};
  const std::vector<Guard> out =
      Dedupe({a, a_again, other_dim, other_value, zero, negative_zero, zero_again});
  std::vector<std::string> provenance;
  for (const Guard& g : out) provenance.push_back(g.provenance);
  EXPECT_THAT(provenance, ::testing::ElementsAre("first", "dim 0", "value 5", "+0", "-0"));
}

}  // namespace
}  // namespace warden::guards
