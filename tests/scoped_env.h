// Test helper: sets (or, with nullptr, unsets) an environment variable for a scope and restores
// the previous state afterwards.
#ifndef WARDEN_TESTS_SCOPED_ENV_H_
#define WARDEN_TESTS_SCOPED_ENV_H_

#include <cstdlib>
#include <string>

namespace warden::test_util {

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

}  // namespace warden::test_util

#endif  // WARDEN_TESTS_SCOPED_ENV_H_
