// Note [Which guards]
// - Always: global state the replay depends on (grad mode and inference mode change what ATen
//   returns), the argument count, each argument's type, and for tensors dtype, device, layout and
//   requires_grad. dtype has to be guarded even for unused tensors because user code can branch
//   on it without the tracer seeing the read (TensorImpl::dtype() is not virtual).
// - Rank and sizes: only for tensors the graph uses (an input of some node, an output) or whose
//   sizes were read by user code or a composite kernel. An argument the graph never reads gets no
//   shape guard and never recompiles on a new shape.
// - Strides: only where strides were read (is_contiguous(), strides(), ...). The replay backend
//   calls the same ATen ops, which handle any layout exactly as eager does, so nothing else in the
//   artifact depends on strides. A read on an intermediate value guards the strides of every used
//   argument, because layout propagates through ops in ways the graph does not track.
// - Scalars: type and value (NaN equals NaN; -0.0 differs from 0.0): C++ code turns them into op
//   arguments invisibly, so the graph is valid for exactly the traced value.
// - Aliasing: when the graph writes an argument (or a view of one), which other arguments share
//   its storage changes the results, so storage sharing is guarded pairwise against the written
//   arguments.
// - Default dtype: when a factory op or a floating-point scalar argument could have used it.
#include "guards/builder.h"

#include <set>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"

namespace warden::guards {
namespace {

using tracer::Graph;
using tracer::NodeArg;
using tracer::ValueId;

// First node that uses each argument, for provenance ("used by aten::add.Tensor at %0").
std::vector<std::string> FirstUse(const Graph& g) {
  std::vector<std::string> use(g.arg_kinds.size());
  auto mark = [&](ValueId id, const std::string& by) {
    if (id == tracer::kNoValue) return;
    const int arg = g.BaseArg(id);
    if (arg >= 0 && use[arg].empty()) use[arg] = by;
  };
  for (const tracer::Node& n : g.nodes) {
    const std::string by = absl::StrCat("used by ", n.op, " at %", n.index);
    for (const NodeArg& a : n.args) {
      if (a.kind == NodeArg::Kind::kValue) mark(a.value, by);
      for (ValueId id : a.values) mark(id, by);
    }
  }
  for (ValueId id : g.outputs) mark(id, "returned as an output");
  return use;
}

bool UsesDefaultDtype(const Graph& g) {
  for (const tracer::Node& n : g.nodes) {
    if (n.factory) return true;
    for (const NodeArg& a : n.args) {
      if (a.kind == NodeArg::Kind::kConstant && (a.constant.isDouble() ||
                                                 (a.constant.isScalar() && a.constant.toScalar().isFloatingPoint()))) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

std::vector<Guard> Dedupe(std::vector<Guard> guards) {
  std::set<std::tuple<int, int, int, int, int64_t>> seen;
  std::vector<Guard> out;
  for (Guard& g : guards) {
    int64_t key = g.expected;
    if (g.kind == GuardKind::kDoubleValue) std::memcpy(&key, &g.expected_double, 8);
    if (!seen.insert({static_cast<int>(g.kind), g.arg, g.dim, g.other_arg, key}).second) continue;
    out.push_back(std::move(g));
  }
  return out;
}

std::vector<Guard> BuildGuards(const BuildInput& in) {
  const Graph& g = *in.graph;
  const std::vector<c10::IValue>& args = *in.args;
  std::vector<Guard> out;
  auto add = [&](Guard guard) { out.push_back(std::move(guard)); };

  add({GuardKind::kGradMode, -1, -1, -1, c10::GradMode::is_enabled(), 0,
       "autograd recording of the replayed ops depends on it"});
  add({GuardKind::kInferenceMode, -1, -1, -1, c10::InferenceMode::is_enabled(), 0,
       "inference tensors and autograd state of the outputs depend on it"});
  if (UsesDefaultDtype(g)) {
    add({GuardKind::kDefaultDtype, -1, -1, -1,
         static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())), 0,
         "a factory op or a floating-point scalar may have taken the default dtype"});
  }
  add({GuardKind::kArgCount, -1, -1, -1, static_cast<int64_t>(args.size()), 0,
       "the function was traced with this many arguments"});

  const std::vector<std::string> first_use = FirstUse(g);
  // Sizes and strides read through wrappers, per argument.
  std::vector<std::string> size_read(args.size()), stride_read(args.size());
  std::string intermediate_stride_read;
  for (const tracer::MetadataRead& r : *in.reads) {
    const int arg = g.BaseArg(r.value);
    const bool is_input = g.value(r.value).kind == tracer::ValueKind::kInput;
    const std::string by = absl::StrCat("read by ", r.by);
    if (r.what == tracer::MetadataRead::What::kSizes) {
      // A size read on an intermediate needs nothing extra: every used argument's sizes are
      // guarded anyway under static shapes.
      if (arg >= 0 && size_read[arg].empty()) size_read[arg] = by;
    } else if (is_input) {
      if (stride_read[arg].empty()) stride_read[arg] = by;
    } else if (intermediate_stride_read.empty()) {
      intermediate_stride_read = absl::StrCat("strides of ", g.ValueName(r.value), " ", by);
    }
  }

  for (size_t i = 0; i < args.size(); ++i) {
    const int a = static_cast<int>(i);
    const ArgType type = ArgTypeOf(args[i]);
    add({GuardKind::kArgType, a, -1, -1, static_cast<int64_t>(type), 0, "every argument's type is guarded"});
    switch (type) {
      case ArgType::kInt:
        add({GuardKind::kIntValue, a, -1, -1, args[i].toInt(), 0,
             "scalar arguments are specialized (static)"});
        continue;
      case ArgType::kBool:
        add({GuardKind::kBoolValue, a, -1, -1, args[i].toBool(), 0,
             "scalar arguments are specialized (static)"});
        continue;
      case ArgType::kDouble: {
        Guard d{GuardKind::kDoubleValue, a, -1, -1, 0, args[i].toDouble(),
                "scalar arguments are specialized (static)"};
        add(d);
        continue;
      }
      case ArgType::kTensor:
        break;
      default:
        continue;
    }
    const at::Tensor& t = args[i].toTensor();
    const std::string meta = "tensor metadata is not observable to the tracer: always guarded";
    add({GuardKind::kDtype, a, -1, -1, static_cast<int64_t>(t.scalar_type()), 0, meta});
    add({GuardKind::kDevice, a, -1, -1,
         (static_cast<int64_t>(t.device().type()) << 16) | (static_cast<int64_t>(t.device().index()) & 0xffff),
         0, meta});
    add({GuardKind::kLayout, a, -1, -1, static_cast<int64_t>(t.layout()), 0, meta});
    add({GuardKind::kRequiresGrad, a, -1, -1, t.requires_grad(), 0, meta});

    std::string why = !size_read[i].empty() ? size_read[i] : first_use[i];
    if (!why.empty()) {
      add({GuardKind::kRank, a, -1, -1, t.dim(), 0, why});
      for (int64_t d = 0; d < t.dim(); ++d) {
        add({GuardKind::kSize, a, static_cast<int>(d), -1, t.sizes()[d], 0,
             absl::StrCat(why, " (static shapes)")});
      }
    }
    std::string stride_why = stride_read[i];
    if (stride_why.empty() && !intermediate_stride_read.empty() && !first_use[i].empty()) {
      stride_why = intermediate_stride_read;
    }
    if (!stride_why.empty()) {
      if (why.empty()) add({GuardKind::kRank, a, -1, -1, t.dim(), 0, stride_why});
      for (int64_t d = 0; d < t.dim(); ++d) {
        add({GuardKind::kStride, a, static_cast<int>(d), -1, t.strides()[d], 0, stride_why});
      }
    }
  }

  const std::vector<int> mutated = g.MutatedArgs();
  for (int m : mutated) {
    for (size_t j = 0; j < args.size(); ++j) {
      if (static_cast<int>(j) == m || ArgTypeOf(args[j]) != ArgType::kTensor) continue;
      if (first_use[j].empty() && size_read[j].empty()) continue;
      const at::Tensor& tm = args[m].toTensor();
      const at::Tensor& tj = args[j].toTensor();
      const int lo = std::min<int>(m, j), hi = std::max<int>(m, j);
      add({GuardKind::kAliasing, lo, -1, hi, tm.is_alias_of(tj), 0,
           absl::StrCat("the graph writes '", g.arg_names[m], "'")});
    }
  }
  return Dedupe(std::move(out));
}

}  // namespace warden::guards
