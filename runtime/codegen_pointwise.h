// Pointwise fusion for backend "cpp": which nodes can run as generated C++ (FusionBlocker), the
// partition of a graph into fused regions (elementwise runs, reductions with their prologue and
// epilogue), their iteration layout, and the C++ source of one kernel per region (reduction
// kernels are written by codegen_reduction.cc). Pure: no compiler, no files, no tensors touched
// but the small constants it inlines (Collapse and ReductionLayout are shared with the artifact's
// run-time check). Compiling lives in codegen_compiler.h, running in cpp_backend.cc.
//
// Note [Pointwise regions]
// A region is a maximal run of consecutive nodes (in graph order) that are each fusible and share
// one output shape (the region shape; dtypes may differ). Because a region occupies a contiguous
// stretch of the node order, running it as one kernel at the position of its first node reads
// every input at the same point of the program as eager does, so mutations and aliasing around it
// are unchanged. Fusible: functional elementwise ops (no in-place, random or view results) on
// f32/f64/i64/b8 whose result is contiguous; tensor operands may have any strides and broadcast
// against the result (missing or size-1 dims), Scalar arguments are literals. Each op computes in
// ATen's common dtype (Note [Type promotion]) and rounds to its result dtype as ATen does.
// Values read after the region (or returned) are written out, contiguous; the rest stay in
// registers. The kernel of region k is
//   extern "C" void warden_kernel_k(const void** in, void** out, const int64_t* params,
//                                   int64_t begin, int64_t end)
// and computes output elements [begin, end) (linear, row-major) of the region shape (a reduction
// region: lines, Note [Row reductions]). in[] are the data pointers of PointwiseRegion::inputs
// (unused for inlined constants, Note [Inlined constants]), out[] of ::outputs. The iteration space is the region
// shape with size-1 dims dropped and mergeable dims merged (Collapse): sizes and per-input element
// strides are literals in the source where every value of the region has static sizes (CompileContext),
// else read from params = [sizes..., outer strides of in[0]..., outer strides of in[1]..., ...]
// (outer: every dim but the innermost, whose strides are always literals: 0, 1 or the traced one). The caller collapses the run-time
// tensors the same way and replays the region's nodes when the result differs from what the
// kernel was built for (Note [Region run-time check] in cpp_backend.cc).
//
// Note [Type promotion]
// The result dtype of every node is the traced one. Ops compute in that dtype, except comparisons
// (bool result), which compute in the common dtype of their operands: ATen's result_type, where a
// tensor with dims outranks a 0-dim tensor, which outranks a Scalar, unless the lower-ranked one
// is of a higher category (bool < integral < floating); a floating Scalar counts as the default
// dtype. Integer arithmetic wraps (the kernels are built with -fwrapv); integer division, bool
// arithmetic and integer pow are not fused.
#ifndef WARDEN_RUNTIME_CODEGEN_POINTWISE_H_
#define WARDEN_RUNTIME_CODEGEN_POINTWISE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "tracer/graph.h"

namespace warden::codegen {

// The signature of a pointwise kernel (Note [Pointwise regions]).
using PointwiseKernelFn = void (*)(const void** in, void** out, const int64_t* params, int64_t begin,
                                   int64_t end);

// The iteration space of a region: `sizes` (>= 1 dim, none of size 1 unless it is the only one) and
// strides[k][d], the element stride of input k along dim d (0: broadcast).
struct Layout {
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides;
  bool operator==(const Layout& o) const { return sizes == o.sizes && strides == o.strides; }
};

// Input k, of `in_sizes[k]`/`in_strides[k]`, broadcast to `shape` (right-aligned); false if some
// input does not broadcast to it. Size-1 dims are dropped and dim d is merged into d+1 when every
// input's stride along d is its stride along d+1 times size d+1. An empty shape gives sizes {1}.
bool Collapse(const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& in_sizes,
              const std::vector<std::vector<int64_t>>& in_strides, Layout* layout);

// The layout of a reduction region (Note [Row reductions]): the region shape split at the reduced
// dims [dim, dim + count) into outer dims (collapsed as by Collapse, >= 1 dim), the reduced dims
// collapsed into one (kept even if its size is 1; false if they do not merge for some operand)
// and, unless the reduced dims are the last ones, the inner dims (collapsed, >= 1 dim).
// *outer_dims is the number of outer layout dims (the reduced one is layout dim *outer_dims).
bool ReductionLayout(const std::vector<int64_t>& shape, int dim, int count,
                     const std::vector<std::vector<int64_t>>& in_sizes,
                     const std::vector<std::vector<int64_t>>& in_strides, Layout* layout, int* outer_dims);

// The strides of a contiguous tensor of `sizes`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes);

// An operand of the reduced shape (keepdim=false) in the coordinates of the region shape (rank
// `rank`): padded with leading size-1 dims to rank - count, then `count` size-1, stride-0 dims
// inserted at `dim`.
void UnsqueezeReduced(size_t rank, int dim, int count, std::vector<int64_t>* sizes, std::vector<int64_t>* strides);

// Note [Row reductions]
// A region may contain one reduction over one dim `d` (any, negative dims normalized): softmax,
// log_softmax, layer_norm over the last dim with optional [C] weight/bias, and sum, mean, amax
// (keepdim or not) over d or over several consecutive dims [d, d + count) (a dim list, or every
// dim: aten::sum/aten::mean without dim, an empty list), which the layout merges into one
// (ReductionLayout; a region whose operands do not allow that is dropped, its nodes replayed);
// f32/f64, no dtype conversion, reduced size >= 1. Below, "the reduced dim" is the merged one and
// S[d] its size. The region is
//   prologue (elementwise nodes on the reduced input's shape S, ending with the reduced value),
//   the reduction,
//   epilogue (elementwise nodes right after it on the reduction's result shape: S for
//             softmax/log_softmax/layer_norm, the reduced shape S' for sum/mean/amax),
// all consecutive in graph order, so Note [Pointwise regions]'s invariant holds. An epilogue node's
// tensor operands are the reduction's result, earlier epilogue values or values from before the
// region (not prologue values: they are not kept for the last pass). The region shape is S; an
// operand of S' without keepdim is unsqueezed at d into S's coordinates (UnsqueezeReduced), so
// every such operand has a stride 0 along the reduced dims there. The layout is ReductionLayout's.
// The kernel runs *lines* [begin, end): a line is one position of the outer and inner dims, i.e.
// one reduced output element; there are numel(S) / S[d] lines, in row-major order of S'.
// * reduced dim(s) last ("row"): one line is a row; the first loop (vectorized along the row) computes the
//   prologue, reduces (max with NaN propagation, or a sum in vector order) and, for softmax-like
//   ops, stores the reduced value into the row buffer: the reduction's output row when that is
//   written, else a scratch row (malloc'd once per call). softmax/log_softmax make one more
//   pass as ATen's vectorized last-dim kernels do (exp(x - max) and its sum; the sum of
//   exp(x - max)), layer_norm one (the biased variance around the mean); the last pass computes
//   the result (e * (1 / sum); x - max - log(sum); (x * rstd - rstd * mean) * w + b), the
//   epilogue, and writes the values read later. sum/mean/amax compute the epilogue once per row.
// * otherwise ("columns"): lines are processed in blocks of up to 64 consecutive positions of the
//   innermost dim, vectorized across the block with per-column accumulators, looping over the
//   reduced dim outside (the same passes, with a scratch block of S[d] x 64).
// Symbolic sizes and outer strides are params as for pointwise regions (the reduced dim's stride
// too when it is not the innermost layout dim); a run-time reduced size of 0 replays.

// Note [Inlined constants]
// A region input that is a graph constant (a captured tensor) of 1..kMaxInlinedElements elements,
// not a view or otherwise sharing its storage, with a version counter (not an inference tensor),
// is a `static const` array of literals in the kernel (row-major; its layout strides are the
// contiguous ones). Constants are captured by reference, so the user may change them between
// calls: the plan records the data pointer, sizes, strides and version counter it read the values
// under (the version first, so a concurrent in-place update leaves a stale version, never stale
// values), and the artifact's run-time check (Note [Region run-time check]) requires all of them,
// and a storage still not shared, to be unchanged, else it replays the region, which reads the
// constant as eager does. Every in-place ATen update bumps the version counter, but writes through
// a raw data pointer do not (a host application's memcpy into data_ptr(), or its own buffer
// wrapped by from_blob and rewritten between calls), so the check also compares the constant's
// current elements with the bytes the literals were made from (at most 16 elements: a few ns).
constexpr int64_t kMaxInlinedElements = 16;

struct InlinedConstant {
  bool inlined = false;
  std::string values;                   // "{...}": the elements, row-major
  const void* data = nullptr;           // as read
  std::vector<int64_t> sizes, strides;  // as read
  uint32_t version = 0;                 // as read
  std::vector<int64_t> offsets;         // element offsets from `data`, row-major order
  std::string bytes;                    // the elements' bytes at `offsets`, as read
};

// Whether the constant tensor `t` still holds what `c` was made from (Note [Inlined constants]).
bool StillInlinable(const InlinedConstant& c, const at::Tensor& t);

// Note [Straight-line programs]
// A small graph is mostly dispatch: the radon log-density is ~60 ATen calls on 0-dim, [85] and
// [919] tensors, and its gradient ~150, each ~1 us of eager overhead for ~100 ns of arithmetic.
// Pointwise regions (one shape each, consecutive) cut it into pieces between the selects, the
// gathers, the reductions and the scalar chains. A program is one generated C function for a
// consecutive stretch of nodes that evaluates them one after another, in graph order, on plain
// arrays: elementwise ops (the op table, in-place forms included), views (select, narrow, slice,
// expand, detach, transpose, permute, view, ...: index arithmetic on the viewed array, so they
// alias exactly as in eager), *_like / zeros / ones / full / empty, fill_ / zero_ / copy_, clone,
// _to_copy / to.dtype / contiguous, sum / mean (all or some dims), index_select, index_add,
// select_scatter, slice_scatter, and the layers of small models in eval mode: mm / addmm / bmm /
// matmul (2-D or batched, up to 16K multiply-adds: above that a real BLAS is faster; accumulated
// in the dtype over vector lanes), embedding,
// batch_norm with running statistics and training=false (ATen's alpha/beta form), dropout with
// train=false, softmax / log_softmax over one dim, layer_norm over the last dim.
// Consecutive elementwise nodes of one shape share one loop (values used only there stay in
// registers). Conditions, all checked when planning:
//   - every size is static (not symbolic) and every value has at most kMaxProgramElements
//     elements (the self of a view or of index_select may be larger): above that ATen's kernels
//     run in parallel and pointwise regions are the better plan; dtypes f32/f64/i64/b8, CPU;
//   - a node whose result requires grad must be history-free (Note [History-free nodes]), unless
//     the entry runs with grad mode off (a view of a parameter still says requires_grad);
//   - nothing from before the program is written (in-place ops write only arrays the program
//     made), an in-place op reads no other view of what it writes and no operand of another
//     dtype (ATen would compute in the common dtype);
//   - a value read after the program (or returned) is an array the program made, whole, and each
//     array is read after it through one TensorImpl only: its own (the base result, in-place
//     results on it) or a single detach/alias of it (and in-place results on that); these arrays
//     are the program's outputs (fresh contiguous tensors of the traced sizes, as eager's results
//     are, whose version counters are bumped once per in-place write they took); a view read
//     after stays outside (replayed on the output);
//   - requires_grad_ only on a tensor the program made that nobody sees after it (views that
//     return their self, like contiguous(), count as that self).
// A node that breaks a condition ends the stretch (planning repeats until stable). A stretch
// becomes a program if it has a node pointwise regions cannot run (else they take it: they also
// run large and symbolic shapes, in parallel) and at least two nodes that compute. An in-place op
// on a broadcast view (stride 0) stays outside, so ATen raises as in eager.
// Run time: the inputs must have the traced dtype, sizes and strides, plain CPU keys and no
// autograd unless the program is history-free (as Note [Region run-time check]); intermediate
// arrays live in a per-thread scratch buffer. Every index of a gather or scatter is checked before
// it is used (all of them, as ATen checks them, even for an empty result); one out of range makes
// the program return 1 before anything outside its own arrays was touched, and its nodes are
// replayed instead, so ATen raises eager's error. Sums accumulate in double (int64 for integers)
// per result element, over vector lanes (`omp simd reduction`): not bit-equal to ATen's cascade
// sum, within its rounding; matmuls accumulate in the dtype, as BLAS does, in another order.
constexpr int64_t kMaxProgramElements = 32768;
constexpr int64_t kMaxProgramScratchBytes = int64_t{8} << 20;

struct ProgramRegion {
  std::vector<int> nodes;                // consecutive node indices
  std::vector<tracer::ValueId> inputs;   // in[k]: values from before the program
  std::vector<tracer::ValueId> outputs;  // out[k]: arrays the program made that are read after it
  // Values read after the program, each with the output array it is (a base, an in-place result
  // on it or its detach).
  std::vector<std::pair<tracer::ValueId, int>> results;
  std::vector<int> output_writes;  // per output: in-place writes to it (its version counter's bumps)
  int64_t scratch_bytes = 0;
  std::string function;  // "warden_program_<index>"
};

// The signature of a program: 0 on success, 1 if an index was out of range (nothing published).
using ProgramFn = int (*)(const void** in, void** out, char* scratch);

enum class ReductionKind : uint8_t { kNone, kSoftmax, kLogSoftmax, kSum, kMean, kAmax, kLayerNorm };

struct PointwiseRegion {
  std::vector<int> nodes;                 // consecutive node indices, in order
  std::vector<int64_t> sizes;             // region shape (a reduction region: its input's, S)
  std::vector<tracer::ValueId> inputs;    // in[k] (a value may appear twice, see input_unsqueeze)
  std::vector<int> input_unsqueeze;       // per input: d if UnsqueezeReduced applies, else -1
  std::vector<InlinedConstant> input_constant;  // per input (Note [Inlined constants])
  std::vector<tracer::ValueId> outputs;   // out[k]: results read after the region or returned
  std::vector<bool> output_reduced;       // per output: of the reduced shape S' (else S)
  Layout layout;                          // the traced iteration space
  bool static_layout = true;              // sizes and strides are literals in the kernel
  ReductionKind reduction = ReductionKind::kNone;  // Note [Row reductions]
  int reduction_node = -1;                // its node index
  int reduced_dim = -1;                   // d, in [0, rank(S)): the first reduced dim
  int reduced_count = 1;                  // the reduced dims are [d, d + reduced_count)
  bool keepdim = false;                   // sum/mean/amax: S' keeps d as size 1
  int outer_dims = 0;                     // layout dims before the reduced one
  std::string function;                   // "warden_kernel_<region index>"
};

struct PointwisePlan {
  std::vector<PointwiseRegion> regions;
  std::vector<ProgramRegion> programs;  // Note [Straight-line programs]; their nodes are in no region
  std::string source;  // all kernels of the graph in one translation unit ("" if no region)
};

// Why `node` cannot be part of a region, or "" if it can.
std::string FusionBlocker(const tracer::Graph& graph, const tracer::Node& node);

// The programs (Note [Straight-line programs]) and regions (Note [Pointwise regions]) of `graph`
// and their source. `symbolic_shape[id]` is true where value id's sizes may differ from the traced
// ones at run time (CompileContext); missing entries are static. `history_free`: per node, Note
// [History-free nodes] (missing: false). `reserved`: per node, taken by another kernel (Note [Conv
// epilogues] in runtime/native_conv.cc) and in no program or region (missing: false).
PointwisePlan PlanPointwise(const tracer::Graph& graph, const std::vector<bool>& symbolic_shape = {},
                            const std::vector<bool>& history_free = {}, const std::vector<bool>& reserved = {});

// The ops the fuser knows, for documentation and tests ("aten::add.Tensor", ...).
std::vector<std::string> FusibleOps();

}  // namespace warden::codegen

#endif  // WARDEN_RUNTIME_CODEGEN_POINTWISE_H_
