// Workloads and helpers shared by the bench/ binaries: the demo's MLP + attention block, the tiny
// 4-argument function of the hit-path benchmark, Warden options for the replay backend, medians.
// Nothing here is part of Warden; benchmarks use only the public API (runtime/warden.h).
#ifndef WARDEN_BENCH_WORKLOADS_H_
#define WARDEN_BENCH_WORKLOADS_H_

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "runtime/warden.h"

namespace warden::bench {

// Static shapes on the replay backend: the configuration whose hit path the issue budgets.
inline Options StaticAten(const std::string& name) {
  Options o;
  o.name = name;
  o.backend = "aten";
  o.dynamic = Dynamic::kStatic;
  return o;
}

// Minor page faults of the process so far (memory the allocator took back from the OS).
inline long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Median of a copy (the caller keeps its order). Empty input gives 0.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (*std::max_element(v.begin(), v.begin() + mid) + upper) / 2;
}

// out = relu(a * b + c) - d, written with the ATen ops directly: the eager baseline.
inline at::Tensor ReluFma(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                          const at::Tensor& d) {
  return at::sub(at::relu(at::add(at::mul(a, b), c)), d);
}

// The same as a Warden function (boxed arguments).
inline std::vector<at::Tensor> ReluFmaFn(const std::vector<c10::IValue>& args) {
  return {ReluFma(args[0].toTensor(), args[1].toTensor(), args[2].toTensor(), args[3].toTensor())};
}

// An MLP block (linear, gelu, linear) followed by a single-head attention block (q/k/v
// projections, softmax(q k^T / sqrt(d)) v, residual, layer_norm) on x of shape [batch, seq, d].
// The weights are constants of the function, as captured module parameters would be.
// The 10-op pointwise chain of the codegen benchmarks (mul, add, tanh, sub, relu, sigmoid, exp,
// scalar mul, add with alpha, neg).
inline at::Tensor Chain10(const at::Tensor& x, const at::Tensor& w) {
  at::Tensor y = x * w;
  y = y + x;
  y = torch::tanh(y);
  y = y - w;
  y = torch::relu(y);
  y = torch::sigmoid(y);
  y = torch::exp(y);
  y = y * 0.5;
  y = torch::add(y, x, 2);
  return -y;
}

inline std::vector<at::Tensor> Chain10Fn(const std::vector<c10::IValue>& args) {
  return {Chain10(args[0].toTensor(), args[1].toTensor())};
}

struct MlpAttention {
  int64_t d;
  at::Tensor w1, b1, w2, b2, wq, wk, wv, ln_w, ln_b;

  explicit MlpAttention(int64_t dim, int64_t hidden_mult = 4) : d(dim) {
    const double s = 1.0 / std::sqrt(static_cast<double>(dim));
    w1 = torch::randn({hidden_mult * dim, dim}) * s;
    b1 = torch::randn({hidden_mult * dim}) * 0.1;
    w2 = torch::randn({dim, hidden_mult * dim}) * (s / std::sqrt(static_cast<double>(hidden_mult)));
    b2 = torch::randn({dim}) * 0.1;
    wq = torch::randn({dim, dim}) * s;
    wk = torch::randn({dim, dim}) * s;
    wv = torch::randn({dim, dim}) * s;
    ln_w = 1 + torch::randn({dim}) * 0.1;
    ln_b = torch::randn({dim}) * 0.1;
  }

  at::Tensor operator()(const at::Tensor& x) const {
    const at::Tensor h = torch::linear(torch::gelu(torch::linear(x, w1, b1)), w2, b2);
    const at::Tensor q = torch::linear(h, wq);
    const at::Tensor k = torch::linear(h, wk);
    const at::Tensor v = torch::linear(h, wv);
    const at::Tensor scores =
        torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    const at::Tensor attn = torch::matmul(torch::softmax(scores, -1), v);
    return torch::layer_norm(attn + h, {d}, ln_w, ln_b);
  }
};

}  // namespace warden::bench

#endif  // WARDEN_BENCH_WORKLOADS_H_
