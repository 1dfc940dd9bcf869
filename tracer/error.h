// warden::Error: the one exception type Warden itself throws (bad arguments, cache limit with
// fail_on_cache_limit, misuse). Errors eager LibTorch raises pass through as the same c10::Error.
#ifndef WARDEN_TRACER_ERROR_H_
#define WARDEN_TRACER_ERROR_H_

#include <stdexcept>
#include <string>

namespace warden {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace warden

#endif  // WARDEN_TRACER_ERROR_H_
