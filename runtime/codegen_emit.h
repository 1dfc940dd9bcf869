// Internal to //runtime:codegen_pointwise: what codegen_pointwise.cc (the op table, the partition,
// pointwise kernels) and codegen_reduction.cc (reduction kernels, Note [Row reductions]) share
// to write kernel source. Not an interface: the library's users include codegen_pointwise.h.
#ifndef WARDEN_RUNTIME_CODEGEN_EMIT_H_
#define WARDEN_RUNTIME_CODEGEN_EMIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "runtime/codegen_pointwise.h"
#include "tracer/graph.h"

namespace warden::codegen::emit {

// codegen_pointwise.cc.
bool IsContiguous(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);
const char* CType(at::ScalarType t);
// A literal of dtype `t` for the finite or non-finite value `d` (already representable in t).
std::string LiteralOf(double d, at::ScalarType t);
// A name for comments in the source that does not depend on user-chosen argument names, so that
// equal kernels of different functions hash (and cache) alike.
std::string CanonicalName(const tracer::Graph& g, tracer::ValueId id);
// The leading tensor operands of a fusible node (FusionBlocker), or of an in-place one a program
// runs (Note [Straight-line programs]).
int TensorOperands(const tracer::Node& n);
// The functional form of an in-place op ("aten::add_.Tensor" -> "aten::add.Tensor"), "" if `op`
// is not named like one.
std::string FunctionalName(const std::string& op);
// Why an elementwise `node` cannot be computed by generated code, or "". `program`: for a
// straight-line program, which also takes in-place forms and leaves the result's history and
// storage (requires grad, views, strides) to its own checks.
std::string ElementwiseBlocker(const tracer::Graph& g, const tracer::Node& node, bool program);
// The dtypes generated code computes in: f32, f64, i64, b8.
bool IsFusedDtype(at::ScalarType t);
// A Scalar argument as a literal of dtype `t` (Scalar::to<T>()); false if not representable.
bool ScalarLiteralOf(const c10::IValue& v, at::ScalarType t, std::string* text, double* value);
// The prelude of every translation unit of kernels (math declarations).
const char* KernelPrelude();
// The signature, sizes and strides (literals when static, else params; the innermost strides are
// always literals) and the typed in/out pointers (or inlined arrays) of a region's kernel.
std::string KernelHead(const tracer::Graph& g, const PointwiseRegion& r);
// `const T v<id> = in<k>[o<k> + ...];` for input k: `r_term` adds the reduced dim's stride times
// r (column reductions), `j` (if not empty) the innermost stride times j.
std::string Load(const tracer::Graph& g, const PointwiseRegion& r, int k, const std::string& indent, bool r_term,
                 const std::string& j);
// The statements computing the elementwise `nodes` (in order) from the values v<id> in scope.
std::string NodeStatements(const tracer::Graph& g, const std::vector<int>& nodes, const std::string& indent);
// `out<k>[index] = v<id>;` for every output of r produced by `nodes`.
std::string Stores(const PointwiseRegion& r, const tracer::Graph& g, const std::vector<int>& nodes,
                   const std::string& index, const std::string& indent);

// codegen_reduction.cc (Note [Row reductions]).
// A reduction the fuser can run: its kind (kNone if none), the reduced dims (normalized,
// consecutive) and keepdim.
struct ReductionInfo {
  ReductionKind kind = ReductionKind::kNone;
  int dim = -1;   // the first reduced dim
  int count = 1;  // consecutive reduced dims
  bool keepdim = false;
};
ReductionInfo ReductionOf(const tracer::Graph& g, const tracer::Node& node);
// softmax, log_softmax and layer_norm: the result has the input's shape (else the reduced one).
bool FullShaped(ReductionKind k);
// The kernel of a reduction region.
std::string ReductionSource(const tracer::Graph& g, const PointwiseRegion& r);

// codegen_program.cc (Note [Straight-line programs]).
// The programs of `g`; their `function` names are left empty. No node `reserved` joins one.
std::vector<ProgramRegion> PlanPrograms(const tracer::Graph& g, const std::vector<bool>& symbolic_shape,
                                        const std::vector<bool>& history_free, const std::vector<bool>& reserved);
std::string ProgramSource(const tracer::Graph& g, const ProgramRegion& p);

}  // namespace warden::codegen::emit

#endif  // WARDEN_RUNTIME_CODEGEN_EMIT_H_
