// Note [Native convolution] (runtime/native_conv.cc) against eager's at::conv2d, shape by shape:
// the convolutions of tests/models/models.h's CNN and ResNet at batch 1 and 8, and larger ones
// around the kernel's limits (C * KH * KW <= 576, O <= 128, 2^25 multiply-adds per call, 2^22 when
// C and O are both >= 16) that show where ATen catches up; the rows marked `false` are beyond them
// (their cpp rows are ATen calls).
// Each row compiles `conv2d(x, w, b, stride, padding)` on backend "cpp" (eval, no grad), checks the
// result against eager (allclose 1e-4 / 1e-5) and that the native kernel ran, then times it;
// the eager row times at::conv2d itself. The last rows are the DCGAN generator's
// conv_transpose2d layers (Note [Native convolution], transposed). The `+bn_relu` / `+bn_add_relu`
// rows add an eval batch_norm, a residual add and a relu after the convolution, which backend "cpp"
// runs in the convolution's call (Note [Conv epilogues]; the row checks that it did) and eager as
// separate ATen calls. Threads: 1 intra-op thread unless --threads=N.
//
//   bazel run -c opt //bench:native_conv_bench [-- --threads=2]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "runtime/codegen_replay.h"
#include "runtime/conv_epilogues.h"
#include "runtime/warden.h"
#include "tools/libtorch_info.h"

namespace {

struct Shape {
  const char* name;
  int64_t n, c, h, w, o, k, stride, pad;
  bool bias;
  bool native = true;  // within the kernel's limits (else the cpp row is the ATen call)
  bool transposed = false;  // conv_transpose2d: weight [c, o, k, k]
  int epilogue = 0;         // Note [Conv epilogues]: 1 batch_norm + relu, 2 batch_norm + residual add + relu
};

const Shape kShapes[] = {
    {"resnet_stem", 8, 1, 16, 16, 8, 3, 1, 1, false},
    {"resnet_block1", 8, 8, 16, 16, 8, 3, 1, 1, false},
    {"resnet_down3x3", 8, 8, 16, 16, 16, 3, 2, 1, false},
    {"resnet_block2", 8, 16, 8, 8, 16, 3, 1, 1, false},
    {"resnet_down1x1", 8, 8, 16, 16, 16, 1, 2, 0, false},
    {"resnet_block1_b1", 1, 8, 16, 16, 8, 3, 1, 1, false},
    {"cnn_conv1", 8, 1, 16, 16, 8, 3, 1, 1, true},
    {"cnn_conv2", 8, 8, 8, 8, 16, 3, 1, 1, true},
    {"c16_16px", 8, 16, 16, 16, 16, 3, 1, 1, true, false},
    {"c32_8px", 8, 32, 8, 8, 32, 3, 1, 1, true, false},
    {"c32_16px", 8, 32, 16, 16, 32, 3, 1, 1, true, false},
    {"c16_32px", 8, 16, 32, 32, 16, 3, 1, 1, true, false},
    {"c64_8px_b1", 1, 64, 8, 8, 64, 3, 1, 1, true},
    {"c32_28px", 8, 32, 28, 28, 32, 3, 1, 1, true, false},
    {"c64_14px", 8, 64, 14, 14, 64, 3, 1, 1, true, false},
    {"c128_7px", 8, 128, 7, 7, 128, 3, 1, 1, true, false},
    {"c3_64px_5x5", 4, 3, 64, 64, 16, 5, 1, 2, true},
    // The DCGAN generator's transposed convolutions at batch 8.
    {"dcgan_t1", 8, 16, 1, 1, 32, 4, 1, 0, false, true, true},
    {"dcgan_t2", 8, 32, 4, 4, 16, 4, 2, 1, false, true, true},
    {"dcgan_t3", 8, 16, 8, 8, 1, 4, 2, 1, false, true, true},
    // With their epilogues (Note [Conv epilogues]), as the models have them.
    {"resnet_stem+bn_relu", 8, 1, 16, 16, 8, 3, 1, 1, false, true, false, 1},
    {"resnet_block1+bn_add_relu", 8, 8, 16, 16, 8, 3, 1, 1, false, true, false, 2},
    {"resnet_block1_b1+bn_add_relu", 1, 8, 16, 16, 8, 3, 1, 1, false, true, false, 2},
    {"resnet_block2+bn_add_relu", 8, 16, 8, 8, 16, 3, 1, 1, false, true, false, 2},
    {"cnn_conv1+bn_relu", 8, 1, 16, 16, 8, 3, 1, 1, true, true, false, 1},
    {"dcgan_t2+bn_relu", 8, 32, 4, 4, 16, 4, 2, 1, false, true, true, 1},
};

// The row's operands: the convolution's, and its epilogue's (batch_norm statistics and parameters
// far from the identity, a residual of the output's sizes).
struct Operands {
  at::Tensor x, w, b, mean, var, gamma, beta, residual;
};

at::Tensor Forward(const Shape& s, const Operands& p, const at::Tensor& x) {
  at::Tensor y = s.transposed ? at::conv_transpose2d(x, p.w, p.b, s.stride, s.pad) : at::conv2d(x, p.w, p.b, s.stride, s.pad);
  if (s.epilogue == 0) return y;
  y = at::batch_norm(y, p.gamma, p.beta, p.mean, p.var, /*training=*/false, 0.1, 1e-5, false);
  if (s.epilogue == 2) y += p.residual;
  return at::relu(y);
}

struct Case {
  Operands p;
  warden::CompiledFunction f;
  std::string error;
};

Case MakeCase(const Shape& s) {
  torch::manual_seed(0);
  Operands p;
  p.x = torch::randn({s.n, s.c, s.h, s.w});
  p.w = (s.transposed ? torch::randn({s.c, s.o, s.k, s.k}) : torch::randn({s.o, s.c, s.k, s.k})) * 0.1;
  p.b = s.bias ? torch::randn({s.o}) : at::Tensor();
  p.mean = torch::randn({s.o});
  p.var = torch::rand({s.o}) + 0.5;
  p.gamma = torch::randn({s.o});
  p.beta = torch::randn({s.o});
  Shape plain = s;
  plain.epilogue = 0;
  p.residual = torch::randn(Forward(plain, p, p.x).sizes());
  warden::Options o;
  o.name = std::string("conv_") + s.name;
  o.backend = "cpp";
  Case c{p, warden::compile([s, p](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
           return {Forward(s, p, a[0].toTensor())};
         }, o), ""};
  const at::Tensor want = Forward(s, p, p.x);
  c.f({p.x});
  const int64_t before = warden::codegen::NativeCallsOnThisThread();
  const int64_t fused_before = warden::codegen::native::FusedConvCallsOnThisThread();
  const std::vector<at::Tensor> got = c.f({p.x});
  if ((warden::codegen::NativeCallsOnThisThread() != before) != s.native) {
    c.error = s.native ? "the native kernel did not run" : "the native kernel ran beyond its limits";
  }
  if (s.epilogue != 0 && warden::codegen::native::FusedConvCallsOnThisThread() == fused_before) {
    c.error = "the epilogue did not run in the convolution's call";
  }
  if (got.size() != 1 || !got[0].sizes().equals(want.sizes()) || !torch::allclose(got[0], want, 1e-4, 1e-5)) {
    c.error = "warden's result differs from eager's";
  }
  return c;
}

void BM_Eager(benchmark::State& state, const Shape* s) {
  torch::NoGradGuard no_grad;
  Case c = MakeCase(*s);
  for (auto _ : state) benchmark::DoNotOptimize(Forward(*s, c.p, c.p.x));
  // A transposed convolution multiplies every input pixel by every weight.
  state.counters["MFLOP"] = s->transposed ? 2.0 * s->n * s->h * s->w * s->c * s->o * s->k * s->k / 1e6
                                          : 2.0 * s->n * s->o * s->c * s->k * s->k *
                                                ((s->h + 2 * s->pad - s->k) / s->stride + 1) *
                                                ((s->w + 2 * s->pad - s->k) / s->stride + 1) / 1e6;
}

void BM_Cpp(benchmark::State& state, const Shape* s) {
  torch::NoGradGuard no_grad;
  Case c = MakeCase(*s);
  if (!c.error.empty()) {
    state.SkipWithError(c.error.c_str());
    return;
  }
  const std::vector<c10::IValue> args = {c.p.x};
  for (auto _ : state) benchmark::DoNotOptimize(c.f(args));
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      threads = std::atoi(argv[i] + 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (threads < 1) {
    std::fprintf(stderr, "native_conv_bench: --threads must be >= 1\n");
    return 2;
  }
  at::set_num_threads(threads);
  for (const Shape& s : kShapes) {
    benchmark::RegisterBenchmark((std::string("conv/") + s.name + "/eager").c_str(), BM_Eager, &s);
    benchmark::RegisterBenchmark((std::string("conv/") + s.name + "/cpp").c_str(), BM_Cpp, &s);
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  std::printf("native_conv_bench: %s, %d intra-op thread(s)\n", warden::tools::LibTorchDescription().c_str(), threads);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
