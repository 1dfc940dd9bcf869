// A Bazel host application: an MLP classifier served through Warden with automatic dynamic
// shapes, checked against eager LibTorch over a batch sweep.
//   cd examples/bazel_host && bazel run //:bazel_host
#include <cstdio>

#include <torch/torch.h>

#include "runtime/warden.h"

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential mlp(torch::nn::Linear(32, 64), torch::nn::GELU(), torch::nn::Linear(64, 10));
  torch::NoGradGuard no_grad;

  warden::Options options;
  options.name = "mlp";
  warden::CompiledFunction f = warden::compile(
      [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        return {torch::softmax(mlp->forward(a[0].toTensor()), -1)};
      },
      options);
  for (int64_t batch : {1, 3, 8, 16, 5, 8}) {
    const torch::Tensor x = torch::randn({batch, 32});
    const torch::Tensor got = f({x})[0];
    const torch::Tensor want = torch::softmax(mlp->forward(x), -1);
    if (!torch::allclose(got, want, 1e-5, 1e-6)) {
      std::printf("MISMATCH at batch %lld\n", static_cast<long long>(batch));
      return 1;
    }
  }
  const warden::Stats s = f.stats();
  std::printf("bazel_host: LibTorch %s, 6 calls equal to eager: %lld compiles, %lld cache hits\n",
              TORCH_VERSION, static_cast<long long>(s.compiles), static_cast<long long>(s.cache_hits));
  return s.cache_hits > 0 ? 0 : 1;
}
