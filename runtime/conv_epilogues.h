// Note [Conv epilogues] (runtime/native_conv.cc): a convolution with the eval-mode batch_norm,
// residual add and relu that follow it, as one native call on backend "cpp".
#ifndef WARDEN_RUNTIME_CONV_EPILOGUES_H_
#define WARDEN_RUNTIME_CONV_EPILOGUES_H_

#include <cstdint>
#include <vector>

#include <ATen/core/ivalue.h>

#include "runtime/codegen_replay.h"
#include "tracer/graph.h"

namespace warden::codegen::native {

struct ConvGroup {
  std::vector<int> nodes;  // the convolution, then batch_norm, add and relu as present, in graph order
  int batch_norm = -1, add = -1, relu = -1;  // their node indices (-1: absent)
  int residual_arg = -1;                     // the add's argument that is not the convolution's chain
  int in_place_writes = 0;                   // add_ / relu_ links after the last out-of-place one: the result's version
};
// The groups of `g` (each node in at most one). `history_free`: Note [History-free nodes].
std::vector<ConvGroup> PlanConvEpilogues(const tracer::Graph& g, const std::vector<bool>& history_free);

// A group's epilogue as its replay steps give it.
struct ConvEpilogue {
  const OpStep* batch_norm = nullptr;   // its tensors and eps
  const OpStepArg* residual = nullptr;  // the add's other argument
  bool relu = false;
};
// Runs `conv` (a step whose native kernel is NativeConv2d or NativeConvTranspose2d) with `e`,
// its result into slots[out_slot]. Returns false, having touched nothing, when any run-time check
// fails (the group's steps then run one by one).
bool NativeConvFused(const OpStep& conv, const ConvEpilogue& e, int out_slot, std::vector<c10::IValue>& slots);
// NativeConvFused calls that ran on this thread so far (tests).
int64_t FusedConvCallsOnThisThread();

}  // namespace warden::codegen::native

#endif  // WARDEN_RUNTIME_CONV_EPILOGUES_H_
