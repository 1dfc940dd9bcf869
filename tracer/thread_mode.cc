// Note [Thread modes]
// C++ code changes thread-local state inside a traced function (NoGradGuard around an optimizer
// step, InferenceMode, AutoGradMode, autocast), and that state decides what an op returns: whether
// the result records autograd history, is an inference tensor, or is cast to a lower precision.
// The trace sees only the op calls, so the tracer compares each op's ThreadMode with the one the
// trace began with, and records it on the node where it differs. Replay ("aten" and the unfused
// nodes of "cpp") re-establishes a node's recorded mode around its call, and "cpp" never fuses such
// a node. The state at entry is guarded (grad mode, inference mode, the dispatch-key words and,
// while autocast is on, its dtype), so a recorded mode is exact: replay restores the absolute
// state the node saw, and the state after the node is the caller's again.
#include "tracer/thread_mode.h"

#include <vector>

#include <ATen/autocast_mode.h>
#include <c10/core/DispatchKeySet.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tracer/autocast_compat.h"

namespace warden::tracer {
namespace {

// The key Warden's tracer includes for the duration of a trace (tracer.cc, Note [Capture]).
constexpr c10::DispatchKey kTraceKey = c10::DispatchKey::DeferredInit;

}  // namespace

int8_t CurrentAutocastCpuDtype() {
  return compat::AutocastCpuEnabled() ? static_cast<int8_t>(compat::AutocastCpuDtype()) : -1;
}

namespace {

// What one dispatch-key word (PODLocalDispatchKeySet's raw form) differs in from a fresh thread's:
// "autocast cpu on" (excluded word; left out where the caller names autocast itself), "below
// autograd" (excluded word; left out under inference mode, which excludes the same keys), then
// "+Key" / "-Key" for any other difference.
std::vector<std::string> WordParts(uint64_t raw, bool excluded, bool name_autocast, bool name_below) {
  std::vector<std::string> parts;
  if (raw == 0) return parts;
  const c10::DispatchKeySet defaults = excluded ? c10::default_excluded_set : c10::default_included_set;
  const c10::DispatchKeySet now = c10::DispatchKeySet(c10::DispatchKeySet::RAW, raw) ^ defaults;
  c10::DispatchKeySet added = now - defaults, removed = defaults - now;
  if (excluded && removed.has(c10::DispatchKey::AutocastCPU)) {
    if (name_autocast) parts.push_back("autocast cpu on");
    removed = removed.remove(c10::DispatchKey::AutocastCPU);
  }
  const c10::DispatchKeySet below = c10::autograd_dispatch_keyset_with_ADInplaceOrView;
  if (excluded && (added & below) == below) {
    if (name_below) parts.push_back("below autograd");
    added = added - below;
  }
  for (c10::DispatchKey k : added) parts.push_back(absl::StrCat("+", c10::toString(k)));
  for (c10::DispatchKey k : removed) parts.push_back(absl::StrCat("-", c10::toString(k)));
  return parts;
}

}  // namespace

std::string DispatchWordText(uint64_t raw, bool excluded) {
  const std::vector<std::string> parts = WordParts(raw, excluded, /*name_autocast=*/true, /*name_below=*/true);
  return parts.empty() ? "default" : absl::StrJoin(parts, ", ");
}

ThreadMode ThreadMode::Current() {
  ThreadMode m;
  const c10::AutogradState& a = c10::AutogradState::get_tls_state();
  m.grad_mode = a.get_grad_mode();
  m.inference_mode = a.get_inference_mode();
  m.fw_grad_mode = a.get_fw_grad_mode();
  const c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  c10::impl::PODLocalDispatchKeySet pod;
  pod.set_included(keys.included_.remove(kTraceKey));
  pod.set_excluded(keys.excluded_.remove(kTraceKey));
  m.included = pod.included_;
  m.excluded = pod.excluded_;
  m.autocast_cpu_dtype = CurrentAutocastCpuDtype();
  return m;
}

std::string ThreadMode::Describe() const {
  std::vector<std::string> parts;
  if (!grad_mode) parts.push_back("grad off");
  if (inference_mode) parts.push_back("inference mode");
  if (!fw_grad_mode) parts.push_back("forward grad off");
  if (autocast_cpu_dtype >= 0) {
    parts.push_back(absl::StrCat("autocast cpu ", c10::toString(static_cast<c10::ScalarType>(autocast_cpu_dtype))));
  }
  for (const bool excluded_word : {false, true}) {
    for (std::string& part : WordParts(excluded_word ? excluded : included, excluded_word,
                                       /*name_autocast=*/autocast_cpu_dtype < 0, /*name_below=*/!inference_mode)) {
      parts.push_back(std::move(part));
    }
  }
  return parts.empty() ? "default" : absl::StrJoin(parts, ", ");
}

ScopedThreadMode::ScopedThreadMode(const ThreadMode& mode)
    : autograd_(c10::AutogradState::get_tls_state()),
      keys_(c10::impl::raw_local_dispatch_key_set),
      autocast_dtype_(static_cast<int8_t>(compat::AutocastCpuDtype())) {
  c10::AutogradState a = autograd_;
  a.set_grad_mode(mode.grad_mode);
  a.set_inference_mode(mode.inference_mode);
  a.set_fw_grad_mode(mode.fw_grad_mode);
  c10::AutogradState::set_tls_state(a);
  c10::impl::PODLocalDispatchKeySet pod{mode.included, mode.excluded};
  c10::impl::_force_tls_local_dispatch_key_set(c10::impl::LocalDispatchKeySet(pod));
  if (mode.autocast_cpu_dtype >= 0) {
    compat::SetAutocastCpuDtype(static_cast<at::ScalarType>(mode.autocast_cpu_dtype));
  }
}

ScopedThreadMode::~ScopedThreadMode() {
  c10::AutogradState::set_tls_state(autograd_);
  c10::impl::_force_tls_local_dispatch_key_set(c10::impl::LocalDispatchKeySet(keys_));
  compat::SetAutocastCpuDtype(static_cast<at::ScalarType>(autocast_dtype_));
}

}  // namespace warden::tracer
