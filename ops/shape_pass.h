// The symbolic shape pass: runs the registered shape rules over a traced graph with some argument
// dims replaced by size symbols, and reports what the graph then requires of those symbols
// (relations such as s0 == s1) and which symbols something had to see concretely
// (specializations, with who needed them). guards/builder.cc turns the result into guards.
#ifndef WARDEN_OPS_SHAPE_PASS_H_
#define WARDEN_OPS_SHAPE_PASS_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ops/registry.h"
#include "tracer/graph.h"
#include "tracer/sym_expr.h"
#include "tracer/tracer.h"

namespace warden::ops {

struct SymbolSource {
  int arg = -1;
  int dim = -1;
  int64_t traced = 0;  // the size seen at trace time
};

struct ShapePassResult {
  std::vector<SymbolSource> symbols;    // symbol id -> where its value comes from
  std::vector<Shape> shapes;            // per value id (empty for non-tensors)
  std::vector<SymbolicFacts::Requirement> requirements;  // why: "required by aten::x at %3 (...)"
  std::map<int, std::string> specialized;                 // symbol -> why it became static
  // With verify_reads: symbols C++ code read as plain integers that were left symbolic, for the
  // caller to verify per value by re-tracing (Note [Verified size reads]), with who read them.
  std::map<int, std::string> read_symbols;
  // With verify_reads: non-empty (who read them) when C++ read strides or contiguity of some
  // value. Every symbol is then in read_symbols, and the strides of every tensor argument the
  // graph uses must be verified with them (layout propagates through ops in ways the graph does
  // not track); the caller either does that or re-runs the pass without verify_reads.
  std::string stride_read;
  // Note [Symbolic sizes] (tracer.cc): op-argument elements C++ computed from symbolic sizes that
  // are k * symbol: (node, argument) -> the argument sizes they are at run time. Apply them to the
  // graph with WithRunTimeSizes.
  std::map<std::pair<int, int>, std::vector<tracer::SizeRef>> run_time_sizes;
  int iterations = 0;
};

// Makes (arg, dim) symbolic for every pair in `dynamic` whose traced size is >= 2 (sizes 0 and 1
// always specialize: broadcasting and empty tensors behave differently). `dim == -1` in a pair
// means every dim of that argument.
// `verify_reads`: the symbols of a size read by code outside the graph (user code, a decomposed
// composite) stay symbolic and are reported in read_symbols instead of specializing;
// a stride read reports every symbol (and sets stride_read) instead of specializing its value's.
ShapePassResult PropagateShapes(const tracer::Graph& graph,
                                const std::vector<tracer::MetadataRead>& reads,
                                const std::set<std::pair<int, int>>& dynamic, bool verify_reads = false);

// `graph` with the pass's run_time_sizes added to its op arguments' sizes_of (the same graph when
// there are none).
std::shared_ptr<tracer::Graph> WithRunTimeSizes(std::shared_ptr<tracer::Graph> graph,
                                                const ShapePassResult& pass);

// "arg0.size(1)" for a symbol, given argument names.
std::string SymbolName(const SymbolSource& s, const std::vector<std::string>& arg_names);

}  // namespace warden::ops

#endif  // WARDEN_OPS_SHAPE_PASS_H_
