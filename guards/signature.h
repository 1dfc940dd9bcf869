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

// HashCall with a plan: the same values in the same order, and the same hash.
uint64_t HashCall(const ProbePlan& plan, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept;

// Hot path. Budget: one read and one multiply per probe; no allocation, no throw. Probes of
// arguments that are missing or of another type hash a sentinel, so they never match by accident
// more than a hash collision would (and the guard program rejects those).
// Writes the probed value of each mask entry to values[0..mask.size()) and returns their hash.
uint64_t HashCall(const std::vector<Probe>& mask, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept;

}  // namespace warden::guards

#endif  // WARDEN_GUARDS_SIGNATURE_H_
