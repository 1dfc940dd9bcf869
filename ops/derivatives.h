// Derivative rules: per ATen op, the vector-Jacobian product written as ATen ops, the way
// derivatives.yaml writes autograd's formulas. The tracer runs them on traced tensors when a
// gradient is taken inside a traced function (Note [Captured gradients] in tracer/tracer.cc), so
// the backward becomes ordinary graph nodes the backends compile like the forward.
//
// A rule sees the op's arguments as the op got them (tensors are traced tensors, so every op it
// runs is recorded, and every size it reads through them is a recorded read) and returns one
// gradient per tensor input, flattened in argument order (a Tensor[] argument contributes one per
// element). It computes only the ones `needs` asks for (undefined elsewhere). Decisions a rule
// makes on sizes without reading them through the traced tensors (`sizes`: the broadcast pattern,
// which ranks and the sizes 0 and 1 fix, both guarded for every traced tensor) must be ones the
// forward op's guards already pin.
#ifndef WARDEN_OPS_DERIVATIVES_H_
#define WARDEN_OPS_DERIVATIVES_H_

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace warden::ops {

struct GradContext {
  const std::vector<c10::IValue>& args;   // the op's arguments (traced tensors, constants)
  const std::vector<at::Tensor>& outputs;  // its tensor results, flattened
  const std::vector<at::Tensor>& grads;    // the gradient of each result (undefined: zero)
  const std::vector<bool>& needs;          // per flattened tensor input
  // The sizes of a traced tensor without recording a read (see above for when that is allowed).
  std::function<std::vector<int64_t>(const at::Tensor&)> sizes;
  // Its strides, likewise without a read: only for choices that change the layout of a gradient,
  // never its values (which of two equal products to compute, as autograd's mm backward chooses).
  std::function<std::vector<int64_t>(const at::Tensor&)> strides;
};

using DerivativeRule = std::vector<at::Tensor> (*)(const GradContext&);

// The rule for `op` ("aten::mul.Tensor"), or null.
DerivativeRule FindDerivative(const std::string& op);

// Every op with a rule (sorted), for documentation and tests.
std::vector<std::string> DerivativeOps();

}  // namespace warden::ops

#endif  // WARDEN_OPS_DERIVATIVES_H_
