// The compiled guard program of one cache entry: a flat array of instructions evaluated against the
// argument list. Check() is the hot path and only says yes or no; FirstFailure() is the separate,
// slow path that explains a miss with the reason texts of guards/guard.h.
#ifndef WARDEN_GUARDS_EVALUATOR_H_
#define WARDEN_GUARDS_EVALUATOR_H_

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "guards/guard.h"

namespace warden::guards {

// A kArgIdentity guard compiled for the hot path (Note [Argument identity] in guards/builder.cc):
// the tensor arguments' positions and, per position, the position of the first one that is the
// same tensor object (itself when none is).
struct IdentityCheck {
  std::vector<int32_t> args;
  std::vector<int32_t> first;
  bool all_distinct = true;

  static IdentityCheck Of(const std::vector<int32_t>& same_as);
  // Hot path: no allocation, lock or throw; the arguments' types were checked before.
  bool Holds(const c10::IValue* args) const noexcept;
};

class GuardProgram {
 public:
  GuardProgram() = default;
  // Orders guards cheapest first (the kind table's order, then by argument and dim) and flattens
  // them into instructions.
  explicit GuardProgram(std::vector<Guard> guards);

  // Hot path. Budget: about 1 ns per instruction; must not allocate, lock, throw or make a
  // virtual call for ordinary (non-subclassed) tensors.
  bool Check(const c10::IValue* args, size_t num_args) const noexcept;
  bool Check(const std::vector<c10::IValue>& args) const noexcept {
    return Check(args.data(), args.size());
  }

  // Slow path: the reason text of the first failing guard, "" if all hold.
  std::string FirstFailure(const std::vector<c10::IValue>& args,
                           const std::vector<std::string>& names) const;

  const std::vector<Guard>& guards() const { return guards_; }
  size_t size() const { return code_.size(); }

 private:
  struct Instr {
    uint8_t op;  // a GuardKind
    int32_t arg;
    int32_t aux;       // dim for kSize/kStride, other argument for kAliasing
    int64_t expected;  // kDoubleValue: the bit pattern of the double
  };
  struct Relation {
    tracer::SymExpr lhs, rhs;
    std::vector<std::pair<int, int>> symbols;  // (arg, dim) of each expression symbol
  };
  // kCapturedTensor: one captured tensor's metadata as the trace found it, packed.
  struct Captured {
    const c10::TensorImpl* impl;  // kept alive by guards_
    caffe2::TypeMeta dtype;
    c10::Device device;
    uint64_t keys;
    bool requires_grad;
    int32_t rank;                 // -1: sizes, strides and offset not guarded (not plain)
    int64_t storage_offset;
    std::vector<int64_t> sizes_strides;  // rank sizes, then rank strides
  };
  static bool CapturedHolds(const Captured& c) noexcept;

  // Relations evaluate with symbol values on the stack up to this many symbols, in a per-thread
  // buffer beyond.
  static constexpr size_t kStackSymbols = 32;

  std::vector<Guard> guards_;  // in evaluation order; code_[i] comes from guards_[i]
  std::vector<Instr> code_;
  std::vector<Relation> relations_;
  std::vector<IdentityCheck> identities_;
  std::vector<Captured> captured_;
};

// The hit path's check of one cache entry: every guard of the entry, the common ones compiled to
// one record per tensor argument (type, dtype, device, layout, requires_grad, rank and size
// bounds, read from the TensorImpl once, no hashing), grad mode and inference mode from one read of
// c10::AutogradState, the thread's dispatch-key words from one read of the TLS, and the rest (strides, relations, scalar values, aliasing, default dtype,
// non-tensor types) in a GuardProgram run after the records. Check() accepts exactly what
// GuardProgram(guards).Check() accepts.
class HitCheck {
 public:
  HitCheck() = default;
  explicit HitCheck(const std::vector<Guard>& guards);

  // Hot path: no allocation, lock or throw; the only calls are the autograd metadata's
  // requires_grad() for tensors that have one (Note [Inline requires_grad]) and the autograd TLS
  // read.
  bool Check(const c10::IValue* args, size_t num_args) const noexcept;
  bool Check(const std::vector<c10::IValue>& args) const noexcept { return Check(args.data(), args.size()); }

  size_t num_tensor_records() const { return tensors_.size() + words_.size(); }
  // Records checked as words of the TensorImpl (Note [Word records] in guards/evaluator.cc).
  size_t num_word_records() const { return words_.size(); }
  // How an all-distinct identity guard is checked in the record loop (Note [Argument identity] in
  // guards/evaluator.cc): not there, pairwise (up to 8 records) or hashed (up to 64).
  enum RecordIdentity : uint8_t { kNoRecordIdentity, kPairwiseRecordIdentity, kHashedRecordIdentity };
  RecordIdentity record_identity() const { return record_identity_; }
  // Whether this LibTorch's TensorImpl admits word records (found once per process).
  static bool WordRecordsSupported();
  const GuardProgram& rest() const { return rest_; }

 private:
  // The sizes a dim may have: size - lo, as unsigned, is <= span ([lo, lo + span]). A record has
  // one per dim of its guarded rank ([0, INT64_MAX] where no size is guarded).
  struct DimBound {
    uint64_t lo;
    uint64_t span;
  };
  // Ranks up to this with every size exact keep their sizes in the record (Note [Lean records]).
  static constexpr int32_t kExactDims = 4;
  struct TensorRecord {
    int32_t arg;
    uint32_t position;        // in the identity set (Note [Argument identity])
    uint32_t first_bound;     // into bounds_; `rank` of them when rank >= 0 and not exact
    int32_t rank;             // -1: not guarded (then no size is)
    caffe2::TypeMeta dtype;   // never Undefined, so an undefined tensor fails here
    uint16_t device;          // DeviceBits of the kDevice guard
    int8_t layout;
    bool requires_grad;
    bool leaf;                // requires_grad: is a leaf (Note [Leaf guard] in guards/builder.cc)
    bool check_keys;          // a kDispatchKeys guard (Note [Dispatch keys])
    bool exact;               // 0 <= rank <= kExactDims and every size exact: in dims
    uint64_t keys;
    int64_t dims[kExactDims];
  };
  // Note [Word records]: a record whose every guard can be read as words of the TensorImpl.
  struct WordRecord {
    uint32_t arg_offset;  // the argument's byte offset in the argument array
    int16_t rank;         // 0..kExactDims, every size exact
    uint16_t position;    // in the identity set (Note [Argument identity])
    uint64_t keys;    // the dispatch key set, raw
    uint64_t window;  // the metadata window's expected bytes (dtype, device; policy bits zero)
    int64_t dims[kExactDims];
  };
  std::vector<WordRecord> words_;  // by rank: words_[rank_end_[r - 1], rank_end_[r]) have rank r
  uint32_t rank_end_[kExactDims + 1] = {};
  uint32_t word_ranks_ = 0;  // bit r: some word record has rank r
  // The word records of rank kRank; each one's TensorImpl goes to `identity` (Note [Argument
  // identity] in guards/evaluator.cc).
  template <int kRank, class Identity>
  bool WordsHold(const c10::IValue* args, Identity& identity) const noexcept;
  // Every record, then the identity set's verdict.
  template <class Identity>
  bool RecordsHold(const c10::IValue* args) const noexcept;
  bool RecordsHoldHashed(const c10::IValue* args) const noexcept;
  ptrdiff_t window_offset_ = 0;  // of the metadata window in a TensorImpl
  uint64_t window_mask_ = 0;     // its bits that are compared
  int64_t arg_count_ = -1;   // -1: not guarded
  int32_t autograd_ = -1;    // grad << 1 | inference; -1: not both guarded (then in rest_)
  bool check_keys_ = false;  // the thread's dispatch-key words (Note [Thread modes]), from one TLS read
  uint64_t included_keys_ = 0, excluded_keys_ = 0;
  size_t min_args_ = 0;      // records index args below this
  std::vector<TensorRecord> tensors_;
  std::vector<DimBound> bounds_;
  // An all-distinct kArgIdentity guard over every record, up to 64 of them, is checked on the
  // pointers the record loop loads: pairwise up to 8, in a table beyond (Note [Argument identity]).
  RecordIdentity record_identity_ = kNoRecordIdentity;
  uint32_t num_records_ = 0;  // words_ and tensors_
  bool check_identity_ = false;  // the kArgIdentity guard, after the records (their types checked)
  IdentityCheck identity_;
  GuardProgram rest_;        // runs after the records, which have checked their arguments' types
};

}  // namespace warden::guards

#endif  // WARDEN_GUARDS_EVALUATOR_H_
