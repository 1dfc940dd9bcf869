// Note [Native LSTM]
// ATen's CPU LSTM (at::lstm, the call nn::LSTM makes) runs each cell of each step as about ten
// ATen calls: a matmul of the hidden state, an add, a chunk, three sigmoids, two tanhs, the cell
// and hidden updates, each a dispatch for a few hundred floats. The LSTM language model of
// bench/models_bench (hidden 24, two layers, seven steps) takes ~170 us eagerly at batch 1 with
// LibTorch 1.13, ~19 us on "cpp" with this kernel; 2.x calls oneDNN's RNN (~110 us eagerly).
// On backend "cpp", a replay step of aten::lstm.input runs the kernel below when its checks pass,
// and the ATen call otherwise:
//   - built only for a unidirectional LSTM whose flags are constants and that draws no random
//     numbers (no dropout between layers while training);
//   - at run time: a float32 input [T, B, I] (or [B, T, I] batch-first), contiguous, every size
//     positive; h0 and c0 [L, B, H], contiguous; per layer w_ih [4H, I or H], w_hh [4H, H] and, with
//     biases, b_ih and b_hh [4H], all contiguous float32 (no projection: its weight count differs);
//     every tensor a plain CPU tensor; H at most kMaxHidden and a cell step of at most
//     kMaxCellWork multiply-adds (below); no gradient wanted (grad mode off, or
//     nothing requires grad) and none forward-mode; the thread's dispatch state as for the other
//     native kernels;
//   - results: output, h_n and c_n with eager's sizes and strides (a batch-first output is the
//     transposed view of a [T, B, H] tensor, as ATen returns it). The values are not eager's bits:
//     the gate sums add in another order than the BLAS call, and the sigmoid and tanh use a
//     polynomial exp (relative error ~2e-7 against ~1e-7 for ATen's). Like the fused kernels of
//     backend "cpp", it is close to eager, not equal (tests compare with a tolerance).
// Each step computes, for every batch row, gates = b_ih + b_hh + W_ih x_t + W_hh h as axpy rows
// over a transposed copy of the weights (made per call, padded to a multiple of 8 gates), then
// the cell update in 8-wide vectors. The loops are compiled twice, for AVX2 with FMA and for the
// baseline, and picked by the CPU once.
#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/codegen_replay.h"
#include "runtime/native_kernels.h"

// The vector helpers below are always inlined, so their AVX-sized arguments never cross a call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace warden::codegen::native {
namespace {

// Where the kernel stops paying: ATen spends ~10 dispatched calls (~10-20 us) per cell step on top
// of BLAS-speed gate products; the kernel's gate products run several times slower than a tuned
// GEMM once they are large. So a cell step of more than kMaxCellWork multiply-adds (batch *
// (input + hidden) * 4 * hidden; the language model's is 8 * 40 * 96 = 30,720 at batch 8) or a
// hidden size above kMaxHidden stays with ATen.
constexpr int64_t kMaxHidden = 256;
constexpr int64_t kMaxCellWork = int64_t{1} << 18;
typedef int32_t I8 __attribute__((vector_size(32)));

// exp(x), relative error ~2e-7: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial of r,
// 2^n by the exponent bits. Clamped to [-87.3, 88.3] (2^n stays normal); NaN stays NaN.
C10_ALWAYS_INLINE F8 Exp(F8 x) {
  x = x < Splat(-87.3f) ? Splat(-87.3f) : x;
  x = x > Splat(88.3f) ? Splat(88.3f) : x;
  const F8 t = x * Splat(1.44269504088896341f);
  const F8 n = (t + Splat(12582912.0f)) - Splat(12582912.0f);  // round to nearest
  const F8 r = (x - n * Splat(0.693359375f)) - n * Splat(-2.12194440e-4f);
  F8 p = Splat(1.9875691500e-4f);
  p = p * r + Splat(1.3981999507e-3f);
  p = p * r + Splat(8.3334519073e-3f);
  p = p * r + Splat(4.1665795894e-2f);
  p = p * r + Splat(1.6666665459e-1f);
  p = p * r + Splat(5.0000001201e-1f);
  p = p * (r * r) + r + Splat(1.0f);
  const I8 bits = (__builtin_convertvector(n, I8) + 127) << 23;
  F8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

C10_ALWAYS_INLINE F8 Sigmoid(F8 x) { return Splat(1.0f) / (Splat(1.0f) + Exp(-x)); }
C10_ALWAYS_INLINE F8 Tanh(F8 x) { return Splat(2.0f) / (Splat(1.0f) + Exp(Splat(-2.0f) * x)) - Splat(1.0f); }

// One layer's shapes and buffers. Weights are transposed and padded: wt_ih [in][gp], wt_hh
// [hidden][gp], bias [gp] (b_ih + b_hh), gp = 4H rounded up to kLanes.
struct Layer {
  int64_t steps, batch, in, hidden, gp;
  const float* x;          // [steps][batch][in] at x + (t * x_step + b * x_row) * in
  int64_t x_step, x_row;   // in rows
  float* y;                // [steps][batch][hidden], contiguous
  float* h;                // [batch][hidden]: h0 in, h_n out
  float* c;                // [batch][hidden]: c0 in, c_n out
  const float* wt_ih;
  const float* wt_hh;
  const float* bias;
  float* gates;            // [batch][gp] scratch
};

C10_ALWAYS_INLINE void Axpy(float a, const float* w, float* g, int64_t gp) {
  const F8 av = Splat(a);
  for (int64_t j = 0; j < gp; j += kLanes) Store(g + j, Load(g + j) + av * Load(w + j));
}

// The cell update of one batch row: gates [i | f | g | o], each `hidden` wide.
C10_ALWAYS_INLINE void Cell(const float* gates, int64_t hidden, float* h, float* c, float* y) {
  int64_t j = 0;
  for (; j + kLanes <= hidden; j += kLanes) {
    const F8 i = Sigmoid(Load(gates + j)), f = Sigmoid(Load(gates + hidden + j));
    const F8 g = Tanh(Load(gates + 2 * hidden + j)), o = Sigmoid(Load(gates + 3 * hidden + j));
    const F8 c2 = f * Load(c + j) + i * g;
    const F8 h2 = o * Tanh(c2);
    Store(c + j, c2);
    Store(h + j, h2);
    Store(y + j, h2);
  }
  if (j < hidden) {  // the last partial vector, through zero-padded lanes
    float lanes[5][kLanes] = {};
    const int64_t n = hidden - j;
    for (int k = 0; k < 4; ++k) std::memcpy(lanes[k], gates + k * hidden + j, n * sizeof(float));
    std::memcpy(lanes[4], c + j, n * sizeof(float));
    const F8 c2 = Sigmoid(Load(lanes[1])) * Load(lanes[4]) + Sigmoid(Load(lanes[0])) * Tanh(Load(lanes[2]));
    const F8 h2 = Sigmoid(Load(lanes[3])) * Tanh(c2);
    float cs[kLanes], hs[kLanes];
    Store(cs, c2);
    Store(hs, h2);
    std::memcpy(c + j, cs, n * sizeof(float));
    std::memcpy(h + j, hs, n * sizeof(float));
    std::memcpy(y + j, hs, n * sizeof(float));
  }
}

C10_ALWAYS_INLINE void RunLayerBody(const Layer& L) {
  for (int64_t t = 0; t < L.steps; ++t) {
    for (int64_t b = 0; b < L.batch; ++b) {
      float* g = L.gates + b * L.gp;
      std::memcpy(g, L.bias, L.gp * sizeof(float));
      const float* x = L.x + (t * L.x_step + b * L.x_row) * L.in;
      for (int64_t k = 0; k < L.in; ++k) Axpy(x[k], L.wt_ih + k * L.gp, g, L.gp);
      const float* h = L.h + b * L.hidden;
      for (int64_t k = 0; k < L.hidden; ++k) Axpy(h[k], L.wt_hh + k * L.gp, g, L.gp);
    }
    for (int64_t b = 0; b < L.batch; ++b) {
      Cell(L.gates + b * L.gp, L.hidden, L.h + b * L.hidden, L.c + b * L.hidden,
           L.y + (t * L.batch + b) * L.hidden);
    }
  }
}

__attribute__((target("avx2,fma"))) void RunLayerAvx2(const Layer& L) { RunLayerBody(L); }
void RunLayerBaseline(const Layer& L) { RunLayerBody(L); }

void RunLayer(const Layer& L) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) {
    RunLayerAvx2(L);
  } else {
    RunLayerBaseline(L);
  }
}

// w [rows][cols] -> out [cols][gp], zero-padded columns rows..gp.
void TransposePadded(const float* w, int64_t rows, int64_t cols, int64_t gp, float* out) {
  std::fill(out, out + cols * gp, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) out[k * gp + r] = w[r * cols + k];
  }
}

// Entry k of a Tensor[] argument, or an undefined tensor.
at::Tensor ListEntry(const OpStepArg& a, const std::vector<c10::IValue>& slots, size_t k) {
  if (a.kind == OpStepArg::Kind::kSlotList) {
    const c10::IValue& v = a.slots[k] >= 0 ? slots[a.slots[k]] : a.list_constants[k];
    return v.isTensor() ? v.toTensor() : at::Tensor();
  }
  return a.constant.toTensorList().get(k);
}

size_t ListSize(const OpStepArg& a) {
  return a.kind == OpStepArg::Kind::kSlotList ? a.slots.size() : a.constant.toTensorList().size();
}

bool IsTensorList(const OpStepArg& a) {
  return a.kind == OpStepArg::Kind::kSlotList || (a.kind == OpStepArg::Kind::kConstant && a.constant.isTensorList());
}

// A contiguous float32 plain CPU tensor of exactly these sizes.
bool Operand(const at::Tensor& t, std::initializer_list<int64_t> sizes) {
  return PlainCpu(t) && t.scalar_type() == at::kFloat && t.sizes().equals(sizes) && t.is_contiguous() &&
         !HasForwardGrad(t);
}

}  // namespace

// lstm.input(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers,
// float dropout, bool train, bool bidirectional, bool batch_first) into native_params:
// has_biases, num_layers, batch_first.
bool LstmParams(const OpStep& s, std::vector<int64_t>* params) {
  if (s.args.size() != 9 || s.args[0].kind != OpStepArg::Kind::kSlot || !IsTensorList(s.args[1]) ||
      !IsTensorList(s.args[2])) {
    return false;
  }
  for (size_t i = 3; i < 9; ++i) {
    if (s.args[i].kind != OpStepArg::Kind::kConstant) return false;
  }
  const c10::IValue &has_biases = s.args[3].constant, &layers = s.args[4].constant, &dropout = s.args[5].constant,
                    &train = s.args[6].constant, &bidirectional = s.args[7].constant,
                    &batch_first = s.args[8].constant;
  if (!has_biases.isBool() || !layers.isInt() || !dropout.isDouble() || !train.isBool() || !bidirectional.isBool() ||
      !batch_first.isBool()) {
    return false;
  }
  if (bidirectional.toBool() || layers.toInt() < 1 || layers.toInt() > 64) return false;
  if (train.toBool() && dropout.toDouble() != 0.0) return false;  // random masks between layers
  const size_t per_layer = has_biases.toBool() ? 4 : 2;
  if (ListSize(s.args[1]) != 2 || ListSize(s.args[2]) != per_layer * static_cast<size_t>(layers.toInt())) return false;
  *params = {has_biases.toBool() ? 1 : 0, layers.toInt(), batch_first.toBool() ? 1 : 0};
  return true;
}

bool NativeLstm(const OpStep& s, std::vector<c10::IValue>& slots) {
  const bool has_biases = s.native_params[0] != 0, batch_first = s.native_params[2] != 0;
  const int64_t layers = s.native_params[1];
  const c10::IValue& xv = slots[s.args[0].slot];
  if (!xv.isTensor()) return false;
  const at::Tensor& x = xv.toTensor();
  if (!PlainCpu(x) || x.scalar_type() != at::kFloat || x.dim() != 3 || !x.is_contiguous() || HasForwardGrad(x)) {
    return false;
  }
  const int64_t steps = batch_first ? x.size(1) : x.size(0), batch = batch_first ? x.size(0) : x.size(1);
  const int64_t in = x.size(2);
  if (steps <= 0 || batch <= 0 || in <= 0) return false;
  const at::Tensor h0 = ListEntry(s.args[1], slots, 0), c0 = ListEntry(s.args[1], slots, 1);
  if (!h0.defined() || h0.dim() != 3) return false;
  const int64_t hidden = h0.size(2);
  if (hidden <= 0 || hidden > kMaxHidden || !Operand(h0, {layers, batch, hidden}) ||
      !Operand(c0, {layers, batch, hidden})) {
    return false;
  }
  if (batch * (std::max(in, hidden) + hidden) * 4 * hidden > kMaxCellWork) return false;
  bool below_autograd = false;
  if (!DispatchStateAllowsNative(&below_autograd)) return false;
  const bool grad = c10::GradMode::is_enabled() && !below_autograd;
  if (grad && (x.requires_grad() || h0.requires_grad() || c0.requires_grad())) return false;
  const size_t per_layer = has_biases ? 4 : 2;
  std::vector<at::Tensor> w(per_layer * layers);
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t layer_in = l == 0 ? in : hidden;
    for (size_t k = 0; k < per_layer; ++k) {
      at::Tensor& t = w[l * per_layer + k];
      t = ListEntry(s.args[2], slots, l * per_layer + k);
      const bool ok = k == 0   ? Operand(t, {4 * hidden, layer_in})
                      : k == 1 ? Operand(t, {4 * hidden, hidden})
                               : Operand(t, {4 * hidden});
      if (!ok || (grad && t.requires_grad())) return false;
    }
  }
  CountCall();
  const int64_t gp = (4 * hidden + kLanes - 1) / kLanes * kLanes;
  // Scratch: per layer's weights, then gates, then the layers' outputs but the last.
  thread_local std::vector<float> scratch;
  const int64_t max_in = std::max(in, hidden);
  const size_t need = static_cast<size_t>((max_in + hidden + 1) * gp + batch * gp + 2 * steps * batch * hidden);
  if (scratch.size() < need) scratch.resize(need);
  float* wt_ih = scratch.data();
  float* wt_hh = wt_ih + max_in * gp;
  float* bias = wt_hh + hidden * gp;
  float* gates = bias + gp;
  float* inner[2] = {gates + batch * gp, gates + batch * gp + steps * batch * hidden};

  const at::TensorOptions options = x.options();
  at::Tensor output = at::empty({steps, batch, hidden}, options);
  // Eager's h_n and c_n are stacks, with canonical strides even on size-1 dims (where a contiguous
  // h0 may have any).
  at::Tensor h_n = h0.clone(at::MemoryFormat::Contiguous), c_n = c0.clone(at::MemoryFormat::Contiguous);
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t layer_in = l == 0 ? in : hidden;
    const at::Tensor* lw = &w[l * per_layer];
    TransposePadded(lw[0].data_ptr<float>(), 4 * hidden, layer_in, gp, wt_ih);
    TransposePadded(lw[1].data_ptr<float>(), 4 * hidden, hidden, gp, wt_hh);
    std::fill(bias, bias + gp, 0.0f);
    if (has_biases) {
      const float* b_ih = lw[2].data_ptr<float>();
      const float* b_hh = lw[3].data_ptr<float>();
      for (int64_t j = 0; j < 4 * hidden; ++j) bias[j] = b_ih[j] + b_hh[j];
    }
    Layer L;
    L.steps = steps;
    L.batch = batch;
    L.in = layer_in;
    L.hidden = hidden;
    L.gp = gp;
    if (l == 0) {
      L.x = x.data_ptr<float>();
      L.x_step = batch_first ? 1 : batch;
      L.x_row = batch_first ? steps : 1;
    } else {
      L.x = inner[(l - 1) % 2];
      L.x_step = batch;
      L.x_row = 1;
    }
    L.y = l == layers - 1 ? output.data_ptr<float>() : inner[l % 2];
    L.h = h_n.data_ptr<float>() + l * batch * hidden;
    L.c = c_n.data_ptr<float>() + l * batch * hidden;
    L.wt_ih = wt_ih;
    L.wt_hh = wt_hh;
    L.bias = bias;
    L.gates = gates;
    RunLayer(L);
  }
  slots[s.returns[0].slots[0]] = batch_first ? output.transpose(0, 1) : output;
  slots[s.returns[1].slots[0]] = std::move(h_n);
  slots[s.returns[2].slots[0]] = std::move(c_n);
  return true;
}

}  // namespace warden::codegen::native
