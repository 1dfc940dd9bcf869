// Pointwise fusion for backend "cpp": which nodes can run as generated C++ (FusionBlocker), the
// partition of a graph into fused regions, their iteration layout, and the C++ source of one
// kernel per region. Pure: no compiler, no files, no tensors touched (Collapse is shared with the
// artifact's run-time check). Compiling lives in codegen_compiler.h, running in cpp_backend.cc.
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
// and computes output elements [begin, end) (linear, row-major) of the region shape. in[] are the
// data pointers of PointwiseRegion::inputs, out[] of ::outputs. The iteration space is the region
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

// Note [Row reductions]
// A region may end with one reduction over the last dim (softmax, log_softmax, sum, mean, amax,
// layer_norm over the last dim with optional [C] weight/bias; f32/f64, no dtype conversion) when every value it touches has static sizes: either the node
// right after the region, reducing the region's last result, or a region of its own. Its kernel
// runs whole rows (begin and end are multiples of the last dim): one loop computes the
// elementwise nodes, writes their outputs and reduces (max with NaN propagation, or a sum in
// vector order), then softmax/log_softmax make two more passes over the output row as ATen's
// vectorized last-dim kernels do (exp(x - max) scaled by 1/sum; x - max - log(sum); layer_norm:
// mean, then the biased variance in a second pass, then (x * rstd - rstd * mean) * w + b). The region
// shape is the reduced input's; the layout is the outer dims collapsed plus the reduced dim.
enum class ReductionKind : uint8_t { kNone, kSoftmax, kLogSoftmax, kSum, kMean, kAmax, kLayerNorm };

struct PointwiseRegion {
  std::vector<int> nodes;                 // consecutive node indices, in order
  std::vector<int64_t> sizes;             // traced shape of every node result in the region
  std::vector<tracer::ValueId> inputs;    // in[k]
  std::vector<tracer::ValueId> outputs;   // out[k]: results read after the region or returned
  Layout layout;                          // the traced iteration space
  bool static_layout = true;              // sizes and strides are literals in the kernel
  ReductionKind reduction = ReductionKind::kNone;  // the last node reduces (Note [Row reductions])
  std::string function;                   // "warden_kernel_<region index>"
};

struct PointwisePlan {
  std::vector<PointwiseRegion> regions;
  std::string source;  // all kernels of the graph in one translation unit ("" if no region)
};

// Why `node` cannot be part of a region, or "" if it can.
std::string FusionBlocker(const tracer::Graph& graph, const tracer::Node& node);

// The regions of `graph` (Note [Pointwise regions]) and their source. `symbolic_shape[id]` is true
// where value id's sizes may differ from the traced ones at run time (CompileContext); missing
// entries are static.
PointwisePlan PlanPointwise(const tracer::Graph& graph, const std::vector<bool>& symbolic_shape = {});

// The ops the fuser knows, for documentation and tests ("aten::add.Tensor", ...).
std::vector<std::string> FusibleOps();

}  // namespace warden::codegen

#endif  // WARDEN_RUNTIME_CODEGEN_POINTWISE_H_
