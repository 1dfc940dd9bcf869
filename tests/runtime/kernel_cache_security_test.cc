// The kernel cache runs code, so it must trust nothing Warden did not write (Note [Kernel cache],
// Note [Private files]), and spawning the compiler must work whatever the host did to its signals,
// descriptors and resource limits (Note [Spawning from a host]). Each test plants what an attacker
// or a careless host would: libraries whose constructor writes a marker file, directories of
// other users, symlinks, FIFOs, sparse files, truncations, a compiler that hangs or writes a FIFO,
// an ignored SIGCHLD, leaked descriptors, RLIMIT_FSIZE with the default SIGXFSZ action.
// The tests run as the user CI runs as (root there: "another user" is uid 65534).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "runtime/codegen_compiler.h"
#include "runtime/private_files.h"
#include "runtime/warden.h"
#include "tests/test_env.h"

extern char** environ;

namespace warden {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using Args = std::vector<c10::IValue>;

constexpr uid_t kOtherUser = 65534;  // nobody

using test_util::ReadFile;
using test_util::ScopedCacheDir;
using test_util::ScopedEnv;
using test_util::TempDir;

void WriteFile(const std::string& path, const std::string& bytes, fs::perms perms = fs::perms::owner_read |
                                                                                   fs::perms::owner_write) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  fs::permissions(path, perms);
}

std::string WriteScript(const std::string& dir, const std::string& name, const std::string& body) {
  const std::string path = dir + "/" + name;
  WriteFile(path, "#!/bin/sh\n" + body, fs::perms::owner_all);
  return path;
}

// Runs `f` on another thread; a hang fails the test at once instead of at Bazel's timeout.
template <typename F>
auto Within(int seconds, const char* what, F f) {
  auto future = std::async(std::launch::async, std::move(f));
  if (future.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s did not return within %d s (hang)\n", what, seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return future.get();
}

const std::string kSource = "extern \"C\" void k(const void**, void**, long) {}\n";

std::string SourceNamed(const std::string& tag) { return absl::StrCat(kSource, "// ", tag, "\n"); }

// The key Warden gives `source` on this machine (the name of its library).
std::string KeyOf(const std::string& source) {
  ScopedCacheDir scratch;
  auto lib = codegen::LoadKernels(source, {"k"});
  EXPECT_TRUE(lib.ok()) << lib.status();
  return lib.ok() ? fs::path((*lib)->path()).stem().string() : "";
}

// What an attacker plants for `key`: a library exporting `k` and the right key marker whose
// constructor writes `marker` when loaded, and (optionally) a record matching it.
void Plant(const std::string& dir, const std::string& key, const std::string& marker, bool with_record) {
  const std::string src = dir + "/planted.cc";
  WriteFile(src, absl::StrCat(kSource, "extern \"C\" const char warden_kernel_key[] = \"warden-kernel-key:", key,
                              "\";\n#include <stdio.h>\n__attribute__((constructor)) static void planted() {\n"
                              "  FILE* f = fopen(\"", marker, "\", \"w\");\n  if (f) { fputs(\"ran\", f); fclose(f); }\n}\n"));
  const std::string so = absl::StrCat(dir, "/", key, ".so");
  ASSERT_EQ(std::system(absl::StrCat("g++ -shared -fPIC -o ", so, " ", src).c_str()), 0);
  fs::remove(src);
  if (with_record) {
    const std::string bytes = ReadFile(so);
    WriteFile(absl::StrCat(dir, "/", key, ".sha256"),
              absl::StrCat("sha256 ", files::Sha256Hex(bytes), " ", bytes.size(), "\n"));
  }
}

std::string Mode(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return "missing";
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", st.st_mode & 07777);
  return buf;
}

// ---- the cache directory ----

// A cache directory another local user controls is refused: the planted library never runs and
// the kernels go to a directory private to the process, with a warning saying why.
TEST(KernelCacheSecurity, UnsafeCacheDirectoriesAreRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create another user's directory";
  const std::string source = SourceNamed("unsafe-dirs");
  const std::string key = KeyOf(source);
  ASSERT_FALSE(key.empty());
  struct Case {
    std::string name;
    std::function<void(const std::string& root, const std::string& planted_dir)> setup;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"kernels owned by another user",
       [](const std::string& root, const std::string& planted) {
         fs::rename(planted, root + "/kernels");
         ASSERT_EQ(chown((root + "/kernels").c_str(), kOtherUser, kOtherUser), 0);
       },
       "is owned by uid 65534"},
      {"kernels writable by everyone",
       [](const std::string& root, const std::string& planted) {
         fs::rename(planted, root + "/kernels");
         fs::permissions(root + "/kernels", fs::perms::all);
       },
       "is writable by group or others"},
      {"kernels is a symlink",
       [](const std::string& root, const std::string& planted) {
         fs::create_directory_symlink(planted, root + "/kernels");
       },
       "is a symlink"},
      {"parent writable by everyone, not sticky",
       [](const std::string& root, const std::string& planted) {
         fs::rename(planted, root + "/kernels");
         fs::permissions(root, fs::perms::all);
       },
       "and not sticky"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir base;
    const std::string root = base.path() + "/cache", planted = base.path() + "/planted";
    const std::string marker = base.path() + "/planted-code-ran";
    fs::create_directory(root);
    fs::create_directory(planted);
    Plant(planted, key, marker, /*with_record=*/true);
    c.setup(root, planted);
    ScopedEnv env("WARDEN_CACHE_DIR", root.c_str());
    testing::internal::CaptureStderr();
    auto lib = codegen::LoadKernels(source, {"k"});
    const std::string err = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(lib.ok()) << lib.status();
    EXPECT_FALSE(fs::exists(marker)) << "a planted library's constructor ran";
    EXPECT_THAT((*lib)->path(), Not(StartsWith(base.path()))) << "a refused directory was used";
    EXPECT_THAT(err, HasSubstr("kernel cache refused"));
    EXPECT_THAT(err, HasSubstr(c.reason));
    EXPECT_NE((*lib)->Find("k"), nullptr);
  }
}

// With HOME unset the cache is under the user database's home, never a predictable shared path
// such as /tmp/warden-cache-<uid> (which another user can create first).
TEST(KernelCacheSecurity, NoSharedFallbackWithoutHome) {
  ScopedEnv root("WARDEN_CACHE_DIR", nullptr);
  ScopedEnv home("HOME", nullptr);
  const std::string dir = codegen::KernelCacheDir();
  EXPECT_THAT(dir, Not(StartsWith("/tmp")));
  if (!dir.empty()) EXPECT_THAT(dir, HasSubstr("/.cache/warden/kernels"));
}

// Directories are created 0700 and files 0600 whatever the umask.
TEST(KernelCacheSecurity, CacheDirectoriesAndFilesArePrivate) {
  TempDir base;
  ScopedEnv env("WARDEN_CACHE_DIR", (base.path() + "/new/cache").c_str());
  const mode_t old_umask = umask(022);
  auto lib = codegen::LoadKernels(SourceNamed("modes"), {"k"});
  umask(old_umask);
  ASSERT_TRUE(lib.ok()) << lib.status();
  const std::string kernels = base.path() + "/new/cache/kernels";
  EXPECT_EQ(Mode(base.path() + "/new"), "0700");
  EXPECT_EQ(Mode(base.path() + "/new/cache"), "0700");
  EXPECT_EQ(Mode(kernels), "0700");
  int files = 0;
  for (const auto& e : fs::directory_iterator(kernels)) {
    if (e.is_directory()) continue;
    ++files;
    EXPECT_EQ(Mode(e.path().string()), "0600") << e.path();
    EXPECT_THAT(e.path().string(), Not(HasSubstr(".tmp."))) << "a temp file was left behind";
  }
  EXPECT_EQ(files, 4);  // <key>.cc, <key>.so, <key>.sha256, <key>.meta
}

// ---- the files in it ----

// A library at the right name with the right key marker, but not the bytes Warden recorded when it
// compiled it, is deleted and rebuilt: its constructor never runs.
TEST(KernelCacheSecurity, ForeignLibraryIsNeverLoaded) {
  ScopedCacheDir cache;
  TempDir scratch;
  const std::string source = SourceNamed("foreign");
  ASSERT_TRUE(codegen::LoadKernels(source, {"k"}).ok());
  const std::string key = KeyOf(source);
  const std::string marker = scratch.path() + "/planted-code-ran";
  Plant(scratch.path(), key, marker, /*with_record=*/false);
  const std::string so = absl::StrCat(cache.kernels(), "/", key, ".so");
  fs::remove(so);
  fs::copy_file(scratch.path() + "/" + key + ".so", so);
  const codegen::KernelCacheStats s0 = codegen::GetKernelCacheStats();
  testing::internal::CaptureStderr();
  auto lib = codegen::LoadKernels(source, {"k"});
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_FALSE(fs::exists(marker)) << "the foreign library's constructor ran";
  const codegen::KernelCacheStats s1 = codegen::GetKernelCacheStats();
  EXPECT_EQ(s1.discarded, s0.discarded + 1);
  EXPECT_EQ(s1.compiles, s0.compiles + 1);
  EXPECT_THAT(err, HasSubstr("differ from what Warden recorded"));
}

// A library cut at any point (here every 1 KB) is found out before dlopen, which would otherwise
// die with SIGBUS on a cut inside a mapped segment.
TEST(KernelCacheSecurity, TruncatedLibraryIsRebuiltAtEveryKilobyte) {
  ScopedCacheDir cache;
  const std::string source = SourceNamed("truncated");
  auto first = codegen::LoadKernels(source, {"k"});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string so = (*first)->path();
  first->reset();
  const std::string good = ReadFile(so);
  ASSERT_GT(good.size(), 4096u);
  int cuts = 0;
  for (size_t cut = 0; cut < good.size(); cut += 1024, ++cuts) {
    SCOPED_TRACE(absl::StrCat("cut at ", cut));
    fs::remove(so);  // a new inode: never the one a loaded library maps
    WriteFile(so, good.substr(0, cut));
    const codegen::KernelCacheStats s0 = codegen::GetKernelCacheStats();
    testing::internal::CaptureStderr();
    auto lib = codegen::LoadKernels(source, {"k"});
    testing::internal::GetCapturedStderr();
    ASSERT_TRUE(lib.ok()) << lib.status();
    EXPECT_EQ(codegen::GetKernelCacheStats().discarded, s0.discarded + 1);
    EXPECT_EQ(ReadFile(so), good);
  }
  EXPECT_GE(cuts, 4);
}

// What sits at a cache path may be a FIFO (reading blocks forever), a symlink to /dev/zero
// (endless) or a 2 GB sparse file: none is read, none blocks, all are replaced.
TEST(KernelCacheSecurity, FifosDevicesAndHugeFilesNeverBlock) {
  ScopedCacheDir cache;
  const std::string source = SourceNamed("special-files");
  auto first = codegen::LoadKernels(source, {"k"});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string so = (*first)->path();
  const std::string record = so.substr(0, so.size() - 3) + ".sha256";
  first->reset();
  const std::vector<std::pair<std::string, std::function<void(const std::string&)>>> plants = {
      {"fifo", [](const std::string& p) { ASSERT_EQ(mkfifo(p.c_str(), 0600), 0); }},
      {"symlink to /dev/zero", [](const std::string& p) { fs::create_symlink("/dev/zero", p); }},
      {"2 GB sparse file",
       [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY | O_CREAT, 0600);
         ASSERT_GE(fd, 0);
         ASSERT_EQ(ftruncate(fd, int64_t{2} << 30), 0);
         close(fd);
       }},
  };
  for (const std::string& target : {so, record}) {
    for (const auto& [what, plant] : plants) {
      SCOPED_TRACE(absl::StrCat(what, " at ", target));
      fs::remove(target);
      plant(target);
      testing::internal::CaptureStderr();
      auto lib = Within(60, "LoadKernels", [&] { return codegen::LoadKernels(source, {"k"}); });
      testing::internal::GetCapturedStderr();
      ASSERT_TRUE(lib.ok()) << lib.status();
      EXPECT_NE((*lib)->Find("k"), nullptr);
    }
  }
}

// ---- the compiler ----

// A compiler that never exits (and leaves a child holding its output open) is killed after
// WARDEN_COMPILE_TIMEOUT; the function runs on backend "aten" and explain() says why.
TEST(KernelCacheSecurity, HungCompilerTimesOutAndFallsBack) {
  ScopedCacheDir cache;
  const std::string fake = WriteScript(cache.root(), "hang-cxx",
                                       "if [ \"$1\" = --version ]; then echo 'hang-cxx 1.0'; exit 0; fi\n"
                                       "sleep 1000 &\nwait\n");
  ScopedEnv cxx("WARDEN_CXX", fake.c_str());
  ScopedEnv timeout("WARDEN_COMPILE_TIMEOUT", "1");
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::tanh(a[0].toTensor() * 3 + 1) - 2};
  };
  Options o;
  o.backend = "cpp";
  o.dynamic = Dynamic::kStatic;
  CompiledFunction f = compile(fn, o);
  const at::Tensor x = torch::randn({64});
  const auto t0 = std::chrono::steady_clock::now();
  testing::internal::CaptureStderr();
  Within(60, "the first call", [&] { return f({x}); });
  testing::internal::GetCapturedStderr();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 30);
  const std::vector<at::Tensor> out = f({x});
  EXPECT_TRUE(torch::allclose(out[0], fn({x})[0]));
  EXPECT_THAT(f.explain(), HasSubstr("did not finish within 1 s and was killed"));
  EXPECT_EQ(nlohmann::json::parse(f.explain_json())["entries"][0]["backend"], "aten");
}

// A "compiler" that leaves a FIFO where the library should be: never read, the compile fails.
TEST(KernelCacheSecurity, CompilerOutputThatIsAFifoIsRefused) {
  ScopedCacheDir cache;
  const std::string fake = WriteScript(cache.root(), "fifo-cxx",
                                       "if [ \"$1\" = --version ]; then echo 'fifo-cxx 1.0'; exit 0; fi\n"
                                       "while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then out=\"$2\"; fi; shift; done\n"
                                       "rm -f \"$out\"; mkfifo \"$out\"\n");
  ScopedEnv cxx("WARDEN_CXX", fake.c_str());
  auto lib = Within(60, "LoadKernels", [&] { return codegen::LoadKernels(SourceNamed("fifo-output"), {"k"}); });
  ASSERT_FALSE(lib.ok());
  EXPECT_THAT(lib.status().message(), HasSubstr("is not a regular file"));
}

std::atomic<int> reaped_by_host{0};
void ReapEveryChild(int) {
  while (waitpid(-1, nullptr, WNOHANG) > 0) ++reaped_by_host;
}

// A host that ignores SIGCHLD or sets SA_NOCLDWAIT (children are reaped by the kernel), or that
// reaps every child in its handler, still gets its kernels compiled with the compiler's status.
TEST(KernelCacheSecurity, HostChildHandlingNeverBreaksCompiles) {
  ScopedCacheDir cache;
  struct Setup {
    const char* name;
    void (*handler)(int);
    int flags;
  };
  const Setup setups[] = {{"SIG_IGN", SIG_IGN, 0},
                          {"SIG_DFL with SA_NOCLDWAIT", SIG_DFL, SA_NOCLDWAIT},
                          {"a handler reaping every child", ReapEveryChild, SA_RESTART}};
  for (const Setup& setup : setups) {
    SCOPED_TRACE(setup.name);
    struct sigaction act = {}, old = {};
    act.sa_handler = setup.handler;
    act.sa_flags = setup.flags;
    sigaction(SIGCHLD, &act, &old);
    auto lib = codegen::LoadKernels(SourceNamed(std::string("sigchld-") + setup.name), {"k"});
    auto bad = codegen::LoadKernels(SourceNamed(std::string("sigchld-bad-") + setup.name) + "not C++;\n", {"k"});
    sigaction(SIGCHLD, &old, nullptr);
    ASSERT_TRUE(lib.ok()) << lib.status();
    EXPECT_NE((*lib)->Find("k"), nullptr);
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(bad.status().message(), HasSubstr("failed (exit 1)")) << "the compiler's status was lost";
  }
}

// An empty or relative PATH entry is not searched: a `g++` planted in the current directory
// (a shared /tmp, say) never runs.
TEST(KernelCacheSecurity, RelativePathEntriesAreNotSearched) {
  ScopedCacheDir cache;
  TempDir cwd;
  const std::string marker = cwd.path() + "/planted-compiler-ran";
  WriteScript(cwd.path(), "g++", absl::StrCat("touch ", marker, "\nexit 1\n"));
  const std::string old_cwd = fs::current_path().string();
  fs::current_path(cwd.path());
  auto lib = [&] {
    ScopedEnv cxx("WARDEN_CXX", nullptr);
    ScopedEnv path("PATH", ":.:bin");
    return codegen::LoadKernels(SourceNamed("relative-path"), {"k"});
  }();
  fs::current_path(old_cwd);
  EXPECT_FALSE(fs::exists(marker)) << "a g++ from the current directory ran";
  ASSERT_FALSE(lib.ok());
  EXPECT_THAT(lib.status().message(), HasSubstr("no C++ compiler"));
}

// Descriptors the host opened without O_CLOEXEC do not leak into the compiler.
TEST(KernelCacheSecurity, HostDescriptorsDoNotLeakIntoTheCompiler) {
  ScopedCacheDir cache;
  const std::string list = cache.root() + "/fds";
  const std::string fake = WriteScript(cache.root(), "listing-cxx",
                                       absl::StrCat("ls /proc/$$/fd > ", list, "\nexec g++ \"$@\"\n"));
  ScopedEnv cxx("WARDEN_CXX", fake.c_str());
  // A descriptor without O_CLOEXEC, as careless hosts open them (high, clear of the shell's own).
  const int opened = open("/dev/null", O_RDONLY);
  ASSERT_GE(opened, 0);
  const int leaked = dup2(opened, 200);
  close(opened);
  ASSERT_EQ(leaked, 200);
  auto lib = codegen::LoadKernels(SourceNamed("fd-leak"), {"k"});
  close(leaked);
  ASSERT_TRUE(lib.ok()) << lib.status();
  std::set<int> open_fds;
  std::istringstream in(ReadFile(list));
  for (int fd; in >> fd;) open_fds.insert(fd);
  EXPECT_FALSE(open_fds.empty());
  EXPECT_EQ(open_fds.count(leaked), 0u) << "host descriptor " << leaked << " leaked into the compiler";
}

// ---- resource limits ----

// The child half of FileSizeLimitNeverKillsTheHost (skipped unless spawned by it): a file size
// limit far below what the cache and the trace log write, with SIGXFSZ's default action (kill).
TEST(KernelCacheSecurity, ChildUnderFileSizeLimit) {
  if (std::getenv("WARDEN_TEST_FSIZE_CHILD") == nullptr) GTEST_SKIP() << "only run as a child process";
  ScopedCacheDir cache;
  TempDir trace;
  ScopedEnv trace_dir("WARDEN_TRACE_DIR", trace.path().c_str());
  signal(SIGXFSZ, SIG_DFL);
  struct rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &limit), 0);
  limit.rlim_cur = 2048;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor y = a[0].toTensor();
    for (int i = 0; i < 12; ++i) y = torch::sigmoid(y * 1.5 + 0.25) - torch::tanh(y);
    return {y};
  };
  Options o;
  o.backend = "cpp";
  o.dynamic = Dynamic::kStatic;
  o.name = "fsize";
  CompiledFunction f = compile(fn, o);
  const at::Tensor x = torch::randn({256});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::allclose(f({x})[0], fn({x})[0]));
  std::cout << "child survived; backend " << nlohmann::json::parse(f.explain_json())["entries"][0]["backend"]
            << "\n";
}

TEST(KernelCacheSecurity, FileSizeLimitNeverKillsTheHost) {
  if (std::getenv("WARDEN_TEST_FSIZE_CHILD") != nullptr) GTEST_SKIP();
  ScopedEnv child("WARDEN_TEST_FSIZE_CHILD", "1");
  // The child must not touch the parent's Bazel/gtest result files.
  ScopedEnv no_exit_file("TEST_PREMATURE_EXIT_FILE", nullptr);
  ScopedEnv no_xml("XML_OUTPUT_FILE", nullptr);
  ScopedEnv no_gtest_output("GTEST_OUTPUT", nullptr);
  ScopedEnv no_shard_file("TEST_SHARD_STATUS_FILE", nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=KernelCacheSecurity.ChildUnderFileSizeLimit";
  std::vector<char*> argv = {self.data(), filter.data(), nullptr};
  // Its output goes through a pipe: a test log file is itself subject to the limit.
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string output;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) output.append(buf, n);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::cout << "---- child output ----\n" << output << "---- end of child output ----\n";
  ASSERT_FALSE(WIFSIGNALED(status)) << "the child was killed by signal " << WTERMSIG(status)
                                    << (WTERMSIG(status) == SIGXFSZ ? " (SIGXFSZ)" : "");
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_THAT(output, HasSubstr("child survived"));
}

}  // namespace
}  // namespace warden
