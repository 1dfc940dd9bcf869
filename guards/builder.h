// Derives the guard set of a cache entry from a trace: exactly the properties the recorded graph
// depends on, each with its provenance, deduplicated. This is the static builder (Dynamic::kStatic
// semantics: every size the graph uses is specialized).
#ifndef WARDEN_GUARDS_BUILDER_H_
#define WARDEN_GUARDS_BUILDER_H_

#include <map>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "guards/guard.h"
#include "ops/shape_pass.h"
#include "tracer/graph.h"
#include "tracer/tracer.h"

namespace warden::guards {

struct BuildInput {
  const tracer::Graph* graph = nullptr;
  const std::vector<tracer::MetadataRead>* reads = nullptr;
  const std::vector<c10::IValue>* args = nullptr;  // the traced call's arguments
  // The symbolic shape pass over the graph; null means every used size is static.
  const ops::ShapePassResult* shapes = nullptr;
  // The entry verifies the strides of every tensor argument per value (Note [Verified size reads]
  // in runtime/verified_sizes.h): stride reads get no stride guards.
  bool strides_verified = false;
};

// What the requirements of a shape pass say about each symbol, after substitution: a symbol is
// free (only `>= 2` is guarded), equal to an expression over free symbols or a constant, or part
// of a residual relation that no substitution could absorb.
struct SymbolResolution {
  std::map<int, tracer::SymExpr> resolved;   // substituted symbols
  std::map<int, std::string> why;            // provenance of each substitution
  std::vector<std::pair<tracer::SymExpr, std::string>> residual;  // expr == 0
};
SymbolResolution ResolveSymbols(const ops::ShapePassResult& shapes);

std::vector<Guard> BuildGuards(const BuildInput& in);

// Removes exact duplicates (same kind, argument, dim and expected value), keeping the first
// provenance; the result is in evaluation order.
std::vector<Guard> Dedupe(std::vector<Guard> guards);

}  // namespace warden::guards

#endif  // WARDEN_GUARDS_BUILDER_H_
