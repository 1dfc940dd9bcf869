// Pointwise fusion: the op table (one row per fusible ATen op, with the C expression that
// computes it as ATen's CPU kernel does), region partition and source emission.
#include "runtime/codegen_pointwise.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace warden::codegen {
namespace {

using tracer::Graph;
using tracer::Node;
using tracer::NodeArg;
using tracer::NodeReturn;
using tracer::TensorMeta;
using tracer::Value;
using tracer::ValueId;

// What an op's emitter gets: tensor operands as C expressions, then its Scalar arguments as
// literals of the region's dtype (and their values, for simplifications like alpha == 1).
struct Operands {
  std::vector<std::string> t;
  std::vector<std::string> s;
  std::vector<double> value;
  bool is_float = true;  // f32 (else f64)

  const std::string& a() const { return t[0]; }
  const std::string& b() const { return t[1]; }
  std::string Fn(const char* name) const { return absl::StrCat(name, is_float ? "f" : ""); }
  const char* Zero() const { return is_float ? "0.0f" : "0.0"; }
  const char* One() const { return is_float ? "1.0f" : "1.0"; }
  const char* Nan() const { return is_float ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")"; }
  // self + alpha * other the way ATen's add kernel computes it: vec::fmadd(other, alpha, self),
  // which for alpha == 1 rounds exactly like self + other.
  std::string AddScaled(const std::string& self, const std::string& other, size_t alpha,
                        bool negate) const {
    if (value[alpha] == 1) return absl::StrCat("(", self, negate ? " - " : " + ", other, ")");
    return absl::StrCat(Fn("__builtin_fma"), "(", other, ", ", negate ? "-" : "", s[alpha], ", ",
                        self, ")");
  }
};

using Emit = std::string (*)(const Operands&);

struct OpDef {
  int tensors;             // leading tensor operands (self, other)
  int scalars;             // Scalar arguments right after them
  bool scalars_not_nan;    // clamp bounds: ATen's NaN-bound behaviour is not modelled
  Emit emit;
};

// Semantics follow LibTorch 1.13's CPU kernels (BinaryOpsKernel, UnaryOpsKernel,
// TensorCompareKernel and ufunc/add.h), including NaN propagation: relu/clamp keep a NaN input,
// maximum/minimum return NaN if either side is NaN.
const std::unordered_map<std::string, OpDef>& OpTable() {
  static const auto* table = new std::unordered_map<std::string, OpDef>{
      {"aten::add.Tensor", {2, 1, false, [](const Operands& o) { return o.AddScaled(o.a(), o.b(), 0, false); }}},
      {"aten::add.Scalar", {1, 2, false, [](const Operands& o) { return o.AddScaled(o.a(), o.s[0], 1, false); }}},
      {"aten::sub.Tensor", {2, 1, false, [](const Operands& o) { return o.AddScaled(o.a(), o.b(), 0, true); }}},
      {"aten::sub.Scalar", {1, 2, false, [](const Operands& o) { return o.AddScaled(o.a(), o.s[0], 1, true); }}},
      {"aten::rsub.Tensor", {2, 1, false, [](const Operands& o) { return o.AddScaled(o.b(), o.a(), 0, true); }}},
      {"aten::rsub.Scalar", {1, 2, false, [](const Operands& o) { return o.AddScaled(o.s[0], o.a(), 1, true); }}},
      {"aten::mul.Tensor", {2, 0, false, [](const Operands& o) { return absl::StrCat("(", o.a(), " * ", o.b(), ")"); }}},
      {"aten::mul.Scalar", {1, 1, false, [](const Operands& o) { return absl::StrCat("(", o.a(), " * ", o.s[0], ")"); }}},
      {"aten::div.Tensor", {2, 0, false, [](const Operands& o) { return absl::StrCat("(", o.a(), " / ", o.b(), ")"); }}},
      {"aten::div.Scalar", {1, 1, false, [](const Operands& o) { return absl::StrCat("(", o.a(), " / ", o.s[0], ")"); }}},
      {"aten::neg", {1, 0, false, [](const Operands& o) { return absl::StrCat("(-", o.a(), ")"); }}},
      {"aten::relu", {1, 0, false, [](const Operands& o) {  // relu is clamp_min(self, 0)
         return absl::StrCat("(", o.a(), " < ", o.Zero(), " ? ", o.Zero(), " : ", o.a(), ")"); }}},
      {"aten::sigmoid", {1, 0, false, [](const Operands& o) {
         return absl::StrCat("(", o.One(), " / (", o.One(), " + ", o.Fn("exp"), "(-", o.a(), ")))"); }}},
      {"aten::tanh", {1, 0, false, [](const Operands& o) { return absl::StrCat(o.Fn("tanh"), "(", o.a(), ")"); }}},
      {"aten::exp", {1, 0, false, [](const Operands& o) { return absl::StrCat(o.Fn("exp"), "(", o.a(), ")"); }}},
      {"aten::log", {1, 0, false, [](const Operands& o) { return absl::StrCat(o.Fn("log"), "(", o.a(), ")"); }}},
      {"aten::abs", {1, 0, false, [](const Operands& o) { return absl::StrCat(o.Fn("__builtin_fabs"), "(", o.a(), ")"); }}},
      {"aten::sqrt", {1, 0, false, [](const Operands& o) { return absl::StrCat(o.Fn("__builtin_sqrt"), "(", o.a(), ")"); }}},
      {"aten::rsqrt", {1, 0, false, [](const Operands& o) {
         return absl::StrCat("(", o.One(), " / ", o.Fn("__builtin_sqrt"), "(", o.a(), "))"); }}},
      {"aten::reciprocal", {1, 0, false, [](const Operands& o) { return absl::StrCat("(", o.One(), " / ", o.a(), ")"); }}},
      {"aten::square", {1, 0, false, [](const Operands& o) { return absl::StrCat("(", o.a(), " * ", o.a(), ")"); }}},
      {"aten::clamp_min", {1, 1, true, [](const Operands& o) {  // std::max(a, min)
         return absl::StrCat("(", o.a(), " < ", o.s[0], " ? ", o.s[0], " : ", o.a(), ")"); }}},
      {"aten::clamp_max", {1, 1, true, [](const Operands& o) {  // std::min(a, max)
         return absl::StrCat("(", o.s[0], " < ", o.a(), " ? ", o.s[0], " : ", o.a(), ")"); }}},
      {"aten::maximum", {2, 0, false, [](const Operands& o) {
         return absl::StrCat("((", o.a(), " != ", o.a(), " || ", o.b(), " != ", o.b(), ") ? ", o.Nan(),
                             " : (", o.a(), " < ", o.b(), " ? ", o.b(), " : ", o.a(), "))"); }}},
      {"aten::minimum", {2, 0, false, [](const Operands& o) {
         return absl::StrCat("((", o.a(), " != ", o.a(), " || ", o.b(), " != ", o.b(), ") ? ", o.Nan(),
                             " : (", o.b(), " < ", o.a(), " ? ", o.b(), " : ", o.a(), "))"); }}},
  };
  return *table;
}

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

// A Scalar argument converted to the region's dtype as Scalar::to<T>() does, as an exact C
// literal. False if it is not a real number or does not fit.
bool Literal(const c10::IValue& v, bool is_float, std::string* text, double* value) {
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
  const char* f = is_float ? "f" : "";
  if (std::isnan(d)) {
    *text = is_float ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
  } else if (std::isinf(d)) {
    *text = absl::StrCat("(", d < 0 ? "-" : "", "__builtin_inf", f, "())");
  } else {
    *text = absl::StrCat("(", absl::StrFormat("%a", d), f, ")");
  }
  return true;
}

bool FusedDtype(at::ScalarType t) { return t == at::ScalarType::Float || t == at::ScalarType::Double; }

// A name for comments in the source that does not depend on user-chosen argument names, so that
// equal kernels of different functions hash (and cache) alike.
std::string CanonicalName(const Graph& g, ValueId id) {
  const Value& v = g.value(id);
  if (v.kind == tracer::ValueKind::kInput) return absl::StrCat("arg", v.arg_index);
  return g.ValueName(id);
}

const char* TypeName(at::ScalarType t) { return t == at::ScalarType::Float ? "float" : "double"; }

std::string RegionSource(const Graph& g, const PointwiseRegion& r) {
  const bool is_float = r.dtype == at::ScalarType::Float;
  const char* T = TypeName(r.dtype);
  std::vector<std::string> ops;
  for (int n : r.nodes) ops.push_back(g.nodes[n].op);
  // No sizes in the text: the kernel takes n at run time, so graphs that differ only in sizes
  // share one source and one cached library.
  std::string s = absl::StrCat("// Nodes %", r.nodes.front(), "..%", r.nodes.back(), " (",
                               tracer::DtypeShort(r.dtype), "): ", absl::StrJoin(ops, ", "), "\n");
  absl::StrAppend(&s, "extern \"C\" void ", r.function,
                  "(const void** in, void** out, int64_t n) {\n");
  std::string loads;
  for (size_t k = 0; k < r.inputs.size(); ++k) {
    const ValueId id = r.inputs[k];
    if (r.scalar_inputs[k]) {
      absl::StrAppend(&s, "  const ", T, " v", id, " = *static_cast<const ", T, "*>(in[", k,
                      "]);  // ", CanonicalName(g, id), " (0-dim)\n");
    } else {
      absl::StrAppend(&s, "  const ", T, "* __restrict in", k, " = static_cast<const ", T,
                      "*>(in[", k, "]);  // ", CanonicalName(g, id), "\n");
      absl::StrAppend(&loads, "    const ", T, " v", id, " = in", k, "[i];\n");
    }
  }
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    absl::StrAppend(&s, "  ", T, "* __restrict out", k, " = static_cast<", T, "*>(out[", k,
                    "]);  // ", CanonicalName(g, r.outputs[k]), "\n");
  }
  absl::StrAppend(&s, "#pragma omp simd\n  for (int64_t i = 0; i < n; ++i) {\n", loads);
  for (int index : r.nodes) {
    const Node& node = g.nodes[index];
    const OpDef& def = OpTable().at(node.op);
    Operands o;
    o.is_float = is_float;
    for (int a = 0; a < def.tensors; ++a) o.t.push_back(absl::StrCat("v", node.args[a].value));
    for (int a = def.tensors; a < def.tensors + def.scalars; ++a) {
      std::string text;
      double value = 0;
      Literal(node.args[a].constant, is_float, &text, &value);  // checked by FusionBlocker
      o.s.push_back(std::move(text));
      o.value.push_back(value);
    }
    const ValueId out = node.returns[0].values[0];
    absl::StrAppend(&s, "    const ", T, " v", out, " = ", def.emit(o), ";  // ",
                    CanonicalName(g, out), " = ", node.op, "\n");
  }
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    absl::StrAppend(&s, "    out", k, "[i] = v", r.outputs[k], ";\n");
  }
  absl::StrAppend(&s, "  }\n}\n");
  return s;
}

// Declarations instead of <math.h>: with glibc >= 2.35 on x86-64 these carry the SIMD attribute
// that glibc's own header only adds under -ffast-math, so GCC calls libmvec's vector variants
// (_ZGVeN16v_expf, ...) from vectorized loops; elsewhere the loops call scalar libm. libmvec's
// tanhf is ~4.5x faster than SLEEF's (ATen's); exp is on par. NaN/Inf follow IEEE like libm.
constexpr char kPrelude[] = R"src(// Generated by Warden (backend "cpp"): fused pointwise kernels.
#include <stdint.h>
#if defined(__x86_64__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define WARDEN_VECTOR_MATH __attribute__((__simd__("notinbranch"), __const__, __nothrow__))
#else
#define WARDEN_VECTOR_MATH __attribute__((__const__, __nothrow__))
#endif
extern "C" {
float expf(float) WARDEN_VECTOR_MATH;
float logf(float) WARDEN_VECTOR_MATH;
float tanhf(float) WARDEN_VECTOR_MATH;
double exp(double) WARDEN_VECTOR_MATH;
double log(double) WARDEN_VECTOR_MATH;
double tanh(double) WARDEN_VECTOR_MATH;
}
)src";

}  // namespace

std::string FusionBlocker(const Graph& g, const Node& node) {
  if (!node.handle) return "no operator";
  if (node.mutates) return "in-place";
  if (node.random) return "random";
  if (node.kind == tracer::NodeKind::kDataDependent) return "data-dependent";
  auto it = OpTable().find(node.op);
  if (it == OpTable().end()) return "no pointwise lowering";
  const OpDef& def = it->second;
  if (node.args.size() != static_cast<size_t>(def.tensors + def.scalars)) return "unexpected schema";
  if (node.returns.size() != 1 || node.returns[0].kind != NodeReturn::Kind::kTensor ||
      node.returns[0].values.size() != 1) {
    return "unexpected returns";
  }
  const Value& out = g.value(node.returns[0].values[0]);
  const TensorMeta& m = out.meta;
  if (!FusedDtype(m.dtype)) return absl::StrCat("dtype ", tracer::DtypeShort(m.dtype));
  if (!m.device.is_cpu()) return "not on the CPU";
  if (m.requires_grad) return "requires grad";
  if (out.alias_of != tracer::kNoValue) return "result is a view";
  if (!IsContiguous(m.sizes, m.strides)) return "non-contiguous result";
  for (int a = 0; a < def.tensors; ++a) {
    const NodeArg& arg = node.args[a];
    if (arg.kind != NodeArg::Kind::kValue) return "operand is not a tensor";
    const TensorMeta& im = g.value(arg.value).meta;
    if (im.dtype != m.dtype) return "mixed dtypes";
    if (!im.device.is_cpu()) return "operand not on the CPU";
    if (im.requires_grad) return "operand requires grad";
    if (im.sizes == m.sizes) {
      if (!IsContiguous(im.sizes, im.strides)) return "non-contiguous operand";
    } else if (!im.sizes.empty()) {
      return "broadcast";
    }
  }
  for (int a = def.tensors; a < def.tensors + def.scalars; ++a) {
    const NodeArg& arg = node.args[a];
    std::string text;
    double value;
    if (arg.kind != NodeArg::Kind::kConstant ||
        !Literal(arg.constant, m.dtype == at::ScalarType::Float, &text, &value)) {
      return "scalar argument is not a representable number";
    }
    if (def.scalars_not_nan && std::isnan(value)) return "NaN bound";
  }
  return "";
}

PointwisePlan PlanPointwise(const Graph& g) {
  PointwisePlan plan;
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

  PointwiseRegion* open = nullptr;
  for (const Node& n : g.nodes) {
    if (!FusionBlocker(g, n).empty()) {
      open = nullptr;
      continue;
    }
    const TensorMeta& m = g.value(n.returns[0].values[0]).meta;
    if (open == nullptr || open->dtype != m.dtype || open->sizes != m.sizes) {
      plan.regions.emplace_back();
      open = &plan.regions.back();
      open->dtype = m.dtype;
      open->sizes = m.sizes;
    }
    open->nodes.push_back(n.index);
  }

  for (size_t k = 0; k < plan.regions.size(); ++k) {
    PointwiseRegion& r = plan.regions[k];
    r.function = absl::StrCat("warden_kernel_", k);
    const int first = r.nodes.front(), last = r.nodes.back();
    auto produced_here = [&](ValueId id) {
      const Value& v = g.value(id);
      return v.kind == tracer::ValueKind::kNode && v.node >= first && v.node <= last;
    };
    for (int index : r.nodes) {
      const Node& n = g.nodes[index];
      const int tensors = OpTable().at(n.op).tensors;
      for (int a = 0; a < tensors; ++a) {
        const ValueId id = n.args[a].value;
        if (produced_here(id) ||
            std::find(r.inputs.begin(), r.inputs.end(), id) != r.inputs.end()) {
          continue;
        }
        r.inputs.push_back(id);
        r.scalar_inputs.push_back(g.value(id).meta.sizes != r.sizes);
      }
      const ValueId out = n.returns[0].values[0];
      if (last_user[out] > last || returned[out]) r.outputs.push_back(out);
    }
  }

  if (!plan.regions.empty()) {
    plan.source = kPrelude;
    for (const PointwiseRegion& r : plan.regions) absl::StrAppend(&plan.source, "\n", RegionSource(g, r));
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
