// Note [Symbolic shape pass]
// The pass runs to a fixpoint: each round assigns symbols to the dynamic dims that are not yet
// specialized, propagates shapes through the rules in node order and collects requirements and
// specializations. A specialization makes the symbol a constant in the next round (its users may
// then take other branches), so rounds repeat until no new symbol is specialized. Safety nets:
// every symbolic result is evaluated at the trace-time sizes and must equal what ATen produced;
// a rule that errs or disagrees, an op without a rule and an opaque op all specialize every symbol
// of their inputs, so a wrong or missing rule costs recompiles, never soundness.
#include "ops/shape_pass.h"

#include "absl/strings/str_cat.h"

namespace warden::ops {
namespace {

using tracer::Graph;
using tracer::NodeArg;
using tracer::ValueId;

struct Round {
  const Graph& g;
  const std::vector<tracer::MetadataRead>& reads;
  const std::vector<SymbolSource>& symbols;
  const std::map<std::pair<int, int>, int>& symbol_of;  // (arg, dim) -> symbol
  std::map<int, std::string>& specialized;
  ShapePassResult& out;
  bool verify_reads = false;

  // A read of dim `d` of a value: its symbols left symbolic (and reported, to be verified per
  // value) when verifying reads, else specialized.
  void Read(const Dim& d, const std::string& why) {
    if (verify_reads) {
      for (int s : d.symbols()) {
        if (!specialized.count(s)) out.read_symbols.emplace(s, why);
      }
      return;
    }
    SpecializeAll({d}, why);
  }

  int64_t Evaluate(const Dim& d) const {
    std::vector<int64_t> values(symbols.size());
    for (size_t i = 0; i < symbols.size(); ++i) values[i] = symbols[i].traced;
    return d.Evaluate(values.data());
  }

  void SpecializeAll(const Shape& shape, const std::string& why) {
    for (const Dim& d : shape) {
      for (int s : d.symbols()) specialized.emplace(s, why);
    }
  }

  Shape Traced(ValueId id) const { return ToShape(g.value(id).meta.sizes); }

  void Run() {
    out.shapes.assign(g.values.size(), Shape{});
    for (const tracer::Value& v : g.values) {
      if (!v.is_tensor) continue;
      out.shapes[v.id] = Traced(v.id);
      if (v.kind != tracer::ValueKind::kInput) continue;
      for (size_t d = 0; d < v.meta.sizes.size(); ++d) {
        auto it = symbol_of.find({v.arg_index, static_cast<int>(d)});
        if (it != symbol_of.end() && !specialized.count(it->second)) {
          out.shapes[v.id][d] = Dim::Symbol(it->second);
        }
      }
    }
    SymbolicFacts facts;
    facts.evaluate = [this](const Dim& d) { return Evaluate(d); };
    for (const tracer::Node& n : g.nodes) RunNode(n, facts);
    // Sizes that user code or a composite kernel read were used as plain integers.
    for (const tracer::MetadataRead& r : reads) {
      if (r.what == tracer::MetadataRead::What::kRank) continue;  // ranks are always static
      const Shape& shape = out.shapes[r.value];
      if (r.what == tracer::MetadataRead::What::kSizes && r.dim >= 0) {
        if (r.dim < static_cast<int>(shape.size())) {
          Read(shape[r.dim], absl::StrCat(g.ValueName(r.value), ".size(", r.dim, ") read by ", r.by));
        }
        continue;
      }
      if (r.what == tracer::MetadataRead::What::kSizes) {
        for (size_t d = 0; d < shape.size(); ++d) {
          Read(shape[d], absl::StrCat("sizes of ", g.ValueName(r.value), " read by ", r.by));
        }
        continue;
      }
      const std::string why = absl::StrCat("strides of ", g.ValueName(r.value), " read by ", r.by);
      if (verify_reads) {
        if (out.stride_read.empty()) out.stride_read = why;
        for (size_t s = 0; s < symbols.size(); ++s) {
          if (!specialized.count(static_cast<int>(s))) out.read_symbols.emplace(static_cast<int>(s), why);
        }
        continue;
      }
      SpecializeAll(shape, why);
    }
    out.requirements = std::move(facts.requirements);
    for (auto& [s, why] : facts.specialized) specialized.emplace(s, why);
  }

  void RunNode(const tracer::Node& n, SymbolicFacts& facts) {
    const std::string at = absl::StrCat(n.op, " at %", n.index);
    std::vector<ValueId> outs;
    for (const tracer::NodeReturn& r : n.returns) {
      if (r.kind == tracer::NodeReturn::Kind::kScalar) continue;
      outs.insert(outs.end(), r.values.begin(), r.values.end());
    }
    auto specialize_inputs = [&](const std::string& why) {
      for (const NodeArg& a : n.args) {
        if (a.kind == NodeArg::Kind::kValue) SpecializeAll(out.shapes[a.value], why);
        for (ValueId id : a.values) {
          if (id != tracer::kNoValue) SpecializeAll(out.shapes[id], why);
        }
      }
      for (ValueId id : outs) out.shapes[id] = Traced(id);
    };
    if (n.kind == tracer::NodeKind::kDataDependent) {
      // Output shapes are value-guarded inside the artifact; the inputs may stay symbolic.
      for (ValueId id : outs) out.shapes[id] = Traced(id);
      return;
    }
    const OpInfo* info = Registry::Global().Find(n.op);
    if (n.kind == tracer::NodeKind::kOpaque || info == nullptr || !info->shape) {
      specialize_inputs(absl::StrCat("input of ", at, ", which has no symbolic shape rule"));
      return;
    }
    std::vector<ShapeContext::Arg> args;
    bool symbolic = false;
    for (const NodeArg& a : n.args) {
      ShapeContext::Arg s;
      switch (a.kind) {
        case NodeArg::Kind::kConstant:
          if (a.constant.isNone() || (a.constant.isTensor() && !a.constant.toTensor().defined())) {
            s.kind = ShapeContext::Arg::Kind::kNone;
          } else {
            s.kind = ShapeContext::Arg::Kind::kConstant;
            s.constant = a.constant;
            if (!a.sizes_of.empty()) {
              // Argument sizes at run time: the symbol of that dim where it has one.
              std::vector<int64_t> ints = a.constant.isIntList() ? a.constant.toIntVector()
                                                                 : std::vector<int64_t>{a.constant.toInt()};
              s.dims.assign(ints.begin(), ints.end());
              for (const tracer::SizeRef& ref : a.sizes_of) {
                auto it = symbol_of.find({ref.arg, ref.dim});
                if (it == symbol_of.end() || specialized.count(it->second)) continue;
                s.dims[ref.elem < 0 ? 0 : ref.elem] = Dim::Symbol(it->second) * Dim(ref.scale);
                symbolic = true;
              }
            }
          }
          break;
        case NodeArg::Kind::kValue:
          if (!g.value(a.value).is_tensor) {  // a symbolic scalar argument: its traced value
            s.kind = ShapeContext::Arg::Kind::kConstant;
            s.constant = g.value(a.value).traced_scalar;
            break;
          }
          s.kind = ShapeContext::Arg::Kind::kTensor;
          s.shape = out.shapes[a.value];
          break;
        case NodeArg::Kind::kValueList:
        case NodeArg::Kind::kOptValueList:
          s.kind = ShapeContext::Arg::Kind::kTensorList;
          for (ValueId id : a.values) s.list.push_back(id == tracer::kNoValue ? Shape{} : out.shapes[id]);
          break;
      }
      for (const Dim& d : s.shape) symbolic |= !d.is_constant();
      for (const Shape& sh : s.list) {
        for (const Dim& d : sh) symbolic |= !d.is_constant();
      }
      args.push_back(std::move(s));
    }
    if (!symbolic) return;  // traced shapes are already right
    SymbolicFacts local;
    local.evaluate = facts.evaluate;
    ShapeContext ctx(n.op, std::move(args), &local);
    auto shapes = info->shape(ctx);
    bool ok = shapes.ok() && shapes->size() == outs.size();
    for (size_t i = 0; ok && i < outs.size(); ++i) {
      const Shape& sym = (*shapes)[i];
      const auto& traced = g.value(outs[i]).meta.sizes;
      ok = sym.size() == traced.size();
      for (size_t d = 0; ok && d < sym.size(); ++d) ok = Evaluate(sym[d]) == traced[d];
    }
    if (!ok) {
      specialize_inputs(absl::StrCat("input of ", at, ", whose shape rule ",
                                     shapes.ok() ? "disagreed with ATen" : "failed symbolically"));
      return;
    }
    for (size_t i = 0; i < outs.size(); ++i) out.shapes[outs[i]] = (*shapes)[i];
    for (auto& r : local.requirements) {
      // The reason text of API.md: "... failed: 4 vs 5 (required by aten::add.Tensor at %3)".
      facts.requirements.push_back({r.lhs, r.rhs, absl::StrCat("required by ", at)});
    }
    for (auto& [s, why] : local.specialized) {
      facts.specialized.emplace(s, absl::StrCat("specialized by ", at, " (", why, ")"));
    }
  }
};

}  // namespace

std::string SymbolName(const SymbolSource& s, const std::vector<std::string>& arg_names) {
  const std::string arg = s.arg >= 0 && s.arg < static_cast<int>(arg_names.size())
                              ? arg_names[s.arg]
                              : absl::StrCat("arg", s.arg);
  return absl::StrCat(arg, ".size(", s.dim, ")");
}

ShapePassResult PropagateShapes(const Graph& g, const std::vector<tracer::MetadataRead>& reads,
                                const std::set<std::pair<int, int>>& dynamic, bool verify_reads) {
  ShapePassResult out;
  std::map<std::pair<int, int>, int> symbol_of;
  for (size_t arg = 0; arg < g.arg_values.size(); ++arg) {
    const ValueId id = g.arg_values[arg];
    if (id == tracer::kNoValue) continue;
    const auto& sizes = g.value(id).meta.sizes;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int a = static_cast<int>(arg), dd = static_cast<int>(d);
      if (!dynamic.count({a, dd}) && !dynamic.count({a, -1})) continue;
      if (sizes[d] < 2) continue;  // 0 and 1 always specialize
      symbol_of[{a, dd}] = static_cast<int>(out.symbols.size());
      out.symbols.push_back({a, dd, sizes[d]});
    }
  }
  std::map<int, std::string> specialized;
  for (int round = 0; round < 16; ++round) {
    const size_t before = specialized.size();
    ShapePassResult attempt;
    attempt.symbols = out.symbols;
    Round r{g, reads, out.symbols, symbol_of, specialized, attempt, verify_reads};
    r.Run();
    out.shapes = std::move(attempt.shapes);
    out.requirements = std::move(attempt.requirements);
    // Every round's: a read symbol a later round has specialized (a rule needed its value) is
    // still one C++ read.
    out.read_symbols.insert(attempt.read_symbols.begin(), attempt.read_symbols.end());
    out.stride_read = attempt.stride_read;
    out.iterations = round + 1;
    if (specialized.size() == before) break;
  }
  out.specialized = specialized;
  return out;
}

}  // namespace warden::ops
