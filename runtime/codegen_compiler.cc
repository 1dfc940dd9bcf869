// The system compiler, the on-disk kernel cache and dlopen (Note [Kernel cache]).
#include "runtime/codegen_compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tracer/status.h"

extern char** environ;

namespace warden::codegen {
namespace {

std::atomic<int64_t> num_compiles{0}, num_disk_hits{0}, num_discarded{0}, num_failures{0};
std::atomic<uint64_t> temp_counter{0};

// -fopenmp-simd honours `#pragma omp simd` without linking an OpenMP runtime. No -ffast-math or
// -ffinite-math-only: NaN and Inf must behave as in ATen. -fno-math-errno lets sqrt vectorize
// (errno is the only difference); -ffp-contract=off keeps each op rounded on its own as in eager.
// -fwrapv: integer kernels wrap on overflow as ATen's do (Note [Type promotion]). 512-bit vectors
// where the CPU has them (GCC prefers 256 by default): the fused loops are compute-bound on
// libmvec calls, which run ~1.4x faster 16-wide (ignored without AVX-512).
const std::vector<std::string>& CompileFlags() {
  static const auto* flags = new std::vector<std::string>{
      "-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp-simd", "-fno-math-errno",
      "-ffp-contract=off", "-fwrapv", "-shared", "-fPIC"};
  return *flags;
}

const std::vector<std::string>& LinkFlags() {
#if defined(__x86_64__) && defined(__GLIBC__)
  static const auto* libs = new std::vector<std::string>{"-lmvec"};  // vector math (glibc)
#else
  static const auto* libs = new std::vector<std::string>{};
#endif
  return *libs;
}

uint64_t Mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Two independent 64-bit hashes (FNV-1a and a multiply-rotate one), 32 hex digits. Stable across
// processes and builds, unlike std::hash or absl::Hash.
std::string HashHex(const std::string& data) {
  uint64_t h1 = 0xcbf29ce484222325ULL;
  uint64_t h2 = 0x9e3779b97f4a7c15ULL ^ data.size();
  for (unsigned char c : data) {
    h1 = (h1 ^ c) * 0x100000001b3ULL;
    h2 = ((h2 ^ c) * 0xff51afd7ed558ccdULL);
    h2 = (h2 << 23) | (h2 >> 41);
  }
  return absl::StrFormat("%016x%016x", Mix(h1), Mix(h2 ^ Mix(h1)));
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

absl::Status MakeDirs(const std::string& dir) {
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    absl::StrAppend(&prefix, part, "/");
    if (part.empty()) continue;
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create kernel cache directory ", prefix, ": ", std::strerror(errno)));
    }
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("kernel cache ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

std::string TempSuffix() {
  return absl::StrCat(".tmp.", getpid(), ".", temp_counter.fetch_add(1));
}

absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + TempSuffix();
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string error = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot rename ", tmp, ": ", error));
  }
  return absl::OkStatus();
}

// Runs argv[0] (a path) with stdin from /dev/null, collecting stdout and stderr together.
absl::StatusOr<int> RunProcess(const std::vector<std::string>& args, std::string* output) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::FailedPreconditionError(absl::StrCat("cannot run ", args[0], ": ", std::strerror(rc)));
  }
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n > 0) {
      output->append(buf, n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

absl::StatusOr<std::string> FindCompiler() {
  const char* env = std::getenv("WARDEN_CXX");
  const std::string name = env != nullptr && *env != '\0' ? env : "g++";
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) == 0) return name;
    return absl::FailedPreconditionError(absl::StrCat("no C++ compiler: WARDEN_CXX=", name, " is not executable"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("no C++ compiler: '", name, "' is not in PATH=",
                                                    path != nullptr ? path : "",
                                                    " (install g++ or set WARDEN_CXX)"));
}

// What identifies the compiler binary without running it: its resolved path and the file's
// device, inode, size and modification time. An upgrade or a retargeted symlink changes it.
std::string CompilerFileStamp(const std::string& compiler) {
  char resolved[PATH_MAX];
  const std::string real = realpath(compiler.c_str(), resolved) != nullptr ? resolved : compiler;
  struct stat st;
  if (stat(real.c_str(), &st) != 0) return "";
  return absl::StrCat(real, "|", st.st_dev, "|", st.st_ino, "|", st.st_size, "|", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec);
}

// The first line of `<compiler> --version`: memoized per compiler path for the process, and on disk
// in <cache>/compilers/ keyed by CompilerFileStamp, so that a new process loading cached kernels
// does not spawn the compiler at all (a warm load costs a few file reads and one dlopen).
absl::StatusOr<std::string> CompilerIdentity(const std::string& compiler, const std::string& cache_dir) {
  static std::mutex mu;
  static auto* known = new std::map<std::string, std::string>();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = known->find(compiler);
    if (it != known->end()) return it->second;
  }
  const std::string stamp = CompilerFileStamp(compiler);
  const std::string memo = absl::StrCat(cache_dir, "/compilers/", HashHex(stamp), ".id");
  std::string line;
  if (!stamp.empty()) {
    std::ifstream in(memo);
    std::string stored_stamp;
    if (std::getline(in, stored_stamp) && stored_stamp == stamp && std::getline(in, line) && !line.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      known->emplace(compiler, line);
      return line;
    }
  }
  std::string output;
  ASSIGN_OR_RETURN(const int rc, RunProcess({compiler, "--version"}, &output));
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat(compiler, " --version failed (exit ", rc, "): ", output));
  }
  line = output.substr(0, output.find('\n'));
  if (!stamp.empty() && MakeDirs(absl::StrCat(cache_dir, "/compilers")).ok()) {
    WriteAtomically(memo, absl::StrCat(stamp, "\n", line, "\n")).IgnoreError();  // only a memo
  }
  std::lock_guard<std::mutex> lock(mu);
  known->emplace(compiler, line);
  return line;
}

// The CPU's feature flags: -march=native code is only valid where they are the same.
const std::string& CpuFlags() {
  static const std::string* flags = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("flags", 0) == 0) return new std::string(line);
    }
    return new std::string();
  }();
  return *flags;
}

std::string KeyMarker(const std::string& key) { return absl::StrCat("warden-kernel-key:", key); }

// Loads a cached or fresh library, checking that it is the one `key` names before dlopen runs
// any of its code. A DataLoss status means the file is unusable (delete and rebuild).
absl::StatusOr<std::shared_ptr<const KernelLibrary>> Load(const std::string& path, const std::string& key,
                                                          const std::vector<std::string>& kernels) {
  const std::string marker = KeyMarker(key);
  {
    std::ifstream in(path, std::ios::binary);
    std::stringstream contents;
    contents << in.rdbuf();
    if (contents.str().find(marker) == std::string::npos) {
      return absl::DataLossError(absl::StrCat(path, " is not the kernel library for key ", key,
                                              " (truncated or foreign file)"));
    }
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::DataLossError(absl::StrCat("dlopen ", path, ": ", error != nullptr ? error : "?"));
  }
  auto fail = [&](const std::string& what) {
    dlclose(handle);
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  const auto* stored = static_cast<const char*>(dlsym(handle, "warden_kernel_key"));
  if (stored == nullptr || marker != stored) return fail("warden_kernel_key does not match");
  std::map<std::string, KernelFn> found;
  for (const std::string& name : kernels) {
    void* sym = dlsym(handle, name.c_str());
    if (sym == nullptr) return fail(absl::StrCat("missing symbol ", name));
    found[name] = reinterpret_cast<KernelFn>(sym);
  }
  return std::shared_ptr<const KernelLibrary>(new KernelLibrary(handle, path, std::move(found)));
}

absl::StatusOr<std::shared_ptr<const KernelLibrary>> CompileOrLoad(
    const std::string& source, const std::vector<std::string>& kernels) {
  ASSIGN_OR_RETURN(const std::string compiler, FindCompiler());
  const std::string dir = KernelCacheDir();
  RETURN_IF_ERROR(MakeDirs(dir));
  ASSIGN_OR_RETURN(const std::string identity, CompilerIdentity(compiler, dir));
  const std::string key = HashHex(absl::StrCat(
      "warden-kernel-v1", std::string(1, '\0'), source, std::string(1, '\0'), compiler,
      std::string(1, '\0'), identity, std::string(1, '\0'), absl::StrJoin(CompileFlags(), " "), " ",
      absl::StrJoin(LinkFlags(), " "), std::string(1, '\0'), CpuFlags()));
  const std::string base = absl::StrCat(dir, "/", key);
  const std::string so = base + ".so";

  if (FileExists(so)) {
    auto cached = Load(so, key, kernels);
    if (cached.ok()) {
      num_disk_hits.fetch_add(1);
      return cached;
    }
    std::remove(so.c_str());  // corrupt or foreign: rebuild once
    num_discarded.fetch_add(1);
  }

  const std::string cc = base + ".cc";
  RETURN_IF_ERROR(WriteAtomically(
      cc, absl::StrCat(source, "\nextern \"C\" const char warden_kernel_key[] = \"", KeyMarker(key), "\";\n")));
  const std::string tmp = so + TempSuffix();
  std::vector<std::string> args = {compiler};
  for (const std::string& f : CompileFlags()) args.push_back(f);
  args.insert(args.end(), {"-o", tmp, cc});
  for (const std::string& f : LinkFlags()) args.push_back(f);
  std::string output;
  ASSIGN_OR_RETURN(const int rc, RunProcess(args, &output));
  if (rc != 0) {
    std::remove(tmp.c_str());
    constexpr size_t kMaxOutput = 4000;
    if (output.size() > kMaxOutput) output = absl::StrCat(output.substr(0, kMaxOutput), "\n[...]");
    return absl::InternalError(absl::StrCat(compiler, " failed (exit ", rc, ") on ", cc, ":\n", output));
  }
  if (std::rename(tmp.c_str(), so.c_str()) != 0) {
    const std::string error = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot rename ", tmp, ": ", error));
  }
  ASSIGN_OR_RETURN(auto library, Load(so, key, kernels));
  num_compiles.fetch_add(1);
  return library;
}

}  // namespace

KernelLibrary::~KernelLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

KernelFn KernelLibrary::Find(const std::string& name) const {
  auto it = kernels_.find(name);
  return it == kernels_.end() ? nullptr : it->second;
}

std::string KernelCacheDir() {
  const char* root = std::getenv("WARDEN_CACHE_DIR");
  if (root != nullptr && *root != '\0') return absl::StrCat(root, "/kernels");
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return absl::StrCat(home, "/.cache/warden/kernels");
  return absl::StrCat("/tmp/warden-cache-", getuid(), "/kernels");
}

absl::StatusOr<std::shared_ptr<const KernelLibrary>> LoadKernels(
    const std::string& source, const std::vector<std::string>& kernels) {
  auto library = CompileOrLoad(source, kernels);
  if (!library.ok()) num_failures.fetch_add(1);
  return library;
}

KernelCacheStats GetKernelCacheStats() {
  KernelCacheStats s;
  s.compiles = num_compiles.load();
  s.disk_hits = num_disk_hits.load();
  s.discarded = num_discarded.load();
  s.failures = num_failures.load();
  return s;
}

}  // namespace warden::codegen
