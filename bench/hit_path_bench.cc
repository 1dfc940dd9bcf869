// Cost of a cache hit: a 4-argument static function (relu(a*b + c) - d on 16 floats, inference
// mode) called eagerly through the ATen ops and through a warmed warden::CompiledFunction
// (backend "aten", kStatic), plus how the hit scales with the argument count and with the number
// of cache entries scanned before the hit. The budget: hit - eager <= 1 us.
//
// After the benchmarks a summary prints the overheads from the benchmark medians, then measures
// eager vs hit again interleaved (rounds alternate which goes first; median over rounds) and
// prints `hit_path_overhead_ns=... ratio=...` (and the scaling pairs), in real and in thread CPU
// time (see the Summary section for why both). Extra flag: --summary_rounds=N (default 41, 0 skips).
//
//   bazel run -c opt //bench:hit_path_bench -- --benchmark_min_time=0.2 [--benchmark_repetitions=5]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "bench/reporting.h"
#include "bench/workloads.h"
#include "runtime/warden.h"

namespace {

using warden::bench::Median;

constexpr int64_t kNumel = 16;

std::vector<c10::IValue> RandomArgs(int n, int64_t numel) {
  std::vector<c10::IValue> args;
  for (int i = 0; i < n; ++i) args.emplace_back(torch::randn({numel}));
  return args;
}

// Runs `f(args)` in the benchmark loop and fails the benchmark unless every iteration hit.
void RunHits(benchmark::State& state, warden::CompiledFunction& f, const std::vector<c10::IValue>& args) {
  const warden::Stats before = f.stats();
  for (auto _ : state) {
    std::vector<at::Tensor> out = f(args);
    benchmark::DoNotOptimize(out.data());
  }
  const warden::Stats after = f.stats();
  if (after.cache_hits - before.cache_hits != static_cast<int64_t>(state.iterations()) ||
      after.compiles != before.compiles || after.eager_calls != before.eager_calls) {
    state.SkipWithError("not every iteration was a cache hit");
  }
  state.counters["entries"] = static_cast<double>(after.compiles);
}

// --- The pair ---------------------------------------------------------------------------

void BM_EagerDirect(benchmark::State& state) {
  c10::InferenceMode inference;
  const std::vector<c10::IValue> args = RandomArgs(4, kNumel);
  const at::Tensor a = args[0].toTensor(), b = args[1].toTensor(), c = args[2].toTensor(),
                   d = args[3].toTensor();
  for (auto _ : state) {
    at::Tensor out = warden::bench::ReluFma(a, b, c, d);
    benchmark::DoNotOptimize(out.unsafeGetTensorImpl());
  }
}
BENCHMARK(BM_EagerDirect);

// The same function through the boxed interface Warden sees (std::function over IValues), but
// eager: separates the cost of the calling convention from Warden's own.
void BM_EagerBoxedFn(benchmark::State& state) {
  c10::InferenceMode inference;
  const std::vector<c10::IValue> args = RandomArgs(4, kNumel);
  const warden::Fn fn = warden::bench::ReluFmaFn;
  for (auto _ : state) {
    std::vector<at::Tensor> out = fn(args);
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_EagerBoxedFn);

void BM_WardenHit(benchmark::State& state) {
  c10::InferenceMode inference;
  const std::vector<c10::IValue> args = RandomArgs(4, kNumel);
  warden::CompiledFunction f = warden::compile(warden::bench::ReluFmaFn, warden::bench::StaticAten("relu_fma"));
  f(args);  // compile
  f(args);  // first hit
  RunHits(state, f, args);
}
BENCHMARK(BM_WardenHit);

// --- Scaling with the number of tensor arguments ------------------------------------------------
// stack(all N args).sum(0): two ops whatever N, every argument read by the graph (so guarded).

std::vector<at::Tensor> StackSum(const std::vector<at::Tensor>& ts) { return {at::stack(ts).sum(0)}; }

std::vector<at::Tensor> StackSumFn(const std::vector<c10::IValue>& args) {
  std::vector<at::Tensor> ts;
  for (const c10::IValue& a : args) ts.push_back(a.toTensor());
  return StackSum(ts);
}

void BM_EagerArgs(benchmark::State& state) {
  c10::InferenceMode inference;
  const std::vector<c10::IValue> args = RandomArgs(static_cast<int>(state.range(0)), kNumel);
  std::vector<at::Tensor> ts;
  for (const c10::IValue& a : args) ts.push_back(a.toTensor());
  for (auto _ : state) {
    std::vector<at::Tensor> out = StackSum(ts);
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_EagerArgs)->Arg(1)->Arg(4)->Arg(16)->Arg(64);

void BM_WardenHitArgs(benchmark::State& state) {
  c10::InferenceMode inference;
  const std::vector<c10::IValue> args = RandomArgs(static_cast<int>(state.range(0)), kNumel);
  warden::CompiledFunction f = warden::compile(StackSumFn, warden::bench::StaticAten("stack_sum"));
  f(args);
  f(args);
  RunHits(state, f, args);
}
BENCHMARK(BM_WardenHitArgs)->Arg(1)->Arg(4)->Arg(16)->Arg(64);

// --- Scaling with the number of cache entries ---------------------------------------------------
// N entries for sizes 16 .. 16+N-1, compiled in that order; calls use size 16, the entry compiled
// first, so the lookup tries the other N-1 entries before it hits (today's lookup is a scan).

void BM_WardenHitEntries(benchmark::State& state) {
  c10::InferenceMode inference;
  const int n = static_cast<int>(state.range(0));
  warden::Options o = warden::bench::StaticAten("relu_fma_entries");
  o.cache_size_limit = 64;
  warden::CompiledFunction f = warden::compile(warden::bench::ReluFmaFn, o);
  for (int i = 0; i < n; ++i) f(RandomArgs(4, kNumel + i));
  const std::vector<c10::IValue> args = RandomArgs(4, kNumel);
  f(args);
  RunHits(state, f, args);
  if (f.stats().compiles != n) state.SkipWithError("unexpected number of entries");
}
BENCHMARK(BM_WardenHitEntries)->Arg(1)->Arg(8)->Arg(64);

// --- Summary --------------------------------------------------------------------------------------
// Two clocks throughout: real time, which the budget is stated in, and this thread's CPU time,
// which excludes the time the calling thread was preempted. The calls are single-threaded and
// never block, so on an idle machine the two agree; on this shared 2-core machine real time swings
// with the neighbours' builds and the CPU time is the figure to trust. The verdict uses CPU time.

using warden::bench::Ns;
using warden::bench::RecordingReporter;

void PrintPair(const std::string& label, const Ns& eager, const Ns& warden, const char* note = "") {
  std::printf("  %-40s real: eager %8.1f warden %8.1f overhead %8.1f ns ratio %.3f | "
              "cpu: eager %8.1f warden %8.1f overhead %8.1f ns ratio %.3f%s\n",
              label.c_str(), eager.real, warden.real, warden.real - eager.real, warden.real / eager.real,
              eager.cpu, warden.cpu, warden.cpu - eager.cpu, warden.cpu / eager.cpu, note);
}

void PrintRecorded(const RecordingReporter& rep, const std::string& label, const std::string& eager,
                   const std::string& warden) {
  const Ns e = rep.MedianNs(eager), w = rep.MedianNs(warden);
  if (e.real < 0 || w.real < 0) return;
  PrintPair(label + " vs " + eager.substr(3), e, w);
}

using warden::bench::Interleaved;
using warden::bench::PairTiming;
using warden::bench::ThreadCpuNs;

// A compiled function and the arguments of its hit.
struct Hitter {
  warden::CompiledFunction f;
  std::vector<c10::IValue> args;
  void operator()() {
    std::vector<at::Tensor> out = f(args);
    benchmark::DoNotOptimize(out.data());
  }
  // Every call that did not compile was a hit.
  const char* Check(int64_t expected_compiles) const {
    const warden::Stats s = f.stats();
    const bool ok = s.eager_calls == 0 && s.compiles == expected_compiles && s.calls - s.cache_hits == s.compiles;
    return ok ? "" : "  WARNING: not every call was a hit";
  }
};

void InterleavedSummary(int rounds) {
  c10::InferenceMode inference;
  constexpr int kCalls = 1000;
  std::printf("\ninterleaved (%d rounds x %d calls, median of per-call means, ns per call):\n", rounds, kCalls);

  // The pair.
  const std::vector<c10::IValue> args = RandomArgs(4, kNumel);
  const at::Tensor a = args[0].toTensor(), b = args[1].toTensor(), c = args[2].toTensor(),
                   d = args[3].toTensor();
  auto eager_direct = [&] {
    at::Tensor out = warden::bench::ReluFma(a, b, c, d);
    benchmark::DoNotOptimize(out.unsafeGetTensorImpl());
  };
  Hitter hit{warden::compile(warden::bench::ReluFmaFn, warden::bench::StaticAten("relu_fma")), args};
  hit();
  const PairTiming main_pair = Interleaved(rounds, kCalls, eager_direct, hit);
  PrintPair("relu_fma (4 args)", main_pair.eager, main_pair.warden, hit.Check(1));

  for (int n : {1, 4, 16, 64}) {
    Hitter h{warden::compile(StackSumFn, warden::bench::StaticAten("stack_sum")), RandomArgs(n, kNumel)};
    std::vector<at::Tensor> ts;
    for (const c10::IValue& v : h.args) ts.push_back(v.toTensor());
    h();
    const PairTiming t = Interleaved(rounds, kCalls, [&] {
      std::vector<at::Tensor> out = StackSum(ts);
      benchmark::DoNotOptimize(out.data());
    }, h);
    PrintPair("stack_sum args=" + std::to_string(n), t.eager, t.warden, h.Check(1));
  }
  for (int n : {1, 8, 64}) {
    warden::Options o = warden::bench::StaticAten("relu_fma_entries");
    o.cache_size_limit = 64;
    Hitter h{warden::compile(warden::bench::ReluFmaFn, o), args};
    for (int i = 0; i < n; ++i) h.f(RandomArgs(4, kNumel + i));
    const PairTiming t = Interleaved(rounds, kCalls, eager_direct, h);
    PrintPair("relu_fma entries=" + std::to_string(n), t.eager, t.warden, h.Check(n));
  }

  const Ns e = main_pair.eager, w = main_pair.warden;
  std::printf("hit_path_overhead_ns=%.1f ratio=%.3f (real)  cpu_overhead_ns=%.1f cpu_ratio=%.3f  "
              "budget_ns=1000 within_budget=%s (cpu)\n",
              w.real - e.real, w.real / e.real, w.cpu - e.cpu, w.cpu / e.cpu,
              w.cpu - e.cpu <= 1000 ? "yes" : "no");
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const int rounds = warden::bench::TakeSummaryRounds(&argc, argv, 41);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf("\nsummary from the benchmark runs (median over repetitions, ns per call):\n");
  PrintRecorded(reporter, "BM_WardenHit", "BM_EagerDirect", "BM_WardenHit");
  PrintRecorded(reporter, "BM_EagerBoxedFn", "BM_EagerDirect", "BM_EagerBoxedFn");
  for (int n : {1, 4, 16, 64}) {
    const std::string s = std::to_string(n);
    PrintRecorded(reporter, "BM_WardenHitArgs/" + s, "BM_EagerArgs/" + s, "BM_WardenHitArgs/" + s);
  }
  for (int n : {1, 8, 64}) {
    const std::string s = std::to_string(n);
    PrintRecorded(reporter, "BM_WardenHitEntries/" + s, "BM_EagerDirect", "BM_WardenHitEntries/" + s);
  }
  const Ns e = reporter.MedianNs("BM_EagerDirect"), w = reporter.MedianNs("BM_WardenHit");
  if (e.real > 0 && w.real > 0) {
    std::printf("benchmark medians: hit_path_overhead_ns=%.1f ratio=%.3f (real)  cpu_overhead_ns=%.1f "
                "cpu_ratio=%.3f\n",
                w.real - e.real, w.real / e.real, w.cpu - e.cpu, w.cpu / e.cpu);
  }
  if (rounds > 0) InterleavedSummary(rounds);
  return 0;
}
