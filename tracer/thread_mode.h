// The thread-local state an ATen op's result depends on besides its arguments: grad mode and
// inference mode (c10::AutogradState), the thread's included/excluded dispatch keys (autocast,
// InferenceMode's autograd exclusion, below-autograd guards) and autocast's CPU dtype. The tracer
// records it per node where user code changed it inside the traced function (Note [Thread modes]);
// replay re-establishes it around that node; guards compare the state at entry.
#ifndef WARDEN_TRACER_THREAD_MODE_H_
#define WARDEN_TRACER_THREAD_MODE_H_

#include <cstdint>
#include <string>

#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace warden::tracer {

struct ThreadMode {
  bool grad_mode = true;
  bool inference_mode = false;
  bool fw_grad_mode = true;
  // PODLocalDispatchKeySet's raw words (0 and 0 on a thread nobody changed), Warden's trace key
  // removed.
  uint64_t included = 0;
  uint64_t excluded = 0;
  int8_t autocast_cpu_dtype = -1;  // the ScalarType autocast casts CPU ops to, while it is enabled

  bool operator==(const ThreadMode& o) const {
    return grad_mode == o.grad_mode && inference_mode == o.inference_mode && fw_grad_mode == o.fw_grad_mode &&
           included == o.included && excluded == o.excluded && autocast_cpu_dtype == o.autocast_cpu_dtype;
  }
  bool operator!=(const ThreadMode& o) const { return !(*this == o); }

  // The calling thread's state now (not allocation-free: reads autocast's dtype through a call).
  static ThreadMode Current();
  // "grad off", "inference mode, autocast cpu bf16", ... (what differs from a fresh thread).
  std::string Describe() const;
};

// The dispatch-key words of the calling thread: what the hit path compares against
// ThreadMode::included/excluded (an inline TLS read, no call). Outside a trace they never hold
// Warden's trace key (a function called inside another's trace runs inline, not from its cache).
inline const c10::impl::PODLocalDispatchKeySet& CurrentDispatchWords() {
  return c10::impl::raw_local_dispatch_key_set;
}

// autocast's CPU dtype while autocast is enabled on the calling thread, else -1.
int8_t CurrentAutocastCpuDtype();

// "default", "autocast cpu on", "below autograd", "+Key"/"-Key" for other differences: the thread's
// included (`excluded` false) or excluded dispatch-key word as PODLocalDispatchKeySet stores it.
std::string DispatchWordText(uint64_t raw, bool excluded);

// Makes `mode` the calling thread's state for the scope's lifetime (replay of one node recorded
// under a mode the function set), restoring the previous state on exit, also on exceptions.
class ScopedThreadMode {
 public:
  explicit ScopedThreadMode(const ThreadMode& mode);
  ~ScopedThreadMode();
  ScopedThreadMode(const ScopedThreadMode&) = delete;
  ScopedThreadMode& operator=(const ScopedThreadMode&) = delete;

 private:
  c10::AutogradState autograd_;
  c10::impl::PODLocalDispatchKeySet keys_;
  int8_t autocast_dtype_;
};

}  // namespace warden::tracer

#endif  // WARDEN_TRACER_THREAD_MODE_H_
