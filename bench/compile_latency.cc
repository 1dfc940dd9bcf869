// First-call latency of backend "cpp" for the 10-op chain, each measured in a fresh child process so
// that no in-process memo helps, against the same first call on backend "aten" (trace + guards only):
//   cold         empty local cache, empty shared cache: the compiler runs (and publishes);
//   remote-warm  empty local cache, the kernel in the shared Redis cache (Note [Shared kernels]);
//   local-warm   the kernel in the local disk cache;
//   package      empty local cache, no compiler on PATH, the kernel in a WARDEN_PACKAGE file.
// The parent starts its own redis-server (Debian's package) on a free loopback port, flushed every
// round, and a fleet key file; entries are HMAC-SHA256 tagged and verified.
//
//   bazel run -c opt //bench:compile_latency [-- --rounds=5]
//
// Each child times compile() + the first call (trace, shape pass, guards, backend, run), checks it
// against eager and prints one line; the parent prints medians over the rounds and checks each
// scenario got its kernel where it should (exit 1 otherwise).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tools/libtorch_info.h"
#include "bench/workloads.h"
#include "runtime/codegen_compiler.h"
#include "runtime/kernel_entry.h"
#include "tools/redis_server.h"

extern char** environ;

namespace {

using warden::bench::Median;

// Child: one first call, printed as "<ms> <compiles> <disk_hits> <remote_hits> <package_hits>".
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
  std::printf("%.3f %lld %lld %lld %lld\n", ms, static_cast<long long>(stats.compiles),
              static_cast<long long>(stats.disk_hits), static_cast<long long>(stats.remote_hits),
              static_cast<long long>(stats.package_hits));
  return 0;
}

struct ChildResult {
  double ms = -1;
  long long compiles = -1, disk_hits = -1, remote_hits = -1, package_hits = -1;
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
  std::sscanf(out.c_str(), "%lf %lld %lld %lld %lld", &r.ms, &r.compiles, &r.disk_hits, &r.remote_hits,
              &r.package_hits);
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

  // The shared cache: a redis-server of our own, and the fleet's key.
  warden::tools::LocalRedisServer redis(root);
  if (!redis.ok()) {
    std::fprintf(stderr, "compile_latency: %s did not start (tools/install_deps.sh installs redis-server)\n",
                 warden::tools::LocalRedisServer::kBinary);
    return 1;
  }
  const std::string key_file = root + "/fleet.key";
  std::ofstream(key_file) << "compile-latency benchmark fleet key";
  chmod(key_file.c_str(), 0600);
  setenv("WARDEN_CACHE_KEY_FILE", key_file.c_str(), 1);
  const std::string url = redis.url();
  const std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "/usr/bin:/bin";

  std::vector<double> cold, remote, warm, package, aten;
  bool ok = true;
  for (int r = 0; r < rounds; ++r) {
    const std::string dir = root + "/round" + std::to_string(r);
    ok = ok && redis.Command({"FLUSHALL"});
    setenv("WARDEN_REMOTE_CACHE", url.c_str(), 1);
    const ChildResult c = RunChild(self, "cpp", dir + "/a");         // nothing anywhere: compiles, publishes
    const ChildResult m = RunChild(self, "cpp", dir + "/b");         // from Redis
    const ChildResult w = RunChild(self, "cpp", dir + "/b");         // from the local disk cache
    unsetenv("WARDEN_REMOTE_CACHE");
    int count = 0;
    std::vector<std::string> skipped;
    auto bytes = warden::codegen::BuildPackage(dir + "/a/kernels", *warden::codegen::ReadKeyFile(key_file), &count,
                                               &skipped);
    const std::string pkg = dir + "/kernels.wpkg";
    if (bytes.ok()) std::ofstream(pkg, std::ios::binary) << *bytes;
    setenv("WARDEN_PACKAGE", pkg.c_str(), 1);
    setenv("PATH", "/nonexistent", 1);
    const ChildResult p = RunChild(self, "cpp", dir + "/c");         // no compiler: from the package
    setenv("PATH", path.c_str(), 1);
    unsetenv("WARDEN_PACKAGE");
    const ChildResult a = RunChild(self, "aten", dir + "/d");        // no kernel at all
    ok = ok && c.ms >= 0 && m.ms >= 0 && w.ms >= 0 && p.ms >= 0 && a.ms >= 0 && c.compiles == 1 &&
         m.compiles == 0 && m.remote_hits == 1 && w.compiles == 0 && w.disk_hits == 1 && p.compiles == 0 &&
         p.package_hits == 1 && count == 1;
    cold.push_back(c.ms);
    remote.push_back(m.ms);
    warm.push_back(w.ms);
    package.push_back(p.ms);
    aten.push_back(a.ms);
  }
  redis.Kill(SIGTERM);
  std::printf("LibTorch %s\n", warden::tools::LibTorchDescription().c_str());
  std::printf("10-op chain, backend \"cpp\", first call (compile() + trace + guards + backend + run), "
              "median of %d fresh processes:\n", rounds);
  std::printf("  cold (compiler runs, publishes):       %8.2f ms\n", Median(cold));
  std::printf("  remote-warm (kernel from Redis):        %8.2f ms\n", Median(remote));
  std::printf("  local-warm (kernel from disk cache):    %8.2f ms\n", Median(warm));
  std::printf("  package (no compiler on PATH):          %8.2f ms\n", Median(package));
  std::printf("  backend \"aten\" (no kernel):            %8.2f ms\n", Median(aten));
  std::printf("  kernel latency: cold %.2f ms, remote %.2f ms, local %.2f ms, package %.2f ms "
              "(first call minus the \"aten\" one)\n",
              Median(cold) - Median(aten), Median(remote) - Median(aten), Median(warm) - Median(aten),
              Median(package) - Median(aten));
  if (!ok) {
    std::printf("  CHECK FAILED: a child failed, or a scenario did not get its kernel where it should\n");
    return 1;
  }
  std::printf("  checked: cold compiled once; remote-warm, local-warm and package compiled nothing and took "
              "their library from Redis, the disk cache and the package\n");
  std::string cleanup = "rm -rf '" + root + "'";
  return std::system(cleanup.c_str()) == 0 ? 0 : 1;
}
