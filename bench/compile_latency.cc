// Compile latency of backend "cpp" for the 10-op chain: cold (the compiler runs) and warm (a new
// process finds the kernel in the disk cache), each measured in a fresh child process so that no
// in-process memo helps, against the same first call on backend "aten" (trace + guards only).
//
//   bazel run -c opt //bench:compile_latency [-- --rounds=5]
//
// Each child times compile() + the first call (trace, shape pass, guards, backend, run) and prints
// one line; the parent prints medians over the rounds. Cold rounds use a new empty cache directory.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tools/libtorch_info.h"
#include "bench/workloads.h"
#include "runtime/codegen_compiler.h"

extern char** environ;

namespace {

using warden::bench::Median;

// Child: one first call, printed as "<ms> <compiles> <disk_hits> <backend>".
int Child(const std::string& backend) {
  warden::Options o;
  o.name = "chain10";
  o.backend = backend;
  o.dynamic = warden::Dynamic::kStatic;
  auto x = torch::randn({1024}), w = torch::randn({1024});
  const auto start = std::chrono::steady_clock::now();
  auto f = warden::compile(warden::bench::Chain10Fn, o);
  auto out = f({x, w});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!torch::allclose(out[0], warden::bench::Chain10(x, w), 1e-5, 1e-6)) {
    std::fprintf(stderr, "compile_latency: output differs from eager\n");
    return 1;
  }
  const auto stats = warden::codegen::GetKernelCacheStats();
  std::printf("%.3f %lld %lld\n", ms, static_cast<long long>(stats.compiles),
              static_cast<long long>(stats.disk_hits));
  return 0;
}

struct ChildResult {
  double ms = -1;
  long long compiles = -1, disk_hits = -1;
};

ChildResult RunChild(const std::string& self, const std::string& backend, const std::string& cache_dir) {
  ChildResult r;
  int fds[2];
  if (pipe(fds) != 0) return r;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  setenv("WARDEN_CACHE_DIR", cache_dir.c_str(), 1);
  const std::string mode = "--child=" + backend;
  char* argv[] = {const_cast<char*>(self.c_str()), const_cast<char*>(mode.c_str()), nullptr};
  pid_t pid;
  const int rc = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return r;
  }
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return r;
  std::sscanf(out.c_str(), "%lf %lld %lld", &r.ms, &r.compiles, &r.disk_hits);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--child=", 8) == 0) return Child(argv[i] + 8);
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) rounds = std::max(1, std::atoi(argv[i] + 9));
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return 1;
  self[len] = '\0';
  char tmpl[] = "/tmp/warden-compile-latency-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string root = tmpl;

  std::vector<double> cold, warm, aten;
  bool ok = true;
  for (int r = 0; r < rounds; ++r) {
    const std::string dir = root + "/round" + std::to_string(r);
    const ChildResult c = RunChild(self, "cpp", dir);   // empty cache: compiles
    const ChildResult w = RunChild(self, "cpp", dir);   // same cache, new process: loads
    const ChildResult a = RunChild(self, "aten", dir);  // no kernel at all
    ok = ok && c.ms >= 0 && w.ms >= 0 && a.ms >= 0 && c.compiles == 1 && w.compiles == 0 && w.disk_hits == 1;
    cold.push_back(c.ms);
    warm.push_back(w.ms);
    aten.push_back(a.ms);
  }
  std::printf("LibTorch %s\n", warden::tools::LibTorchDescription().c_str());
  std::printf("10-op chain, backend \"cpp\", first call (compile() + trace + guards + backend + run), "
              "median of %d fresh processes:\n", rounds);
  std::printf("  cold (compiler runs):          %8.2f ms\n", Median(cold));
  std::printf("  warm (kernel from disk cache): %8.2f ms\n", Median(warm));
  std::printf("  backend \"aten\" (no kernel):    %8.2f ms\n", Median(aten));
  std::printf("  kernel latency: cold %.2f ms, warm %.2f ms (first call minus the \"aten\" one)\n",
              Median(cold) - Median(aten), Median(warm) - Median(aten));
  if (!ok) {
    std::printf("  CHECK FAILED: a child failed, or cold did not compile / warm did not load from disk\n");
    return 1;
  }
  std::printf("  checked: cold compiled once, warm compiled nothing and loaded 1 library from disk\n");
  std::string cleanup = "rm -rf '" + root + "'";
  return std::system(cleanup.c_str()) == 0 ? 0 : 1;
}
