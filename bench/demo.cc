// The project's demo job: an inference loop over an MLP + attention block with varying batch
// sizes, run eagerly and through warden::compile (the default backend "cpp", automatic dynamic
// shapes by default, like torch.compile's dynamic=None). It first checks
// that Warden returns what eager returns for every batch size (exit 1 if not), then times both
// on the same inputs and prints calls, compiles, hits, recompile reasons, guards and medians,
// and at the end a short summary (speedup on cache hits, compiles, recompile reasons).
//
//   bazel run //bench:demo -- [--calls=200] [--d=64] [--seq=16] [--dynamic=auto|static|dynamic]
//                             [--backend=cpp|aten]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tools/libtorch_info.h"
#include "bench/workloads.h"
#include "runtime/warden.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int calls = 200;
  int64_t d = 64;
  int64_t seq = 16;
  warden::Dynamic dynamic = warden::Dynamic::kAuto;  // --dynamic=auto|static|dynamic
  const char* dynamic_name = "auto";
  std::string backend = "cpp";  // --backend=cpp|aten
};

bool ParseInt(const char* arg, const char* name, int64_t* out) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  char* end = nullptr;
  const long long v = std::strtoll(arg + n + 1, &end, 10);
  if (end == arg + n + 1 || *end != '\0' || v <= 0) {
    std::fprintf(stderr, "demo: bad value in %s\n", arg);
    std::exit(2);
  }
  *out = v;
  return true;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    int64_t calls = 0;
    if (ParseInt(argv[i], "--calls", &calls)) {
      f.calls = static_cast<int>(calls);
    } else if (std::strcmp(argv[i], "--dynamic=auto") == 0) {
      f.dynamic = warden::Dynamic::kAuto;
      f.dynamic_name = "auto";
    } else if (std::strcmp(argv[i], "--dynamic=static") == 0) {
      f.dynamic = warden::Dynamic::kStatic;
      f.dynamic_name = "static";
    } else if (std::strcmp(argv[i], "--dynamic=dynamic") == 0) {
      f.dynamic = warden::Dynamic::kDynamic;
      f.dynamic_name = "dynamic";
    } else if (std::strcmp(argv[i], "--backend=cpp") == 0 || std::strcmp(argv[i], "--backend=aten") == 0) {
      f.backend = argv[i] + std::strlen("--backend=");
    } else if (ParseInt(argv[i], "--d", &f.d) || ParseInt(argv[i], "--seq", &f.seq)) {
    } else {
      std::fprintf(stderr,
                   "usage: demo [--calls=N] [--d=N] [--seq=N] [--dynamic=auto|static|dynamic] [--backend=cpp|aten]\n");
      std::exit(2);
    }
  }
  return f;
}

double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// CPU time of the whole process (all intra-op threads), in us. On a machine shared with other
// jobs, wall time per call swings by whole scheduler slices; CPU time does not.
double ProcessCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// Compares one Warden result with eager; prints the problem and returns false on a mismatch.
bool SameAsEager(const std::vector<at::Tensor>& got, const at::Tensor& want, int64_t batch,
                 const char* what) {
  if (got.size() != 1 || !got[0].defined()) {
    std::printf("MISMATCH batch=%lld (%s): expected 1 defined output, got %zu\n",
                static_cast<long long>(batch), what, got.size());
    return false;
  }
  if (got[0].sizes() != want.sizes() || got[0].scalar_type() != want.scalar_type()) {
    std::printf("MISMATCH batch=%lld (%s): shape/dtype differ\n", static_cast<long long>(batch), what);
    return false;
  }
  const double max_diff = (got[0] - want).abs().max().item<double>();
  if (!torch::allclose(got[0], want, 1e-5, 1e-6)) {
    std::printf("MISMATCH batch=%lld (%s): max |warden - eager| = %g\n",
                static_cast<long long>(batch), what, max_diff);
    return false;
  }
  std::printf("  batch=%-3lld %-7s ok (max |diff| = %g)\n", static_cast<long long>(batch), what, max_diff);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  std::printf("LibTorch %s\n", warden::tools::LibTorchDescription().c_str());
  torch::manual_seed(0);
  c10::InferenceMode inference;

  const warden::bench::MlpAttention model(flags.d);
  const warden::Fn fn = [model](const std::vector<c10::IValue>& args) -> std::vector<at::Tensor> {
    return {model(args[0].toTensor())};
  };

  const std::vector<int64_t> pattern = {1, 4, 8, 4, 1, 16, 8, 2};
  std::vector<int64_t> batches;
  for (int i = 0; i < flags.calls; ++i) batches.push_back(pattern[i % pattern.size()]);
  std::vector<int64_t> distinct;
  for (int64_t b : batches) {
    if (std::find(distinct.begin(), distinct.end(), b) == distinct.end()) distinct.push_back(b);
  }

  warden::Options options;
  options.name = "mlp_attention";
  options.backend = flags.backend;
  options.dynamic = flags.dynamic;
  std::printf("warden demo: mlp_attention, x = [batch, %lld, %lld], %d calls, backend=%s, dynamic=%s, batch sizes {",
              static_cast<long long>(flags.seq), static_cast<long long>(flags.d), flags.calls,
              flags.backend.c_str(), flags.dynamic_name);
  for (size_t i = 0; i < distinct.size(); ++i) {
    std::printf("%s%lld", i ? ", " : "", static_cast<long long>(distinct[i]));
  }
  std::printf("}\n\n");

  // 1. Correctness, on a separate compiled function so the timed one starts cold: per batch size
  // the compiling call (the trace's outputs) and a cache hit (the replay) against eager.
  std::printf("correctness (warden vs eager, torch::allclose):\n");
  {
    warden::CompiledFunction check = warden::compile(fn, options);
    bool ok = true;
    for (int64_t b : distinct) {
      const at::Tensor x1 = torch::randn({b, flags.seq, flags.d});
      ok &= SameAsEager(check({x1}), model(x1), b, "compile");
      const at::Tensor x2 = torch::randn({b, flags.seq, flags.d});
      ok &= SameAsEager(check({x2}), model(x2), b, "hit");
    }
    const warden::Stats s = check.stats();
    // Static shapes compile once per batch size; automatic dynamic once more at most.
    const bool counts_ok = flags.dynamic == warden::Dynamic::kStatic
                               ? s.compiles == static_cast<int64_t>(distinct.size())
                               : s.compiles <= 2;
    if (!counts_ok || s.cache_hits + s.compiles != s.calls || s.eager_calls != 0) {
      std::printf("UNEXPECTED stats in the check: compiles=%lld hits=%lld eager=%lld\n",
                  static_cast<long long>(s.compiles), static_cast<long long>(s.cache_hits),
                  static_cast<long long>(s.eager_calls));
      ok = false;
    }
    if (!ok) {
      std::printf("FAILED: warden's outputs differ from eager\n");
      return 1;
    }
  }

  // 2. Timing on the same inputs, eager and warden interleaved per call (alternating which goes
  // first) so that machine noise hits both alike. Warden's times include its compiles.
  std::vector<std::vector<c10::IValue>> inputs;
  for (int64_t b : batches) inputs.push_back({torch::randn({b, flags.seq, flags.d})});

  warden::CompiledFunction f = warden::compile(fn, options);
  std::vector<double> eager_us, warden_us, eager_cpu_us, warden_cpu_us;
  std::vector<bool> hit;
  const auto loop_start = Clock::now();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& x = inputs[i][0].toTensor();
    const int64_t hits_before = f.stats().cache_hits;
    for (int pass = 0; pass < 2; ++pass) {
      const bool eager_now = (pass == 0) == (i % 2 == 0);
      const double c0 = ProcessCpuMicros();
      const auto t0 = Clock::now();
      if (eager_now) {
        at::Tensor out = model(x);
        const auto t1 = Clock::now();
        eager_cpu_us.push_back(ProcessCpuMicros() - c0);
        eager_us.push_back(Micros(t1 - t0));
      } else {
        std::vector<at::Tensor> out = f(inputs[i]);
        const auto t1 = Clock::now();
        warden_cpu_us.push_back(ProcessCpuMicros() - c0);
        warden_us.push_back(Micros(t1 - t0));
      }
    }
    hit.push_back(f.stats().cache_hits > hits_before);
  }
  const double wall_ms = Micros(Clock::now() - loop_start) / 1000;

  const warden::Stats s = f.stats();
  std::printf("\nstats: calls=%lld compiles=%lld cache_hits=%lld eager_calls=%lld\n",
              static_cast<long long>(s.calls), static_cast<long long>(s.compiles),
              static_cast<long long>(s.cache_hits), static_cast<long long>(s.eager_calls));

  const std::vector<warden::RecompileEvent> events = f.recompiles();
  std::printf("\nrecompiles (%zu):\n", events.size());
  for (const warden::RecompileEvent& e : events) {
    std::printf("  call %lld (batch %lld): %s\n", static_cast<long long>(e.call_index),
                static_cast<long long>(batches[e.call_index]), e.action.c_str());
    for (const std::string& r : e.reasons) std::printf("      - %s\n", r.c_str());
  }

  for (int64_t e = 0; e < s.compiles; ++e) {
    std::printf("\nguards of entry %lld:\n", static_cast<long long>(e));
    for (const std::string& g : f.guards(static_cast<int>(e))) std::printf("  %s\n", g.c_str());
  }

  double eager_total = 0, warden_total = 0, compile_total = 0;
  std::vector<double> warden_hit_us, eager_at_hit_us, warden_hit_cpu_us, eager_at_hit_cpu_us;
  std::map<int64_t, std::vector<double>> eager_by_b, warden_by_b, eager_cpu_by_b, warden_cpu_by_b;
  for (size_t i = 0; i < inputs.size(); ++i) {
    eager_total += eager_us[i];
    warden_total += warden_us[i];
    if (hit[i]) {
      warden_hit_us.push_back(warden_us[i]);
      eager_at_hit_us.push_back(eager_us[i]);
      warden_by_b[batches[i]].push_back(warden_us[i]);
      eager_by_b[batches[i]].push_back(eager_us[i]);
      warden_hit_cpu_us.push_back(warden_cpu_us[i]);
      eager_at_hit_cpu_us.push_back(eager_cpu_us[i]);
      warden_cpu_by_b[batches[i]].push_back(warden_cpu_us[i]);
      eager_cpu_by_b[batches[i]].push_back(eager_cpu_us[i]);
    } else {
      compile_total += warden_us[i];
    }
  }
  using warden::bench::Median;
  const double me = Median(eager_us), mw = Median(warden_us);
  const double mec = Median(eager_cpu_us), mwc = Median(warden_cpu_us);
  std::printf("\ntiming per call, median (wall = steady_clock; cpu = process CPU time, robust to "
              "other jobs on the machine):\n");
  std::printf("  all calls:  wall eager %8.1f us warden %8.1f us ratio %.3f | cpu eager %8.1f us "
              "warden %8.1f us ratio %.3f\n",
              me, mw, mw / me, mec, mwc, mwc / mec);
  const double he = Median(eager_at_hit_us), hw = Median(warden_hit_us);
  const double hec = Median(eager_at_hit_cpu_us), hwc = Median(warden_hit_cpu_us);
  std::printf("  cache hits: wall eager %8.1f us warden %8.1f us ratio %.3f | cpu eager %8.1f us "
              "warden %8.1f us ratio %.3f  (%zu calls)\n",
              he, hw, hw / he, hec, hwc, hwc / hec, warden_hit_us.size());
  std::printf("  by batch (hits only):\n");
  for (int64_t b : distinct) {
    const double e = Median(eager_by_b[b]), w = Median(warden_by_b[b]);
    const double ec = Median(eager_cpu_by_b[b]), wc = Median(warden_cpu_by_b[b]);
    std::printf("    batch=%-3lld wall eager %8.1f us warden %8.1f us ratio %.3f | cpu eager %8.1f us "
                "warden %8.1f us ratio %.3f  (%zu calls)\n",
                static_cast<long long>(b), e, w, w / e, ec, wc, wc / ec, warden_by_b[b].size());
  }
  std::printf("  total wall: eager %.2f ms, warden %.2f ms (of which %lld compiling calls %.2f ms), "
              "loop %.2f ms\n",
              eager_total / 1000, warden_total / 1000,
              static_cast<long long>(inputs.size() - warden_hit_us.size()), compile_total / 1000,
              wall_ms);

  // The short human summary: speedup on cache hits, compiles, why it recompiled.
  std::printf("\nsummary: warden (backend %s) is %.2fx eager on cache hits (median cpu %.1f vs %.1f us per "
              "call; above 1 = faster), %lld compiles for %zu batch sizes, %lld hits, %lld eager calls\n",
              options.backend.c_str(), hec / hwc, hwc, hec, static_cast<long long>(s.compiles), distinct.size(),
              static_cast<long long>(s.cache_hits), static_cast<long long>(s.eager_calls));
  for (const warden::RecompileEvent& e : events) {
    std::printf("  recompiled at call %lld (batch %lld): %s, because %s\n", static_cast<long long>(e.call_index),
                static_cast<long long>(batches[e.call_index]), e.action.c_str(),
                e.reasons.empty() ? "(no reason recorded)" : e.reasons.front().c_str());
  }
  return 0;
}
