// Kernels shared between processes and machines (Note [Shared kernels]): the Redis cache with a
// real redis-server on a loopback port, authenticated entries, degraded servers, packages.
#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "runtime/codegen_compiler.h"
#include "runtime/kernel_entry.h"
#include "runtime/remote_cache.h"
#include "runtime/warden.h"
#include "tests/test_env.h"
#include "tools/redis_server.h"

extern char** environ;

namespace warden {
namespace {

namespace fs = std::filesystem;
using test_util::ReadFile;
using test_util::ScopedCacheDir;
using test_util::ScopedEnv;
using test_util::TempDir;
using testing::HasSubstr;
using Args = std::vector<c10::IValue>;

using tools::BindLoopback;
int FreePort() { return tools::FreeLoopbackPort(); }

pid_t Spawn(const std::vector<std::string>& args, const std::string& output_file) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// tools::LocalRedisServer, failing the test if it does not come up, with the raw access an
// attacker who can write the server has.
class RedisServer {
 public:
  RedisServer() : server_(dir_.path()) {
    if (!server_.ok()) {
      ADD_FAILURE() << tools::LocalRedisServer::kBinary << " did not come up (tools/install_deps.sh installs "
                    << "redis-server): " << ReadFile(server_.log());
    }
  }
  void Kill(int sig) { server_.Kill(sig); }
  std::string url() const { return server_.url(); }
  std::string Get(const std::string& key) const {
    std::vector<std::string> out;
    server_.Command({"GET", key}, &out);
    return out.empty() ? "" : out[0];
  }
  void Set(const std::string& key, const std::string& value) const { server_.Command({"SET", key, value}); }
  std::vector<std::string> Keys() const {
    std::vector<std::string> out;
    server_.Command({"KEYS", "warden:*"}, &out);
    return out;
  }

 private:
  TempDir dir_;
  tools::LocalRedisServer server_;
};

std::string WriteKey(const std::string& dir, const std::string& secret, mode_t mode = 0600) {
  const std::string path = dir + "/fleet.key";
  std::ofstream(path) << secret;
  chmod(path.c_str(), mode);
  return path;
}

// A compiler that logs each of its runs to $CXX_LOG, then runs g++.
std::string LoggingCompiler(const std::string& dir) {
  const std::string path = dir + "/logging-cxx";
  std::ofstream(path) << "#!/bin/sh\necho \"$*\" >> \"$CXX_LOG\"\nexec g++ \"$@\"\n";
  chmod(path.c_str(), 0700);
  return path;
}

int Lines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// The workload both processes run: three functions of backend cpp, each checked against eager.
std::vector<Fn> Workload() {
  return {
      [](const Args& a) -> std::vector<at::Tensor> { return {torch::tanh(a[0].toTensor() * 2 + 1)}; },
      [](const Args& a) -> std::vector<at::Tensor> {
        const at::Tensor x = a[0].toTensor();
        return {torch::sigmoid(x) * x - torch::exp(-x.abs())};
      },
      [](const Args& a) -> std::vector<at::Tensor> { return {(a[0].toTensor() * 3).relu().sum(1)}; },
  };
}

// Runs the workload; returns the kernels' origins, one per function.
std::vector<std::string> RunWorkload() {
  std::vector<std::string> origins;
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({8, 33});
  for (const Fn& fn : Workload()) {
    Options o;
    o.backend = "cpp";
    o.dynamic = Dynamic::kStatic;
    CompiledFunction f = compile(fn, o);
    for (int i = 0; i < 2; ++i) {
      const std::vector<at::Tensor> got = f({x}), want = fn({x});
      EXPECT_TRUE(torch::allclose(got[0], want[0], 1e-5, 1e-6));
    }
    const auto e = nlohmann::json::parse(f.explain_json())["entries"][0];
    EXPECT_EQ(e["backend"], "cpp") << e["backend_note"];
    origins.push_back(e["kernel_origin"].get<std::string>());
  }
  return origins;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) absl::StrAppend(&out, s, "\n");
  return out;
}

// The child half of TwoProcessesShareKernels (skipped unless spawned by it).
TEST(SharedCache, ChildRunsTheWorkload) {
  if (std::getenv("WARDEN_TEST_SHARED_CHILD") == nullptr) GTEST_SKIP() << "only run as a child process";
  const codegen::KernelCacheStats before = codegen::GetKernelCacheStats();
  const std::vector<std::string> origins = RunWorkload();
  const codegen::KernelCacheStats after = codegen::GetKernelCacheStats();
  std::cout << "origins:\n" << Joined(origins) << "compiles " << after.compiles - before.compiles << " remote_hits "
            << after.remote_hits - before.remote_hits << "\n";
}

std::string RunChild(const std::string& out) {
  ScopedEnv child("WARDEN_TEST_SHARED_CHILD", "1");
  ScopedEnv no_exit_file("TEST_PREMATURE_EXIT_FILE", nullptr);
  ScopedEnv no_xml("XML_OUTPUT_FILE", nullptr);
  ScopedEnv no_gtest_output("GTEST_OUTPUT", nullptr);
  ScopedEnv no_shard_file("TEST_SHARD_STATUS_FILE", nullptr);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const pid_t pid = Spawn({self, "--gtest_filter=SharedCache.ChildRunsTheWorkload"}, out);
  int status = -1;
  waitpid(pid, &status, 0);
  const std::string text = ReadFile(out);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  return text;
}

// Two processes with separate local caches and one Redis: the second runs the compiler 0 times
// (every run of it, --version included, is logged by the wrapper) and gets every kernel remotely.
TEST(SharedCache, TwoProcessesShareKernels) {
  RedisServer redis;
  TempDir work;
  ScopedEnv remote("WARDEN_REMOTE_CACHE", redis.url().c_str());
  ScopedEnv key("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "correct horse battery staple").c_str());
  const std::string log1 = work.path() + "/cxx1.log", log2 = work.path() + "/cxx2.log";
  std::string first, second;
  {
    ScopedEnv cache("WARDEN_CACHE_DIR", (work.path() + "/cache1").c_str());
    ScopedEnv cxx("WARDEN_CXX", LoggingCompiler(work.path()).c_str());
    ScopedEnv log("CXX_LOG", log1.c_str());
    first = RunChild(work.path() + "/child1.txt");
  }
  {
    ScopedEnv cache("WARDEN_CACHE_DIR", (work.path() + "/cache2").c_str());
    ScopedEnv cxx("WARDEN_CXX", LoggingCompiler(work.path()).c_str());
    ScopedEnv log("CXX_LOG", log2.c_str());
    second = RunChild(work.path() + "/child2.txt");
  }
  EXPECT_THAT(first, HasSubstr("compiles 3 remote_hits 0"));
  EXPECT_EQ(Lines(log1), 3) << ReadFile(log1);
  EXPECT_EQ(redis.Keys().size(), 3u);
  EXPECT_THAT(second, HasSubstr("compiles 0 remote_hits 3")) << second;
  EXPECT_THAT(second, HasSubstr("origins:\nremote hit\nremote hit\nremote hit\n"));
  EXPECT_EQ(Lines(log2), 0) << "the second process ran the compiler:\n" << ReadFile(log2);
  EXPECT_EQ(fs::exists(work.path() + "/cache2/kernels"), true);
}

// Every way of tampering with an entry in Redis is caught before any of its code runs: the entry
// is rejected (and reported), the kernel is rebuilt locally, results equal eager's.
TEST(SharedCache, TamperedEntriesAreRejectedAndRebuilt) {
  RedisServer redis;
  TempDir work;
  ScopedEnv remote("WARDEN_REMOTE_CACHE", redis.url().c_str());
  ScopedEnv key("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "fleet secret number one").c_str());
  codegen::ResetRemoteCacheForTesting();
  {
    ScopedCacheDir cache;
    RunWorkload();
  }
  const std::vector<std::string> keys = redis.Keys();
  ASSERT_EQ(keys.size(), 3u);
  const std::string good = redis.Get(keys[0]);
  const size_t body = good.find("\n\n") + 2;
  ASSERT_GT(good.size(), body + 1000);

  TempDir other;
  const std::string other_key = WriteKey(other.path(), "some other fleet's secret");
  auto retagged = [&](const std::string& entry, const std::string& secret_file) {
    // Re-encode with another key (an attacker without ours can only do this).
    codegen::SharingConfig c;
    c.unauthenticated = true;
    auto decoded = codegen::DecodeEntry(entry, c, "", "");
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    return codegen::EncodeEntry(*decoded, *codegen::ReadKeyFile(secret_file));
  };
  auto with_library_byte_flipped = good;
  with_library_byte_flipped[body + 600] ^= 0x40;
  std::string with_size_changed = good;
  const size_t size_at = with_size_changed.find("\nsize ") + 6;
  with_size_changed[size_at] = with_size_changed[size_at] == '9' ? '1' : '9';
  const std::string untagged = good.substr(0, good.find("hmac-sha256 ")) + "hmac-sha256 none\n\n" + good.substr(body);
  const struct {
    const char* what;
    std::string entry;
    const char* reason;
  } cases[] = {
      {"a library byte flipped", with_library_byte_flipped, "digest"},
      {"the header's size edited", with_size_changed, "tag: does not verify"},
      {"tagged with another key", retagged(good, other_key), "tag: does not verify"},
      {"untagged", untagged, "tag: the entry is not authenticated"},
      {"garbage", "#!/bin/sh\nrm -rf ~\n", "malformed"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    redis.Set(keys[0], c.entry);
    ScopedCacheDir cache;
    const codegen::KernelCacheStats before = codegen::GetKernelCacheStats();
    testing::internal::CaptureStderr();
    const std::vector<std::string> origins = RunWorkload();
    const std::string err = testing::internal::GetCapturedStderr();
    const codegen::KernelCacheStats after = codegen::GetKernelCacheStats();
    EXPECT_EQ(after.rejected - before.rejected, 1);
    EXPECT_EQ(after.compiles - before.compiles, 1);
    EXPECT_EQ(after.remote_hits - before.remote_hits, 2);
    EXPECT_THAT(Joined(origins), HasSubstr(absl::StrCat("compiled; remote entry rejected (", c.reason)));
    EXPECT_THAT(err, HasSubstr("remote entry rejected"));
    // The rebuilt kernel replaced the rejected entry: the key heals instead of failing forever.
    const auto healed = codegen::DecodeEntry(redis.Get(keys[0]), codegen::ReadSharingConfig(), "", "");
    EXPECT_TRUE(healed.ok()) << healed.status();
  }
}

// A listener that misbehaves: never answers, or starts a long reply and hangs up.
class FakeServer {
 public:
  explicit FakeServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = BindLoopback(&port_);
    listen(fd_, 8);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0 || stop_) {
          if (c >= 0) close(c);
          return;
        }
        char buf[4096];
        if (recv(c, buf, sizeof(buf), 0) > 0 && !reply_.empty()) send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
        if (reply_.empty()) {
          held_.push_back(c);  // silent: keep it open
        } else {
          close(c);  // killed mid-transfer
        }
      }
    });
  }
  ~FakeServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    const int c = socket(AF_INET, SOCK_STREAM, 0);  // wake accept()
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port_);
    connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    close(c);
    thread_.join();
    close(fd_);
    for (int h : held_) close(h);
  }
  std::string url() const { return absl::StrCat("redis://127.0.0.1:", port_); }

 private:
  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> held_;
  std::thread thread_;
};

// A dead, silent, or mid-reply-killed server costs at most the timeout per miss; the kernels are
// compiled locally, with a warning that names the server and the failure.
TEST(SharedCache, DeadSlowAndKilledServersDegradeToLocalCompiles) {
  TempDir work;
  ScopedEnv key("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "fleet secret number two").c_str());
  ScopedEnv timeout("WARDEN_REMOTE_CACHE_TIMEOUT_MS", "300");
  FakeServer silent(""), hangs_up("$100000\r\nonly the first bytes");
  const std::string dead = absl::StrCat("redis://127.0.0.1:", FreePort());
  const struct {
    const char* what;
    std::string url;
    const char* warning;
  } cases[] = {
      {"nothing listening", dead, "cannot connect"},
      {"never answers", silent.url(), "timed out waiting for the reply"},
      {"killed mid-transfer", hangs_up.url(), "closed the connection mid-reply"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    codegen::ResetRemoteCacheForTesting();
    ScopedEnv remote("WARDEN_REMOTE_CACHE", c.url.c_str());
    testing::internal::CaptureStderr();
    const auto t0 = std::chrono::steady_clock::now();
    auto got = codegen::RemoteGet(c.url, "0123456789abcdef0123456789abcdef");
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
    EXPECT_LT(ms, 1500) << "one miss must cost at most about the timeout";
    // The server is now left alone: the workload neither waits for it nor fails.
    ScopedCacheDir cache;
    const codegen::KernelCacheStats before = codegen::GetKernelCacheStats();
    codegen::ResetRemoteCacheForTesting();
    const std::vector<std::string> origins = RunWorkload();
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(codegen::GetKernelCacheStats().compiles - before.compiles, 3);
    EXPECT_EQ(Joined(origins), "compiled\ncompiled\ncompiled\n");
    EXPECT_THAT(err, HasSubstr(c.warning));
    EXPECT_THAT(err, HasSubstr("compiling locally"));
  }
  // A real server killed between two misses.
  RedisServer redis;
  codegen::ResetRemoteCacheForTesting();
  ScopedEnv remote("WARDEN_REMOTE_CACHE", redis.url().c_str());
  {
    ScopedCacheDir cache;
    RunWorkload();
  }
  redis.Kill(SIGKILL);
  ScopedCacheDir cache;
  testing::internal::CaptureStderr();
  EXPECT_EQ(Joined(RunWorkload()), "compiled\ncompiled\ncompiled\n");
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("compiling locally"));
}

// Entries are kept per fleet key: another key's entries (or those from before a key rotation) are
// never fetched, so they are neither loaded nor reported as attacks; both fleets share one server.
TEST(SharedCache, EachKeyHasItsOwnNamespace) {
  RedisServer redis;
  TempDir work;
  ScopedEnv remote("WARDEN_REMOTE_CACHE", redis.url().c_str());
  codegen::ResetRemoteCacheForTesting();
  {
    ScopedEnv key("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "the old fleet key, rotated out").c_str());
    ScopedCacheDir cache;
    RunWorkload();
  }
  ScopedEnv key("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "the new fleet key, rotated in").c_str());
  {
    ScopedCacheDir cache;
    const codegen::KernelCacheStats before = codegen::GetKernelCacheStats();
    testing::internal::CaptureStderr();
    EXPECT_EQ(Joined(RunWorkload()), "compiled\ncompiled\ncompiled\n");
    EXPECT_THAT(testing::internal::GetCapturedStderr(), testing::Not(HasSubstr("rejected")));
    EXPECT_EQ(codegen::GetKernelCacheStats().rejected, before.rejected);
  }
  EXPECT_EQ(redis.Keys().size(), 6u);
  ScopedCacheDir cache;
  EXPECT_EQ(Joined(RunWorkload()), "remote hit\nremote hit\nremote hit\n");
}

// A reply that is an array (hiredis would allocate its elements up front) is refused at once.
TEST(SharedCache, ArrayRepliesAreRefused) {
  FakeServer huge_array("*500000000\r\n:1\r\n");
  codegen::ResetRemoteCacheForTesting();
  testing::internal::CaptureStderr();
  auto got = codegen::RemoteGet(huge_array.url(), "0123456789abcdef0123456789abcdef");
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("unexpected array reply"));
}

// Without a usable key nothing is shared (no request reaches the server) unless the user opts in.
TEST(SharedCache, SharingNeedsAKeyOrAnExplicitOptIn) {
  RedisServer redis;
  TempDir work;
  ScopedEnv remote("WARDEN_REMOTE_CACHE", redis.url().c_str());
  codegen::ResetRemoteCacheForTesting();
  {
    ScopedEnv no_key("WARDEN_CACHE_KEY_FILE", nullptr);
    ScopedCacheDir cache;
    testing::internal::CaptureStderr();
    const int64_t gets = codegen::GetRemoteCacheStats().gets;
    RunWorkload();
    EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("no WARDEN_CACHE_KEY_FILE"));
    EXPECT_EQ(codegen::GetRemoteCacheStats().gets, gets);
    EXPECT_TRUE(redis.Keys().empty());
  }
  {
    ScopedEnv readable("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "a readable secret", 0644).c_str());
    EXPECT_THAT(std::string(codegen::ReadKeyFile(work.path() + "/fleet.key").status().message()),
                HasSubstr("accessible to group or others"));
    EXPECT_FALSE(codegen::ReadSharingConfig().enabled());
    ScopedEnv short_key("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "short").c_str());
    EXPECT_THAT(std::string(codegen::ReadKeyFile(work.path() + "/fleet.key").status().message()),
                HasSubstr("at least 16"));
  }
  {
    ScopedEnv no_key("WARDEN_CACHE_KEY_FILE", nullptr);
    ScopedEnv opt_in("WARDEN_CACHE_UNAUTHENTICATED", "1");
    ScopedCacheDir cache;
    testing::internal::CaptureStderr();
    RunWorkload();
    EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("without authentication"));
    EXPECT_EQ(redis.Keys().size(), 3u);
  }
}

// A package built from one cache serves a host with no compiler at all: every kernel of the
// workload loads from it, verified; a kernel it does not cover falls back to "aten", saying so.
TEST(Package, ServesAHostWithoutACompiler) {
  TempDir work;
  ScopedEnv key("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "the robot fleet's secret").c_str());
  ScopedEnv no_remote("WARDEN_REMOTE_CACHE", nullptr);
  const std::string package = work.path() + "/kernels.wpkg";
  {
    ScopedCacheDir cache;
    RunWorkload();
    int count = 0;
    std::vector<std::string> skipped;
    auto bytes = codegen::BuildPackage(cache.kernels(), *codegen::ReadKeyFile(work.path() + "/fleet.key"), &count,
                                       &skipped);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(count, 3);
    EXPECT_TRUE(skipped.empty()) << Joined(skipped);
    std::ofstream(package, std::ios::binary) << *bytes;
  }
  ScopedEnv pkg("WARDEN_PACKAGE", package.c_str());
  ScopedEnv no_cxx("WARDEN_CXX", nullptr);
  ScopedEnv no_path("PATH", "/nonexistent");
  ScopedCacheDir cache;
  const codegen::KernelCacheStats before = codegen::GetKernelCacheStats();
  EXPECT_EQ(Joined(RunWorkload()), "package hit\npackage hit\npackage hit\n");
  const codegen::KernelCacheStats after = codegen::GetKernelCacheStats();
  EXPECT_EQ(after.package_hits - before.package_hits, 3);
  EXPECT_EQ(after.compiles, before.compiles);
  // A second function object: now a local hit (the package's library was installed locally).
  EXPECT_EQ(RunWorkload()[0], "local hit");
  // Not in the package: replayed, and explain says why.
  auto uncovered = [](const Args& a) -> std::vector<at::Tensor> { return {torch::cos(a[0].toTensor()) * 5 - 1}; };
  Options o;
  o.backend = "cpp";
  CompiledFunction f = compile(uncovered, o);
  const at::Tensor x = torch::randn({40});
  EXPECT_TRUE(torch::allclose(f({x})[0], uncovered({x})[0]));
  EXPECT_THAT(f.explain(), HasSubstr("the kernel is not in WARDEN_PACKAGE="));
  EXPECT_EQ(nlohmann::json::parse(f.explain_json())["entries"][0]["backend"], "aten");
}

// A package whose entries were altered, or read without the key they were tagged with, is never
// loaded from; a package file that is not private is refused when it is not authenticated.
TEST(Package, TamperedOrForeignPackagesAreRefused) {
  TempDir work;
  ScopedEnv no_remote("WARDEN_REMOTE_CACHE", nullptr);
  const std::string key_file = WriteKey(work.path(), "the robot fleet's secret");
  const std::string package = work.path() + "/kernels.wpkg";
  std::string bytes;
  {
    ScopedCacheDir cache;
    RunWorkload();
    int count = 0;
    std::vector<std::string> skipped;
    bytes = *codegen::BuildPackage(cache.kernels(), *codegen::ReadKeyFile(key_file), &count, &skipped);
  }
  std::string flipped = bytes;
  flipped[flipped.size() - 500] ^= 0x01;  // inside the last entry's library
  std::ofstream(package, std::ios::binary) << flipped;
  ScopedEnv pkg("WARDEN_PACKAGE", package.c_str());
  {
    ScopedEnv key("WARDEN_CACHE_KEY_FILE", key_file.c_str());
    ScopedCacheDir cache;
    testing::internal::CaptureStderr();
    const std::string origins = Joined(RunWorkload());
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_THAT(origins, HasSubstr("compiled; package entry rejected (digest"));
    EXPECT_EQ(std::count(origins.begin(), origins.end(), '\n'), 3);
    EXPECT_THAT(err, HasSubstr("package entry rejected"));
  }
  std::ofstream(package, std::ios::binary | std::ios::trunc) << bytes;
  {
    ScopedEnv key("WARDEN_CACHE_KEY_FILE", WriteKey(work.path(), "not the robot fleet's secret").c_str());
    ScopedCacheDir cache;
    testing::internal::CaptureStderr();
    EXPECT_EQ(Joined(RunWorkload()).find("package hit"), std::string::npos);
    EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("tag: does not verify"));
  }
  {
    ScopedEnv no_key("WARDEN_CACHE_KEY_FILE", nullptr);
    ScopedEnv opt_in("WARDEN_CACHE_UNAUTHENTICATED", "1");
    chmod(package.c_str(), 0666);
    ScopedCacheDir cache;
    testing::internal::CaptureStderr();
    EXPECT_EQ(Joined(RunWorkload()).find("package hit"), std::string::npos);
    EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("writable by group or others"));
  }
}

}  // namespace
}  // namespace warden
