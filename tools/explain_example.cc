// Prints the worked example of explain() that README.md shows: one function, automatic dynamic
// shapes, a broadcast relation and a recompile. Regenerate with `bazel run //tools:explain_example`.
#include <iostream>

#include <torch/torch.h>

#include "runtime/warden.h"

int main() {
  warden::Options options;
  options.name = "scaled_add";
  options.backend = "aten";
  options.arg_names = {"x", "y"};
  warden::CompiledFunction f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        return {torch::relu(a[0].toTensor() + a[1].toTensor()) * 3};
      },
      options);
  f({torch::randn({3, 4}), torch::randn({3, 4})});
  f({torch::randn({5, 4}), torch::randn({5, 4})});  // size change: recompiled with dims dynamic
  f({torch::randn({9, 4}), torch::randn({9, 4})});  // hit
  std::cout << f.explain();
  return 0;
}
