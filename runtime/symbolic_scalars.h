// Symbolic int/double arguments, on request (mark_dynamic on a scalar argument).
//
// Note [Symbolic scalars]
// The tracer sees a C++ scalar only where it reaches an op as an argument (`x * alpha`); what the
// user's code does with it before that (`if (alpha > 0)`, `std::min(n, 3)`, `alpha * 2`) is
// invisible. Making a scalar symbolic automatically would therefore be unsound, so scalars are
// specialized by value unless the caller vouches, with mark_dynamic(arg, 0), that the argument is
// used only as an op argument. Even then Warden verifies what it can: it traces the function a
// second time with a different value of that argument and promotes the argument only if the two
// graphs are identical except for op arguments that are exactly the argument's value in both
// traces (those become reads of the argument). Any other difference (a branch taken differently,
// a derived value `alpha * 2`, a changed shape or data-dependent value), an exception, or no use at
// all keeps the argument specialized, with the reason, and for good: the function's later compiles
// do not try that argument again (evidence of a branch at one value is evidence at every value).
// A branch that the second value does not cross stays invisible, which is why promotion is only
// done for arguments the caller marked. The second trace is skipped (and the value
// specialized) when the graph writes a tensor or draws random numbers: running it again would
// change state eager would not. Promoted arguments keep their type guard and lose their value guard.
#ifndef WARDEN_RUNTIME_SYMBOLIC_SCALARS_H_
#define WARDEN_RUNTIME_SYMBOLIC_SCALARS_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tracer/graph.h"
#include "tracer/tracer.h"

namespace warden::runtime {

struct ScalarPromotion {
  std::shared_ptr<tracer::Graph> graph;  // the traced graph, with promoted arguments as inputs
  std::vector<int> promoted;             // arguments now read by the graph instead of guarded
  std::vector<int> kept_args;            // candidates that stay specialized
  std::vector<std::string> kept;         // "arg1 stays specialized: <why>", one per kept_args
};

// Exact equality of two op-argument constants: doubles bit for bit (so -0.0 != 0.0, NaN == NaN),
// tensors by identity, everything else by value and type.
bool SameIValue(const c10::IValue& a, const c10::IValue& b);

// Promotes the int/double arguments in `candidates` that pass the check of Note [Symbolic
// scalars]. `trace` is the trace of `fn` on `args`; `fn` may run once more per candidate.
ScalarPromotion PromoteScalars(const tracer::TracedFn& fn, const std::vector<c10::IValue>& args,
                               const std::vector<std::string>& names, const tracer::TraceResult& trace,
                               const std::set<int>& candidates);

// Options::capture_scalar_outputs, checked the same way: each item() result that is an int or a
// float is perturbed in a verification trace (tracer::Trace's scalar_overrides), and becomes a
// graph value, with no value guard, only if the two graphs are identical apart from op arguments
// that are exactly that value in both (the same rule as for arguments above). Anything else (a
// branch, a derived value, a changed shape, a later data-dependent value, an exception, a graph
// that writes tensors or draws random numbers) keeps its value guard, with the reason.
struct ScalarCapture {
  std::shared_ptr<tracer::Graph> graph;  // the traced graph, with captured values
  std::vector<std::string> captured;     // "item() at %3 is a graph value (no value guard)"
  std::vector<std::string> kept;         // "item() at %3 (0.5) stays value-guarded: <why>"
};
ScalarCapture CaptureScalarOutputs(const tracer::TracedFn& fn, const std::vector<c10::IValue>& args,
                                   const std::vector<std::string>& names, const tracer::TraceResult& trace);

}  // namespace warden::runtime

#endif  // WARDEN_RUNTIME_SYMBOLIC_SCALARS_H_
