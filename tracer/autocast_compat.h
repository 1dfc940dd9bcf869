// CPU autocast state across LibTorch versions: 2.4 replaced the per-device functions
// (is_cpu_enabled, get_autocast_cpu_dtype, ...) with ones taking a device type and deprecated the
// old ones (each call warns on stderr).
#pragma once

#include <ATen/autocast_mode.h>

#include "tracer/torch_compat.h"

namespace warden::compat {

inline bool AutocastCpuEnabled() {
#if WARDEN_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(at::kCPU);
#else
  return at::autocast::is_cpu_enabled();
#endif
}

inline void SetAutocastCpuEnabled(bool enabled) {
#if WARDEN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
#else
  at::autocast::set_cpu_enabled(enabled);
#endif
}

inline at::ScalarType AutocastCpuDtype() {
#if WARDEN_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(at::kCPU);
#else
  return at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void SetAutocastCpuDtype(at::ScalarType dtype) {
#if WARDEN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
  at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

}  // namespace warden::compat
