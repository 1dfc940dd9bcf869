// Graph helpers and the canonical printer. The printed form is what tests compare against, so it
// must not depend on pointers, hash order or anything but the graph's contents.
#include "tracer/graph.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace warden::tracer {

TensorMeta TensorMeta::Of(const at::Tensor& t) {
  TensorMeta m;
  if (!t.defined()) return m;
  m.dtype = t.scalar_type();
  m.device = t.device();
  m.sizes = t.sizes().vec();
  m.strides = t.strides().vec();
  m.requires_grad = t.requires_grad();
  m.is_leaf = !m.requires_grad || t.is_leaf();
  return m;
}

const char* ValueKindName(ValueKind kind) {
  switch (kind) {
#define WARDEN_X(name, text) \
  case ValueKind::name:      \
    return text;
    WARDEN_VALUE_KINDS(WARDEN_X)
#undef WARDEN_X
  }
  return "?";
}

const char* NodeKindName(NodeKind kind) {
  switch (kind) {
#define WARDEN_X(name, text) \
  case NodeKind::name:       \
    return text;
    WARDEN_NODE_KINDS(WARDEN_X)
#undef WARDEN_X
  }
  return "?";
}

const char* ArgKindName(ArgKind kind) {
  switch (kind) {
    case ArgKind::kTensor: return "Tensor";
    case ArgKind::kUndefinedTensor: return "UndefinedTensor";
    case ArgKind::kInt: return "Int";
    case ArgKind::kDouble: return "Double";
    case ArgKind::kBool: return "Bool";
  }
  return "?";
}

ValueId Graph::AddValue(Value v) {
  v.id = static_cast<ValueId>(values.size());
  values.push_back(std::move(v));
  return values.back().id;
}

int Graph::BaseArg(ValueId id) const {
  // alias_of always points to an earlier value, so this terminates.
  while (id != kNoValue) {
    const Value& v = values.at(id);
    if (v.kind == ValueKind::kInput) return v.arg_index;
    id = v.alias_of;
  }
  return -1;
}

ValueId Graph::RootOf(ValueId id) const {
  while (values.at(id).alias_of != kNoValue) id = values.at(id).alias_of;
  return id;
}

ValueId SingleTensorResult(const Node& n) {
  const bool one = n.returns.size() == 1 && n.returns[0].kind == NodeReturn::Kind::kTensor && n.returns[0].values.size() == 1;
  return one ? n.returns[0].values[0] : kNoValue;
}

std::vector<ValueId> InputValues(const Node& n) {
  std::vector<ValueId> ids;
  for (const NodeArg& a : n.args) {
    if (a.kind == NodeArg::Kind::kValue) {
      ids.push_back(a.value);
    } else if (a.kind == NodeArg::Kind::kValueList || a.kind == NodeArg::Kind::kOptValueList) {
      ids.insert(ids.end(), a.values.begin(), a.values.end());
    }
  }
  return ids;
}

std::vector<ValueId> WrittenValues(const Node& n) {
  if (!n.handle) return InputValues(n);
  const auto& schema = n.handle->schema();
  std::vector<ValueId> ids;
  for (size_t i = 0; i < n.args.size() && i < schema.arguments().size(); ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    const NodeArg& a = n.args[i];
    if (a.kind == NodeArg::Kind::kValue) ids.push_back(a.value);
    for (ValueId v : a.values) {
      if (v != kNoValue) ids.push_back(v);
    }
  }
  return ids;
}

std::vector<int> Graph::MutatedArgs() const {
  std::set<int> args;
  for (const Node& n : nodes) {
    if (!n.mutates || !n.handle) continue;
    for (ValueId v : WrittenValues(n)) {
      const int base = BaseArg(v);
      if (base >= 0) args.insert(base);
    }
  }
  return {args.begin(), args.end()};
}

bool Graph::HasMutation() const {
  for (const Node& n : nodes) {
    if (n.mutates) return true;
  }
  return false;
}

std::string DtypeShort(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "f32";
    case at::kDouble: return "f64";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    case at::kLong: return "i64";
    case at::kInt: return "i32";
    case at::kShort: return "i16";
    case at::kChar: return "i8";
    case at::kByte: return "u8";
    case at::kBool: return "b8";
    case at::kComplexFloat: return "c64";
    case at::kComplexDouble: return "c128";
    case at::ScalarType::Undefined: return "undef";
    default: return c10::toString(t);
  }
}

std::string ShapeString(const std::vector<int64_t>& sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

std::string IValueString(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isBool()) return v.toBool() ? "true" : "false";
  if (v.isInt()) return absl::StrCat(v.toInt());
  if (v.isDouble()) {
    const double d = v.toDouble();
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    if (d == 0.0 && std::signbit(d)) return "-0.";
    std::string s = absl::StrCat(d);
    if (s.find_first_of(".e") == std::string::npos) s += ".";
    return s;
  }
  if (v.isIntList()) return ShapeString(v.toIntVector());
  if (v.isDoubleList()) return absl::StrCat("[", absl::StrJoin(v.toDoubleVector(), ", "), "]");
  if (v.isBoolList()) {
    std::vector<std::string> parts;
    for (bool b : v.toBoolList()) parts.push_back(b ? "true" : "false");
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  }
  if (v.isString()) return absl::StrCat("\"", v.toStringRef(), "\"");
  if (v.isDevice()) return v.toDevice().str();
  if (v.isGenerator()) return "<generator>";
  if (v.isScalar()) return v.toScalar().isFloatingPoint() ? absl::StrCat(v.toScalar().toDouble())
                                                          : absl::StrCat(v.toScalar().toLong());
  return v.tagKind();
}

std::string Graph::ValueName(ValueId id) const {
  if (id == kNoValue) return "None";
  const Value& v = values.at(id);
  switch (v.kind) {
    case ValueKind::kInput:
      return absl::StrCat("%", arg_names.at(v.arg_index));
    case ValueKind::kConstant: {
      int k = 0;
      for (ValueId i = 0; i < id; ++i) k += values[i].kind == ValueKind::kConstant;
      return absl::StrCat("%c", k);
    }
    case ValueKind::kNode: {
      const Node& n = nodes.at(v.node);
      size_t outs = 0;
      for (const NodeReturn& r : n.returns) outs += r.values.size();
      if (outs == 1) return absl::StrCat("%", v.node);
      return absl::StrCat("%", v.node, ".", v.output_index);
    }
  }
  return "%?";
}

namespace {

using ShapeOf = std::function<std::string(ValueId)>;

std::string TypeString(const Value& v, const ShapeOf& shape_of = nullptr) {
  if (!v.is_tensor && v.kind == ValueKind::kInput) {
    return absl::StrCat(v.traced_scalar.isDouble() ? "float" : "int", " (symbolic)");
  }
  if (!v.is_tensor) return absl::StrCat("scalar = ", IValueString(v.traced_scalar));
  return absl::StrCat(DtypeShort(v.meta.dtype), shape_of ? shape_of(v.id) : ShapeString(v.meta.sizes));
}

// An int / int[] constant with run-time sizes in it: [%x.size(0), -1].
std::string ConstantWithSizes(const NodeArg& a, const std::vector<std::string>& arg_names) {
  auto size_text = [&](const SizeRef& r) {
    const std::string name = r.arg >= 0 && r.arg < static_cast<int>(arg_names.size()) ? arg_names[r.arg]
                                                                                      : absl::StrCat("arg", r.arg);
    return absl::StrCat("%", name, ".size(", r.dim, ")", r.scale == 1 ? "" : absl::StrCat("*", r.scale));
  };
  if (!a.constant.isIntList()) return a.sizes_of.empty() ? IValueString(a.constant) : size_text(a.sizes_of[0]);
  const std::vector<int64_t> ints = a.constant.toIntVector();
  std::vector<std::string> items;
  for (size_t i = 0; i < ints.size(); ++i) {
    std::string item = absl::StrCat(ints[i]);
    for (const SizeRef& r : a.sizes_of) {
      if (r.elem == static_cast<int>(i)) item = size_text(r);
    }
    items.push_back(std::move(item));
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

}  // namespace

std::string Graph::ToString() const { return ToString(nullptr); }

std::string Graph::ToString(const ShapeOf& shape_of) const {
  std::string out = "graph(";
  std::vector<std::string> params;
  for (size_t i = 0; i < arg_kinds.size(); ++i) {
    if (arg_values[i] != kNoValue) {
      params.push_back(
          absl::StrCat(ValueName(arg_values[i]), ": ", TypeString(value(arg_values[i]), shape_of)));
    } else {
      params.push_back(absl::StrCat("%", arg_names[i], ": ", ArgKindName(arg_kinds[i])));
    }
  }
  absl::StrAppend(&out, absl::StrJoin(params, ", "), "):\n");
  for (const Value& v : values) {
    if (v.kind == ValueKind::kConstant) {
      absl::StrAppend(&out, "  ", ValueName(v.id), " = constant ", TypeString(v), "\n");
    }
  }
  for (const Node& n : nodes) {
    std::vector<std::string> results;
    std::vector<std::string> types;
    for (const NodeReturn& r : n.returns) {
      for (ValueId id : r.values) {
        results.push_back(ValueName(id));
        types.push_back(TypeString(value(id), shape_of));
      }
    }
    std::vector<std::string> args;
    for (const NodeArg& a : n.args) {
      switch (a.kind) {
        case NodeArg::Kind::kConstant:
          args.push_back(a.sizes_of.empty() ? IValueString(a.constant) : ConstantWithSizes(a, arg_names));
          break;
        case NodeArg::Kind::kValue:
          args.push_back(ValueName(a.value));
          break;
        case NodeArg::Kind::kValueList:
        case NodeArg::Kind::kOptValueList: {
          std::vector<std::string> items;
          for (ValueId id : a.values) items.push_back(ValueName(id));
          args.push_back(absl::StrCat("[", absl::StrJoin(items, ", "), "]"));
          break;
        }
      }
    }
    std::string flags;
    if (n.kind != NodeKind::kRule) absl::StrAppend(&flags, "  # ", NodeKindName(n.kind));
    if (n.mode) absl::StrAppend(&flags, flags.empty() ? "  # " : ", ", "mode: ", n.mode->Describe());
    if (n.grad_of >= 0) absl::StrAppend(&flags, flags.empty() ? "  # " : ", ", "backward of %", n.grad_of);
    absl::StrAppend(&out, "  ", results.empty() ? "_" : absl::StrJoin(results, ", "), " = ", n.op,
                    "(", absl::StrJoin(args, ", "), ") : ", absl::StrJoin(types, ", "), flags,
                    "\n");
  }
  std::vector<std::string> outs;
  for (ValueId id : outputs) outs.push_back(ValueName(id));
  absl::StrAppend(&out, "  return (", absl::StrJoin(outs, ", "), ")\n");
  return out;
}

}  // namespace warden::tracer
