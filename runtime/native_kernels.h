// What the native kernels (Note [Native kernels] in runtime/native_kernels.cc) share between their
// files: the run-time checks every kernel makes and the per-thread call count.
#ifndef WARDEN_RUNTIME_NATIVE_KERNELS_H_
#define WARDEN_RUNTIME_NATIVE_KERNELS_H_

#include <cstring>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "runtime/codegen_replay.h"

namespace warden::codegen::native {

// A defined tensor with exactly a plain CPU tensor's dispatch keys, with or without autograd's.
bool PlainCpu(const at::Tensor& t);

// Whether the thread's dispatch state lets a kernel stand for ATen's CPU kernel (and the autograd
// kernel above it): nothing included beyond the default, nothing excluded beyond the default and
// autograd's, AutocastCPU still excluded (CPU autocast un-excludes it). *below_autograd: the
// autograd keys are excluded (the result has no history).
bool DispatchStateAllowsNative(bool* below_autograd);

// A forward-mode gradient on t (the kernels have no forward derivative: ATen runs).
bool HasForwardGrad(const at::Tensor& t);

// Counts one native kernel call on this thread (NativeCallsOnThisThread).
void CountCall();

// Eight floats as a generic vector (AVX-sized; SSE pairs on the baseline build), for the kernels'
// loops. The helpers are always inlined, so their vector arguments never cross a call.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
constexpr int kLanes = 8;
typedef float F8 __attribute__((vector_size(32)));
C10_ALWAYS_INLINE F8 Splat(float x) { return F8{x, x, x, x, x, x, x, x}; }
C10_ALWAYS_INLINE F8 Load(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
C10_ALWAYS_INLINE void Store(float* p, F8 v) { std::memcpy(p, &v, sizeof(v)); }
#pragma GCC diagnostic pop

// Note [Native LSTM] (runtime/native_lstm.cc): aten::lstm.input.
bool LstmParams(const OpStep& s, std::vector<int64_t>* params);
bool NativeLstm(const OpStep& s, std::vector<c10::IValue>& slots);

// Note [Native convolution] (runtime/native_conv.cc): aten::conv2d and aten::conv_transpose2d.input.
bool Conv2dParams(const OpStep& s, std::vector<int64_t>* params);
bool NativeConv2d(const OpStep& s, std::vector<c10::IValue>& slots);
bool ConvTranspose2dParams(const OpStep& s, std::vector<int64_t>* params);
bool NativeConvTranspose2d(const OpStep& s, std::vector<c10::IValue>& slots);

// Note [Conv epilogues] (runtime/native_conv.cc): a convolution with the eval-mode batch_norm,
// residual add and relu that follow it, as one native call.
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

#endif  // WARDEN_RUNTIME_NATIVE_KERNELS_H_
