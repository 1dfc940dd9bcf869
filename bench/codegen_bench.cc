// Backend "cpp" against eager LibTorch and backend "aten" in the same run: the 10-op pointwise
// chain on 16 and 16M floats (plus a plain copy of the same bytes, the bandwidth yardstick),
// softmax, layer_norm, reductions over a leading dim (softmax, sum), epilogues fused into a
// reduction (layer_norm + gelu, softmax * y), a gelu MLP and the demo's MLP + attention block. Every Warden function is
// checked once against eager before it is timed. The summary prints, per workload, the medians
// and the ratios eager/cpp and eager/aten, measured interleaved (see bench/reporting.h), and for
// the 16M chain the fraction of copy bandwidth the fused kernel reaches.
//
//   bazel run -c opt //bench:codegen_bench -- --benchmark_min_time=0.2 [--summary_rounds=15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "bench/reporting.h"
#include "bench/workloads.h"
#include "runtime/warden.h"

namespace {

using Args = std::vector<c10::IValue>;
using EagerFn = std::function<std::vector<at::Tensor>(const Args&)>;

struct Workload {
  std::string name;
  EagerFn fn;
  Args args;
  int64_t bytes = 0;  // bytes a fused kernel must move (inputs read + outputs written), or 0
};

std::vector<Workload>& Workloads() {
  static auto* all = [] {
    auto* w = new std::vector<Workload>();
    torch::manual_seed(0);
    for (int64_t n : {int64_t{16}, int64_t{16} << 20}) {
      const at::Tensor x = torch::randn({n}), y = torch::randn({n});
      w->push_back({absl::StrCat("chain10/", n),
                    warden::bench::Chain10Fn, {x, y}, 3 * n * 4});
    }
    for (int64_t rows : {int64_t{8}, int64_t{4096}}) {
      const at::Tensor x = torch::randn({rows, 1024});
      w->push_back({absl::StrCat("softmax/", rows, "x1024"),
                    [](const Args& a) -> std::vector<at::Tensor> {
                      return {torch::softmax(a[0].toTensor() * 0.5, -1)};
                    },
                    {x}});
      const at::Tensor g = torch::randn({1024}), b = torch::randn({1024});
      w->push_back({absl::StrCat("layer_norm/", rows, "x1024"),
                    [g, b](const Args& a) -> std::vector<at::Tensor> {
                      return {torch::layer_norm(a[0].toTensor() + 1, {1024}, g, b)};
                    },
                    {x}});
    }
    // Reductions over a leading dim (the column kernel) and epilogues fused into the reduction.
    {
      const at::Tensor x = torch::randn({1024, 1024});
      w->push_back({"softmax_dim0/1024x1024",
                    [](const Args& a) -> std::vector<at::Tensor> { return {torch::softmax(a[0].toTensor(), 0)}; },
                    {x}});
      w->push_back({"sum_dim0/1024x1024",
                    [](const Args& a) -> std::vector<at::Tensor> { return {torch::sum(a[0].toTensor(), {0})}; },
                    {x}});
      const at::Tensor x3 = torch::randn({32, 128, 64});
      w->push_back({"softmax_dim1/32x128x64",
                    [](const Args& a) -> std::vector<at::Tensor> { return {torch::softmax(a[0].toTensor(), 1)}; },
                    {x3}});
      const at::Tensor g = torch::randn({1024}), b = torch::randn({1024});
      w->push_back({"layer_norm_gelu/4096x1024",
                    [g, b](const Args& a) -> std::vector<at::Tensor> {
                      return {torch::gelu(torch::layer_norm(a[0].toTensor(), {1024}, g, b))};
                    },
                    {torch::randn({4096, 1024})}});
      w->push_back({"softmax_mul/4096x1024",
                    [](const Args& a) -> std::vector<at::Tensor> {
                      return {torch::softmax(a[0].toTensor(), -1) * a[1].toTensor()};
                    },
                    {torch::randn({4096, 1024}), torch::randn({4096, 1024})}});
    }
    {
      const at::Tensor x = torch::randn({64, 256}), w1 = torch::randn({1024, 256}) * 0.06,
                       b1 = torch::randn({1024}), w2 = torch::randn({256, 1024}) * 0.03;
      w->push_back({"gelu_mlp/64x256",
                    [=](const Args& a) -> std::vector<at::Tensor> {
                      const at::Tensor h = torch::gelu(torch::linear(a[0].toTensor(), w1, b1));
                      return {torch::relu(torch::linear(h, w2)) * 2 + 1};
                    },
                    {x}});
    }
    {
      auto block = std::make_shared<warden::bench::MlpAttention>(64);
      w->push_back({"mlp_attention/4x16x64",
                    [block](const Args& a) -> std::vector<at::Tensor> { return {(*block)(a[0].toTensor())}; },
                    {torch::randn({4, 16, 64})}});
    }
    return w;
  }();
  return *all;
}

warden::Options WardenOptions(const std::string& backend, const std::string& name) {
  warden::Options o;
  o.name = name;
  o.backend = backend;
  o.dynamic = warden::Dynamic::kStatic;
  return o;
}

// A warmed compiled function whose output was checked against eager once.
struct Compiled {
  warden::CompiledFunction f;
  bool ok = true;
};

Compiled& Warden(const Workload& w, const std::string& backend) {
  static auto* all = new std::map<std::string, Compiled>();
  const std::string key = absl::StrCat(backend, ":", w.name);
  auto it = all->find(key);
  if (it != all->end()) return it->second;
  Compiled c{warden::compile(w.fn, WardenOptions(backend, w.name))};
  c.f(w.args);
  const std::vector<at::Tensor> got = c.f(w.args), want = w.fn(w.args);
  for (size_t i = 0; i < want.size(); ++i) {
    if (!torch::allclose(got[i], want[i], 1e-4, 1e-5)) {
      std::fprintf(stderr, "%s differs from eager on %s\n", backend.c_str(), w.name.c_str());
      c.ok = false;
    }
  }
  return all->emplace(key, std::move(c)).first->second;
}

void BM_Eager(benchmark::State& state, const Workload* w) {
  c10::InferenceMode inference;
  for (auto _ : state) {
    std::vector<at::Tensor> out = w->fn(w->args);
    benchmark::DoNotOptimize(out.data());
  }
}

void BM_Warden(benchmark::State& state, const Workload* w, const std::string& backend) {
  c10::InferenceMode inference;
  Compiled& c = Warden(*w, backend);
  if (!c.ok) state.SkipWithError("output differs from eager");
  for (auto _ : state) {
    std::vector<at::Tensor> out = c.f(w->args);
    benchmark::DoNotOptimize(out.data());
  }
}

// A copy of the chain's input bytes into a preallocated tensor: the bandwidth yardstick.
void BM_Copy(benchmark::State& state, const Workload* w) {
  const at::Tensor& x = w->args[0].toTensor();
  at::Tensor dst = torch::empty_like(x);
  for (auto _ : state) {
    dst.copy_(x);
    benchmark::DoNotOptimize(dst.data_ptr());
  }
}

void Register() {
  for (const Workload& w : Workloads()) {
    benchmark::RegisterBenchmark(("eager/" + w.name).c_str(), BM_Eager, &w)->UseRealTime();
    benchmark::RegisterBenchmark(("cpp/" + w.name).c_str(), BM_Warden, &w, std::string("cpp"))->UseRealTime();
    benchmark::RegisterBenchmark(("aten/" + w.name).c_str(), BM_Warden, &w, std::string("aten"))->UseRealTime();
    if (w.bytes > 0) benchmark::RegisterBenchmark(("copy/" + w.name).c_str(), BM_Copy, &w)->UseRealTime();
  }
}

// Interleaved eager vs cpp vs aten per workload; ratios > 1 mean faster than eager.
void Summary(int rounds) {
  c10::InferenceMode inference;
  std::printf("\ninterleaved summary (%d rounds, median of per-call means, real time):\n", rounds);
  for (const Workload& w : Workloads()) {
    Compiled& cpp = Warden(w, "cpp");
    Compiled& aten = Warden(w, "aten");
    // ~20 ms per round and body.
    const auto t0 = std::chrono::steady_clock::now();
    w.fn(w.args);
    const double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int calls = std::max(1, std::min(2000, static_cast<int>(0.02 / std::max(once, 1e-7))));
    auto eager = [&] { benchmark::DoNotOptimize(w.fn(w.args).data()); };
    auto run_cpp = [&] { benchmark::DoNotOptimize(cpp.f(w.args).data()); };
    auto run_aten = [&] { benchmark::DoNotOptimize(aten.f(w.args).data()); };
    const warden::bench::PairTiming vs_cpp = warden::bench::Interleaved(rounds, calls, eager, run_cpp);
    const warden::bench::PairTiming vs_aten = warden::bench::Interleaved(rounds, calls, eager, run_aten);
    std::printf("  %-24s eager %11.1f ns  cpp %11.1f ns (x%5.2f)  aten %11.1f ns (x%5.2f)%s",
                w.name.c_str(), vs_cpp.eager.real, vs_cpp.warden.real,
                vs_cpp.eager.real / vs_cpp.warden.real, vs_aten.warden.real,
                vs_aten.eager.real / vs_aten.warden.real, cpp.ok && aten.ok ? "" : "  OUTPUT DIFFERS");
    if (w.bytes > 0) {
      const at::Tensor& x = w.args[0].toTensor();
      at::Tensor dst = torch::empty_like(x);
      auto copy = [&] { dst.copy_(x); };
      const warden::bench::PairTiming vs_copy = warden::bench::Interleaved(rounds, calls, copy, run_cpp);
      const double copy_bw = 2.0 * x.nbytes() / vs_copy.eager.real;  // read + write, bytes/ns
      const double cpp_bw = static_cast<double>(w.bytes) / vs_copy.warden.real;
      std::printf("  copy %.1f GB/s, cpp %.1f GB/s = %.0f%% of copy", copy_bw, cpp_bw, 100 * cpp_bw / copy_bw);
    }
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = warden::bench::TakeSummaryRounds(&argc, argv, 11);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (rounds > 0) Summary(rounds);
  return 0;
}
