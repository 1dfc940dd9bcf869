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

  // A size leaf (Note [Symbolic sizes]) in the symbols: its value's dim as propagated so far.
  Dim LeafDim(int k) const {
    const tracer::SymLeaf& leaf = g.sym_leaves.at(k);
    const Shape& shape = out.shapes.at(leaf.value);
    if (leaf.dim >= 0 && leaf.dim < static_cast<int>(shape.size())) return shape[leaf.dim];
    return Dim(g.value(leaf.value).meta.sizes.at(leaf.dim));
  }
  Dim InSymbols(const tracer::SymExpr& e) const {
    return e.Map([this](int k) { return LeafDim(k); });
  }

  // The comparisons C++ made on symbolic sizes: decided by the symbols' domain (>= 2), a
  // requirement (an equality that held), or a read of the sizes involved.
  void Checks(SymbolicFacts& facts) {
    using Op = tracer::SymCheck::Op;
    for (const tracer::SymCheck& c : g.sym_checks) {
      const Dim l = InSymbols(c.lhs), r = InSymbols(c.rhs);
      if ((l - r).is_constant()) continue;  // the same for every value of the symbols
      auto at_least = [](const Dim& e, int64_t k) {
        std::optional<int64_t> lb = e.LowerBound(2);
        return lb.has_value() && *lb >= k;
      };
      // Normalize to what held: `op` with its answer.
      Op op = c.op;
      if (!c.result) {
        switch (op) {
          case Op::kEq: op = Op::kNe; break;
          case Op::kNe: op = Op::kEq; break;
          case Op::kLt: op = Op::kGe; break;
          case Op::kLe: op = Op::kGt; break;
          case Op::kGt: op = Op::kLe; break;
          case Op::kGe: op = Op::kLt; break;
        }
      }
      const char* text[] = {" == ", " != ", " < ", " <= ", " > ", " >= "};
      const std::string what = absl::StrCat(l.ToString(), text[static_cast<int>(op)], r.ToString());
      bool known = false;
      switch (op) {
        case Op::kEq:
          facts.requirements.push_back({l, r, absl::StrCat("required by ", c.by, ", which compared sizes")});
          known = true;
          break;
        case Op::kNe: known = at_least(l - r, 1) || at_least(r - l, 1); break;
        case Op::kLt: known = at_least(r - l, 1); break;
        case Op::kLe: known = at_least(r - l, 0); break;
        case Op::kGt: known = at_least(l - r, 1); break;
        case Op::kGe: known = at_least(l - r, 0); break;
      }
      if (known) continue;
      const std::string why = absl::StrCat("size comparison ", what, " made by ", c.by);
      Read(l, why);
      Read(r, why);
    }
  }

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
    Checks(facts);
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
    // Integers of argument `i` computed from symbolic sizes stay the traced ones.
    auto specialize_elems_of = [&](int i, const std::string& why) {
      out.run_time_sizes.erase({n.index, i});
      for (const tracer::SymElem& e : n.args[i].sym_elems) SpecializeAll({InSymbols(e.expr)}, why);
    };
    auto specialize_elems = [&](const std::string& why) {
      for (size_t i = 0; i < n.args.size(); ++i) specialize_elems_of(static_cast<int>(i), why);
    };
    auto specialize_inputs = [&](const std::string& why) {
      for (const NodeArg& a : n.args) {
        if (a.kind == NodeArg::Kind::kValue) SpecializeAll(out.shapes[a.value], why);
        for (ValueId id : a.values) {
          if (id != tracer::kNoValue) SpecializeAll(out.shapes[id], why);
        }
      }
      // Integers computed from symbolic sizes stay the traced ones (Note [Symbolic sizes]).
      specialize_elems(why);
      for (ValueId id : outs) out.shapes[id] = Traced(id);
    };
    if (n.kind == tracer::NodeKind::kDataDependent) {
      // Output shapes are value-guarded inside the artifact; the inputs may stay symbolic.
      specialize_elems(absl::StrCat("argument of ", at, ", which is data-dependent"));
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
    std::vector<int> computed_args;  // arguments with elements computed from symbolic sizes
    for (const NodeArg& a : n.args) {
      const int index = static_cast<int>(&a - n.args.data());
      ShapeContext::Arg s;
      auto traced_dims = [&] {  // every element as a Dim, at its traced value
        if (!s.dims.empty()) return;
        std::vector<int64_t> ints = a.constant.isIntList() ? a.constant.toIntVector()
                                                           : std::vector<int64_t>{a.constant.toInt()};
        s.dims.assign(ints.begin(), ints.end());
      };
      switch (a.kind) {
        case NodeArg::Kind::kConstant:
          if (a.constant.isNone() || (a.constant.isTensor() && !a.constant.toTensor().defined())) {
            s.kind = ShapeContext::Arg::Kind::kNone;
          } else {
            s.kind = ShapeContext::Arg::Kind::kConstant;
            s.constant = a.constant;
            if (!a.sizes_of.empty()) {
              // Argument sizes at run time: the symbol of that dim where it has one.
              traced_dims();
              for (const tracer::SizeRef& ref : a.sizes_of) {
                auto it = symbol_of.find({ref.arg, ref.dim});
                if (it == symbol_of.end() || specialized.count(it->second)) continue;
                s.dims[ref.elem < 0 ? 0 : ref.elem] = Dim::Symbol(it->second) * Dim(ref.scale);
                symbolic = true;
              }
            }
            if (!a.sym_elems.empty()) {
              // Computed by C++ from symbolic sizes: run-time sizes where that is k * symbol.
              traced_dims();
              for (const tracer::SymElem& e : a.sym_elems) {
                const Dim d = InSymbols(e.expr);
                if (d.is_constant()) continue;
                const std::vector<int> syms = d.symbols();
                // ExactDiv is exact for every value of the symbols: d == k * symbol.
                std::optional<Dim> k =
                    syms.size() == 1 ? Dim::ExactDiv(d, Dim::Symbol(syms[0])) : std::nullopt;
                if (!k.has_value() || !k->is_constant() || k->constant() < 1) {
                  SpecializeAll({d}, absl::StrCat("argument ", index, " of ", at, ", computed from sizes as ",
                                                  d.ToString(), ", which is not a multiple of one size"));
                  continue;
                }
                tracer::SizeRef ref;
                ref.elem = e.elem;
                ref.arg = symbols[syms[0]].arg;
                ref.dim = symbols[syms[0]].dim;
                ref.scale = k->constant();
                out.run_time_sizes[{n.index, index}].push_back(ref);
                s.dims[e.elem < 0 ? 0 : e.elem] = d;
                symbolic = true;
                computed_args.push_back(index);
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
    // A run-time size the rule took as a traced integer (narrow's length, a scalar) would leave
    // the output shape traced while the argument follows the call: those elements specialize.
    for (int i : computed_args) {
      if (ctx.TakenOnlyAsSizes(static_cast<size_t>(i))) continue;
      specialize_elems_of(i, absl::StrCat("argument ", i, " of ", at,
                                          ", computed from sizes, which its shape rule takes as a traced integer"));
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

std::shared_ptr<Graph> WithRunTimeSizes(std::shared_ptr<Graph> graph, const ShapePassResult& pass) {
  if (pass.run_time_sizes.empty()) return graph;
  auto out = std::make_shared<Graph>(*graph);
  for (const auto& [where, refs] : pass.run_time_sizes) {
    std::vector<tracer::SizeRef>& to = out->nodes.at(where.first).args.at(where.second).sizes_of;
    for (const tracer::SizeRef& r : refs) {
      bool have = false;
      for (const tracer::SizeRef& o : to) have |= o.elem == r.elem;
      if (!have) to.push_back(r);
    }
  }
  return out;
}

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
    out.run_time_sizes = std::move(attempt.run_time_sizes);
    out.iterations = round + 1;
    if (specialized.size() == before) break;
  }
  out.specialized = specialized;
  return out;
}

}  // namespace warden::ops
