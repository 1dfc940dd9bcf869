// Test helpers for the environment Warden reads: an environment variable set for a scope, a
// temporary directory, a fresh WARDEN_CACHE_DIR, and reading a file whole.
#ifndef WARDEN_TESTS_TEST_ENV_H_
#define WARDEN_TESTS_TEST_ENV_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace warden::test_util {

// Sets (or, with nullptr, unsets) an environment variable for the scope, restoring the previous
// state afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A fresh directory under TEST_TMPDIR (else /tmp), removed with its contents afterwards.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/warden_test_XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// WARDEN_CACHE_DIR set to a fresh directory for the scope.
class ScopedCacheDir {
 public:
  ScopedCacheDir() : env_("WARDEN_CACHE_DIR", dir_.path().c_str()) {}
  const std::string& root() const { return dir_.path(); }
  std::string kernels() const { return root() + "/kernels"; }
  // The files in kernels() whose extension is `extension` (".so", ".cc").
  std::vector<std::string> Files(const std::string& extension) const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(kernels(), ec)) {
      if (e.path().extension() == extension) out.push_back(e.path().string());
    }
    return out;
  }

 private:
  TempDir dir_;  // outlives env_: the variable is restored before the directory goes
  ScopedEnv env_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace warden::test_util

#endif  // WARDEN_TESTS_TEST_ENV_H_
