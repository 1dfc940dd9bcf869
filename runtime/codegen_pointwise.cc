// Pointwise fusion: the op table (one row per fusible ATen op, with the C expression that
// computes it as ATen's CPU kernel does), type promotion, region partition, layout collapsing,
// inlined constants and the source of pointwise kernels (reduction kernels: codegen_reduction.cc).
#include "runtime/codegen_pointwise.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/codegen_emit.h"

namespace warden::codegen {
namespace {

using at::ScalarType;
using emit::CanonicalName;
using emit::CType;
using emit::FullShaped;
using emit::IsContiguous;
using emit::KernelHead;
using emit::LiteralOf;
using emit::Load;
using emit::NodeStatements;
using emit::ReductionInfo;
using emit::ReductionOf;
using emit::ReductionSource;
using emit::Stores;
using tracer::Graph;
using tracer::Node;
using tracer::NodeArg;
using tracer::NodeReturn;
using tracer::TensorMeta;
using tracer::Value;
using tracer::ValueId;

// What an op's emitter gets: tensor operands as C expressions of the compute dtype, then its
// Scalar arguments as literals of that dtype (and their values, for simplifications like
// alpha == 1), and the node's remaining constant arguments.
struct Operands {
  std::vector<std::string> t;
  std::vector<std::string> s;
  std::vector<double> value;
  std::vector<c10::IValue> extra;
  ScalarType dtype = ScalarType::Float;  // compute dtype

  const std::string& a() const { return t[0]; }
  const std::string& b() const { return t[1]; }
  bool is_float() const { return dtype == ScalarType::Float; }
  bool is_integral() const { return !at::isFloatingType(dtype); }
  std::string Fn(const char* name) const { return absl::StrCat(name, is_float() ? "f" : ""); }
  std::string Call(const char* name, const std::string& x) const { return absl::StrCat(Fn(name), "(", x, ")"); }
  std::string Lit(double v) const;  // a literal of the compute dtype
  const char* Zero() const { return is_integral() ? "0" : is_float() ? "0.0f" : "0.0"; }
  const char* One() const { return is_integral() ? "1" : is_float() ? "1.0f" : "1.0"; }
  const char* Nan() const { return is_float() ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")"; }
  // self + alpha * other the way ATen's add kernel computes it: vec::fmadd(other, alpha, self) for
  // floats, which for alpha == 1 rounds exactly like self + other; wrapping for integers.
  std::string AddScaled(const std::string& self, const std::string& other, size_t alpha,
                        bool negate) const {
    if (value[alpha] == 1) return absl::StrCat("(", self, negate ? " - " : " + ", other, ")");
    if (is_integral()) return absl::StrCat("(", self, negate ? " - " : " + ", s[alpha], " * ", other, ")");
    return absl::StrCat(Fn("__builtin_fma"), "(", other, ", ", negate ? "-" : "", s[alpha], ", ",
                        self, ")");
  }
  std::string Sigmoid(const std::string& x) const {
    return absl::StrCat("(", One(), " / (", One(), " + ", Call("exp", absl::StrCat("-", x)), "))");
  }
};

using Emit = std::string (*)(const Operands&);

enum class Kind : uint8_t {
  kArith,    // integer or floating (not bool); computes in the result dtype
  kFloat,    // floating compute dtype only (transcendentals, rounding)
  kCompare,  // bool result; computes in the operands' common dtype
  kWhere,    // where(condition, self, other): bool condition, computes in the result dtype
};

struct OpDef {
  int tensors;           // leading tensor operands (self, other)
  int scalars;           // Scalar arguments right after them
  Kind kind;
  Emit emit;
  int extra = 0;         // further constant arguments, checked by `accept`
  std::string (*accept)(const Node&, double first_scalar) = nullptr;  // "" or why not
};

std::string NotNanBound(const Node&, double bound) { return std::isnan(bound) ? "NaN bound" : ""; }

std::string GeluApproximation(const Node& n, double) {
  const c10::IValue& a = n.args[1].constant;
  if (a.isString() && (a.toStringRef() == "none" || a.toStringRef() == "tanh")) return "";
  return "unknown gelu approximation";
}

// pow(self, exponent) as ATen's pow_tensor_scalar kernels special-case it.
std::string Pow(const Operands& o) {
  const double e = o.value[0];
  const std::string& x = o.a();
  if (e == 0) return o.One();
  if (e == 1) return x;
  if (e == 0.5) return o.Call("__builtin_sqrt", x);
  if (e == -0.5) return absl::StrCat("(", o.One(), " / ", o.Call("__builtin_sqrt", x), ")");
  if (e == -1) return absl::StrCat("(", o.One(), " / ", x, ")");
  if (e == 2) return absl::StrCat("(", x, " * ", x, ")");
  if (e == 3) return absl::StrCat("(", x, " * ", x, " * ", x, ")");
  if (e == -2) return absl::StrCat("(", o.One(), " / (", x, " * ", x, "))");
  return absl::StrCat(o.Fn("pow"), "(", x, ", ", o.s[0], ")");
}

// ATen tests 0, 1, 0.5, -0.5 and -1 on the Scalar itself, 2, 3 and -2 after the conversion to the
// compute dtype; an exponent that is special only after the conversion would take another branch.
std::string PowExponent(const Node& n, double converted) {
  const c10::IValue& e = n.args[1].constant;
  const double raw = e.isDouble() ? e.toDouble() : e.isInt() ? static_cast<double>(e.toInt()) : converted;
  for (double special : {0.0, 1.0, 0.5, -0.5, -1.0}) {
    if ((raw == special) != (converted == special)) return "exponent rounds to a special value";
  }
  return "";
}

// Whether eager's exact gelu returns NaN at +inf for a contiguous tensor of this compute dtype.
// LibTorch 2.x's vectorized float kernel does (its one-element and strided paths, and double, give
// +inf as the formula does); 1.13's does not. Probed once per dtype on the running LibTorch, so the
// fused kernel follows eager's contiguous path whatever the version (Note [Which LibTorch]).
// The probe runs outside any trace (a compile may happen while an enclosing function is traced on
// this thread: the tracer's key is excluded) and records no autograd history.
bool ProbeGeluNanAtPosInf(at::ScalarType dtype) {
  c10::impl::ExcludeDispatchKeyGuard no_trace(c10::DispatchKey::DeferredInit);
  c10::InferenceMode no_autograd;
  return std::isnan(at::gelu(at::full({16}, INFINITY, dtype))[0].item<double>());
}

bool EagerGeluIsNanAtPosInf(ScalarType dtype) {
  static const bool float_nan = ProbeGeluNanAtPosInf(at::kFloat);
  static const bool double_nan = ProbeGeluNanAtPosInf(at::kDouble);
  return dtype == ScalarType::Double ? double_nan : float_nan;
}

// GeluKernel.cpp: none: x * 0.5 * (1 + erf(x * M_SQRT1_2));
// tanh: 0.5 * x * (1 + tanh(kBeta * (x + kKappa * x^3))), kBeta = sqrt(2) * (2/sqrt(pi)) * 0.5.
std::string Gelu(const Operands& o) {
  const std::string& x = o.a();
  if (o.extra[0].toStringRef() == "none") {
    std::string v = absl::StrCat("(", x, " * ", o.Lit(0.5), " * (", o.One(), " + ",
                                 o.Call("erf", absl::StrCat("(", x, " * ", o.Lit(M_SQRT1_2), ")")), "))");
    if (EagerGeluIsNanAtPosInf(o.dtype)) {
      const char* inf = o.is_float() ? "__builtin_inff()" : "__builtin_inf()";
      const char* nan = o.is_float() ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
      v = absl::StrCat("(", x, " == ", inf, " ? ", nan, " : ", v, ")");
    }
    return v;
  }
  const std::string cube = absl::StrCat("(", x, " * ", x, " * ", x, ")");
  const std::string inner = absl::StrCat("(", o.Lit(M_SQRT2 * M_2_SQRTPI * 0.5), " * (", x, " + ",
                                         o.Lit(0.044715), " * ", cube, "))");
  return absl::StrCat("(", o.Lit(0.5), " * ", x, " * (", o.One(), " + ", o.Call("tanh", inner), "))");
}

std::string Compare(const Operands& o, const char* op) { return absl::StrCat("(", o.a(), " ", op, " ", o.b(), ")"); }
std::string CompareScalar(const Operands& o, const char* op) {
  return absl::StrCat("(", o.a(), " ", op, " ", o.s[0], ")");
}

// Semantics follow LibTorch 1.13's CPU kernels (BinaryOpsKernel, UnaryOpsKernel,
// TensorCompareKernel, GeluKernel, PowKernel and ufunc/add.h), including NaN propagation:
// relu/clamp keep a NaN input, maximum/minimum return NaN if either side is NaN.
const std::unordered_map<std::string, OpDef>& OpTable() {
#define WARDEN_CMP(name, op)                                                                    \
  {"aten::" name ".Tensor", {2, 0, Kind::kCompare, [](const Operands& o) { return Compare(o, op); }}}, \
  {"aten::" name ".Scalar", {1, 1, Kind::kCompare, [](const Operands& o) { return CompareScalar(o, op); }}}
#define WARDEN_UNARY(name, fn) \
  {"aten::" name, {1, 0, Kind::kFloat, [](const Operands& o) { return o.Call(fn, o.a()); }}}
  static const auto* table = new std::unordered_map<std::string, OpDef>{
      {"aten::add.Tensor", {2, 1, Kind::kArith, [](const Operands& o) { return o.AddScaled(o.a(), o.b(), 0, false); }}},
      {"aten::add.Scalar", {1, 2, Kind::kArith, [](const Operands& o) { return o.AddScaled(o.a(), o.s[0], 1, false); }}},
      {"aten::sub.Tensor", {2, 1, Kind::kArith, [](const Operands& o) { return o.AddScaled(o.a(), o.b(), 0, true); }}},
      {"aten::sub.Scalar", {1, 2, Kind::kArith, [](const Operands& o) { return o.AddScaled(o.a(), o.s[0], 1, true); }}},
      {"aten::rsub.Tensor", {2, 1, Kind::kArith, [](const Operands& o) { return o.AddScaled(o.b(), o.a(), 0, true); }}},
      {"aten::rsub.Scalar", {1, 2, Kind::kArith, [](const Operands& o) { return o.AddScaled(o.s[0], o.a(), 1, true); }}},
      {"aten::mul.Tensor", {2, 0, Kind::kArith, [](const Operands& o) { return absl::StrCat("(", o.a(), " * ", o.b(), ")"); }}},
      {"aten::mul.Scalar", {1, 1, Kind::kArith, [](const Operands& o) { return absl::StrCat("(", o.a(), " * ", o.s[0], ")"); }}},
      // True division: the result (and so the compute dtype) is floating even for integer inputs.
      {"aten::div.Tensor", {2, 0, Kind::kFloat, [](const Operands& o) { return absl::StrCat("(", o.a(), " / ", o.b(), ")"); }}},
      {"aten::div.Scalar", {1, 1, Kind::kFloat, [](const Operands& o) { return absl::StrCat("(", o.a(), " / ", o.s[0], ")"); }}},
      {"aten::neg", {1, 0, Kind::kArith, [](const Operands& o) { return absl::StrCat("(-", o.a(), ")"); }}},
      {"aten::relu", {1, 0, Kind::kArith, [](const Operands& o) {  // relu is clamp_min(self, 0)
         return absl::StrCat("(", o.a(), " < ", o.Zero(), " ? ", o.Zero(), " : ", o.a(), ")"); }}},
      {"aten::sigmoid", {1, 0, Kind::kFloat, [](const Operands& o) { return o.Sigmoid(o.a()); }}},
      {"aten::silu", {1, 0, Kind::kFloat, [](const Operands& o) {  // x / (1 + exp(-x))
         return absl::StrCat("(", o.a(), " / (", o.One(), " + ", o.Call("exp", absl::StrCat("-", o.a())), "))"); }}},
      {"aten::gelu", {1, 0, Kind::kFloat, Gelu, 1, GeluApproximation}},
      WARDEN_UNARY("tanh", "tanh"),
      WARDEN_UNARY("exp", "exp"),
      WARDEN_UNARY("expm1", "expm1"),
      WARDEN_UNARY("log", "log"),
      WARDEN_UNARY("log1p", "log1p"),
      WARDEN_UNARY("log2", "log2"),
      WARDEN_UNARY("log10", "log10"),
      WARDEN_UNARY("erf", "erf"),
      WARDEN_UNARY("erfc", "erfc"),
      WARDEN_UNARY("sin", "sin"),
      WARDEN_UNARY("cos", "cos"),
      WARDEN_UNARY("sqrt", "__builtin_sqrt"),
      WARDEN_UNARY("floor", "__builtin_floor"),
      WARDEN_UNARY("ceil", "__builtin_ceil"),
      WARDEN_UNARY("trunc", "__builtin_trunc"),
      WARDEN_UNARY("round", "__builtin_nearbyint"),  // half to even, as std::nearbyint
      {"aten::abs", {1, 0, Kind::kArith, [](const Operands& o) {
         if (o.is_integral()) return absl::StrCat("(", o.a(), " < 0 ? -", o.a(), " : ", o.a(), ")");
         return o.Call("__builtin_fabs", o.a()); }}},
      {"aten::rsqrt", {1, 0, Kind::kFloat, [](const Operands& o) {
         return absl::StrCat("(", o.One(), " / ", o.Call("__builtin_sqrt", o.a()), ")"); }}},
      {"aten::reciprocal", {1, 0, Kind::kFloat, [](const Operands& o) { return absl::StrCat("(", o.One(), " / ", o.a(), ")"); }}},
      {"aten::square", {1, 0, Kind::kArith, [](const Operands& o) { return absl::StrCat("(", o.a(), " * ", o.a(), ")"); }}},
      {"aten::pow.Tensor_Scalar", {1, 1, Kind::kFloat, Pow, 0, PowExponent}},
      {"aten::clamp_min", {1, 1, Kind::kArith, [](const Operands& o) {  // std::max(a, min)
         return absl::StrCat("(", o.a(), " < ", o.s[0], " ? ", o.s[0], " : ", o.a(), ")"); }, 0, NotNanBound}},
      {"aten::clamp_max", {1, 1, Kind::kArith, [](const Operands& o) {  // std::min(a, max)
         return absl::StrCat("(", o.s[0], " < ", o.a(), " ? ", o.s[0], " : ", o.a(), ")"); }, 0, NotNanBound}},
      {"aten::maximum", {2, 0, Kind::kArith, [](const Operands& o) {
         if (o.is_integral()) return absl::StrCat("(", o.a(), " < ", o.b(), " ? ", o.b(), " : ", o.a(), ")");
         return absl::StrCat("((", o.a(), " != ", o.a(), " || ", o.b(), " != ", o.b(), ") ? ", o.Nan(),
                             " : (", o.a(), " < ", o.b(), " ? ", o.b(), " : ", o.a(), "))"); }}},
      {"aten::minimum", {2, 0, Kind::kArith, [](const Operands& o) {
         if (o.is_integral()) return absl::StrCat("(", o.b(), " < ", o.a(), " ? ", o.b(), " : ", o.a(), ")");
         return absl::StrCat("((", o.a(), " != ", o.a(), " || ", o.b(), " != ", o.b(), ") ? ", o.Nan(),
                             " : (", o.b(), " < ", o.a(), " ? ", o.b(), " : ", o.a(), "))"); }}},
      {"aten::where.self", {3, 0, Kind::kWhere, [](const Operands& o) {
         return absl::StrCat("(", o.t[0], " ? ", o.t[1], " : ", o.t[2], ")"); }}},
      WARDEN_CMP("eq", "=="),
      WARDEN_CMP("ne", "!="),
      WARDEN_CMP("lt", "<"),
      WARDEN_CMP("le", "<="),
      WARDEN_CMP("gt", ">"),
      WARDEN_CMP("ge", ">="),
  };
#undef WARDEN_CMP
#undef WARDEN_UNARY
  return *table;
}

bool FusedDtype(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Long || t == ScalarType::Bool;
}

// A Scalar argument converted to dtype `t` as Scalar::to<T>() does. False if it is not a real
// number, does not fit, or (integral t) is not an exact integer: those cases stay unfused.
bool ScalarLiteral(const c10::IValue& v, ScalarType t, std::string* text, double* value) {
  if (t == ScalarType::Long) {
    int64_t i;
    if (v.isInt()) {
      i = v.toInt();
    } else if (v.isBool()) {
      i = v.toBool();
    } else {
      return false;
    }
    *value = static_cast<double>(i);
    *text = i == INT64_MIN ? "INT64_MIN" : absl::StrCat("INT64_C(", i, ")");
    return true;
  }
  if (t == ScalarType::Bool) return false;
  const bool is_float = t == ScalarType::Float;
  double d;
  if (v.isDouble()) {
    d = v.toDouble();
    if (is_float && std::isfinite(d) && std::abs(d) > FLT_MAX) return false;  // to<float> throws
    if (is_float) d = static_cast<float>(d);
  } else if (v.isInt()) {
    d = is_float ? static_cast<double>(static_cast<float>(v.toInt())) : static_cast<double>(v.toInt());
  } else if (v.isBool()) {
    d = v.toBool() ? 1 : 0;
  } else {
    return false;
  }
  *value = d;
  *text = LiteralOf(d, t);
  return true;
}

// Note [Type promotion]: one operand of result_type.
struct Participant {
  ScalarType dtype;
  int rank;  // 2: tensor with dims, 1: 0-dim tensor, 0: Scalar
};

int Category(ScalarType t) { return t == ScalarType::Bool ? 0 : at::isFloatingType(t) ? 2 : 1; }

// ATen's combine_categories(higher, lower) over the three priority classes.
ScalarType CommonDtype(const std::vector<Participant>& ps) {
  ScalarType by_rank[3] = {ScalarType::Undefined, ScalarType::Undefined, ScalarType::Undefined};
  for (const Participant& p : ps) {
    ScalarType t = p.dtype;
    if (p.rank == 0 && at::isFloatingType(t)) t = c10::get_default_dtype_as_scalartype();
    by_rank[p.rank] = by_rank[p.rank] == ScalarType::Undefined ? t : c10::promoteTypes(by_rank[p.rank], t);
  }
  auto combine = [](ScalarType higher, ScalarType lower) {
    if (higher == ScalarType::Undefined) return lower;
    if (lower == ScalarType::Undefined) return higher;
    if (Category(higher) == 2) return higher;
    if (higher == ScalarType::Bool || Category(lower) == 2) return c10::promoteTypes(higher, lower);
    return higher;
  };
  return combine(by_rank[2], combine(by_rank[1], by_rank[0]));
}

// The op table's row for `op`, or for its functional form when `op` is an in-place variant
// ("aten::add_.Tensor" -> "aten::add.Tensor"; Note [Straight-line programs] runs those); null if none.
const OpDef* FindOp(const std::string& op) {
  auto it = OpTable().find(op);
  if (it != OpTable().end()) return &it->second;
  it = OpTable().find(emit::FunctionalName(op));
  return it == OpTable().end() ? nullptr : &it->second;
}

// The dtype a fusible node computes in (Note [Type promotion]).
ScalarType ComputeDtype(const Graph& g, const Node& n, const OpDef& def) {
  const ScalarType out = g.value(n.returns[0].values[0]).meta.dtype;
  if (def.kind != Kind::kCompare) return out;
  std::vector<Participant> ps;
  for (int a = 0; a < def.tensors; ++a) {
    const Value& v = g.value(n.args[a].value);
    // A wrapped number (a Scalar an ATen composite turned into a tensor) ranks like a Scalar.
    const bool wrapped = v.kind == tracer::ValueKind::kConstant && v.constant.defined() &&
                         v.constant.unsafeGetTensorImpl()->is_wrapped_number();
    ps.push_back({v.meta.dtype, wrapped ? 0 : v.meta.sizes.empty() ? 1 : 2});
  }
  for (int a = def.tensors; a < def.tensors + def.scalars; ++a) {
    const c10::IValue& v = n.args[a].constant;
    ps.push_back({v.isDouble() ? ScalarType::Double : v.isInt() ? ScalarType::Long : ScalarType::Bool, 0});
  }
  return CommonDtype(ps);
}

// Whether `in` broadcasts to `out` (right-aligned, missing or size-1 dims).
bool Broadcasts(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  if (in.size() > out.size()) return false;
  const size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] != out[lead + d] && in[d] != 1) return false;
  }
  return true;
}

// Note [Inlined constants]: the constant `v` as literals, if it is inlined.
InlinedConstant Inline(const Value& v) {
  InlinedConstant c;
  if (v.kind != tracer::ValueKind::kConstant || !v.constant.defined()) return c;
  const at::Tensor& t = v.constant;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!FusedDtype(t.scalar_type()) || t.scalar_type() != v.meta.dtype || !t.device().is_cpu() ||
      t.layout() != at::kStrided || t.requires_grad() || t.is_neg() || t.numel() < 1 ||
      t.numel() > kMaxInlinedElements || !impl->has_storage() || !impl->version_counter().enabled() ||
      impl->storage().use_count() != 1) {
    return c;
  }
  c.version = impl->version_counter().current_version();  // before the values
  c.data = t.data_ptr();
  c.sizes = t.sizes().vec();
  c.strides = t.strides().vec();
  if (c.sizes != v.meta.sizes || c.strides != v.meta.strides) return InlinedConstant();
  std::vector<std::string> items;
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t offset = 0;
    for (int64_t d = t.dim() - 1, rest = i; d >= 0; --d) {
      offset += rest % c.sizes[d] * c.strides[d];
      rest /= c.sizes[d];
    }
    c.offsets.push_back(offset);
    c.bytes.append(static_cast<const char*>(c.data) + offset * t.element_size(), t.element_size());
    switch (t.scalar_type()) {
      case ScalarType::Float:
        items.push_back(LiteralOf(static_cast<const float*>(c.data)[offset], ScalarType::Float));
        break;
      case ScalarType::Double:
        items.push_back(LiteralOf(static_cast<const double*>(c.data)[offset], ScalarType::Double));
        break;
      case ScalarType::Long: {
        const int64_t x = static_cast<const int64_t*>(c.data)[offset];
        items.push_back(x == INT64_MIN ? "INT64_MIN" : absl::StrCat("INT64_C(", x, ")"));
        break;
      }
      default:
        items.push_back(static_cast<const bool*>(c.data)[offset] ? "true" : "false");
    }
  }
  c.values = absl::StrCat("{", absl::StrJoin(items, ", "), "}");
  c.inlined = true;
  return c;
}

// Pointwise region (Note [Pointwise regions]).
std::string RegionSource(const Graph& g, const PointwiseRegion& r) {
  const Layout& L = r.layout;
  const int dims = static_cast<int>(L.sizes.size());
  const int ins = static_cast<int>(r.inputs.size());
  std::string s = KernelHead(g, r);
  // The innermost loop over [j0, j1) of the row starting at linear index `lin`, input k at o<k>.
  std::vector<std::string> offsets;
  for (int k = 0; k < ins; ++k) offsets.push_back(absl::StrCat("int64_t o", k));
  absl::StrAppend(&s, "  const int64_t inner = s", dims - 1, ";\n  (void)inner;\n");
  absl::StrAppend(&s, "  auto row = [&](int64_t lin, ", absl::StrJoin(offsets, ", "), ins ? ", " : "",
                  "int64_t j0, int64_t j1) __attribute__((always_inline)) {\n");
  absl::StrAppend(&s, "#pragma omp simd\n    for (int64_t j = j0; j < j1; ++j) {\n");
  for (int k = 0; k < ins; ++k) absl::StrAppend(&s, Load(g, r, k, "      ", false, "j"));
  absl::StrAppend(&s, NodeStatements(g, r.nodes, "      "), Stores(r, g, r.nodes, "lin + j", "      "),
                  "    }\n  };\n");

  std::vector<std::string> zeros(ins, "0");
  const std::string zero_offsets = absl::StrCat(absl::StrJoin(zeros, ", "), ins ? ", " : "");
  if (dims == 1) {
    if (r.static_layout) {
      // The whole range in one call (small tensors, one thread): literal bounds, so g++ can unroll.
      absl::StrAppend(&s, "  if (begin == 0 && end == s0) {\n    row(0, ", zero_offsets,
                      "0, s0);\n    return;\n  }\n");
    }
    absl::StrAppend(&s, "  row(0, ", zero_offsets, "begin, end);\n}\n");
    return s;
  }
  // Rows of the innermost dim; the row's input offsets from its index over the outer dims.
  absl::StrAppend(&s, "  for (int64_t r = begin / inner, lin = r * inner; lin < end; ++r, lin += inner) {\n",
                  "    const int64_t j0 = begin > lin ? begin - lin : 0;\n",
                  "    const int64_t j1 = end - lin < inner ? end - lin : inner;\n",
                  "    int64_t rest = r;\n");
  for (int k = 0; k < ins; ++k) absl::StrAppend(&s, "    int64_t o", k, " = 0;\n");
  for (int d = dims - 2; d >= 0; --d) {
    absl::StrAppend(&s, "    {\n      const int64_t i = rest % s", d, ";\n      rest /= s", d, ";\n");
    for (int k = 0; k < ins; ++k) absl::StrAppend(&s, "      o", k, " += i * t", k, "_", d, ";\n");
    absl::StrAppend(&s, "    }\n");
  }
  std::vector<std::string> os;
  for (int k = 0; k < ins; ++k) os.push_back(absl::StrCat("o", k));
  absl::StrAppend(&s, "    row(lin, ", absl::StrJoin(os, ", "), ins ? ", " : "", "j0, j1);\n  }\n}\n");
  return s;
}

// Declarations instead of <math.h>: with glibc >= 2.35 on x86-64 these carry the SIMD attribute
// that glibc's own header only adds under -ffast-math, so GCC calls libmvec's vector variants
// (_ZGVeN16v_expf, ...) from vectorized loops; elsewhere the loops call scalar libm. libmvec's
// functions are within 4 ulp (ATen's SLEEF ones within 1); tanhf is ~4.5x faster than SLEEF's,
// exp on par. NaN/Inf follow IEEE like libm.
constexpr char kPrelude[] = R"src(// Generated by Warden (backend "cpp"): fused pointwise kernels.
#include <stdint.h>
#if defined(__x86_64__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define WARDEN_VECTOR_MATH __attribute__((__simd__("notinbranch"), __const__, __nothrow__))
#else
#define WARDEN_VECTOR_MATH __attribute__((__const__, __nothrow__))
#endif
// Note [Short rows]: row kernels whose rows are not a multiple of 16 lanes run 8-wide.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WARDEN_SHORT_ROWS __attribute__((target("prefer-vector-width=256")))
#else
#define WARDEN_SHORT_ROWS
#endif
#define WARDEN_MATH(name) \
  float name##f(float) WARDEN_VECTOR_MATH; \
  double name(double) WARDEN_VECTOR_MATH;
extern "C" {
WARDEN_MATH(exp) WARDEN_MATH(expm1) WARDEN_MATH(log) WARDEN_MATH(log1p) WARDEN_MATH(log2)
WARDEN_MATH(log10) WARDEN_MATH(tanh) WARDEN_MATH(erf) WARDEN_MATH(erfc) WARDEN_MATH(sin)
WARDEN_MATH(cos)
float powf(float, float) WARDEN_VECTOR_MATH;
double pow(double, double) WARDEN_VECTOR_MATH;
void* malloc(__SIZE_TYPE__) __attribute__((__nothrow__));  // scratch rows of reductions
void free(void*) __attribute__((__nothrow__));
}
)src";

std::string Operands::Lit(double v) const { return LiteralOf(v, dtype); }

}  // namespace

const char* emit::KernelPrelude() { return kPrelude; }

bool StillInlinable(const InlinedConstant& c, const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->has_storage() || impl->storage().use_count() != 1 || !impl->version_counter().enabled() ||
      impl->version_counter().current_version() != c.version || t.data_ptr() != c.data ||
      !t.sizes().equals(c.sizes) || !t.strides().equals(c.strides)) {
    return false;
  }
  const size_t size = t.element_size();
  const char* data = static_cast<const char*>(c.data);
  for (size_t i = 0; i < c.offsets.size(); ++i) {
    if (std::memcmp(data + c.offsets[i] * size, c.bytes.data() + i * size, size) != 0) return false;
  }
  return true;
}

namespace emit {

bool IsContiguous(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  if (sizes.size() != strides.size()) return false;
  int64_t expected = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    if (sizes[k] == 0) return true;
    if (sizes[k] != 1 && strides[k] != expected) return false;
    expected *= sizes[k];
  }
  return true;
}

const char* CType(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float";
    case ScalarType::Double: return "double";
    case ScalarType::Long: return "int64_t";
    default: return "bool";
  }
}

std::string LiteralOf(double d, ScalarType t) {
  if (t == ScalarType::Long) return absl::StrCat("INT64_C(", static_cast<int64_t>(d), ")");
  if (t == ScalarType::Bool) return d != 0 ? "true" : "false";
  const bool is_float = t == ScalarType::Float;
  const char* f = is_float ? "f" : "";
  if (std::isnan(d)) return is_float ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
  if (std::isinf(d)) return absl::StrCat("(", d < 0 ? "-" : "", "__builtin_inf", f, "())");
  return absl::StrCat("(", absl::StrFormat("%a", is_float ? static_cast<float>(d) : d), f, ")");
}

std::string CanonicalName(const Graph& g, ValueId id) {
  const Value& v = g.value(id);
  if (v.kind == tracer::ValueKind::kInput) return absl::StrCat("arg", v.arg_index);
  return g.ValueName(id);
}

int TensorOperands(const Node& n) { return FindOp(n.op)->tensors; }

std::string FunctionalName(const std::string& op) {
  const size_t dot = op.find('.', 6);  // after "aten::"
  std::string name = op.substr(0, dot), overload = dot == std::string::npos ? "" : op.substr(dot);
  if (name.size() < 8 || name.back() != '_' || name[name.size() - 2] == '_') return "";
  name.pop_back();
  return name + overload;
}

bool IsFusedDtype(ScalarType t) { return FusedDtype(t); }

bool ScalarLiteralOf(const c10::IValue& v, ScalarType t, std::string* text, double* value) {
  return ScalarLiteral(v, t, text, value);
}

// Note [Short rows]
// The kernels are built for 16-lane vectors where the CPU has AVX-512 (CompileFlags), which suits
// long loops. A row reduction loops over one row at a time, several times (softmax: max, sum of
// exp, write), and each loop ends in a scalar tail of up to 15 elements, where every exp/log is a
// scalar libm call. For rows of a static length below 256 that is not a multiple of 16 the tails
// dominate: log_softmax over [56, 40] (the LSTM language model's output at batch 8) took 7.0 us
// 16-wide and 3.2 us 8-wide (tails of 8 vs 0). Such kernels are marked WARDEN_SHORT_ROWS, GCC's
// per-function prefer-vector-width=256 (nothing elsewhere, where the attribute does not exist).
bool ShortRows(const PointwiseRegion& r) {
  const int dims = static_cast<int>(r.layout.sizes.size());
  if (r.reduction == ReductionKind::kNone || !r.static_layout || r.outer_dims != dims - 1) return false;
  const int64_t row = r.layout.sizes[r.outer_dims];
  return row < 256 && row % 16 != 0;
}

std::string KernelHead(const Graph& g, const PointwiseRegion& r) {
  const Layout& L = r.layout;
  const int dims = static_cast<int>(L.sizes.size());
  const int ins = static_cast<int>(r.inputs.size());
  std::vector<std::string> ops;
  for (int n : r.nodes) ops.push_back(g.nodes[n].op);
  std::string s = absl::StrCat("// Nodes %", r.nodes.front(), "..%", r.nodes.back(), " on ",
                               tracer::ShapeString(r.sizes), r.static_layout ? "" : " (symbolic)",
                               ": ", absl::StrJoin(ops, ", "), "\n");
  absl::StrAppend(&s, "extern \"C\" ", ShortRows(r) ? "WARDEN_SHORT_ROWS " : "", "void ", r.function,
                  "(const void** in, void** out, const int64_t* params, int64_t begin, int64_t end) {\n");
  int param = 0;
  auto size_or_param = [&](int64_t traced, bool literal) {
    return literal ? absl::StrCat(traced) : absl::StrCat("params[", param++, "]");
  };
  for (int d = 0; d < dims; ++d) {
    absl::StrAppend(&s, "  const int64_t s", d, " = ", size_or_param(L.sizes[d], r.static_layout), ";\n");
  }
  for (int k = 0; k < ins; ++k) {
    for (int d = 0; d < dims; ++d) {
      absl::StrAppend(&s, "  const int64_t t", k, "_", d, " = ",
                      size_or_param(L.strides[k][d], r.static_layout || d == dims - 1), ";\n");
    }
  }
  absl::StrAppend(&s, "  (void)params;\n");
  for (int k = 0; k < ins; ++k) {
    const ScalarType t = g.value(r.inputs[k]).meta.dtype;
    const InlinedConstant& c = r.input_constant[k];
    if (c.inlined) {
      absl::StrAppend(&s, "  static const ", CType(t), " in", k, "[] = ", c.values, ";  // ",
                      CanonicalName(g, r.inputs[k]), " (inlined)\n");
      continue;
    }
    absl::StrAppend(&s, "  const ", CType(t), "* __restrict in", k, " = static_cast<const ", CType(t),
                    "*>(in[", k, "]);  // ", CanonicalName(g, r.inputs[k]), "\n");
  }
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    const ScalarType t = g.value(r.outputs[k]).meta.dtype;
    absl::StrAppend(&s, "  ", CType(t), "* __restrict out", k, " = static_cast<", CType(t), "*>(out[",
                    k, "]);  // ", CanonicalName(g, r.outputs[k]), "\n");
  }
  return s;
}

std::string Load(const Graph& g, const PointwiseRegion& r, int k, const std::string& indent,
                 bool r_term, const std::string& j) {
  const int dims = static_cast<int>(r.layout.sizes.size());
  std::string index = absl::StrCat("o", k);
  if (r_term) absl::StrAppend(&index, " + r * t", k, "_", r.outer_dims);
  const int64_t inner = r.layout.strides[k][dims - 1];
  if (!j.empty() && inner == 1) absl::StrAppend(&index, " + ", j);
  if (!j.empty() && inner != 0 && inner != 1) absl::StrAppend(&index, " + ", j, " * t", k, "_", dims - 1);
  return absl::StrCat(indent, "const ", CType(g.value(r.inputs[k]).meta.dtype), " v", r.inputs[k], " = in",
                      k, "[", index, "];\n");
}

std::string NodeStatements(const Graph& g, const std::vector<int>& nodes, const std::string& indent) {
  std::string s;
  for (int index : nodes) {
    const Node& node = g.nodes[index];
    const OpDef& def = *FindOp(node.op);
    Operands o;
    o.dtype = ComputeDtype(g, node, def);
    for (int a = 0; a < def.tensors; ++a) {
      const ValueId v = node.args[a].value;
      const bool condition = def.kind == Kind::kWhere && a == 0;
      const std::string name = absl::StrCat("v", v);
      o.t.push_back(condition || g.value(v).meta.dtype == o.dtype
                        ? name
                        : absl::StrCat("static_cast<", CType(o.dtype), ">(", name, ")"));
    }
    for (int a = def.tensors; a < def.tensors + def.scalars; ++a) {
      std::string text;
      double value = 0;
      ScalarLiteral(node.args[a].constant, o.dtype, &text, &value);  // checked by FusionBlocker
      o.s.push_back(std::move(text));
      o.value.push_back(value);
    }
    for (int a = def.tensors + def.scalars; a < static_cast<int>(node.args.size()); ++a) {
      o.extra.push_back(node.args[a].constant);
    }
    const ValueId out = node.returns[0].values[0];
    const ScalarType out_dtype = g.value(out).meta.dtype;
    std::string expr = def.emit(o);
    if (out_dtype != o.dtype && def.kind != Kind::kCompare) {
      expr = absl::StrCat("static_cast<", CType(out_dtype), ">(", expr, ")");
    }
    absl::StrAppend(&s, indent, "const ", CType(out_dtype), " v", out, " = ", expr, ";  // ",
                    CanonicalName(g, out), " = ", node.op, "\n");
  }
  return s;
}

std::string Stores(const PointwiseRegion& r, const Graph& g, const std::vector<int>& nodes,
                   const std::string& index, const std::string& indent) {
  std::string s;
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    const Value& v = g.value(r.outputs[k]);
    if (std::find(nodes.begin(), nodes.end(), v.node) == nodes.end()) continue;
    absl::StrAppend(&s, indent, "out", k, "[", index, "] = v", r.outputs[k], ";\n");
  }
  return s;
}

}  // namespace emit

bool Collapse(const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& in_sizes,
              const std::vector<std::vector<int64_t>>& in_strides, Layout* layout) {
  const size_t n = in_sizes.size();
  // Broadcast strides of every input over `shape`, keeping only dims of size > 1.
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides(n);
  for (size_t k = 0; k < n; ++k) {
    if (!Broadcasts(in_sizes[k], shape) || in_strides[k].size() != in_sizes[k].size()) return false;
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    sizes.push_back(shape[d]);
    for (size_t k = 0; k < n; ++k) {
      const size_t lead = shape.size() - in_sizes[k].size();
      strides[k].push_back(d < lead || in_sizes[k][d - lead] == 1 ? 0 : in_strides[k][d - lead]);
    }
  }
  if (sizes.empty()) {
    sizes.push_back(1);
    for (auto& st : strides) st.push_back(0);
  }
  // Merge d into d + 1 (from the innermost pair outwards) where every input allows it.
  layout->sizes.clear();
  layout->strides.assign(n, {});
  std::vector<int64_t> cur_sizes = {sizes.back()};
  std::vector<std::vector<int64_t>> cur(n);
  for (size_t k = 0; k < n; ++k) cur[k] = {strides[k].back()};
  for (size_t d = sizes.size() - 1; d-- > 0;) {
    bool merge = true;
    for (size_t k = 0; k < n; ++k) merge &= strides[k][d] == cur[k].back() * cur_sizes.back();
    if (merge) {
      cur_sizes.back() *= sizes[d];
    } else {
      cur_sizes.push_back(sizes[d]);
      for (size_t k = 0; k < n; ++k) cur[k].push_back(strides[k][d]);
    }
  }
  layout->sizes.assign(cur_sizes.rbegin(), cur_sizes.rend());
  for (size_t k = 0; k < n; ++k) layout->strides[k].assign(cur[k].rbegin(), cur[k].rend());
  return true;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

std::string FusionBlocker(const Graph& g, const Node& node) { return emit::ElementwiseBlocker(g, node, false); }

namespace emit {

std::string ElementwiseBlocker(const Graph& g, const Node& node, bool program) {
  if (!node.handle) return "no operator";
  if (node.mutates && !program) return "in-place";
  for (const tracer::NodeArg& a : node.args) {
    if (!a.sizes_of.empty()) return "takes argument sizes at run time";  // replayed (codegen_replay)
  }
  if (node.random) return "random";
  if (node.kind == tracer::NodeKind::kDataDependent) return "data-dependent";
  if (node.mode) return "runs under a thread-local mode the function set";  // Note [Thread modes]
  const OpDef* found = program ? FindOp(node.op) : nullptr;
  if (!program) {
    auto it = OpTable().find(node.op);
    if (it != OpTable().end()) found = &it->second;
  }
  if (found == nullptr) return "no pointwise lowering";
  const OpDef& def = *found;
  if (node.mutates != (OpTable().count(node.op) == 0)) return "unexpected in-place form";
  if (node.args.size() != static_cast<size_t>(def.tensors + def.scalars + def.extra)) return "unexpected schema";
  if (node.returns.size() != 1 || node.returns[0].kind != NodeReturn::Kind::kTensor ||
      node.returns[0].values.size() != 1) {
    return "unexpected returns";
  }
  const Value& out = g.value(node.returns[0].values[0]);
  const TensorMeta& m = out.meta;
  if (!FusedDtype(m.dtype)) return absl::StrCat("dtype ", tracer::DtypeShort(m.dtype));
  if (!m.device.is_cpu()) return "not on the CPU";
  // A program (Note [Straight-line programs]) checks history and the result's storage itself.
  if (!program) {
    if (m.requires_grad) return "requires grad";
    if (out.alias_of != tracer::kNoValue) return "result is a view";
    if (!IsContiguous(m.sizes, m.strides)) return "non-contiguous result";
  }
  for (int a = def.tensors + def.scalars; a < static_cast<int>(node.args.size()); ++a) {
    if (node.args[a].kind != NodeArg::Kind::kConstant) return "unexpected schema";
  }
  for (int a = 0; a < def.tensors; ++a) {
    const NodeArg& arg = node.args[a];
    if (arg.kind != NodeArg::Kind::kValue) return "operand is not a tensor";
    const TensorMeta& im = g.value(arg.value).meta;
    if (!FusedDtype(im.dtype)) return absl::StrCat("operand dtype ", tracer::DtypeShort(im.dtype));
    if (!im.device.is_cpu()) return "operand not on the CPU";
    if (im.requires_grad && !program) return "operand requires grad";
    if (!Broadcasts(im.sizes, m.sizes)) return "operand does not broadcast to the result";
    if (im.strides.size() != im.sizes.size()) return "operand without strides";
  }
  const ScalarType compute = ComputeDtype(g, node, def);
  if (!FusedDtype(compute)) return absl::StrCat("compute dtype ", tracer::DtypeShort(compute));
  switch (def.kind) {
    case Kind::kArith:
      if (compute == ScalarType::Bool) return "bool arithmetic";
      break;
    case Kind::kFloat:
      if (!at::isFloatingType(compute)) return "integer result";
      break;
    case Kind::kCompare:
      if (m.dtype != ScalarType::Bool) return "comparison result is not bool";
      break;
    case Kind::kWhere:
      if (g.value(node.args[0].value).meta.dtype != ScalarType::Bool) return "condition is not bool";
      break;
  }
  double first_scalar = 0;
  for (int a = def.tensors; a < def.tensors + def.scalars; ++a) {
    const NodeArg& arg = node.args[a];
    std::string text;
    double value;
    if (arg.kind != NodeArg::Kind::kConstant || !ScalarLiteral(arg.constant, compute, &text, &value)) {
      return "scalar argument is not a representable number";
    }
    if (a == def.tensors) first_scalar = value;
  }
  if (def.accept != nullptr) return def.accept(node, first_scalar);
  return "";
}

}  // namespace emit

namespace {

// Note [Lone softmax]
// A region that is nothing but one softmax or log_softmax saves one ATen call and otherwise races
// ATen's own kernel, whose exp is vectorized SLEEF (1.13) or a faster approximation (2.x). Measured
// on 2.13 (log_softmax over rows of 40 floats, backend cpp vs eager, medians of 5): 1 row 551 vs
// 606 ns, 2 rows 584 vs 599, 7 rows 922 vs 767, 56 rows (the LSTM language model's output at batch
// 8) 4.5 us vs 2.5 us; as an ATen call 56 rows took what eager takes. Warden's row kernel alone
// took 3.2 us for the 56 rows 8-wide (Note [Short rows]); an inline polynomial exp in place of
// libmvec's measured slower. Long rows are another matter: softmax over [64, 1024] alone ran 2.5x
// faster than eager as a 16-wide kernel on 1.13 (and at eager's speed as an ATen call). So a lone
// softmax over rows shorter than kLoneSoftmaxLongRow, of more than kLoneSoftmaxMax elements,
// stays an ATen call; smaller ones, softmaxes over other dims (not measured) and softmaxes fused
// with neighbours (which save whole passes over memory) stay kernels.
constexpr int64_t kLoneSoftmaxMax = 64;
constexpr int64_t kLoneSoftmaxLongRow = 256;

bool LoneSoftmaxForATen(const PointwiseRegion& r) {
  if (r.nodes.size() != 1 ||
      (r.reduction != ReductionKind::kSoftmax && r.reduction != ReductionKind::kLogSoftmax) ||
      r.outer_dims != static_cast<int>(r.layout.sizes.size()) - 1) {
    return false;  // fused, or over another dim than the (merged) last: measured only for rows
  }
  int64_t numel = 1;
  for (int64_t d : r.sizes) numel *= d;
  // Long rows stay kernels: 16 lanes wide they beat ATen (softmax over [64, 1024] on 1.13: 2.5x).
  const int64_t row = r.layout.sizes[r.outer_dims];
  return numel > kLoneSoftmaxMax && row < kLoneSoftmaxLongRow;
}

}  // namespace

PointwisePlan PlanPointwise(const Graph& g, const std::vector<bool>& symbolic_shape,
                            const std::vector<bool>& history_free, const std::vector<bool>& reserved) {
  PointwisePlan plan;
  plan.programs = emit::PlanPrograms(g, symbolic_shape, history_free, reserved);
  std::vector<bool> in_program(g.nodes.size(), false);
  for (size_t p = 0; p < plan.programs.size(); ++p) {
    plan.programs[p].function = absl::StrCat("warden_program_", p);
    for (int n : plan.programs[p].nodes) in_program[n] = true;
  }
  std::vector<int> last_user(g.values.size(), -1);
  auto use = [&](ValueId id, int node) {
    if (id != tracer::kNoValue) last_user[id] = std::max(last_user[id], node);
  };
  for (const Node& n : g.nodes) {
    for (const NodeArg& a : n.args) {
      if (a.kind == NodeArg::Kind::kValue) use(a.value, n.index);
      for (ValueId id : a.values) use(id, n.index);
    }
  }
  std::vector<bool> returned(g.values.size(), false);
  for (ValueId id : g.outputs) {
    if (id != tracer::kNoValue) returned[id] = true;
  }
  auto is_static = [&](ValueId id) {
    return static_cast<size_t>(id) >= symbolic_shape.size() || !symbolic_shape[id];
  };

  PointwiseRegion* open = nullptr;      // the region elementwise nodes of its shape may join
  PointwiseRegion* epilogue = nullptr;  // a reduction region whose epilogue nodes may follow
  std::vector<int64_t> epilogue_shape;
  for (const Node& n : g.nodes) {
    if (in_program[n.index] || (static_cast<size_t>(n.index) < reserved.size() && reserved[n.index])) {
      open = epilogue = nullptr;
      continue;
    }
    const ReductionInfo reduction = ReductionOf(g, n);
    if (reduction.kind != ReductionKind::kNone) {
      // Note [Row reductions]: ends the open region if it produced the reduced value just before,
      // else starts one; either way only epilogue nodes may follow.
      epilogue = nullptr;
      const ValueId in = n.args[0].value;
      const Value& v = g.value(in);
      // Other tensor operands (layer_norm's weight and bias) must come from before the region.
      bool operands_before = true;
      for (size_t a = 1; a < n.args.size(); ++a) {
        if (n.args[a].kind != NodeArg::Kind::kValue || open == nullptr) continue;
        const Value& w = g.value(n.args[a].value);
        operands_before &= !(w.kind == tracer::ValueKind::kNode && w.node >= open->nodes.front());
      }
      if (open == nullptr || !operands_before || open->nodes.back() != n.index - 1 ||
          v.kind != tracer::ValueKind::kNode || v.node != n.index - 1 || open->sizes != v.meta.sizes) {
        plan.regions.emplace_back();
        open = &plan.regions.back();
        open->sizes = v.meta.sizes;
      }
      open->nodes.push_back(n.index);
      open->reduction = reduction.kind;
      open->reduction_node = n.index;
      open->reduced_dim = reduction.dim;
      open->reduced_count = reduction.count;
      open->keepdim = reduction.keepdim;
      epilogue = open;
      epilogue_shape = g.value(n.returns[0].values[0]).meta.sizes;
      open = nullptr;
      continue;
    }
    if (!FusionBlocker(g, n).empty()) {
      open = epilogue = nullptr;
      continue;
    }
    const TensorMeta& m = g.value(n.returns[0].values[0]).meta;
    if (epilogue != nullptr) {
      // An epilogue node: of the reduction's result shape, reading no prologue value.
      bool joins = m.sizes == epilogue_shape;
      for (int a = 0; a < OpTable().at(n.op).tensors; ++a) {
        const Value& w = g.value(n.args[a].value);
        joins &= !(w.kind == tracer::ValueKind::kNode && w.node >= epilogue->nodes.front() &&
                   w.node < epilogue->reduction_node);
      }
      if (joins) {
        epilogue->nodes.push_back(n.index);
        continue;
      }
      epilogue = nullptr;
    }
    if (open == nullptr || open->sizes != m.sizes) {
      plan.regions.emplace_back();
      open = &plan.regions.back();
      open->sizes = m.sizes;
    }
    open->nodes.push_back(n.index);
  }

  std::vector<PointwiseRegion> regions;
  regions.swap(plan.regions);
  for (PointwiseRegion& r : regions) {
    const int first = r.nodes.front(), last = r.nodes.back();
    auto produced_here = [&](ValueId id) {
      const Value& v = g.value(id);
      return v.kind == tracer::ValueKind::kNode && v.node >= first && v.node <= last;
    };
    const bool reduced_shape = r.reduction != ReductionKind::kNone && !FullShaped(r.reduction);
    std::vector<std::vector<int64_t>> in_sizes, in_strides;
    for (int index : r.nodes) {
      const Node& n = g.nodes[index];
      const bool is_reduction = index == r.reduction_node;
      const bool after = r.reduction != ReductionKind::kNone && index >= r.reduction_node;
      // Operands of the reduced shape without keepdim, in the region's coordinates.
      const int unsqueeze = after && !is_reduction && reduced_shape && !r.keepdim ? r.reduced_dim : -1;
      const int tensors = is_reduction ? static_cast<int>(n.args.size()) : OpTable().at(n.op).tensors;
      for (int a = 0; a < tensors; ++a) {
        if (n.args[a].kind != NodeArg::Kind::kValue) continue;  // a reduction's constants
        const ValueId id = n.args[a].value;
        bool known = produced_here(id);
        for (size_t j = 0; j < r.inputs.size(); ++j) known |= r.inputs[j] == id && r.input_unsqueeze[j] == unsqueeze;
        if (known) continue;
        r.inputs.push_back(id);
        r.input_unsqueeze.push_back(unsqueeze);
        r.input_constant.push_back(Inline(g.value(id)));
        in_sizes.push_back(g.value(id).meta.sizes);
        in_strides.push_back(r.input_constant.back().inlined ? ContiguousStrides(in_sizes.back())
                                                             : g.value(id).meta.strides);
        if (unsqueeze >= 0) {
          UnsqueezeReduced(r.sizes.size(), unsqueeze, r.reduced_count, &in_sizes.back(), &in_strides.back());
        }
        r.static_layout = r.static_layout && is_static(id);
      }
      const ValueId out = n.returns[0].values[0];
      r.static_layout = r.static_layout && is_static(out);
      if (last_user[out] > last || returned[out]) {
        r.outputs.push_back(out);
        r.output_reduced.push_back(after && reduced_shape);
      }
    }
    if (r.reduction == ReductionKind::kNone) {
      Collapse(r.sizes, in_sizes, in_strides, &r.layout);  // operands broadcast (FusionBlocker)
    } else if (!ReductionLayout(r.sizes, r.reduced_dim, r.reduced_count, in_sizes, in_strides, &r.layout,
                                &r.outer_dims)) {
      continue;  // reduced dims that do not merge for some operand: the region's nodes are replayed
    }
    if (LoneSoftmaxForATen(r)) continue;
    r.function = absl::StrCat("warden_kernel_", plan.regions.size());
    plan.regions.push_back(std::move(r));
  }

  if (!plan.regions.empty() || !plan.programs.empty()) {
    plan.source = kPrelude;
    for (const PointwiseRegion& r : plan.regions) {
      absl::StrAppend(&plan.source, "\n",
                      r.reduction == ReductionKind::kNone ? RegionSource(g, r) : ReductionSource(g, r));
    }
    for (const ProgramRegion& p : plan.programs) absl::StrAppend(&plan.source, "\n", emit::ProgramSource(g, p));
  }
  return plan;
}

std::vector<std::string> FusibleOps() {
  std::vector<std::string> names;
  for (const auto& [name, def] : OpTable()) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace warden::codegen
