// A CMake host application: a small CNN (conv, batch norm, pooling, a linear head) served through
// Warden in eval mode, checked against eager LibTorch at every batch size.
//   cmake -S examples/cmake_host -B build -DCMAKE_PREFIX_PATH=<Warden package>
//   cmake --build build && ./build/cmake_host
#include <cstdio>

#include <torch/torch.h>

#include "runtime/warden.h"

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(8))),
        fc(register_module("fc", torch::nn::Linear(8 * 4 * 4, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn(conv(x))), 2);
    return torch::log_softmax(fc(x.view({x.size(0), -1})), 1);
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

int main() {
  torch::manual_seed(0);
  Net net;
  net->eval();
  torch::NoGradGuard no_grad;

  warden::Options options;
  options.name = "cnn";
  warden::CompiledFunction f = warden::compile(
      [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> { return {net->forward(a[0].toTensor())}; },
      options);
  f.watch(*net, "net");  // a train()/eval() switch recompiles instead of replaying the other mode
  for (int round = 0; round < 2; ++round) {
    for (int64_t batch : {1, 2, 4, 8}) {
      const torch::Tensor x = torch::randn({batch, 1, 8, 8});
      const torch::Tensor got = f({x})[0];
      const torch::Tensor want = net->forward(x);
      if (!torch::allclose(got, want, 1e-5, 1e-5)) {
        std::printf("MISMATCH at batch %lld\n", static_cast<long long>(batch));
        return 1;
      }
    }
  }
  const warden::Stats s = f.stats();
  std::printf("cmake_host: LibTorch %s, 8 calls equal to eager: %lld compiles, %lld cache hits\n",
              TORCH_VERSION, static_cast<long long>(s.compiles), static_cast<long long>(s.cache_hits));
  return s.cache_hits > 0 ? 0 : 1;
}
