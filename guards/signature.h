// Guard signatures: the part of a guard program that is an exact match on one property (argument
// count and types, dtypes, ranks, static sizes, scalar values). Entries with the same set of
// matched properties (the same mask) are found by hashing those properties of a call, so cache
// lookup does not grow with the number of entries; the full guard program then confirms the
// candidate (hash collisions, relations, >= 2 bounds).
#ifndef WARDEN_GUARDS_SIGNATURE_H_
#define WARDEN_GUARDS_SIGNATURE_H_

#include <cstdint>
#include <vector>

#include <ATen/core/ivalue.h>

#include "guards/guard.h"

namespace warden::guards {

struct Probe {
  GuardKind kind;
  int32_t arg;
  int32_t dim;
  friend bool operator==(const Probe& a, const Probe& b) {
    return a.kind == b.kind && a.arg == b.arg && a.dim == b.dim;
  }
};

struct Signature {
  std::vector<Probe> mask;       // by argument, then kind and dim
  std::vector<int64_t> values;   // the expected value of each probe
  uint64_t key = 0;              // hash of `values`, as HashCall computes it for a match
};

// The signature of a guard list.
Signature SignatureOf(const std::vector<Guard>& guards);

// A mask compiled for the hot path: one record per argument (what to read of it) and the dims
// whose sizes are keyed, so an argument is loaded once and no switch runs per probe.
struct ProbePlan {
  struct Arg {
    int32_t arg;         // -1: the argument count
    uint8_t flags;       // kType | kDtype | kRank | kInt | kDouble | kBool
    uint16_t first_dim;  // into dims
    uint16_t num_dims;
  };
  enum : uint8_t { kType = 1, kDtype = 2, kRank = 4, kInt = 8, kDouble = 16, kBool = 32 };
  std::vector<Arg> args;
  std::vector<int32_t> dims;
  size_t num_values = 0;
};
ProbePlan PlanOf(const std::vector<Probe>& mask);

// The value HashCall reads for one probe (kMissing-like sentinels for missing or mistyped
// arguments, as HashCall).
int64_t ProbeValue(const Probe& p, const c10::IValue* args, size_t num_args) noexcept;

// HashCall with a plan: the same values in the same order, and the same hash.
uint64_t HashCall(const ProbePlan& plan, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept;

// Hot path. Budget: one read and one multiply per probe; no allocation, no throw. Probes of
// arguments that are missing or of another type hash a sentinel, so they never match by accident
// more than a hash collision would (and the guard program rejects those).
// Writes the probed value of each mask entry to values[0..mask.size()) and returns their hash.
uint64_t HashCall(const std::vector<Probe>& mask, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept;

// The signatures of one mask (a cache's entries with the same keyed properties), found by the
// values of only the probes on which they differ: for one signature, or several that differ in
// one size, a lookup hashes nothing or one value. Candidates are not confirmed: the caller checks
// each one's guards in full (HitCheck), so a hash collision costs a check, never a wrong hit, and
// every signature whose values a call matches is among its candidates.
class SignatureIndex {
 public:
  SignatureIndex() = default;
  // All of `signatures` have the same mask. Candidates are positions in `signatures`.
  explicit SignatureIndex(const std::vector<const Signature*>& signatures);

  struct Range {
    const uint32_t* begin;
    const uint32_t* end;
  };
  // Positions of the signatures whose differing probes hash as the call's do, in the order given.
  // Hot path: no allocation, no throw.
  Range Candidates(const c10::IValue* args, size_t num_args) const noexcept {
    if (slots_.empty()) return {ids_.data(), ids_.data() + ids_.size()};
    return Lookup(args, num_args);
  }

  size_t num_probes() const { return plan_.num_values; }  // the differing probes (tests)

 private:
  Range Lookup(const c10::IValue* args, size_t num_args) const noexcept;

  struct Slot {
    uint64_t key;
    uint32_t begin, end;  // into ids_; begin == end: empty
  };
  size_t SlotOf(uint64_t key) const { return static_cast<size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_); }

  ProbePlan plan_;             // the differing probes
  bool single_ = false;        // exactly one: its value is the key
  Probe probe_{};              // that probe
  std::vector<uint32_t> ids_;  // grouped by key, in the given order within a key
  std::vector<Slot> slots_;    // open addressing, a power of two long; empty when plan_ is
  uint64_t slot_mask_ = 0;
  int shift_ = 63;
};

}  // namespace warden::guards

#endif  // WARDEN_GUARDS_SIGNATURE_H_
