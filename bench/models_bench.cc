// Per-call time of the real-program models (tests/models/models.h) at a fixed batch size: eager
// LibTorch, Warden's replay backend ("aten") and its fused C++ backend ("cpp") in one process,
// eval mode under NoGradGuard, default Options (kAuto; one entry per batch size here).
//
//   bazel run -c opt //bench:models_bench                     # Google Benchmark rows + summary
//   bazel run -c opt //bench:models_bench -- --model=ResNet --summary_rounds=0   # one model, no summary
//
// Rows are models/<model>/b<batch>/<path>; the counter faults_per_call is the process's minor page
// faults per call (memory the allocator took back from the OS). Before a Warden path is timed its
// output (the compiling call and a hit) is checked against eager with torch::allclose; a mismatch
// fails the row. Every timed Warden call must be a cache hit. The summary after the rows measures
// each model eager vs each backend in alternating rounds, in thread CPU time (robust to the other jobs of a shared
// machine; each pair has its own eager time) and prints a Markdown table of ratios (> 1: Warden
// faster) with the geometric mean and the lowest ratio per batch and backend.
// Defaults added when not given: --benchmark_min_time=0.2; LibTorch's intra-op threads = 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "bench/reporting.h"
#include "bench/workloads.h"
#include "runtime/warden.h"
#include "tests/models/models.h"
#include "tools/libtorch_info.h"

namespace {

using Args = std::vector<c10::IValue>;
using Outputs = std::vector<at::Tensor>;

struct Workload {
  std::string name;
  int64_t batch;
  warden::Fn fn;                               // the model's forward, eagerly
  Args args;                                   // one fixed call
  std::shared_ptr<torch::nn::Module> module;   // watched (its train/eval flag is C++ state)
};

std::vector<Workload> Workloads() {
  torch::manual_seed(0);
  std::vector<Workload> out;
  for (int64_t b : {int64_t{1}, int64_t{8}}) {
    auto mlp = models::Eval(models::Mlp(12, 16, 4, true));
    out.push_back({"MLP+BN", b, [mlp](const Args& a) mutable -> Outputs { return {mlp->forward(a[0].toTensor())}; },
                   {torch::randn({b, 12})}, mlp.ptr()});
    auto cnn = models::Eval(models::ConvNet());
    out.push_back({"CNN", b, [cnn](const Args& a) mutable -> Outputs { return {cnn->forward(a[0].toTensor())}; },
                   {torch::randn({b, 1, 16, 16})}, cnn.ptr()});
    auto resnet = models::Eval(models::ResNet(10));
    out.push_back({"ResNet", b,
                   [resnet](const Args& a) mutable -> Outputs { return {resnet->forward(a[0].toTensor())}; },
                   {torch::randn({b, 1, 16, 16})}, resnet.ptr()});
    auto lstm = models::Eval(models::LstmLm(40, 16, 24));
    out.push_back({"LSTM-LM-seq7", b,
                   [lstm](const Args& a) mutable -> Outputs { return {std::get<0>(lstm->forward(a[0].toTensor()))}; },
                   {torch::randint(40, {7, b}, torch::kLong)}, lstm.ptr()});
    auto step = models::Eval(models::LstmLm(40, 16, 24));
    out.push_back({"LSTM-LM-step", b,
                   [step](const Args& a) mutable -> Outputs {
                     auto [logits, h, c] = step->forward(a[0].toTensor(), a[1].toTensor(), a[2].toTensor());
                     return {logits, h, c};
                   },
                   {torch::randint(40, {1, b}, torch::kLong), torch::zeros({2, b, 24}), torch::zeros({2, b, 24})},
                   step.ptr()});
    auto vae = models::Eval(models::Vae());
    out.push_back({"VAE", b, [vae](const Args& a) mutable -> Outputs { return {std::get<0>(vae->forward(a[0].toTensor()))}; },
                   {torch::rand({b, 1, 16, 16})}, vae.ptr()});
    auto gen = models::Eval(models::DcganGenerator());
    out.push_back({"DCGAN-G", b, [gen](const Args& a) mutable -> Outputs { return {gen->forward(a[0].toTensor())}; },
                   {torch::randn({b, 16, 1, 1})}, gen.ptr()});
    auto lm = models::Eval(models::TransformerLm(50, 32, 4, 2));
    out.push_back({"Transformer-LM", b,
                   [lm](const Args& a) mutable -> Outputs {
                     const at::Tensor& t = a[0].toTensor();
                     auto [causal, padding] = models::CausalMasks(t.size(0), t.size(1));
                     return {lm->forward(t, causal, padding)};
                   },
                   {torch::randint(50, {6, b}, torch::kLong)}, lm.ptr()});
  }
  return out;
}

bool Close(const Outputs& got, const Outputs& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].sizes().equals(want[i].sizes()) || !torch::allclose(got[i], want[i], 1e-4, 1e-5)) return false;
  }
  return true;
}

std::string RowName(const Workload& w, const std::string& path) {
  return "models/" + w.name + "/b" + std::to_string(w.batch) + "/" + path;
}

warden::CompiledFunction Compile(const Workload& w, const std::string& backend) {
  warden::Options o;
  o.name = w.name + "/b" + std::to_string(w.batch);
  o.backend = backend;
  warden::CompiledFunction f = warden::compile(w.fn, o);
  f.watch(*w.module, "model");
  return f;
}

void RunEager(benchmark::State& state, const Workload& w) {
  torch::NoGradGuard no_grad;
  const long faults = warden::bench::MinorFaults();
  for (auto _ : state) {
    Outputs out = w.fn(w.args);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["faults_per_call"] =
      benchmark::Counter(static_cast<double>(warden::bench::MinorFaults() - faults) / state.iterations());
}

void RunWarden(benchmark::State& state, const Workload& w, const std::string& backend) {
  torch::NoGradGuard no_grad;
  warden::CompiledFunction f = Compile(w, backend);
  const Outputs want = w.fn(w.args);
  if (!Close(f(w.args), want) || !Close(f(w.args), want)) {
    state.SkipWithError("output differs from eager");
    return;
  }
  const int64_t hits = f.stats().cache_hits;
  const long faults = warden::bench::MinorFaults();
  for (auto _ : state) {
    Outputs out = f(w.args);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["faults_per_call"] =
      benchmark::Counter(static_cast<double>(warden::bench::MinorFaults() - faults) / state.iterations());
  if (f.stats().cache_hits - hits != static_cast<int64_t>(state.iterations())) {
    state.SkipWithError("a timed call was not a cache hit");
  }
}

// Eager vs each backend in alternating rounds; a Markdown table and the geometric means.
void Summary(const std::vector<Workload>& workloads, int rounds) {
  if (rounds <= 0) return;
  torch::NoGradGuard no_grad;
  std::printf("\nmodels_bench summary: %s, BLAS %s, %d intra-op thread(s), %d alternating rounds per pair, per-call "
              "thread CPU us (median; the calling thread does all the work with 1 intra-op thread, and CPU "
              "time is robust to other jobs on the machine), ratio = eager / Warden (> 1: Warden faster)\n\n",
              warden::tools::LibTorchDescription().c_str(), warden::tools::BlasDescription().c_str(),
              at::get_num_threads(), rounds);
  std::printf("| model | batch | aten us (eager us) | aten vs eager | cpp us (eager us) | cpp vs eager |\n"
              "|---|---:|---:|---:|---:|---:|\n");
  std::map<int64_t, std::map<std::string, std::vector<double>>> ratios;  // batch -> backend -> ratios
  for (const Workload& w : workloads) {
    std::string cells;
    for (const char* backend : {"aten", "cpp"}) {
      warden::CompiledFunction f = Compile(w, backend);
      f(w.args);
      f(w.args);
      // Calls per round: about 2 ms of eager work.
      const auto t0 = std::chrono::steady_clock::now();
      w.fn(w.args);
      const double once = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      const int calls = std::max(1, static_cast<int>(2e6 / std::max(once, 1.0)));
      const auto t = warden::bench::Interleaved(
          rounds, calls, [&] { benchmark::DoNotOptimize(w.fn(w.args).data()); },
          [&] { benchmark::DoNotOptimize(f(w.args).data()); });
      const double ratio = t.eager.cpu / t.warden.cpu;
      ratios[w.batch][backend].push_back(ratio);
      char cell[96];
      std::snprintf(cell, sizeof(cell), " %.1f (%.1f) | %.2fx |", t.warden.cpu / 1e3, t.eager.cpu / 1e3, ratio);
      cells += cell;
    }
    std::printf("| %s | %lld |%s\n", w.name.c_str(), static_cast<long long>(w.batch), cells.c_str());
    std::fflush(stdout);
  }
  for (const auto& [batch, per_backend] : ratios) {
    for (const auto& [backend, rs] : per_backend) {
      double log_sum = 0, worst = 1e9;
      for (double r : rs) {
        log_sum += std::log(r);
        worst = std::min(worst, r);
      }
      std::printf("batch %lld, %s: geometric mean %.2fx eager, lowest %.2fx\n", static_cast<long long>(batch),
                  backend.c_str(), std::exp(log_sum / rs.size()), worst);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int summary_rounds = warden::bench::TakeSummaryRounds(&argc, argv, 15);
  const std::string only = warden::bench::TakeFlag(&argc, argv, "model", "");
  std::vector<char*> args(argv, argv + argc);
  bool has_min_time = false;
  for (int i = 1; i < argc; ++i) has_min_time |= std::string(argv[i]).rfind("--benchmark_min_time", 0) == 0;
  std::string min_time = "--benchmark_min_time=0.2";
  if (!has_min_time) args.push_back(min_time.data());
  int n = static_cast<int>(args.size());
  at::set_num_threads(1);
  warden::tools::SetBlasThreads(1);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  std::fprintf(stderr, "models_bench: %s\n", warden::tools::LibTorchDescription().c_str());
  std::vector<Workload> workloads;
  for (Workload& w : Workloads()) {
    if (w.name.find(only) != std::string::npos) workloads.push_back(std::move(w));
  }
  for (const Workload& w : workloads) {
    benchmark::RegisterBenchmark(RowName(w, "eager").c_str(), [&w](benchmark::State& s) { RunEager(s, w); });
    for (const char* backend : {"aten", "cpp"}) {
      const std::string b = backend;
      benchmark::RegisterBenchmark(RowName(w, b).c_str(), [&w, b](benchmark::State& s) { RunWarden(s, w, b); });
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  Summary(workloads, summary_rounds);
  return 0;
}
