// What the native kernels (Note [Native kernels] in runtime/native_kernels.cc) share between their
// files: the run-time checks every kernel makes and the per-thread call count.
#ifndef WARDEN_RUNTIME_NATIVE_KERNELS_H_
#define WARDEN_RUNTIME_NATIVE_KERNELS_H_

#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "runtime/codegen_replay.h"

namespace warden::codegen::native {

// A defined tensor with exactly a plain CPU tensor's dispatch keys, with or without autograd's.
bool PlainCpu(const at::Tensor& t);

// Whether the thread's dispatch state lets a kernel stand for ATen's CPU kernel (and the autograd
// kernel above it): nothing included beyond the default, nothing excluded beyond the default and
// autograd's, every default-excluded key still excluded (CPU autocast un-excludes AutocastCPU). *below_autograd: the autograd keys are excluded (the result has no history).
bool DispatchStateAllowsNative(bool* below_autograd);

// A forward-mode gradient on t (the kernels have no forward derivative: ATen runs).
bool HasForwardGrad(const at::Tensor& t);

// Counts one native kernel call on this thread (NativeCallsOnThisThread).
void CountCall();

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
