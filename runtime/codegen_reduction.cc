// Reduction regions (Note [Row reductions] in codegen_pointwise.h): which nodes are reductions
// the fuser runs, their layout, and the source of their kernels (row and column variants).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/codegen_emit.h"
#include "runtime/codegen_pointwise.h"

namespace warden::codegen {
namespace {

using at::ScalarType;
using emit::CanonicalName;
using emit::CType;
using emit::FullShaped;
using emit::LiteralOf;
using emit::Load;
using emit::NodeStatements;
using emit::Stores;
using tracer::Graph;
using tracer::Node;
using tracer::NodeArg;
using tracer::NodeReturn;
using tracer::TensorMeta;
using tracer::Value;
using tracer::ValueId;

// Note [Row reductions]: the reductions a region may contain, and their schemas.
struct ReductionDef {
  ReductionKind kind;
  bool dim_list;  // int[] dim (else int dim)
  int args;       // schema length (2: sum/mean over every dim)
};

const std::unordered_map<std::string, ReductionDef>& ReductionTable() {
  static const auto* table = new std::unordered_map<std::string, ReductionDef>{
      {"aten::softmax.int", {ReductionKind::kSoftmax, false, 3}},
      {"aten::_softmax", {ReductionKind::kSoftmax, false, 3}},
      {"aten::log_softmax.int", {ReductionKind::kLogSoftmax, false, 3}},
      {"aten::_log_softmax", {ReductionKind::kLogSoftmax, false, 3}},
      {"aten::sum.dim_IntList", {ReductionKind::kSum, true, 4}},
      {"aten::mean.dim", {ReductionKind::kMean, true, 4}},
      {"aten::sum", {ReductionKind::kSum, true, 2}},  // (self, dtype): every dim
      {"aten::mean", {ReductionKind::kMean, true, 2}},
      {"aten::amax", {ReductionKind::kAmax, true, 3}},
      {"aten::layer_norm", {ReductionKind::kLayerNorm, true, 6}},
  };
  return *table;
}

// The tensor operands of `nodes` that are region inputs, as indices into r.inputs (an operand of
// the reduced shape with keepdim=false is the input unsqueezed for it).
std::vector<int> InputsOf(const Graph& g, const PointwiseRegion& r, const std::vector<int>& nodes, int unsqueeze) {
  std::vector<int> ks;
  for (int index : nodes) {
    const Node& n = g.nodes[index];
    const bool is_reduction = index == r.reduction_node;
    const int tensors = is_reduction ? static_cast<int>(n.args.size()) : emit::TensorOperands(n);
    for (int a = 0; a < tensors; ++a) {
      if (n.args[a].kind != NodeArg::Kind::kValue || (is_reduction && a > 0)) continue;
      for (size_t k = 0; k < r.inputs.size(); ++k) {
        if (r.inputs[k] == n.args[a].value && r.input_unsqueeze[k] == unsqueeze &&
            std::find(ks.begin(), ks.end(), static_cast<int>(k)) == ks.end()) {
          ks.push_back(static_cast<int>(k));
        }
      }
    }
  }
  return ks;
}

// `o<k> += i * t<k>_<d>` for layout dims [first, last) (from the last), taking i from `rest`.
std::string Offsets(int ins, int first, int last, const std::string& indent) {
  std::string s;
  for (int d = last - 1; d >= first; --d) {
    absl::StrAppend(&s, indent, "{\n", indent, "  const int64_t i = rest % s", d, ";\n", indent, "  rest /= s", d,
                    ";\n");
    for (int k = 0; k < ins; ++k) absl::StrAppend(&s, indent, "  o", k, " += i * t", k, "_", d, ";\n");
    absl::StrAppend(&s, indent, "}\n");
  }
  return s;
}

// Columns per block of a column reduction (Note [Row reductions]).
constexpr int kColumns = 64;

}  // namespace

namespace emit {

bool FullShaped(ReductionKind k) {
  return k == ReductionKind::kSoftmax || k == ReductionKind::kLogSoftmax || k == ReductionKind::kLayerNorm;
}

ReductionInfo ReductionOf(const Graph& g, const Node& node) {
  ReductionInfo none;
  auto it = ReductionTable().find(node.op);
  if (it == ReductionTable().end() || !node.handle || node.mutates || node.mode) return none;
  for (const NodeArg& a : node.args) {
    if (!a.sizes_of.empty()) return none;  // argument sizes at run time: replayed
  }
  const ReductionDef& def = it->second;
  if (node.args.size() != static_cast<size_t>(def.args) || node.returns.size() != 1 ||
      node.returns[0].kind != NodeReturn::Kind::kTensor || node.returns[0].values.size() != 1 ||
      node.args[0].kind != NodeArg::Kind::kValue) {
    return none;
  }
  const Value& out = g.value(node.returns[0].values[0]);
  const TensorMeta& im = g.value(node.args[0].value).meta;
  const TensorMeta& m = out.meta;
  if (im.sizes.empty() || im.dtype != m.dtype ||
      (m.dtype != ScalarType::Float && m.dtype != ScalarType::Double) || !m.device.is_cpu() ||
      !im.device.is_cpu() || m.requires_grad || im.requires_grad || out.alias_of != tracer::kNoValue ||
      !IsContiguous(m.sizes, m.strides) || im.strides.size() != im.sizes.size()) {
    return none;
  }
  const int64_t rank = static_cast<int64_t>(im.sizes.size());
  if (def.kind == ReductionKind::kLayerNorm) {
    // layer_norm(input, normalized_shape=[C], weight?, bias?, eps, cudnn_enable)
    const NodeArg& shape = node.args[1];
    if (im.sizes.back() < 1 || shape.kind != NodeArg::Kind::kConstant || !shape.constant.isIntList() ||
        shape.constant.toIntList().size() != 1 || shape.constant.toIntList().get(0) != im.sizes.back() ||
        node.args[4].kind != NodeArg::Kind::kConstant || !node.args[4].constant.isDouble()) {
      return none;
    }
    for (int a : {2, 3}) {
      const NodeArg& wb = node.args[a];
      if (wb.kind == NodeArg::Kind::kConstant && wb.constant.isNone()) continue;
      if (wb.kind != NodeArg::Kind::kValue) return none;
      const TensorMeta& wm = g.value(wb.value).meta;
      if (wm.sizes != std::vector<int64_t>{im.sizes.back()} || wm.dtype != m.dtype || !wm.device.is_cpu() ||
          wm.requires_grad || wm.strides.size() != 1) {
        return none;
      }
    }
    return {def.kind, static_cast<int>(rank - 1), 1, false};
  }
  for (size_t a = 1; a < node.args.size(); ++a) {
    if (node.args[a].kind != NodeArg::Kind::kConstant) return none;
  }
  // The reduced dims: one int, an int list (empty: all dims), or all (sum/mean without dim).
  std::vector<int64_t> dims;
  const c10::IValue& dim = node.args[1].constant;
  if (def.args == 2 || (def.dim_list && dim.isIntList() && dim.toIntList().empty())) {
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  } else if (def.dim_list && dim.isIntList()) {
    for (int64_t d : dim.toIntList()) dims.push_back(d < 0 ? d + rank : d);
  } else if (!def.dim_list && dim.isInt()) {
    dims.push_back(dim.toInt() < 0 ? dim.toInt() + rank : dim.toInt());
  } else {
    return none;
  }
  std::sort(dims.begin(), dims.end());
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] < 0 || dims[k] >= rank || im.sizes[dims[k]] < 1 || dims[k] != dims[0] + static_cast<int64_t>(k)) {
      return none;  // out of range, empty, repeated or not consecutive
    }
  }
  const c10::IValue& last = node.args[def.args - 1].constant;  // dtype (None), half_to_float, amax's keepdim
  if (def.kind != ReductionKind::kAmax && !(last.isNone() || (last.isBool() && !last.toBool()))) return none;
  bool keepdim = false;
  if (def.dim_list && def.args > 2) {  // sum/mean (self, dim, keepdim, dtype), amax (self, dim, keepdim)
    if (!node.args[2].constant.isBool()) return none;
    keepdim = node.args[2].constant.toBool();
  }
  return {def.kind, static_cast<int>(dims[0]), static_cast<int>(dims.size()), keepdim};
}

std::string ReductionSource(const Graph& g, const PointwiseRegion& r) {
  const int dims = static_cast<int>(r.layout.sizes.size());
  const int ins = static_cast<int>(r.inputs.size());
  const int ra = r.outer_dims;
  const bool columns = ra < dims - 1;
  const Node& red = g.nodes[r.reduction_node];
  const ValueId x = red.args[0].value, y = red.returns[0].values[0];
  const ScalarType t = g.value(x).meta.dtype;
  const char* T = CType(t);
  const char* f = t == ScalarType::Float ? "f" : "";
  const std::string nan = t == ScalarType::Float ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
  const std::string inf = t == ScalarType::Float ? "__builtin_inff()" : "__builtin_inf()";
  const bool full = FullShaped(r.reduction);
  const bool max_like = r.reduction == ReductionKind::kAmax || r.reduction == ReductionKind::kSoftmax ||
                        r.reduction == ReductionKind::kLogSoftmax;
  std::vector<int> prologue, epilogue;
  for (int n : r.nodes) {
    if (n < r.reduction_node) prologue.push_back(n);
    if (n > r.reduction_node) epilogue.push_back(n);
  }
  std::vector<int> with_reduction = prologue;
  with_reduction.push_back(r.reduction_node);
  const std::vector<int> in_prologue = InputsOf(g, r, with_reduction, -1);
  const std::vector<int> in_epilogue = InputsOf(g, r, epilogue, full || r.keepdim ? -1 : r.reduced_dim);
  int y_out = -1;
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    if (r.outputs[k] == y) y_out = static_cast<int>(k);
  }
  const bool scratch = full && y_out < 0;

  std::string s = KernelHead(g, r);
  absl::StrAppend(&s, "  const int64_t R = s", ra, ";\n");
  // Indices: a full-shaped element (`at`), a line (`line_at`), the row buffer (`buf_at`).
  std::string at, line_at, buf_at, lane, lane_loop;
  if (columns) {
    absl::StrAppend(&s, "  const int64_t cols = s", dims - 1, ";\n  const int64_t inner = ");
    for (int d = ra + 1; d < dims; ++d) absl::StrAppend(&s, d > ra + 1 ? " * " : "", "s", d);
    absl::StrAppend(&s, ";\n");
    if (scratch) {
      absl::StrAppend(&s, "  ", T, "* const scratch = static_cast<", T, "*>(malloc(R * ", kColumns, " * sizeof(",
                      T, ")));\n  if (scratch == 0) __builtin_trap();\n");
    }
    absl::StrAppend(&s, "  for (int64_t line = begin; line < end;) {\n",
                    "    const int64_t oi = line / inner, ii = line % inner;\n",
                    "    const int64_t ih = ii / cols, j0 = ii % cols;\n",
                    "    const int64_t j1 = cols - j0 < end - line ? cols : j0 + (end - line);\n");
    for (int k = 0; k < ins; ++k) absl::StrAppend(&s, "    int64_t o", k, " = 0;\n");
    absl::StrAppend(&s, "    int64_t rest = oi;\n", Offsets(ins, 0, ra, "    "), "    rest = ih;\n",
                    Offsets(ins, ra + 1, dims - 1, "    "), "    (void)rest;\n");
    absl::StrAppend(&s, "    for (int64_t cb = j0; cb < j1; cb += ", kColumns, ") {\n",
                    "      const int64_t nc = j1 - cb < ", kColumns, " ? j1 - cb : ", kColumns, ";\n",
                    "      const int64_t lin = oi * inner + ih * cols + cb;\n",
                    "      const int64_t base = oi * R * inner + ih * cols + cb;\n      (void)lin;\n      (void)base;\n");
    if (full) {
      absl::StrAppend(&s, "      ", T, "* const buf = ",
                      scratch ? "scratch" : absl::StrCat("out", y_out, " + base"), ";\n",
                      "      const int64_t bs = ", scratch ? absl::StrCat(kColumns) : "inner", ";\n");
    }
    at = "base + r * inner + c";
    line_at = "lin + c";
    buf_at = "r * bs + c";
    lane = "[c]";
    lane_loop = "      for (int64_t c = 0; c < nc; ++c) ";
  } else {
    if (scratch) {
      absl::StrAppend(&s, "  ", T, "* const scratch = static_cast<", T, "*>(malloc(R * sizeof(", T,
                      ")));\n  if (scratch == 0) __builtin_trap();\n");
    }
    absl::StrAppend(&s, "  for (int64_t line = begin; line < end; ++line) {\n");
    for (int k = 0; k < ins; ++k) absl::StrAppend(&s, "    int64_t o", k, " = 0;\n");
    absl::StrAppend(&s, "    int64_t rest = line;\n", Offsets(ins, 0, ra, "    "), "    (void)rest;\n",
                    "    const int64_t base = line * R;\n    (void)base;\n");
    if (full) {
      absl::StrAppend(&s, "    ", T, "* const buf = ", scratch ? "scratch" : absl::StrCat("out", y_out, " + base"),
                      ";\n");
    }
    at = "base + j";
    line_at = "line";
    buf_at = "j";
  }
  // The loop over the reduced dim (and, for columns, the block), vectorized innermost.
  auto open_loop = [&](const std::string& reduction_clause) {
    if (columns) {
      return absl::StrCat("      for (int64_t r = 0; r < R; ++r) {\n#pragma omp simd\n",
                          "        for (int64_t c = 0; c < nc; ++c) {\n");
    }
    return absl::StrCat("#pragma omp simd", reduction_clause, "\n    for (int64_t j = 0; j < R; ++j) {\n");
  };
  const std::string close_loop = columns ? "        }\n      }\n" : "    }\n";
  const std::string body = columns ? "          " : "      ";
  const std::string j = columns ? "(cb + c)" : "j";

  // Pass 1: the prologue and the reduction.
  const std::string m = absl::StrCat("m", lane), nan_flag = absl::StrCat("nan", lane), acc = absl::StrCat("acc", lane);
  if (columns) {
    if (max_like) {
      absl::StrAppend(&s, "      ", T, " m[", kColumns, "];\n      int nan[", kColumns, "];\n", lane_loop, "{\n        m[c] = -",
                      inf, ";\n        nan[c] = 0;\n      }\n");
    } else {
      absl::StrAppend(&s, "      ", T, " acc[", kColumns, "];\n", lane_loop, "acc[c] = 0;\n");
    }
  } else if (max_like) {
    absl::StrAppend(&s, "    ", T, " m = -", inf,
                    ";\n    int nan = 0;  // not bool: a bool reduction keeps the loop from vectorizing well\n");
  } else {
    absl::StrAppend(&s, "    ", T, " acc = 0;\n");
  }
  absl::StrAppend(&s, open_loop(columns ? "" : max_like ? " reduction(max:m) reduction(|:nan)" : " reduction(+:acc)"));
  for (int k : in_prologue) absl::StrAppend(&s, Load(g, r, k, body, columns, j));
  absl::StrAppend(&s, NodeStatements(g, prologue, body), Stores(r, g, prologue, at, body));
  if (max_like) {
    absl::StrAppend(&s, body, m, " = v", x, " > ", m, " ? v", x, " : ", m, ";  // ", red.op, "\n", body, nan_flag,
                    " |= v", x, " != v", x, ";\n");
  } else {
    absl::StrAppend(&s, body, acc, " += v", x, ";  // ", red.op, "\n");
  }
  if (full) absl::StrAppend(&s, body, "buf[", buf_at, "] = v", x, ";\n");
  absl::StrAppend(&s, close_loop);

  // The epilogue's loads, statements and stores for one element (full) or line (reduced).
  auto epilogue_body = [&](const std::string& indent, const std::string& index, bool r_term,
                           const std::string& jj) {
    std::string e;
    for (int k : in_epilogue) absl::StrAppend(&e, Load(g, r, k, indent, r_term, jj));
    absl::StrAppend(&e, NodeStatements(g, epilogue, indent), Stores(r, g, epilogue, index, indent));
    return e;
  };
  const std::string buf = absl::StrCat("buf[", buf_at, "]");
  std::string result;  // full-shaped ops: v<y> from buf in the last pass
  const std::string R = absl::StrCat("static_cast<", T, ">(R)");
  switch (r.reduction) {
    case ReductionKind::kAmax:
    case ReductionKind::kSum:
    case ReductionKind::kMean: {
      const std::string value = r.reduction == ReductionKind::kAmax
                                    ? absl::StrCat(nan_flag, " ? ", nan, " : ", m)
                                    : r.reduction == ReductionKind::kSum ? acc : absl::StrCat(acc, " / ", R);
      const std::string indent = columns ? "        " : "    ";
      if (columns) absl::StrAppend(&s, "#pragma omp simd\n", lane_loop, "{\n");
      absl::StrAppend(&s, indent, "const ", T, " v", y, " = ", value, ";  // ", CanonicalName(g, y), "\n");
      if (y_out >= 0) absl::StrAppend(&s, indent, "out", y_out, "[", line_at, "] = v", y, ";\n");
      absl::StrAppend(&s, epilogue_body(indent, line_at, false, columns ? j : ""));
      if (columns) absl::StrAppend(&s, "      }\n");
      break;
    }
    case ReductionKind::kSoftmax:
    case ReductionKind::kLogSoftmax: {
      const bool log = r.reduction == ReductionKind::kLogSoftmax;
      const std::string sum = absl::StrCat("sum", lane);
      if (columns) {
        absl::StrAppend(&s, "      ", T, " sum[", kColumns, "];\n", lane_loop, "{\n        if (nan[c]) m[c] = ", nan,
                        ";\n        sum[c] = 0;\n      }\n");
      } else {
        absl::StrAppend(&s, "    if (nan) m = ", nan, ";\n    ", T, " sum = 0;\n");
      }
      absl::StrAppend(&s, open_loop(" reduction(+:sum)"));
      if (log) {
        absl::StrAppend(&s, body, sum, " += exp", f, "(", buf, " - ", m, ");\n");
      } else {
        absl::StrAppend(&s, body, "const ", T, " e = exp", f, "(", buf, " - ", m, ");\n", body, buf, " = e;\n", body,
                        sum, " += e;\n");
      }
      absl::StrAppend(&s, close_loop);
      // softmax: sum becomes 1 / sum, log_softmax: log(sum).
      absl::StrAppend(&s, columns ? lane_loop : "    ", sum, " = ", log ? absl::StrCat("log", f, "(", sum, ")")
                                                                     : absl::StrCat("1 / ", sum), ";\n");
      result = log ? absl::StrCat(buf, " - ", m, " - ", sum) : absl::StrCat(buf, " * ", sum);
      break;
    }
    case ReductionKind::kLayerNorm: {
      // LayerNormKernel.cpp: rstd = 1 / sqrt(var + eps); y = (x * rstd + -rstd * mean) * w + b.
      absl::StrAppend(&s, "    const ", T, " mean = acc / ", R, ";\n    ", T, " var = 0;\n", open_loop(" reduction(+:var)"),
                      body, "const ", T, " d = ", buf, " - mean;\n", body, "var += d * d;\n", close_loop,
                      "    const ", T, " rstd = 1 / __builtin_sqrt", f, "(var / ", R, " + ",
                      LiteralOf(red.args[4].constant.toDouble(), t), ");\n    const ", T, " shift = -rstd * mean;\n");
      result = absl::StrCat("(", buf, " * rstd + shift)");
      for (int a : {2, 3}) {
        if (red.args[a].kind != NodeArg::Kind::kValue) continue;
        int k = 0;
        while (r.inputs[k] != red.args[a].value || r.input_unsqueeze[k] != -1) ++k;
        const int64_t st = r.layout.strides[k][dims - 1];
        const std::string w = absl::StrCat("in", k, "[o", k, st == 0 ? "" : absl::StrCat(" + j * t", k, "_", dims - 1), "]");
        result = absl::StrCat("(", result, a == 2 ? " * " : " + ", w, ")");
      }
      break;
    }
    case ReductionKind::kNone:
      break;
  }
  if (full) {  // the last pass: the result, the epilogue, the stores
    absl::StrAppend(&s, open_loop(""), body, "const ", T, " v", y, " = ", result, ";  // ", CanonicalName(g, y), "\n");
    if (y_out >= 0) absl::StrAppend(&s, body, buf, " = v", y, ";\n");
    absl::StrAppend(&s, epilogue_body(body, at, columns, j), close_loop);
  }
  if (columns) {
    absl::StrAppend(&s, "    }\n    line += j1 - j0;\n  }\n");
  } else {
    absl::StrAppend(&s, "  }\n");
  }
  if (scratch) absl::StrAppend(&s, "  free(scratch);\n");
  absl::StrAppend(&s, "}\n");
  return s;
}

}  // namespace emit

bool ReductionLayout(const std::vector<int64_t>& shape, int dim, int count,
                     const std::vector<std::vector<int64_t>>& in_sizes,
                     const std::vector<std::vector<int64_t>>& in_strides, Layout* layout, int* outer_dims) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const size_t n = in_sizes.size();
  if (dim < 0 || count < 1 || dim + count > rank) return false;
  // Each operand's dims (right-aligned to `shape`) split into outer, reduced and inner ones.
  std::vector<std::vector<int64_t>> sizes[3], strides[3];
  for (auto* part : {sizes, strides}) {
    for (int p = 0; p < 3; ++p) part[p].assign(n, {});
  }
  for (size_t k = 0; k < n; ++k) {
    const int64_t m = static_cast<int64_t>(in_sizes[k].size());
    if (m > rank || in_strides[k].size() != in_sizes[k].size()) return false;
    for (int64_t e = 0; e < m; ++e) {
      const int64_t d = rank - m + e;
      const int p = d < dim ? 0 : d < dim + count ? 1 : 2;
      sizes[p][k].push_back(in_sizes[k][e]);
      strides[p][k].push_back(in_strides[k][e]);
    }
  }
  Layout parts[3];
  for (int p = 0; p < 3; ++p) {
    const int64_t from = p == 0 ? 0 : p == 1 ? dim : dim + count, to = p == 0 ? dim : p == 1 ? dim + count : rank;
    if (!Collapse(std::vector<int64_t>(shape.begin() + from, shape.begin() + to), sizes[p], strides[p], &parts[p])) {
      return false;
    }
  }
  if (parts[1].sizes.size() != 1) return false;  // the reduced dims do not merge into one
  *layout = std::move(parts[0]);
  *outer_dims = static_cast<int>(layout->sizes.size());
  for (int p = 1; p < (dim + count == rank ? 2 : 3); ++p) {
    layout->sizes.insert(layout->sizes.end(), parts[p].sizes.begin(), parts[p].sizes.end());
    for (size_t k = 0; k < n; ++k) {
      layout->strides[k].insert(layout->strides[k].end(), parts[p].strides[k].begin(), parts[p].strides[k].end());
    }
  }
  return true;
}

void UnsqueezeReduced(size_t rank, int dim, int count, std::vector<int64_t>* sizes,
                      std::vector<int64_t>* strides) {
  const size_t reduced_rank = rank - count;
  if (sizes->size() < reduced_rank) {
    sizes->insert(sizes->begin(), reduced_rank - sizes->size(), 1);
    strides->insert(strides->begin(), reduced_rank - strides->size(), 0);
  }
  sizes->insert(sizes->begin() + dim, count, 1);
  strides->insert(strides->begin() + dim, count, 0);
}

}  // namespace warden::codegen
