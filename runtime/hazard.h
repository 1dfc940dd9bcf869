// Lock-free readers of a published pointer, and safe reclamation of the values it used to hold
// (Note [Reclaiming snapshots]).
//
// Note [Reclaiming snapshots]
// The hot path of a compiled function reads the current Snapshot through one atomic pointer and
// takes no lock; a compile publishes a new Snapshot. The old one may still be in use by a reader,
// so it cannot simply be freed, and keeping every one made memory quadratic in entries. Readers
// announce what they read in hazard slots, and a publisher frees a retired value only when no slot
// holds it:
//   - Each thread owns a record of kSlots slots (registered on its first read, reused after it
//     exits). A reader loads the pointer, stores it in its next slot, and loads the pointer again:
//     if it changed, it retries with the new value. When it is done it clears the slot.
//   - The store/load pair needs a StoreLoad fence, which would cost the hot path ~10 ns. It pays
//     only a compiler barrier: the publisher runs membarrier(PRIVATE_EXPEDITED), a full fence on
//     every running thread of the process, between storing the new pointer and reading the slots
//     (an asymmetric fence). Then any reader either has its slot visible to the scan, or reloads
//     after the new pointer is visible and moves on. Where membarrier is unavailable, nothing is
//     reclaimed (the old behaviour: memory grows, nothing is freed early).
//   - Slot stores are releases and scan loads acquires, so a reader's last access to a value
//     happens-before its reclamation (for ThreadSanitizer, too, which does not model membarrier).
//   - A thread already inside kSlots nested reads (a body that calls compiled functions that call
//     compiled functions ...) counts itself in the domain's `overflow` counter instead; while it is
//     non-zero nothing is reclaimed.
// The publisher must serialize publications (the function's mutex) and may only reclaim values it
// retired itself.
#ifndef WARDEN_RUNTIME_HAZARD_H_
#define WARDEN_RUNTIME_HAZARD_H_

#include <atomic>
#include <cstdint>
#include <vector>

namespace warden::runtime::hazard {

constexpr int kSlots = 8;

struct ThreadRecord {
  std::atomic<const void*> slots[kSlots] = {};
  int depth = 0;  // the owner thread's nesting; only it reads or writes this
  std::atomic<bool> in_use{false};
  ThreadRecord* next = nullptr;  // registry: append-only, never freed
};

// This thread's record, registering one on first use.
ThreadRecord* RegisterThread();
extern __thread ThreadRecord* tls_record;  // __thread: constant-initialized, no TLS wrapper call

// Protects the value of `source` for the reader's scope. `overflow` is the domain's counter of
// readers that ran out of slots.
template <typename T>
class Reader {
 public:
  Reader(const std::atomic<const T*>& source, std::atomic<int>& overflow) {
    ThreadRecord* r = tls_record;
    if (__builtin_expect(r == nullptr, 0)) r = RegisterThread();
    record_ = r;
    slot_ = r->depth;
    if (__builtin_expect(slot_ >= kSlots, 0)) {
      overflow_ = &overflow;
      overflow.fetch_add(1, std::memory_order_seq_cst);
      value_ = source.load(std::memory_order_seq_cst);
      return;
    }
    const T* p = source.load(std::memory_order_acquire);
    for (;;) {
      r->slots[slot_].store(p, std::memory_order_release);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the publisher's membarrier orders it
      const T* q = source.load(std::memory_order_acquire);
      if (q == p) break;
      p = q;
    }
    value_ = p;
    r->depth = slot_ + 1;
  }
  ~Reader() {
    if (__builtin_expect(overflow_ != nullptr, 0)) {
      overflow_->fetch_sub(1, std::memory_order_release);
      return;
    }
    record_->slots[slot_].store(nullptr, std::memory_order_release);
    record_->depth = slot_;
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const T* get() const { return value_; }

 private:
  ThreadRecord* record_;
  int slot_;
  const T* value_;
  std::atomic<int>* overflow_ = nullptr;
};

// Called by the publisher after storing a new value: true if the values in `retired` that no
// reader holds may be freed now, and then `protected_values` holds those still held. False when
// reclamation is impossible right now (no membarrier, or an overflowed reader).
bool Scan(const std::atomic<int>& overflow, std::vector<const void*>* protected_values);

}  // namespace warden::runtime::hazard

#endif  // WARDEN_RUNTIME_HAZARD_H_
