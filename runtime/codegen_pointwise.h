// Pointwise fusion for backend "cpp": which nodes can run as generated C++ (FusionBlocker), the
// partition of a graph into fused regions, and the C++ source of one kernel per region. Pure: no
// compiler, no files, no tensors touched. Compiling lives in codegen_compiler.h, running in
// cpp_backend.cc.
//
// Note [Pointwise regions]
// A region is a maximal run of consecutive nodes (in graph order) that are each fusible and share
// one dtype (f32 or f64) and one output shape. Because a region occupies a contiguous stretch of
// the node order, running it as one kernel at the position of its first node reads every input at
// the same point of the program as eager does, so mutations and aliasing around it are unchanged.
// Fusible: functional elementwise ops (no in-place, random or view results) whose tensor operands
// have the node's exact shape, dtype and a contiguous layout, or are 0-dim tensors of the same dtype
// (read once, broadcast); non-tensor operands are numeric constants, baked in as literals of the
// region's dtype. Values read after the region (or returned) are written out; the rest stay in
// registers. The kernel of region k is
//   extern "C" void warden_kernel_k(const void** in, void** out, int64_t n)
// with in[] in PointwiseRegion::inputs order (0-dim inputs point at their single element), out[]
// in PointwiseRegion::outputs order, and n the element count; all buffers are contiguous. The
// caller re-checks layouts at run time and replays the region's nodes when they do not hold.
#ifndef WARDEN_RUNTIME_CODEGEN_POINTWISE_H_
#define WARDEN_RUNTIME_CODEGEN_POINTWISE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "tracer/graph.h"

namespace warden::codegen {

struct PointwiseRegion {
  std::vector<int> nodes;  // consecutive node indices, in order
  at::ScalarType dtype = at::ScalarType::Float;
  std::vector<int64_t> sizes;                // traced shape of every node result in the region
  std::vector<tracer::ValueId> inputs;       // in[k]
  std::vector<bool> scalar_inputs;           // in[k] is a 0-dim tensor broadcast over the region
  std::vector<tracer::ValueId> outputs;      // out[k]: results read after the region or returned
  std::string function;                      // "warden_kernel_<region index>"
};

struct PointwisePlan {
  std::vector<PointwiseRegion> regions;
  std::string source;  // all kernels of the graph in one translation unit ("" if no region)
};

// Why `node` cannot be part of a region, or "" if it can.
std::string FusionBlocker(const tracer::Graph& graph, const tracer::Node& node);

// The regions of `graph` (Note [Pointwise regions]) and their source.
PointwisePlan PlanPointwise(const tracer::Graph& graph);

// The ops the fuser knows, for documentation and tests ("aten::add.Tensor", ...).
std::vector<std::string> FusibleOps();

}  // namespace warden::codegen

#endif  // WARDEN_RUNTIME_CODEGEN_POINTWISE_H_
