// Note [Reclaiming snapshots] in hazard.h.
#include "runtime/hazard.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace warden::runtime::hazard {

__thread ThreadRecord* tls_record = nullptr;

namespace {

std::atomic<ThreadRecord*> registry{nullptr};

// Gives the record back when its thread exits (a separate thread_local: only registration
// touches it, so the hot path never pays for its destructor).
struct Release {
  ThreadRecord* record = nullptr;
  ~Release() {
    if (record == nullptr) return;
    for (auto& slot : record->slots) slot.store(nullptr, std::memory_order_release);
    record->depth = 0;
    tls_record = nullptr;
    record->in_use.store(false, std::memory_order_release);
  }
};
thread_local Release release;

// membarrier(PRIVATE_EXPEDITED): registered once per process; false if the kernel (or a seccomp
// profile) does not offer it.
bool Membarrier() {
  static const bool registered =
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  return registered && syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
}

}  // namespace

ThreadRecord* RegisterThread() {
  ThreadRecord* r = nullptr;
  for (ThreadRecord* it = registry.load(std::memory_order_acquire); it != nullptr; it = it->next) {
    bool expected = false;
    if (it->in_use.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      r = it;
      break;
    }
  }
  if (r == nullptr) {
    r = new ThreadRecord();
    r->in_use.store(true, std::memory_order_relaxed);
    ThreadRecord* head = registry.load(std::memory_order_relaxed);
    do {
      r->next = head;
    } while (!registry.compare_exchange_weak(head, r, std::memory_order_release, std::memory_order_relaxed));
  }
  r->depth = 0;
  release.record = r;
  tls_record = r;
  return r;
}

bool Scan(const std::atomic<int>& overflow, std::vector<const void*>* protected_values) {
  protected_values->clear();
  if (!Membarrier()) return false;
  if (overflow.load(std::memory_order_seq_cst) != 0) return false;
  for (ThreadRecord* it = registry.load(std::memory_order_acquire); it != nullptr; it = it->next) {
    for (const auto& slot : it->slots) {
      if (const void* p = slot.load(std::memory_order_acquire)) protected_values->push_back(p);
    }
  }
  return true;
}

}  // namespace warden::runtime::hazard
