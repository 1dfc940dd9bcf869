// Cost of watch(module) on the hit path: a function whose graph returns its argument (so the hit is
// the guard check plus the call convention, ~30 ns) compiled without and with a watched module of
// N submodules (N/2 Linear and N/2 BatchNorm1d in a Sequential, plus the Sequential: each has a
// training flag and parameter, buffer and child registries, Note [Watched modules]). The budget of
// the issue: a watched module with 50 submodules adds at most ~50 ns to a hit.
//
//   bazel run -c opt //bench:watch_bench -- --benchmark_min_time=0.2 --benchmark_repetitions=5
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "runtime/warden.h"

namespace {

std::vector<at::Tensor> Identity(const std::vector<c10::IValue>& a) { return {a[0].toTensor()}; }

torch::nn::Sequential MakeNet(int64_t submodules) {
  torch::nn::Sequential net;
  for (int64_t i = 0; i < submodules / 2; ++i) {
    net->push_back(torch::nn::Linear(4, 4));
    net->push_back(torch::nn::BatchNorm1d(4));
  }
  return net;
}

// Arg: the number of submodules of the watched module (0: nothing watched).
void BM_HitWithWatchedModule(benchmark::State& state) {
  c10::InferenceMode inference;
  warden::Options options;
  options.backend = "aten";
  options.dynamic = warden::Dynamic::kStatic;
  warden::CompiledFunction f = warden::compile(Identity, options);
  torch::nn::Sequential net = MakeNet(state.range(0));
  if (state.range(0) > 0) f.watch(*net, "net");
  const std::vector<c10::IValue> args = {torch::randn({4})};
  f(args);
  const warden::Stats before = f.stats();
  for (auto _ : state) {
    std::vector<at::Tensor> out = f(args);
    benchmark::DoNotOptimize(out.data());
  }
  const warden::Stats after = f.stats();
  if (after.cache_hits - before.cache_hits != static_cast<int64_t>(state.iterations())) {
    state.SkipWithError("not every iteration was a cache hit");
  }
  state.counters["modules"] = static_cast<double>(net->modules().size());
}
BENCHMARK(BM_HitWithWatchedModule)->Arg(0)->Arg(10)->Arg(50)->Arg(200);

}  // namespace

BENCHMARK_MAIN();
