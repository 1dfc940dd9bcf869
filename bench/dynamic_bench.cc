// Sequence-length sweep: every length L = 1..512, once each and in order, through a small
// attention block (x: [1, L, 32]; q/k/v = x @ W with captured [32, 32] weights;
// softmax(q @ k^T / sqrt(32)) @ v; + x; layer_norm over 32 with captured weight and bias), in
// c10::InferenceMode, through Warden (backend "aten") in Dynamic::kStatic, kAuto and kDynamic,
// and eagerly. Counts compiles and hits and times the whole sweep, so it shows what each mode
// costs a workload whose shapes change on every call. The target: kAuto <= 3 compiles over
// the sweep (kStatic needs one per length: 512; every function here has cache_size_limit 512 so
// that kStatic really compiles them all instead of running eagerly past the default limit of 8).
//
// Before timing, each mode's outputs are checked against eager (torch::allclose) on a separate
// compiled function for a few lengths, including repeated lengths (hits); after the timed sweep
// a few lengths are called again (hits on the sweep's entries) and checked too. Exit code 1 on any
// mismatch or if the counts are inconsistent.
//
// Times are wall clock (steady_clock) and this thread's CPU time (CLOCK_THREAD_CPUTIME_ID); the
// machine is shared, so CPU time is the steadier figure.
//
// Then a restart check (Note [Dynamism profiles]): two fresh processes, one after the other, each
// sweep L = 2..max_len through kAuto with one shared, initially empty WARDEN_CACHE_DIR; the first
// compiles twice (static, then dynamic), the second once (its first compile reads the profile the
// first wrote). Exit 1 unless the second compiles exactly once.
//
//   bazel run -c opt //bench:dynamic_bench [-- --max_len=512]
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tools/libtorch_info.h"
#include "runtime/warden.h"

extern char** environ;

namespace {

constexpr int64_t kDim = 32;

struct Attention {
  at::Tensor wq, wk, wv, ln_w, ln_b;

  Attention() {
    const double s = 1.0 / std::sqrt(static_cast<double>(kDim));
    wq = torch::randn({kDim, kDim}) * s;
    wk = torch::randn({kDim, kDim}) * s;
    wv = torch::randn({kDim, kDim}) * s;
    ln_w = 1 + torch::randn({kDim}) * 0.1;
    ln_b = torch::randn({kDim}) * 0.1;
  }

  at::Tensor operator()(const at::Tensor& x) const {
    const at::Tensor q = torch::matmul(x, wq);
    const at::Tensor k = torch::matmul(x, wk);
    const at::Tensor v = torch::matmul(x, wv);
    const at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(kDim));
    const at::Tensor attn = torch::matmul(torch::softmax(scores, -1), v);
    return torch::layer_norm(attn + x, {kDim}, ln_w, ln_b);
  }
};

double ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

struct Clocks {
  using Clock = std::chrono::steady_clock;
  Clock::time_point wall = Clock::now();
  double cpu = ThreadCpuNs();
  // (wall ms, cpu ms) since construction.
  std::pair<double, double> Ms() const {
    return {std::chrono::duration<double, std::milli>(Clock::now() - wall).count(), (ThreadCpuNs() - cpu) / 1e6};
  }
};

const char* ModeName(warden::Dynamic d) {
  switch (d) {
    case warden::Dynamic::kStatic: return "kStatic";
    case warden::Dynamic::kAuto: return "kAuto";
    case warden::Dynamic::kDynamic: return "kDynamic";
  }
  return "?";
}

warden::Options SweepOptions(warden::Dynamic d, const std::string& name) {
  warden::Options o;
  o.name = name;
  o.backend = "aten";
  o.dynamic = d;
  o.cache_size_limit = 512;
  return o;
}

bool Close(const std::vector<at::Tensor>& got, const at::Tensor& want, std::string* why) {
  if (got.size() != 1) {
    *why = "expected 1 output, got " + std::to_string(got.size());
    return false;
  }
  if (!got[0].sizes().equals(want.sizes())) {
    *why = "shape mismatch";
    return false;
  }
  if (!torch::allclose(got[0], want, 1e-5, 1e-6)) {
    *why = "values differ, max abs diff " + std::to_string((got[0] - want).abs().max().item<double>());
    return false;
  }
  return true;
}

// Checks a fresh compiled function of mode `d` against eager on `lengths`, in order.
bool CheckMode(warden::Dynamic d, const Attention& block, const warden::Fn& fn, const std::vector<int64_t>& lengths) {
  warden::CompiledFunction f = warden::compile(fn, SweepOptions(d, std::string("check_") + ModeName(d)));
  bool ok = true;
  for (int64_t len : lengths) {
    const at::Tensor x = torch::randn({1, len, kDim});
    std::string why;
    if (!Close(f({x}), block(x), &why)) {
      std::printf("MISMATCH %s L=%lld: %s\n", ModeName(d), static_cast<long long>(len), why.c_str());
      ok = false;
    }
  }
  const warden::Stats s = f.stats();
  std::printf("  check %-8s lengths:", ModeName(d));
  for (int64_t len : lengths) std::printf(" %lld", static_cast<long long>(len));
  std::printf("  -> %s (compiles %lld, hits %lld, eager %lld)\n", ok ? "match" : "MISMATCH",
              static_cast<long long>(s.compiles), static_cast<long long>(s.cache_hits),
              static_cast<long long>(s.eager_calls));
  return ok;
}

struct SweepResult {
  double wall_ms = 0, cpu_ms = 0;
  double compile_calls_wall_ms = 0, hit_calls_wall_ms = 0;
  int64_t compile_calls = 0, hit_calls = 0;
};

// The child of the restart check: sweeps L = 2..max_len through kAuto, checking a few lengths
// against eager; prints "compiles N".
int RestartChild(int64_t max_len) {
  torch::manual_seed(0);
  c10::InferenceMode inference;
  const Attention block;
  const warden::Fn fn = [&block](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {block(a[0].toTensor())};
  };
  warden::CompiledFunction f = warden::compile(fn, SweepOptions(warden::Dynamic::kAuto, "restart_sweep"));
  for (int64_t len = 2; len <= max_len; ++len) {
    const at::Tensor x = torch::randn({1, len, kDim});
    std::vector<at::Tensor> out = f({x});
    std::string why;
    if ((len <= 4 || len == max_len) && !Close(out, block(x), &why)) {
      std::printf("MISMATCH L=%lld: %s\n", static_cast<long long>(len), why.c_str());
      return 1;
    }
  }
  std::printf("compiles %lld\n", static_cast<long long>(f.stats().compiles));
  return 0;
}

// Runs this binary as a restart child; its compiles, or -1.
int64_t SpawnRestartChild(int64_t max_len) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  const std::string flag = "--restart_child=" + std::to_string(max_len);
  char* argv[] = {self, const_cast<char*>(flag.c_str()), nullptr};
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid;
  const int rc = posix_spawn(&pid, self, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t got; rc == 0 && (got = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, got);
  close(fds[0]);
  int status = 0;
  if (rc != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  long long compiles = -1;
  if (std::sscanf(out.c_str(), "compiles %lld", &compiles) != 1) return -1;
  return compiles;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t max_len = 512;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--restart_child=", 16) == 0) return RestartChild(std::atoll(argv[i] + 16));
    if (std::strncmp(argv[i], "--max_len=", 10) == 0) {
      max_len = std::atoll(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      at::set_num_threads(std::atoi(argv[i] + 10));
      warden::tools::SetBlasThreads(std::atoi(argv[i] + 10));
    } else {
      std::fprintf(stderr, "unknown flag %s (supported: --max_len=N --threads=N)\n", argv[i]);
      return 2;
    }
  }
  if (max_len < 1) max_len = 1;
  std::printf("LibTorch %s\n", warden::tools::LibTorchDescription().c_str());
  torch::manual_seed(0);
  c10::InferenceMode inference;
  const Attention block;
  const warden::Fn fn = [&block](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {block(a[0].toTensor())};
  };
  const warden::Dynamic modes[] = {warden::Dynamic::kStatic, warden::Dynamic::kAuto, warden::Dynamic::kDynamic};

  std::printf("dynamic_bench: attention block x[1, L, %lld], L = 1..%lld once each in order, backend aten, "
              "InferenceMode, cache_size_limit 512, %d intra-op threads\n\ncorrectness against eager (torch::allclose rtol 1e-5 "
              "atol 1e-6):\n",
              static_cast<long long>(kDim), static_cast<long long>(max_len), at::get_num_threads());
  bool ok = true;
  const std::vector<int64_t> check_lengths = {1, 2, 3, 3, 17, 1, 64, 2, 511, 17};
  for (warden::Dynamic d : modes) ok = CheckMode(d, block, fn, check_lengths) && ok;
  if (!ok) {
    std::printf("FAILED: outputs differ from eager\n");
    return 1;
  }

  std::vector<c10::IValue> inputs;
  for (int64_t len = 1; len <= max_len; ++len) inputs.emplace_back(torch::randn({1, len, kDim}));

  // Eager sweep (warm the allocator / kernels once first, as the Warden sweeps get their first
  // call's warm-up from the compile).
  for (const c10::IValue& x : inputs) block(x.toTensor());
  // Timed twice, before and after the Warden sweeps (the machine is shared; the spread shows the
  // drift); the mean is the baseline.
  auto eager_sweep = [&] {
    SweepResult r;
    Clocks c;
    for (const c10::IValue& x : inputs) {
      at::Tensor out = block(x.toTensor());
      (void)out;
    }
    std::tie(r.wall_ms, r.cpu_ms) = c.Ms();
    return r;
  };
  const SweepResult eager_before = eager_sweep();

  std::map<std::string, warden::Stats> stats_of;
  std::map<std::string, SweepResult> result_of;
  std::map<std::string, std::vector<warden::RecompileEvent>> events_of;
  for (warden::Dynamic d : modes) {
    warden::CompiledFunction f = warden::compile(fn, SweepOptions(d, std::string("sweep_") + ModeName(d)));
    SweepResult r;
    {
      Clocks total;
      for (const c10::IValue& x : inputs) {
        const int64_t compiles_before = f.stats().compiles;
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<at::Tensor> out = f({x});
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (f.stats().compiles != compiles_before) {
          ++r.compile_calls;
          r.compile_calls_wall_ms += ms;
        } else {
          ++r.hit_calls;
          r.hit_calls_wall_ms += ms;
        }
      }
      std::tie(r.wall_ms, r.cpu_ms) = total.Ms();
    }
    const warden::Stats s = f.stats();
    stats_of[ModeName(d)] = s;
    result_of[ModeName(d)] = r;
    events_of[ModeName(d)] = f.recompiles();

    // The sweep's entries still give eager's results (hits now).
    int64_t checks = 0;
    for (int64_t len : {int64_t{1}, int64_t{2}, max_len / 2, max_len}) {
      if (len < 1 || len > max_len) continue;
      ++checks;
      const at::Tensor& x = inputs[len - 1].toTensor();
      std::string why;
      if (!Close(f({x}), block(x), &why)) {
        std::printf("MISMATCH %s after the sweep, L=%lld: %s\n", ModeName(d), static_cast<long long>(len),
                    why.c_str());
        ok = false;
      }
    }
    const warden::Stats after = f.stats();
    if (after.calls != max_len + checks || after.compiles != s.compiles || after.eager_calls != s.eager_calls ||
        s.compiles + s.cache_hits + s.eager_calls != s.calls) {
      std::printf("INCONSISTENT stats for %s (or a check call after the sweep was not a hit)\n", ModeName(d));
      ok = false;
    }
  }
  const SweepResult eager_after = eager_sweep();
  SweepResult eager;
  eager.wall_ms = (eager_before.wall_ms + eager_after.wall_ms) / 2;
  eager.cpu_ms = (eager_before.cpu_ms + eager_after.cpu_ms) / 2;

  std::printf("\nsweep L=1..%lld (%lld calls per mode; times are totals over the sweep; the eager baseline is "
              "the mean of a sweep before and one after the Warden sweeps: %.1f / %.1f ms cpu):\n",
              static_cast<long long>(max_len), static_cast<long long>(max_len), eager_before.cpu_ms,
              eager_after.cpu_ms);
  std::printf("  %-8s compiles %4d  hits %4d  eager_calls %3d  total %8.1f ms wall %8.1f ms cpu\n", "eager", 0, 0,
              static_cast<int>(max_len), eager.wall_ms, eager.cpu_ms);
  for (warden::Dynamic d : modes) {
    // Stats as of the end of the sweep (before the check calls).
    const warden::Stats& s = stats_of[ModeName(d)];
    const SweepResult& r = result_of[ModeName(d)];
    std::printf("  %-8s compiles %4lld  hits %4lld  eager_calls %3lld  total %8.1f ms wall %8.1f ms cpu  "
                "%.2fx eager cpu (%+.1f ms); calls that compiled %.1f ms wall, the %lld others %.1f ms wall\n",
                ModeName(d), static_cast<long long>(s.compiles),
                static_cast<long long>(s.cache_hits), static_cast<long long>(s.eager_calls),
                r.wall_ms, r.cpu_ms, r.cpu_ms / eager.cpu_ms, r.cpu_ms - eager.cpu_ms, r.compile_calls_wall_ms,
                static_cast<long long>(r.hit_calls), r.hit_calls_wall_ms);
  }
  {
    const warden::Stats& s = stats_of["kStatic"];
    std::printf("  kStatic pays about %.2f ms cpu per compile over eager (%lld compiles, one per length)\n",
                (result_of["kStatic"].cpu_ms - eager.cpu_ms) / std::max<int64_t>(1, s.compiles),
                static_cast<long long>(s.compiles));
  }

  std::printf("\nrecompile actions:\n");
  for (warden::Dynamic d : modes) {
    const std::vector<warden::RecompileEvent>& events = events_of[ModeName(d)];
    std::map<std::string, int> counts;
    for (const warden::RecompileEvent& e : events) ++counts[e.action];
    std::printf("  %s: %zu events\n", ModeName(d), events.size());
    if (events.size() <= 8) {
      for (const warden::RecompileEvent& e : events) {
        std::printf("    call %lld (L=%lld): %s\n      reason: %s\n", static_cast<long long>(e.call_index),
                    static_cast<long long>(e.call_index + 1), e.action.c_str(),
                    e.reasons.empty() ? "" : e.reasons.front().c_str());
      }
    } else {
      for (const auto& [action, n] : counts) std::printf("    %d x \"%s\"\n", n, action.c_str());
      std::printf("    first: call %lld reason: %s\n", static_cast<long long>(events.front().call_index),
                  events.front().reasons.empty() ? "" : events.front().reasons.front().c_str());
    }
  }

  const int64_t auto_compiles = stats_of["kAuto"].compiles;
  std::printf("\nsummary: compiles over L=1..%lld: kStatic=%lld (one per length) kAuto=%lld kDynamic=%lld; "
              "target kAuto<=3 met=%s\n",
              static_cast<long long>(max_len), static_cast<long long>(stats_of["kStatic"].compiles),
              static_cast<long long>(auto_compiles), static_cast<long long>(stats_of["kDynamic"].compiles),
              auto_compiles <= 3 ? "yes" : "no");

  // The restart check (Note [Dynamism profiles]).
  if (max_len >= 3) {
    char dir[] = "/tmp/warden-dynamic-bench-XXXXXX";
    if (mkdtemp(dir) == nullptr) return 1;
    setenv("WARDEN_CACHE_DIR", dir, 1);
    setenv("WARDEN_DYNAMISM_PROFILES", "1", 1);
    const int64_t first = SpawnRestartChild(max_len), second = SpawnRestartChild(max_len);
    std::printf("restart: kAuto sweep L=2..%lld in two fresh processes sharing an empty cache directory: first %lld "
                "compiles, second %lld (dynamism profile; target 1) %s\n",
                static_cast<long long>(max_len), static_cast<long long>(first), static_cast<long long>(second),
                second == 1 && first == 2 ? "met=yes" : "met=NO");
    ok = ok && second == 1 && first == 2;
    std::system((std::string("rm -rf '") + dir + "'").c_str());
  }
  if (!ok) {
    std::printf("FAILED\n");
    return 1;
  }
  return 0;
}
