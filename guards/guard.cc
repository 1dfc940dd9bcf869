// Guard texts and the reference (slow) semantics every compiled guard program must agree with.
#include "guards/guard.h"

#include <cmath>
#include <cstring>
#include <typeinfo>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "tracer/thread_mode.h"

namespace warden::guards {

const char* GuardKindName(GuardKind kind) {
  switch (kind) {
#define WARDEN_X(name, text) \
  case GuardKind::name:      \
    return text;
    WARDEN_GUARD_KINDS(WARDEN_X)
#undef WARDEN_X
  }
  return "?";
}

bool IsKeyed(GuardKind kind) {
  switch (kind) {
    case GuardKind::kArgCount:
    case GuardKind::kArgType:
    case GuardKind::kDtype:
    case GuardKind::kRank:
    case GuardKind::kSize:
    case GuardKind::kIntValue:
    case GuardKind::kBoolValue:
    case GuardKind::kDoubleValue:
      return true;
    default:
      return false;
  }
}

const char* ArgTypeName(ArgType t) {
  switch (t) {
    case ArgType::kTensor: return "Tensor";
    case ArgType::kUndefinedTensor: return "UndefinedTensor";
    case ArgType::kInt: return "Int";
    case ArgType::kDouble: return "Double";
    case ArgType::kBool: return "Bool";
    case ArgType::kOther: return "Other";
  }
  return "?";
}

ArgType ArgTypeOf(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() ? ArgType::kTensor : ArgType::kUndefinedTensor;
  if (v.isInt()) return ArgType::kInt;
  if (v.isDouble()) return ArgType::kDouble;
  if (v.isBool()) return ArgType::kBool;
  return ArgType::kOther;
}

std::vector<int32_t> IdentityOf(const std::vector<c10::IValue>& args) {
  std::vector<int32_t> same_as(args.size(), -1);
  for (size_t i = 0; i < args.size(); ++i) {
    if (ArgTypeOf(args[i]) != ArgType::kTensor) continue;
    same_as[i] = static_cast<int32_t>(i);
    for (size_t j = 0; j < i; ++j) {
      if (same_as[j] == static_cast<int32_t>(j) && args[j].toTensor().is_same(args[i].toTensor())) {
        same_as[i] = static_cast<int32_t>(j);
        break;
      }
    }
  }
  return same_as;
}

CapturedTensor CapturedTensor::Of(const at::Tensor& t, std::string name) {
  CapturedTensor c;
  c.tensor = t;
  c.name = std::move(name);
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  c.dtype = t.scalar_type();
  c.device = t.device();
  c.keys = impl->key_set().raw_repr();
  c.requires_grad = t.requires_grad();
  c.plain = typeid(*impl) == typeid(c10::TensorImpl) && t.layout() == c10::kStrided;
  if (c.plain) {
    c.sizes = t.sizes().vec();
    c.strides = t.strides().vec();
    c.storage_offset = t.storage_offset();
  }
  return c;
}

namespace {
std::string KeysText(int64_t raw) {
  return c10::toString(c10::DispatchKeySet(c10::DispatchKeySet::RAW, static_cast<uint64_t>(raw)));
}

// The first difference between a captured tensor and what its guard expects, as a reason text,
// or "" if there is none.
std::string CapturedDifference(const CapturedTensor& c) {
  const CapturedTensor now = CapturedTensor::Of(c.tensor, c.name);
  const std::string what = absl::StrCat("captured tensor ", c.name, " ");
  if (now.keys != c.keys) {
    return absl::StrCat(what, "dispatch keys mismatch. expected ", KeysText(static_cast<int64_t>(c.keys)), ", actual ",
                        KeysText(static_cast<int64_t>(now.keys)));
  }
  if (now.dtype != c.dtype) {
    return absl::StrCat(what, "dtype mismatch. expected ", c10::toString(c.dtype), ", actual ", c10::toString(now.dtype));
  }
  if (now.device != c.device) {
    return absl::StrCat(what, "device mismatch. expected ", c.device.str(), ", actual ", now.device.str());
  }
  if (now.requires_grad != c.requires_grad) {
    return absl::StrCat(what, "requires_grad mismatch. expected ", c.requires_grad ? "true" : "false", ", actual ",
                        now.requires_grad ? "true" : "false");
  }
  if (!c.plain) return "";
  if (now.sizes.size() != c.sizes.size()) {
    return absl::StrCat(what, "rank mismatch. expected ", c.sizes.size(), ", actual ", now.sizes.size());
  }
  for (size_t d = 0; d < c.sizes.size(); ++d) {
    if (now.sizes[d] != c.sizes[d]) {
      return absl::StrCat(what, "size mismatch at index ", d, ". expected ", c.sizes[d], ", actual ", now.sizes[d]);
    }
  }
  for (size_t d = 0; d < c.strides.size(); ++d) {
    if (now.strides[d] != c.strides[d]) {
      return absl::StrCat(what, "stride mismatch at index ", d, ". expected ", c.strides[d], ", actual ",
                          now.strides[d]);
    }
  }
  if (now.storage_offset != c.storage_offset) {
    return absl::StrCat(what, "storage offset mismatch. expected ", c.storage_offset, ", actual ",
                        now.storage_offset);
  }
  return "";
}

std::string ArgName(int i, const std::vector<std::string>& names) {
  return i >= 0 && i < static_cast<int>(names.size()) ? names[i] : absl::StrCat("arg", i);
}

// The first argument whose identity differs from what a kArgIdentity guard expects, as a reason
// text, or "" if there is none.
std::string IdentityDifference(const Guard& g, const std::vector<c10::IValue>& args,
                               const std::vector<std::string>& names) {
  const std::vector<int32_t> now = IdentityOf(args);
  for (size_t i = 0; i < g.same_as.size(); ++i) {
    const int32_t want = g.same_as[i];
    const int32_t got = i < now.size() ? now[i] : -1;
    if (want < 0 || want == got) continue;
    auto text = [&](int32_t s) {
      if (s < 0) return std::string("not a tensor");
      if (s == static_cast<int32_t>(i)) return std::string("a distinct tensor");
      return absl::StrCat("the same tensor as '", ArgName(s, names), "'");
    };
    return absl::StrCat("tensor '", ArgName(static_cast<int>(i), names), "' identity mismatch. expected ", text(want),
                        ", actual ", text(got));
  }
  return "";
}

std::string CapturedText(const CapturedTensor& c) {
  std::string text = absl::StrCat(c.name, " (captured): ", c10::toString(c.dtype));
  if (c.plain) {
    absl::StrAppend(&text, "[", absl::StrJoin(c.sizes, ", "), "] strides [", absl::StrJoin(c.strides, ", "),
                    "] offset ", c.storage_offset);
  }
  absl::StrAppend(&text, " on ", c.device.str(), ", requires_grad ", c.requires_grad ? "true" : "false");
  return text;
}

std::string IdentityText(const Guard& g, const std::vector<std::string>& names) {
  std::vector<std::string> distinct, same;
  for (size_t i = 0; i < g.same_as.size(); ++i) {
    const int32_t s = g.same_as[i];
    if (s < 0) continue;
    if (s == static_cast<int32_t>(i)) {
      distinct.push_back(ArgName(static_cast<int>(i), names));
    } else {
      same.push_back(absl::StrCat(ArgName(static_cast<int>(i), names), " is ", ArgName(s, names)));
    }
  }
  std::string text = absl::StrCat("distinct tensors: ", absl::StrJoin(distinct, ", "));
  if (!same.empty()) absl::StrAppend(&text, "; ", absl::StrJoin(same, ", "));
  return text;
}

}  // namespace

bool SameDouble(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  int64_t ia, ib;
  std::memcpy(&ia, &a, sizeof a);
  std::memcpy(&ib, &b, sizeof b);
  return ia == ib || (a == b && std::signbit(a) == std::signbit(b));
}

namespace {

int64_t DeviceCode(c10::Device d) {
  return (static_cast<int64_t>(d.type()) << 16) | (static_cast<int64_t>(d.index()) & 0xffff);
}

std::string DeviceText(int64_t code) {
  c10::Device d(static_cast<c10::DeviceType>(code >> 16),
                static_cast<c10::DeviceIndex>(static_cast<int16_t>(code & 0xffff)));
  return d.str();
}

std::string DtypeText(int64_t code) { return c10::toString(static_cast<at::ScalarType>(code)); }

std::string LayoutText(int64_t code) {
  switch (static_cast<c10::Layout>(code)) {
    case c10::kStrided: return "Strided";
    case c10::kSparse: return "Sparse";
    case c10::kSparseCsr: return "SparseCsr";
    case c10::kMkldnn: return "Mkldnn";
    default: return absl::StrCat("Layout(", code, ")");
  }
}

std::string BoolText(int64_t b) { return b ? "true" : "false"; }
// A GradState (Note [Leaf guard]): "true" for a leaf, as requires_grad_() makes one.
std::string GradText(int64_t state) {
  return state == 2 ? "true (not a leaf: it has autograd history)" : BoolText(state);
}


std::string DoubleText(double d) {
  if (std::isnan(d)) return "nan";
  if (d == 0.0 && std::signbit(d)) return "-0.0";
  return absl::StrCat(d);
}

const at::Tensor* TensorArg(const Guard& g, const std::vector<c10::IValue>& args) {
  if (g.arg < 0 || g.arg >= static_cast<int>(args.size())) return nullptr;
  const c10::IValue& v = args[g.arg];
  if (!v.isTensor() || !v.toTensor().defined()) return nullptr;
  return &v.toTensor();
}

}  // namespace

int64_t Actual(const Guard& g, const std::vector<c10::IValue>& args) {
  switch (g.kind) {
    case GuardKind::kGradMode: return c10::GradMode::is_enabled();
    case GuardKind::kInferenceMode: return c10::InferenceMode::is_enabled();
    case GuardKind::kDefaultDtype: return static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype()));
    case GuardKind::kThreadIncludedKeys:
      return static_cast<int64_t>(c10::impl::raw_local_dispatch_key_set.included_);
    case GuardKind::kThreadExcludedKeys:
      return static_cast<int64_t>(c10::impl::raw_local_dispatch_key_set.excluded_);
    case GuardKind::kAutocastDtype: return tracer::CurrentAutocastCpuDtype();
    case GuardKind::kArgCount: return static_cast<int64_t>(args.size());
    case GuardKind::kArgType:
      return g.arg < static_cast<int>(args.size()) ? static_cast<int64_t>(ArgTypeOf(args[g.arg]))
                                                   : static_cast<int64_t>(ArgType::kOther);
    default: break;
  }
  if (g.kind == GuardKind::kIntValue || g.kind == GuardKind::kDoubleValue ||
      g.kind == GuardKind::kBoolValue) {
    const c10::IValue& v = args.at(g.arg);
    if (v.isInt()) return v.toInt();
    if (v.isBool()) return v.toBool();
    if (v.isDouble()) {
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof d);
      return bits;
    }
    return 0;
  }
  const at::Tensor* t = TensorArg(g, args);
  if (t == nullptr) return -1;
  switch (g.kind) {
    case GuardKind::kDtype: return static_cast<int64_t>(t->scalar_type());
    case GuardKind::kDispatchKeys: return static_cast<int64_t>(t->key_set().raw_repr());
    case GuardKind::kDevice: return DeviceCode(t->device());
    case GuardKind::kLayout: return static_cast<int64_t>(t->layout());
    case GuardKind::kRequiresGrad: return GradStateOf(*t);
    case GuardKind::kRank: return t->dim();
    case GuardKind::kSize:
    case GuardKind::kSizeAtLeast: return g.dim < t->dim() ? t->sizes()[g.dim] : -1;
    case GuardKind::kStride: return g.dim < t->dim() ? t->strides()[g.dim] : -1;
    case GuardKind::kAliasing: {
      const c10::IValue& o = args.at(g.other_arg);
      if (!o.isTensor() || !o.toTensor().defined()) return 0;
      const at::Tensor& u = o.toTensor();
      return t->has_storage() && u.has_storage() && t->is_alias_of(u);
    }
    default: return 0;
  }
}

std::vector<int64_t> SymbolValues(const Guard& g, const std::vector<c10::IValue>& args) {
  std::vector<int64_t> values;
  for (const auto& [arg, dim] : g.symbols) {
    int64_t v = -1;
    if (arg >= 0 && arg < static_cast<int>(args.size()) && args[arg].isTensor() &&
        args[arg].toTensor().defined() && dim < args[arg].toTensor().dim()) {
      v = args[arg].toTensor().sizes()[dim];
    }
    values.push_back(v);
  }
  return values;
}

namespace {
std::string SymbolText(const Guard& g, int k, const std::vector<std::string>& names) {
  const auto& [arg, dim] = g.symbols.at(k);
  const std::string n = arg >= 0 && arg < static_cast<int>(names.size()) ? names[arg] : absl::StrCat("arg", arg);
  return absl::StrCat(n, ".size(", dim, ")");
}
std::string RelationText(const Guard& g, const std::vector<std::string>& names) {
  auto namer = [&](int k) { return SymbolText(g, k, names); };
  return absl::StrCat(g.lhs.ToString(namer), " == ", g.rhs.ToString(namer));
}
}  // namespace

bool Holds(const Guard& g, const std::vector<c10::IValue>& args) {
  if (g.kind == GuardKind::kArgIdentity) return IdentityDifference(g, args, {}).empty();
  if (g.kind == GuardKind::kCapturedTensor) return CapturedDifference(*g.captured).empty();
  if (g.kind == GuardKind::kSizeRelation) {
    const std::vector<int64_t> v = SymbolValues(g, args);
    for (int64_t x : v) {
      if (x < 0) return false;
    }
    int64_t lhs, rhs;
    return g.lhs.TryEvaluate(v.data(), &lhs) && g.rhs.TryEvaluate(v.data(), &rhs) && lhs == rhs;
  }
  if (g.kind == GuardKind::kSizeAtLeast) return Actual(g, args) >= g.expected;
  if (g.kind == GuardKind::kDoubleValue) {
    const c10::IValue& v = args.at(g.arg);
    return v.isDouble() && SameDouble(v.toDouble(), g.expected_double);
  }
  return Actual(g, args) == g.expected;
}

std::string Describe(const Guard& g, const std::vector<std::string>& names) {
  auto name = [&](int i) {
    return i >= 0 && i < static_cast<int>(names.size()) ? names[i] : absl::StrCat("arg", i);
  };
  switch (g.kind) {
    case GuardKind::kGradMode: return absl::StrCat("grad_mode == ", BoolText(g.expected));
    case GuardKind::kInferenceMode: return absl::StrCat("inference_mode == ", BoolText(g.expected));
    case GuardKind::kDefaultDtype: return absl::StrCat("default_dtype == ", DtypeText(g.expected));
    case GuardKind::kThreadIncludedKeys:
      return absl::StrCat("thread_included_keys == ", tracer::DispatchWordText(g.expected, false));
    case GuardKind::kThreadExcludedKeys:
      return absl::StrCat("thread_excluded_keys == ", tracer::DispatchWordText(g.expected, true));
    case GuardKind::kAutocastDtype: return absl::StrCat("autocast_cpu_dtype == ", DtypeText(g.expected));
    case GuardKind::kArgCount: return absl::StrCat("len(args) == ", g.expected);
    case GuardKind::kArgType:
      return absl::StrCat("type(", name(g.arg), ") == ", ArgTypeName(static_cast<ArgType>(g.expected)));
    case GuardKind::kDtype: return absl::StrCat(name(g.arg), ".dtype == ", DtypeText(g.expected));
    case GuardKind::kDispatchKeys:
      return absl::StrCat(name(g.arg), ".dispatch_keys == ", KeysText(g.expected));
    case GuardKind::kDevice: return absl::StrCat(name(g.arg), ".device == ", DeviceText(g.expected));
    case GuardKind::kLayout: return absl::StrCat(name(g.arg), ".layout == ", LayoutText(g.expected));
    case GuardKind::kRequiresGrad:
      return absl::StrCat(name(g.arg), ".requires_grad == ", GradText(g.expected));
    case GuardKind::kRank: return absl::StrCat(name(g.arg), ".dim() == ", g.expected);
    case GuardKind::kSize: return absl::StrCat(name(g.arg), ".size(", g.dim, ") == ", g.expected);
    case GuardKind::kSizeAtLeast:
      return absl::StrCat(name(g.arg), ".size(", g.dim, ") >= ", g.expected);
    case GuardKind::kSizeRelation: return RelationText(g, names);
    case GuardKind::kStride: return absl::StrCat(name(g.arg), ".stride(", g.dim, ") == ", g.expected);
    case GuardKind::kIntValue: return absl::StrCat(name(g.arg), " == ", g.expected);
    case GuardKind::kDoubleValue: return absl::StrCat(name(g.arg), " == ", DoubleText(g.expected_double));
    case GuardKind::kBoolValue: return absl::StrCat(name(g.arg), " == ", BoolText(g.expected));
    case GuardKind::kAliasing:
      return absl::StrCat(g.expected ? "shares_storage(" : "!shares_storage(", name(g.arg), ", ",
                          name(g.other_arg), ")");
    case GuardKind::kArgIdentity: return IdentityText(g, names);
    case GuardKind::kCapturedTensor: return CapturedText(*g.captured);
  }
  return "?";
}

std::string FailureReason(const Guard& g, const std::vector<c10::IValue>& args,
                          const std::vector<std::string>& names) {
  if (Holds(g, args)) return "";
  auto name = [&](int i) {
    return i >= 0 && i < static_cast<int>(names.size()) ? names[i] : absl::StrCat("arg", i);
  };
  const int64_t actual = Actual(g, args);
  const std::string tensor = absl::StrCat("tensor '", name(g.arg), "' ");
  switch (g.kind) {
    case GuardKind::kGradMode:
      return absl::StrCat("grad mode mismatch. expected ", g.expected ? "enabled" : "disabled",
                          ", actual ", actual ? "enabled" : "disabled");
    case GuardKind::kInferenceMode:
      return absl::StrCat("inference mode mismatch. expected ", g.expected ? "enabled" : "disabled",
                          ", actual ", actual ? "enabled" : "disabled");
    case GuardKind::kDefaultDtype:
      return absl::StrCat("default dtype mismatch. expected ", DtypeText(g.expected), ", actual ",
                          DtypeText(actual));
    case GuardKind::kThreadIncludedKeys:
    case GuardKind::kThreadExcludedKeys: {
      const bool excluded = g.kind == GuardKind::kThreadExcludedKeys;
      return absl::StrCat("thread-local ", excluded ? "excluded" : "included",
                          " dispatch keys mismatch. expected ", tracer::DispatchWordText(g.expected, excluded),
                          ", actual ", tracer::DispatchWordText(actual, excluded));
    }
    case GuardKind::kAutocastDtype:
      return absl::StrCat("autocast dtype mismatch. expected ", DtypeText(g.expected), ", actual ",
                          actual < 0 ? "autocast off" : DtypeText(actual));
    case GuardKind::kArgCount:
      return absl::StrCat("argument count mismatch. expected ", g.expected, ", actual ", actual);
    case GuardKind::kArgType: {
      ArgType found = g.arg < static_cast<int>(args.size()) ? ArgTypeOf(args[g.arg]) : ArgType::kOther;
      std::string found_name = ArgTypeName(found);
      if (found == ArgType::kOther && g.arg < static_cast<int>(args.size())) {
        found_name = args[g.arg].tagKind();
      }
      return absl::StrCat("expected type of '", name(g.arg), "' to be ",
                          ArgTypeName(static_cast<ArgType>(g.expected)), ", but found ", found_name);
    }
    case GuardKind::kDtype:
      return absl::StrCat(tensor, "dtype mismatch. expected ", DtypeText(g.expected), ", actual ",
                          DtypeText(actual));
    case GuardKind::kDevice:
      return absl::StrCat(tensor, "device mismatch. expected ", DeviceText(g.expected), ", actual ",
                          DeviceText(actual));
    case GuardKind::kDispatchKeys:
      return absl::StrCat(tensor, "dispatch keys mismatch. expected ", KeysText(g.expected), ", actual ",
                          KeysText(actual));
    case GuardKind::kLayout:
      return absl::StrCat(tensor, "layout mismatch. expected ", LayoutText(g.expected), ", actual ",
                          LayoutText(actual));
    case GuardKind::kRequiresGrad:
      return absl::StrCat(tensor, "requires_grad mismatch. expected ", GradText(g.expected),
                          ", actual ", GradText(actual));
    case GuardKind::kRank:
      return absl::StrCat(tensor, "rank mismatch. expected ", g.expected, ", actual ", actual);
    case GuardKind::kSize:
      return absl::StrCat(tensor, "size mismatch at index ", g.dim, ". expected ", g.expected,
                          ", actual ", actual);
    case GuardKind::kStride:
      return absl::StrCat(tensor, "stride mismatch at index ", g.dim, ". expected ", g.expected,
                          ", actual ", actual);
    case GuardKind::kSizeAtLeast:
      return absl::StrCat(name(g.arg), ".size(", g.dim, ") >= ", g.expected, " failed: actual ",
                          actual);
    case GuardKind::kSizeRelation: {
      const std::vector<int64_t> v = SymbolValues(g, args);
      auto value = [&](const tracer::SymExpr& e) {
        int64_t x;
        return e.TryEvaluate(v.data(), &x) ? absl::StrCat(x) : std::string("(overflows int64)");
      };
      return absl::StrCat(RelationText(g, names), " failed: ", value(g.lhs), " vs ", value(g.rhs), " (",
                          g.provenance, ")");
    }
    case GuardKind::kIntValue:
      return absl::StrCat("scalar '", name(g.arg), "' value mismatch. expected ", g.expected,
                          ", actual ", actual);
    case GuardKind::kDoubleValue:
      return absl::StrCat("scalar '", name(g.arg), "' value mismatch. expected ",
                          DoubleText(g.expected_double), ", actual ",
                          DoubleText(args.at(g.arg).toDouble()));
    case GuardKind::kBoolValue:
      return absl::StrCat("scalar '", name(g.arg), "' value mismatch. expected ",
                          BoolText(g.expected), ", actual ", BoolText(actual));
    case GuardKind::kAliasing:
      return absl::StrCat(tensor, "aliasing mismatch with '", name(g.other_arg), "'. expected ",
                          g.expected ? "shared" : "distinct", " storage, actual ",
                          actual ? "shared" : "distinct", " storage");
    case GuardKind::kArgIdentity: return IdentityDifference(g, args, names);
    case GuardKind::kCapturedTensor: return CapturedDifference(*g.captured);
  }
  return "?";
}

}  // namespace warden::guards
