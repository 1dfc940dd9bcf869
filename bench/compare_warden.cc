// Warden's half of the torch.compile comparison (bench/compare.sh runs both halves against the
// same LibTorch and prints the README table). Each line of output is one JSON object:
//   {"workload": ..., "system": "eager-cpp" | "warden-cpp" | "warden-aten", "us": median µs per
//    call, "compiles": cache entries created}
// The workloads mirror bench/torch_compile_compare.py exactly (same shapes, same ops).
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench/radon.h"
#include "bench/workloads.h"
#include "runtime/warden.h"
#include "tools/libtorch_info.h"

namespace {

using Args = std::vector<c10::IValue>;
using Outputs = std::vector<at::Tensor>;
using warden::bench::Median;

// Median µs per call over `reps` repetitions of `iters` calls, after `warm` calls.
double TimeUs(const std::function<void()>& call, int iters, int reps = 7, int warm = 3) {
  for (int i = 0; i < warm; ++i) call();
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) call();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  return Median(us);
}

void Emit(const std::string& workload, const std::string& system, double us, int64_t compiles) {
  std::printf("{\"workload\": \"%s\", \"system\": \"%s\", \"us\": %.4f, \"compiles\": %lld}\n", workload.c_str(),
              system.c_str(), us, static_cast<long long>(compiles));
  std::fflush(stdout);
}

bool Same(const Outputs& a, const Outputs& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::allclose(a[i], b[i], 1e-4, 1e-5)) return false;
  }
  return true;
}

// Eager, Warden "cpp" and Warden "aten" on one fixed-shape workload; outputs checked first.
bool Compare(const std::string& name, const warden::Fn& fn, const Args& args, int iters) {
  const Outputs want = fn(args);
  Emit(name, "eager-cpp", TimeUs([&] { fn(args); }, iters), 0);
  for (const char* backend : {"cpp", "aten"}) {
    warden::Options o;
    o.name = name;
    o.backend = backend;
    warden::CompiledFunction f = warden::compile(fn, o);
    if (!Same(f(args), want)) {
      std::fprintf(stderr, "compare_warden: %s on %s differs from eager\n", name.c_str(), backend);
      return false;
    }
    const double us = TimeUs([&] { f(args); }, iters);
    Emit(name, std::string("warden-") + backend, us, f.stats().compiles);
  }
  return true;
}

// Calls over a sweep of shapes: how many compiles the sweep costs (kAuto, backend cpp).
bool Sweep(const std::string& name, const warden::Fn& fn, const std::vector<Args>& calls) {
  warden::Options o;
  o.name = name;
  warden::CompiledFunction f = warden::compile(fn, o);
  const auto t0 = std::chrono::steady_clock::now();
  for (const Args& a : calls) {
    if (!Same(f(a), fn(a))) {
      std::fprintf(stderr, "compare_warden: %s differs from eager\n", name.c_str());
      return false;
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  Emit(name, "warden-cpp", us / calls.size(), f.stats().compiles);
  return true;
}

struct Cnn {  // conv-bn-relu-pool twice, linear head (eval mode), as in the C++ tutorials
  torch::nn::Conv2d c1{torch::nn::Conv2dOptions(1, 16, 3).padding(1)}, c2{torch::nn::Conv2dOptions(16, 32, 3).padding(1)};
  torch::nn::BatchNorm2d b1{16}, b2{32};
  torch::nn::Linear fc{32 * 7 * 7, 10};
  Cnn() {
    for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(c1.get()), static_cast<torch::nn::Module*>(c2.get()),
                                 static_cast<torch::nn::Module*>(b1.get()), static_cast<torch::nn::Module*>(b2.get()),
                                 static_cast<torch::nn::Module*>(fc.get())}) {
      m->eval();
    }
  }
  at::Tensor operator()(const at::Tensor& x) {
    at::Tensor h = torch::max_pool2d(torch::relu(b1->forward(c1->forward(x))), 2);
    h = torch::max_pool2d(torch::relu(b2->forward(c2->forward(h))), 2);
    return fc->forward(h.flatten(1));
  }
};

}  // namespace

int main() {
  std::fprintf(stderr, "compare_warden: LibTorch %s\n", warden::tools::LibTorchDescription().c_str());
  torch::manual_seed(0);
  bool ok = true;
  {
    c10::InferenceMode inference;
    // Per-call overhead at N tensor arguments: each argument plus one (one-element tensors).
    for (int n : {1, 4, 16, 64}) {
      Args args;
      for (int i = 0; i < n; ++i) args.emplace_back(torch::randn({1}));
      const warden::Fn add1 = [](const Args& a) {
        Outputs out;
        for (const c10::IValue& v : a) out.push_back(v.toTensor() + 1);
        return out;
      };
      ok &= Compare("overhead/args=" + std::to_string(n), add1, args, n >= 16 ? 2000 : 20000);
    }
    const at::Tensor x16 = torch::randn({16}), w16 = torch::randn({16});
    ok &= Compare("chain10/n=16", warden::bench::Chain10Fn, {x16, w16}, 20000);
    const at::Tensor x64k = torch::randn({65536}), w64k = torch::randn({65536});
    ok &= Compare("chain10/n=65536", warden::bench::Chain10Fn, {x64k, w64k}, 500);
    const warden::bench::MlpAttention block(64);
    const warden::Fn attention = [&block](const Args& a) -> Outputs { return {block(a[0].toTensor())}; };
    ok &= Compare("attention/b=1,L=16,d=64", attention, {torch::randn({1, 16, 64})}, 2000);
    Cnn cnn;
    const warden::Fn cnn_fn = [&cnn](const Args& a) -> Outputs { return {cnn(a[0].toTensor())}; };
    ok &= Compare("cnn/b=8,28x28", cnn_fn, {torch::randn({8, 1, 28, 28})}, 200);
    const auto data = std::make_shared<warden::bench::RadonData>(warden::bench::MakeRadonData());
    const warden::Fn logp = [data](const Args& a) -> Outputs { return {warden::bench::RadonLogp(a[0].toTensor(), *data)}; };
    ok &= Compare("radon/logp", logp, {warden::bench::RadonTheta(*data)}, 5000);

    // Compiles over sweeps (kAuto): sequence length 1..512 through the attention block, and the
    // batch sizes 1..64 through the small CNN.
    std::vector<Args> seq;
    for (int64_t len = 1; len <= 512; len *= 2) seq.push_back({torch::randn({1, len, 64})});
    for (int64_t len : {3, 17, 100, 300, 511}) seq.push_back({torch::randn({1, len, 64})});
    ok &= Sweep("sweep/attention L=1..512 (15 lengths)", attention, seq);
    std::vector<Args> batches;
    for (int64_t b : {1, 2, 3, 4, 8, 16, 32, 64}) batches.push_back({torch::randn({b, 1, 28, 28})});
    ok &= Sweep("sweep/cnn batch=1..64 (8 sizes)", cnn_fn, batches);
  }
  {
    // logp + gradient, as a sampler calls it: the gradient taken outside the compiled function.
    const auto data = std::make_shared<warden::bench::RadonData>(warden::bench::MakeRadonData());
    const warden::Fn logp = [data](const Args& a) -> Outputs { return {warden::bench::RadonLogp(a[0].toTensor(), *data)}; };
    const at::Tensor theta = warden::bench::RadonTheta(*data).requires_grad_(true);
    auto grad_of = [&](const std::function<Outputs(const Args&)>& f) {
      return torch::autograd::grad({f({theta})[0]}, {theta})[0];
    };
    const at::Tensor want = grad_of(logp);
    Emit("radon/logp+grad", "eager-cpp", TimeUs([&] { grad_of(logp); }, 2000), 0);
    for (const char* backend : {"cpp", "aten"}) {
      warden::Options o;
      o.name = "radon_grad";
      o.backend = backend;
      warden::CompiledFunction f = warden::compile(logp, o);
      const auto call = [&f](const Args& a) { return f(a); };
      if (!torch::allclose(grad_of(call), want, 1e-6, 1e-8)) {
        std::fprintf(stderr, "compare_warden: radon gradient on %s differs from eager\n", backend);
        ok = false;
        continue;
      }
      Emit("radon/logp+grad", std::string("warden-") + backend, TimeUs([&] { grad_of(call); }, 2000),
           f.stats().compiles);
    }
  }
  return ok ? 0 : 1;
}
