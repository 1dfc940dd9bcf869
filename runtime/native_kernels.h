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

}  // namespace warden::codegen::native

#endif  // WARDEN_RUNTIME_NATIVE_KERNELS_H_
