// Note [Symbolic scalars]: promotion of vouched-for int/double arguments, verified by a second trace.
#include "runtime/symbolic_scalars.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace warden::runtime {
namespace {

using tracer::Graph;
using tracer::NodeArg;
using tracer::Value;
using tracer::ValueId;

}  // namespace

bool SameIValue(const c10::IValue& a, const c10::IValue& b) {
  if (a.isDouble() || b.isDouble()) {
    if (!a.isDouble() || !b.isDouble()) return false;
    const double x = a.toDouble(), y = b.toDouble();
    return std::memcmp(&x, &y, sizeof x) == 0;
  }
  if (a.isTensor() || b.isTensor()) {
    return a.isTensor() && b.isTensor() && a.toTensor().unsafeGetTensorImpl() == b.toTensor().unsafeGetTensorImpl();
  }
  if (a.tagKind() != b.tagKind()) return false;
  return a == b;
}

namespace {

bool SameMeta(const tracer::TensorMeta& a, const tracer::TensorMeta& b) {
  return a.dtype == b.dtype && a.device == b.device && a.sizes == b.sizes && a.strides == b.strides &&
         a.requires_grad == b.requires_grad;
}

bool SameValue(const Value& a, const Value& b) {
  if (a.kind != b.kind || a.is_tensor != b.is_tensor || a.arg_index != b.arg_index || a.node != b.node ||
      a.output_index != b.output_index || a.alias_of != b.alias_of) {
    return false;
  }
  if (a.is_tensor && !SameMeta(a.meta, b.meta)) return false;
  if (!a.is_tensor && !SameIValue(a.traced_scalar, b.traced_scalar)) return false;
  if (a.kind == tracer::ValueKind::kConstant &&
      a.constant.unsafeGetTensorImpl() != b.constant.unsafeGetTensorImpl()) {
    return false;  // a tensor made inside the function without the dispatcher: new every call
  }
  return true;
}

// A different value of the same type, or nullopt when there is no safe choice.
c10::optional<c10::IValue> Perturbed(const c10::IValue& v) {
  if (v.isInt()) {
    const int64_t i = v.toInt();
    return c10::IValue(i == std::numeric_limits<int64_t>::max() ? i - 1 : i + 1);
  }
  if (v.isDouble() && std::isfinite(v.toDouble())) {
    const double d = v.toDouble();
    return c10::IValue(d + 0.5 + 0.25 * std::abs(d));
  }
  return c10::nullopt;
}

struct Position {
  int node;
  int arg;
};

// Compares the two traces. On success fills `positions` with the op arguments that are `before`
// in `a` and `after` in `b`; everything else must be identical. Returns "" or the difference.
// `skip`: a value whose recorded scalar is the one that was changed (a captured item()).
std::string Compare(const tracer::TraceResult& a, const tracer::TraceResult& b, const c10::IValue& before,
                    const c10::IValue& after, std::vector<Position>* positions, ValueId skip = tracer::kNoValue) {
  const Graph& x = *a.graph;
  const Graph& y = *b.graph;
  if (x.nodes.size() != y.nodes.size() || x.values.size() != y.values.size()) {
    return "the function records different ops for another value (a branch on it?)";
  }
  if (x.outputs != y.outputs || x.arg_values != y.arg_values) return "the outputs differ for another value";
  for (size_t i = 0; i < x.values.size(); ++i) {
    if (static_cast<ValueId>(i) == skip) continue;
    if (!SameValue(x.values[i], y.values[i])) {
      return absl::StrCat("value ", x.ValueName(static_cast<ValueId>(i)),
                          " differs for another value (shape, dtype or a data-dependent result)");
    }
  }
  if (a.reads.size() != b.reads.size()) return "the function reads different sizes for another value";
  for (size_t i = 0; i < a.reads.size(); ++i) {
    if (a.reads[i].value != b.reads[i].value || a.reads[i].what != b.reads[i].what || a.reads[i].dim != b.reads[i].dim) {
      return "the function reads different sizes for another value";
    }
  }
  for (size_t n = 0; n < x.nodes.size(); ++n) {
    const tracer::Node& p = x.nodes[n];
    const tracer::Node& q = y.nodes[n];
    if (p.op != q.op || p.kind != q.kind || p.args.size() != q.args.size()) {
      return absl::StrCat("%", n, " is ", p.op, " for one value and ", q.op, " for another (a branch on it?)");
    }
    for (size_t k = 0; k < p.args.size(); ++k) {
      const NodeArg& s = p.args[k];
      const NodeArg& t = q.args[k];
      if (s.kind != t.kind || s.value != t.value || s.values != t.values) {
        return absl::StrCat("the operands of ", p.op, " at %", n, " differ for another value");
      }
      if (s.kind != NodeArg::Kind::kConstant || SameIValue(s.constant, t.constant)) continue;
      if (SameIValue(s.constant, before) && SameIValue(t.constant, after)) {
        positions->push_back({static_cast<int>(n), static_cast<int>(k)});
        continue;
      }
      return absl::StrCat("argument ", k, " of ", p.op, " at %", n,
                          " changes with it but is not its value (computed from it in C++?)");
    }
  }
  return "";
}

// The second trace of Note [Symbolic scalars] (probe_args / overrides carry the other value) and
// its comparison with the first: "" and the op arguments that are the value, or why not.
std::string ProbeAndCompare(const tracer::TracedFn& fn, const std::vector<c10::IValue>& probe_args,
                            const std::vector<std::string>& names, const tracer::TraceResult& trace,
                            const c10::IValue& before, const c10::IValue& after,
                            const std::map<int, c10::IValue>* overrides, ValueId skip, const std::string& what,
                            std::vector<Position>* positions) {
  tracer::TraceResult probe;
  try {
    probe = tracer::Trace(fn, probe_args, names, /*verification=*/true, overrides);
  } catch (const std::exception& e) {
    return absl::StrCat("the function raised with ", what, " = ", tracer::IValueString(after), " (", e.what(), ")");
  }
  if (!probe.untraceable.empty() || probe.rerun_eagerly) {
    return absl::StrCat("the function is not traceable with another value",
                        probe.untraceable.empty() ? "" : absl::StrCat(" (", probe.untraceable, ")"));
  }
  const std::string diff = Compare(trace, probe, before, after, positions, skip);
  if (!diff.empty()) return diff;
  if (positions->empty()) return "no op takes it as an argument (only C++ code uses it)";
  return "";
}

}  // namespace

ScalarPromotion PromoteScalars(const tracer::TracedFn& fn, const std::vector<c10::IValue>& args,
                               const std::vector<std::string>& names, const tracer::TraceResult& trace,
                               const std::set<int>& candidates) {
  ScalarPromotion out;
  out.graph = trace.graph;
  if (candidates.empty()) return out;
  bool stateful = false;
  for (const tracer::Node& n : trace.graph->nodes) stateful |= n.mutates || n.random;
  std::vector<std::pair<int, std::vector<Position>>> promote;
  for (int k : candidates) {
    const std::string name = k < static_cast<int>(names.size()) ? names[k] : absl::StrCat("arg", k);
    auto keep = [&](const std::string& why) {
      out.kept_args.push_back(k);
      out.kept.push_back(absl::StrCat(name, " stays specialized: ", why));
    };
    if (k < 0 || k >= static_cast<int>(args.size()) || !(args[k].isInt() || args[k].isDouble())) continue;
    if (stateful) {
      keep("the graph writes a tensor or draws random numbers, so it cannot be traced again to verify");
      continue;
    }
    const c10::optional<c10::IValue> other = Perturbed(args[k]);
    if (!other) {
      keep("its value is not finite");
      continue;
    }
    std::vector<c10::IValue> probe_args = args;
    probe_args[k] = *other;
    std::vector<Position> positions;
    const std::string why =
        ProbeAndCompare(fn, probe_args, names, trace, args[k], *other, nullptr, tracer::kNoValue, name, &positions);
    if (!why.empty()) {
      keep(why);
      continue;
    }
    promote.emplace_back(k, std::move(positions));
  }
  if (promote.empty()) return out;
  auto graph = std::make_shared<Graph>(*trace.graph);
  for (auto& [k, positions] : promote) {
    Value v;
    v.kind = tracer::ValueKind::kInput;
    v.is_tensor = false;
    v.arg_index = k;
    v.traced_scalar = args[k];
    const ValueId id = graph->AddValue(std::move(v));
    graph->arg_values[k] = id;
    for (const Position& p : positions) {
      NodeArg& a = graph->nodes[p.node].args[p.arg];
      a.kind = NodeArg::Kind::kValue;
      a.constant = c10::IValue();
      a.value = id;
    }
    out.promoted.push_back(k);
  }
  out.graph = std::move(graph);
  return out;
}

ScalarCapture CaptureScalarOutputs(const tracer::TracedFn& fn, const std::vector<c10::IValue>& args,
                                   const std::vector<std::string>& names, const tracer::TraceResult& trace) {
  ScalarCapture out;
  out.graph = trace.graph;
  const Graph& g = *trace.graph;
  std::vector<ValueId> candidates;
  for (const Value& v : g.values) {
    if (v.is_tensor || v.kind != tracer::ValueKind::kNode) continue;
    if (g.nodes[v.node].op != "aten::_local_scalar_dense") continue;  // item()
    candidates.push_back(v.id);
  }
  if (candidates.empty()) return out;
  bool stateful = false;
  for (const tracer::Node& n : g.nodes) stateful |= n.mutates || n.random;
  std::vector<std::pair<ValueId, std::vector<Position>>> capture;
  for (ValueId id : candidates) {
    const Value& v = g.value(id);
    const std::string name = absl::StrCat("item() at %", v.node, " (", tracer::IValueString(v.traced_scalar), ")");
    auto keep = [&](const std::string& why) { out.kept.push_back(absl::StrCat(name, " stays value-guarded: ", why)); };
    if (stateful) {
      keep("the graph writes a tensor or draws random numbers, so it cannot be traced again to verify");
      continue;
    }
    if (!v.traced_scalar.isInt() && !v.traced_scalar.isDouble()) {
      keep("only int and float results are captured (a bool decides branches)");
      continue;
    }
    const c10::optional<c10::IValue> other = Perturbed(v.traced_scalar);
    if (!other) {
      keep("its value is not finite");
      continue;
    }
    const std::map<int, c10::IValue> overrides{{v.node, *other}};
    std::vector<Position> positions;
    const std::string why = ProbeAndCompare(fn, args, names, trace, v.traced_scalar, *other, &overrides, id, "item()",
                                            &positions);
    if (!why.empty()) {
      keep(why);
      continue;
    }
    capture.emplace_back(id, std::move(positions));
  }
  if (capture.empty()) return out;
  auto graph = std::make_shared<Graph>(g);
  for (auto& [id, positions] : capture) {
    graph->values[id].captured = true;
    for (const Position& p : positions) {
      NodeArg& a = graph->nodes[p.node].args[p.arg];
      a.kind = NodeArg::Kind::kValue;
      a.constant = c10::IValue();
      a.value = id;
    }
    out.captured.push_back(absl::StrCat("item() at %", g.value(id).node, " is a graph value (no value guard)"));
  }
  out.graph = std::move(graph);
  return out;
}

}  // namespace warden::runtime
