#include "guards/evaluator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include <ATen/core/Tensor.h>
#include <c10/core/AutogradState.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "tracer/thread_mode.h"

namespace warden::guards {

GuardProgram::GuardProgram(std::vector<Guard> guards) : guards_(std::move(guards)) {
  std::stable_sort(guards_.begin(), guards_.end(), [](const Guard& a, const Guard& b) {
    if (a.kind != b.kind) return a.kind < b.kind;
    if (a.arg != b.arg) return a.arg < b.arg;
    return a.dim < b.dim;
  });
  code_.reserve(guards_.size());
  for (const Guard& g : guards_) {
    Instr in{static_cast<uint8_t>(g.kind), g.arg, g.kind == GuardKind::kAliasing ? g.other_arg : g.dim, g.expected};
    if (g.kind == GuardKind::kDoubleValue) std::memcpy(&in.expected, &g.expected_double, 8);
    if (g.kind == GuardKind::kSizeRelation) {
      in.aux = static_cast<int32_t>(relations_.size());
      relations_.push_back({g.lhs, g.rhs, g.symbols});
    }
    if (g.kind == GuardKind::kArgIdentity) {
      in.aux = static_cast<int32_t>(identities_.size());
      identities_.push_back(IdentityCheck::Of(g.same_as));
    }
    if (g.kind == GuardKind::kCapturedTensor) {
      in.aux = static_cast<int32_t>(captured_.size());
      const CapturedTensor& c = *g.captured;
      Captured r{c.tensor.unsafeGetTensorImpl(), caffe2::TypeMeta::fromScalarType(c.dtype), c.device, c.keys,
                 c.requires_grad, c.plain ? static_cast<int32_t>(c.sizes.size()) : -1, c.storage_offset, c.sizes};
      r.sizes_strides.insert(r.sizes_strides.end(), c.strides.begin(), c.strides.end());
      captured_.push_back(std::move(r));
    }
    code_.push_back(in);
  }
}

namespace {

// Note [Argument identity]: the hot path compares the arguments' TensorImpl pointers. When every
// tensor argument has a record and all must be distinct (the usual case), the record loop hands
// each pointer it loads to an identity set as it goes: up to kPairwiseIdentity pointers are kept
// and compared pairwise at the end without a branch per pair; up to kMaxDistinctPointers each is
// looked up in an open-addressing table on the stack as it comes (one multiply, one load and two
// stores per pointer). Other identity guards (some arguments the same tensor, or arguments without
// a record) run after the records in IdentityCheck::Holds: the same table for all-distinct sets up
// to kMaxDistinctPointers, a table of (pointer, position) up to kHashed, and the pairwise loop on
// the arguments beyond (the stack budget). Any number of arguments is checked exactly.
constexpr size_t kPairwiseIdentity = 8, kMaxDistinctPointers = 64;

// True if two of the n pointers are equal, without a branch per pair: straight-line for the
// usual small counts, the pairs loop beyond.
C10_ALWAYS_INLINE bool AnyTwoEqual(const c10::TensorImpl* const* q, size_t n) noexcept {
  switch (n) {
    case 0:
    case 1:
      return false;
    case 2:
      return q[0] == q[1];
    case 3:
      return (q[0] == q[1]) | (q[0] == q[2]) | (q[1] == q[2]);
    case 4:
      return (q[0] == q[1]) | (q[0] == q[2]) | (q[0] == q[3]) | (q[1] == q[2]) | (q[1] == q[3]) | (q[2] == q[3]);
    default: {
      unsigned same = 0;
      for (size_t k = 1; k < n; ++k) {
        for (size_t p = 0; p < k; ++p) same |= static_cast<unsigned>(q[p] == q[k]);
      }
      return same != 0;
    }
  }
}

// The identity sets of the record loop, for n records: Add(p, position) takes record `position`'s
// pointer (1 <= position <= n, each once) and is false when p was added before, or says nothing
// and Distinct() answers at the end. The position comes from the record, so the loop keeps no
// counter.
struct NoIdentity {
  explicit NoIdentity(size_t) noexcept {}
  C10_ALWAYS_INLINE bool Add(const c10::TensorImpl*, uint32_t) noexcept { return true; }
  C10_ALWAYS_INLINE bool Distinct() const noexcept { return true; }
};

// n <= kPairwiseIdentity, compared at the end.
struct PairwiseIdentity {
  explicit PairwiseIdentity(size_t count) noexcept : n(count) {}
  C10_ALWAYS_INLINE bool Add(const c10::TensorImpl* p, uint32_t position) noexcept {
    seen[position] = p;
    return true;
  }
  C10_ALWAYS_INLINE bool Distinct() const noexcept { return !AnyTwoEqual(seen + 1, n); }
  const c10::TensorImpl* seen[kPairwiseIdentity + 1];  // by position (seen[0] unused)
  size_t n;
};

// n <= kMaxDistinctPointers, each pointer looked up as it is added in an open-addressing table of
// at least 16n slots (a collision in the home slot, a branch the predictor cannot learn, about
// n/32 times per check). Slots hold the position (0: empty), one byte each, so the clear is at
// most 1 KB.
class HashedIdentity {
 public:
  explicit HashedIdentity(size_t n) noexcept
      : shift_(64 - (n <= 16 ? 8 : n <= 32 ? 9 : 10)), mask_((size_t{1} << (64 - shift_)) - 1) {
    std::memset(table_, 0, mask_ + 1);
  }
  C10_ALWAYS_INLINE bool Add(const c10::TensorImpl* p, uint32_t position) noexcept {
    const size_t s = static_cast<size_t>((reinterpret_cast<uintptr_t>(p) * 0x9e3779b97f4a7c15ull) >> shift_);
    seen_[position] = p;
    if (C10_LIKELY(table_[s] == 0)) {
      table_[s] = static_cast<uint8_t>(position);
      return true;
    }
    return AddProbing(p, position, s);
  }
  C10_ALWAYS_INLINE bool Distinct() const noexcept { return true; }

 private:
  static constexpr size_t kMaxSlots = 1024;
  static_assert(kMaxSlots >= 16 * kMaxDistinctPointers, "at least 16 slots per pointer");
  static_assert(kMaxDistinctPointers < 256, "positions fit in a byte");
  // The home slot s is taken: false if p is there or further along the probe sequence.
  C10_NOINLINE bool AddProbing(const c10::TensorImpl* p, uint32_t position, size_t s) noexcept {
    do {
      if (seen_[table_[s]] == p) return false;
      s = (s + 1) & mask_;
    } while (table_[s] != 0);
    table_[s] = static_cast<uint8_t>(position);
    return true;
  }
  const int shift_;
  const size_t mask_;
  alignas(64) uint8_t table_[kMaxSlots];
  const c10::TensorImpl* seen_[kMaxDistinctPointers + 1];  // by position (seen_[0] unused)
};

}  // namespace

IdentityCheck IdentityCheck::Of(const std::vector<int32_t>& same_as) {
  IdentityCheck id;
  for (size_t i = 0; i < same_as.size(); ++i) {
    if (same_as[i] < 0) continue;
    const auto pos = std::find(id.args.begin(), id.args.end(), same_as[i]);
    const int32_t first = static_cast<int32_t>(pos == id.args.end() ? id.args.size() : pos - id.args.begin());
    id.all_distinct = id.all_distinct && first == static_cast<int32_t>(id.args.size());
    id.first.push_back(first);
    id.args.push_back(static_cast<int32_t>(i));
  }
  return id;
}

bool IdentityCheck::Holds(const c10::IValue* values) const noexcept {
  constexpr size_t kPairwise = kPairwiseIdentity, kHashed = 512, kSlots = 2 * kHashed;
  const size_t n = args.size();
  if (all_distinct && n <= kPairwise) {
    PairwiseIdentity set(n);
    for (size_t k = 0; k < n; ++k) set.Add(values[args[k]].unsafeToTensorImpl(), static_cast<uint32_t>(k + 1));
    return set.Distinct();
  }
  if (all_distinct && n <= kMaxDistinctPointers) {
    HashedIdentity set(n);
    for (size_t k = 0; k < n; ++k) {
      if (!set.Add(values[args[k]].unsafeToTensorImpl(), static_cast<uint32_t>(k + 1))) return false;
    }
    return true;
  }
  if (n <= kPairwise) {
    const c10::TensorImpl* impl[kPairwise];
    for (size_t k = 0; k < n; ++k) impl[k] = values[args[k]].unsafeToTensorImpl();
    for (size_t k = 0; k < n; ++k) {
      size_t first = k;
      for (size_t p = k; p-- > 0;) {
        if (impl[p] == impl[k]) first = p;
      }
      if (first != static_cast<size_t>(this->first[k])) return false;
    }
    return true;
  }
  if (n <= kHashed) {
    struct Slot {
      const c10::TensorImpl* impl;
      int32_t pos;
    };
    size_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    Slot table[kSlots];
    std::memset(table, 0, slots * sizeof(Slot));
    const size_t mask = slots - 1;
    for (size_t k = 0; k < n; ++k) {
      const c10::TensorImpl* impl = values[args[k]].unsafeToTensorImpl();
      size_t s = static_cast<size_t>((reinterpret_cast<uintptr_t>(impl) >> 4) * 0x9e3779b97f4a7c15ull >> 32) & mask;
      while (table[s].impl != nullptr && table[s].impl != impl) s = (s + 1) & mask;
      int32_t found = static_cast<int32_t>(k);
      if (table[s].impl == nullptr) {
        table[s] = {impl, found};
      } else {
        found = table[s].pos;
      }
      if (found != first[k]) return false;
    }
    return true;
  }
  for (size_t k = 0; k < n; ++k) {
    const c10::TensorImpl* impl = values[args[k]].unsafeToTensorImpl();
    size_t found = k;
    for (size_t p = 0; p < k; ++p) {
      if (values[args[p]].unsafeToTensorImpl() == impl) {
        found = p;
        break;
      }
    }
    if (found != static_cast<size_t>(first[k])) return false;
  }
  return true;
}

// Note [Captured tensors]: the key set, dtype and requires_grad (which asks the autograd meta when
// there is one) of any captured tensor; device, sizes, strides and offset only of a plain
// TensorImpl, where they are inline field reads that cannot throw.
bool GuardProgram::CapturedHolds(const Captured& c) noexcept {
  const c10::TensorImpl* t = c.impl;
  if (t->key_set().raw_repr() != c.keys || t->dtype() != c.dtype || t->requires_grad() != c.requires_grad) {
    return false;
  }
  // A subclass may compute its device and sizes (and throw); its key set names the backend.
  if (c.rank < 0) return true;
  if (t->device() != c.device) return false;
  if (c.rank == 0) return t->dim() == 0 && t->storage_offset() == c.storage_offset;
  const c10::IntArrayRef sizes = t->sizes();
  if (sizes.size() != static_cast<size_t>(c.rank) || t->storage_offset() != c.storage_offset) return false;
  const c10::IntArrayRef strides = t->strides();
  const int64_t* want = c.sizes_strides.data();
  return std::memcmp(sizes.data(), want, c.rank * sizeof(int64_t)) == 0 &&
         std::memcmp(strides.data(), want + c.rank, c.rank * sizeof(int64_t)) == 0;
}

bool GuardProgram::Check(const c10::IValue* args, size_t num_args) const noexcept {
  // Every instruction after kArgCount may index args; kArgType of an argument precedes its tensor
  // and scalar checks, so the unchecked accessors below see the type they expect.
  for (const Instr& in : code_) {
    switch (static_cast<GuardKind>(in.op)) {
      case GuardKind::kGradMode:
        if (c10::GradMode::is_enabled() != static_cast<bool>(in.expected)) return false;
        break;
      case GuardKind::kInferenceMode:
        if (c10::InferenceMode::is_enabled() != static_cast<bool>(in.expected)) return false;
        break;
      case GuardKind::kDefaultDtype:
        if (static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())) != in.expected)
          return false;
        break;
      case GuardKind::kThreadIncludedKeys:
        if (static_cast<int64_t>(c10::impl::raw_local_dispatch_key_set.included_) != in.expected) return false;
        break;
      case GuardKind::kThreadExcludedKeys:
        if (static_cast<int64_t>(c10::impl::raw_local_dispatch_key_set.excluded_) != in.expected) return false;
        break;
      case GuardKind::kAutocastDtype:
        if (tracer::CurrentAutocastCpuDtype() != in.expected) return false;
        break;
      case GuardKind::kArgCount:
        if (static_cast<int64_t>(num_args) != in.expected) return false;
        break;
      case GuardKind::kArgType: {
        const c10::IValue& v = args[in.arg];
        ArgType t;
        if (v.isTensor()) {
          t = v.unsafeToTensorImpl() == c10::UndefinedTensorImpl::singleton()
                  ? ArgType::kUndefinedTensor
                  : ArgType::kTensor;
        } else if (v.isInt()) {
          t = ArgType::kInt;
        } else if (v.isDouble()) {
          t = ArgType::kDouble;
        } else if (v.isBool()) {
          t = ArgType::kBool;
        } else {
          t = ArgType::kOther;
        }
        if (static_cast<int64_t>(t) != in.expected) return false;
        break;
      }
      case GuardKind::kDispatchKeys:
        if (static_cast<int64_t>(args[in.arg].unsafeToTensorImpl()->key_set().raw_repr()) != in.expected) return false;
        break;
      case GuardKind::kDtype:
        if (static_cast<int64_t>(c10::typeMetaToScalarType(args[in.arg].unsafeToTensorImpl()->dtype())) !=
            in.expected)
          return false;
        break;
      case GuardKind::kDevice: {
        const c10::Device d = args[in.arg].unsafeToTensorImpl()->device();
        const int64_t code = (static_cast<int64_t>(d.type()) << 16) |
                             (static_cast<int64_t>(d.index()) & 0xffff);
        if (code != in.expected) return false;
        break;
      }
      case GuardKind::kLayout:
        if (static_cast<int64_t>(args[in.arg].unsafeToTensorImpl()->layout()) != in.expected)
          return false;
        break;
      case GuardKind::kRequiresGrad:
        if (GradStateOf(args[in.arg].toTensor()) != in.expected) return false;
        break;
      case GuardKind::kRank:
        if (args[in.arg].unsafeToTensorImpl()->dim() != in.expected) return false;
        break;
      case GuardKind::kSize:
        if (args[in.arg].unsafeToTensorImpl()->sizes()[in.aux] != in.expected) return false;
        break;
      case GuardKind::kSizeAtLeast:
        if (args[in.arg].unsafeToTensorImpl()->sizes()[in.aux] < in.expected) return false;
        break;
      case GuardKind::kSizeRelation: {
        // Any number of symbols (cat of many arguments under kDynamic): on the stack up to
        // kStackSymbols, beyond that in a per-thread buffer that only grows (no lock; it
        // allocates the first time a thread sees a relation that large).
        const Relation& r = relations_[in.aux];
        const size_t n = r.symbols.size();
        int64_t stack[kStackSymbols];
        int64_t* values = stack;
        if (n > kStackSymbols) {
          thread_local std::vector<int64_t> large;
          if (large.size() < n) {
            try {
              large.resize(n);
            } catch (...) {
              return false;  // out of memory: a miss, whose slow path reports it
            }
          }
          values = large.data();
        }
        for (size_t k = 0; k < n; ++k) {
          values[k] = args[r.symbols[k].first].unsafeToTensorImpl()->sizes()[r.symbols[k].second];
        }
        int64_t lhs, rhs;
        if (!r.lhs.TryEvaluate(values, &lhs) || !r.rhs.TryEvaluate(values, &rhs) || lhs != rhs) return false;
        break;
      }
      case GuardKind::kStride:
        if (args[in.arg].unsafeToTensorImpl()->strides()[in.aux] != in.expected) return false;
        break;
      case GuardKind::kIntValue:
        if (args[in.arg].toInt() != in.expected) return false;
        break;
      case GuardKind::kDoubleValue: {
        const double d = args[in.arg].toDouble();
        int64_t bits;
        std::memcpy(&bits, &d, 8);
        if (bits != in.expected) {
          double e;
          std::memcpy(&e, &in.expected, 8);
          if (!(std::isnan(d) && std::isnan(e))) return false;
        }
        break;
      }
      case GuardKind::kBoolValue:
        if (args[in.arg].toBool() != static_cast<bool>(in.expected)) return false;
        break;
      case GuardKind::kAliasing: {
        const c10::TensorImpl* a = args[in.arg].unsafeToTensorImpl();
        const c10::TensorImpl* b = args[in.aux].unsafeToTensorImpl();
        const bool shared = a->has_storage() && b->has_storage() &&
                            a->storage().is_alias_of(b->storage());
        if (shared != static_cast<bool>(in.expected)) return false;
        break;
      }
      case GuardKind::kArgIdentity:
        if (!identities_[in.aux].Holds(args)) return false;
        break;
      case GuardKind::kCapturedTensor:
        if (!CapturedHolds(captured_[in.aux])) return false;
        break;
    }
  }
  return true;
}

std::string GuardProgram::FirstFailure(const std::vector<c10::IValue>& args,
                                       const std::vector<std::string>& names) const {
  for (const Guard& g : guards_) {
    std::string reason = FailureReason(g, args, names);
    if (!reason.empty()) return reason;
  }
  return "";
}

// --- HitCheck -------------------------------------------------------------------------------------

namespace {

// The thread's c10::AutogradState. get_tls_state() is an out-of-line call into libc10 that reaches
// its thread_local through __tls_get_addr (~30 instructions per hit); the object's address is
// fixed for the thread's lifetime, so it is looked up once per thread and kept in a __thread slot.
inline const c10::AutogradState& AutogradTls() {
  static __thread const c10::AutogradState* cached = nullptr;
  const c10::AutogradState* state = cached;
  if (__builtin_expect(state == nullptr, 0)) cached = state = &c10::AutogradState::get_tls_state();
  return *state;
}

// Note [Inline requires_grad]
// TensorImpl::requires_grad() is defined out of line in libc10: a call per tensor record, with the
// registers the record loop keeps live spilled around it, for a body that tests autograd_meta_ and,
// only when there is one, asks it. The record loop makes the same test inline. autograd_meta_ is a
// protected member; its member pointer comes from an explicit instantiation, where C++ does not
// check access ([temp.spec.general]), so the offset is the compiler's, from LibTorch's own header,
// and a LibTorch whose member differs fails to compile here rather than reading the wrong field.
struct AutogradMetaMember {
  using type = std::unique_ptr<c10::AutogradMetaInterface> c10::TensorImpl::*;
  friend type MemberPointer(AutogradMetaMember);
};
template <typename Tag, typename Tag::type kMember>
struct ExposeMember {
  friend typename Tag::type MemberPointer(Tag) { return kMember; }
};
template struct ExposeMember<AutogradMetaMember, &c10::TensorImpl::autograd_meta_>;

// TensorImpl::requires_grad(), inline (Note [Inline requires_grad]).
inline bool RequiresGrad(const c10::TensorImpl* t) {
  const std::unique_ptr<c10::AutogradMetaInterface>& meta = t->*MemberPointer(AutogradMetaMember{});
  return meta != nullptr && meta->requires_grad();
}

// Note [Word records]
// Most tensor arguments are plain: an exact dispatch key set without a sparse or mkldnn key, a
// strided layout, every size exact up to kExactDims dims, no requires_grad. Their record is
// checked as a handful of words read straight from the TensorImpl, no accessor branches: the key
// set; the metadata window, 8 bytes from data_type_ that hold the dtype, device_opt_ and the size,
// device and layout policy bits; the sizes' count and the sizes themselves; autograd_meta_. The
// accessors the other records use read the same fields whenever those policy bits are zero
// (sizes(), device() and layout() only leave them when a policy is set), so a word record
// demands the policy bits be zero and is then exactly as strict (stricter for a tensor with a
// custom policy, which misses and is served by the slow path's full program).
// The fields' offsets are the compiler's, from member pointers as in Note [Inline requires_grad].
// The policy bits are bit-fields, which have no member pointer, so they are found once per
// process: a TensorImpl subclass sets each policy through TensorImpl's own setters and the bits
// that changed are the ones to demand zero. If anything does not fit the window (another
// LibTorch's layout), no record is a word record and the accessor path checks them all.
struct DataTypeMember {
  using type = caffe2::TypeMeta c10::TensorImpl::*;
  friend type MemberPointer(DataTypeMember);
};
template struct ExposeMember<DataTypeMember, &c10::TensorImpl::data_type_>;
struct DeviceOptMember {
  using type = c10::optional<c10::Device> c10::TensorImpl::*;
  friend type MemberPointer(DeviceOptMember);
};
template struct ExposeMember<DeviceOptMember, &c10::TensorImpl::device_opt_>;
struct SizesMember {
  using type = c10::impl::SizesAndStrides c10::TensorImpl::*;
  friend type MemberPointer(SizesMember);
};
template struct ExposeMember<SizesMember, &c10::TensorImpl::sizes_and_strides_>;
// The inline sizes of a SizesAndStrides (its first kInlineSizes values; strides follow).
constexpr size_t kInlineSizes = C10_SIZES_AND_STRIDES_MAX_INLINE_SIZE;
struct InlineSizesMember {
  using type = int64_t (c10::impl::SizesAndStrides::*)[kInlineSizes * 2];
  friend type MemberPointer(InlineSizesMember);
};
template struct ExposeMember<InlineSizesMember, &c10::impl::SizesAndStrides::inlineStorage_>;

// A storage-less CPU TensorImpl that can set its own policies (the setters are protected in 2.x).
class PolicyProbe final : public c10::TensorImpl {
 public:
  PolicyProbe()
      : c10::TensorImpl(c10::DispatchKeySet(c10::DispatchKey::CPU), caffe2::TypeMeta::Make<float>(),
                        c10::Device(c10::kCPU)) {}
  void SetPolicy(int which) {
    switch (which) {
      case 0: set_custom_sizes_strides(SizesStridesPolicy::CustomStrides); break;
      case 1: set_custom_sizes_strides(SizesStridesPolicy::CustomSizes); break;
      case 2: set_custom_device(true); break;
      default: set_custom_layout(true); break;
    }
  }
};
constexpr int kPolicies = 4;

// The window starts at data_type_, so the dtype is its first two bytes.
struct MetadataWindow {
  bool ok = false;
  ptrdiff_t offset = 0;
  uint64_t mask = 0;       // dtype and device bytes, policy bits
  ptrdiff_t device_at = 0;  // device_opt_, within the window
};

// The byte range [at, at + size) of the window, or false if it is outside.
bool MarkBytes(ptrdiff_t at, size_t size, uint64_t* mask) {
  if (at < 0 || at + static_cast<ptrdiff_t>(size) > 8) return false;
  for (size_t b = 0; b < size; ++b) *mask |= uint64_t{0xff} << (8 * (at + static_cast<ptrdiff_t>(b)));
  return true;
}

MetadataWindow FindMetadataWindow() {
  MetadataWindow w;
  const c10::intrusive_ptr<PolicyProbe> probe = c10::make_intrusive<PolicyProbe>();
  const char* base = reinterpret_cast<const char*>(probe.get());
  w.offset = reinterpret_cast<const char*>(&(probe.get()->*MemberPointer(DataTypeMember{}))) - base;
  w.device_at = reinterpret_cast<const char*>(&(probe.get()->*MemberPointer(DeviceOptMember{}))) - base - w.offset;
  constexpr size_t kImpl = sizeof(c10::TensorImpl);
  if (w.offset < 0 || w.offset + 8 > static_cast<ptrdiff_t>(kImpl) || sizeof(c10::optional<c10::Device>) != 3 ||
      sizeof(caffe2::TypeMeta) != 2 || !MarkBytes(0, 2, &w.mask) || !MarkBytes(w.device_at, 3, &w.mask)) {
    return w;
  }
  for (int which = 0; which < kPolicies; ++which) {
    const c10::intrusive_ptr<PolicyProbe> p = c10::make_intrusive<PolicyProbe>();
    unsigned char before[kImpl], after[kImpl];
    std::memcpy(before, static_cast<const void*>(p.get()), kImpl);
    p->SetPolicy(which);
    std::memcpy(after, static_cast<const void*>(p.get()), kImpl);
    bool changed = false;
    for (size_t b = 0; b < kImpl; ++b) {
      const unsigned bits = before[b] ^ after[b];
      if (bits == 0) continue;
      const ptrdiff_t at = static_cast<ptrdiff_t>(b) - w.offset;
      if (at < 0 || at >= 8) return w;  // a policy bit outside the window
      w.mask |= static_cast<uint64_t>(bits) << (8 * at);
      changed = true;
    }
    if (!changed) return w;
  }
  w.ok = true;
  return w;
}

const MetadataWindow& Window() {
  static const MetadataWindow window = FindMetadataWindow();
  return window;
}

// The window's expected bytes for a tensor of this dtype on this device, policies zero.
uint64_t WindowBytes(const MetadataWindow& w, caffe2::TypeMeta dtype, c10::Device device) {
  unsigned char bytes[8] = {};
  std::memcpy(bytes, &dtype, sizeof(dtype));
  const c10::optional<c10::Device> opt = device;
  std::memcpy(bytes + w.device_at, static_cast<const void*>(&opt), sizeof(opt));
  uint64_t word;
  std::memcpy(&word, bytes, 8);
  return word & w.mask;
}

// A device as two bytes (type, index), as the record compares it.
inline uint16_t DeviceBits(c10::Device d) {
  return static_cast<uint16_t>(static_cast<uint8_t>(d.type()) |
                               (static_cast<uint16_t>(static_cast<uint8_t>(d.index())) << 8));
}

// The guards of one argument that a tensor record can hold.
bool IsRecordKind(GuardKind k) {
  switch (k) {
    case GuardKind::kArgType:
    case GuardKind::kDispatchKeys:
    case GuardKind::kDtype:
    case GuardKind::kDevice:
    case GuardKind::kLayout:
    case GuardKind::kRequiresGrad:
    case GuardKind::kRank:
    case GuardKind::kSize:
    case GuardKind::kSizeAtLeast:
      return true;
    default:
      return false;
  }
}

// The guards of one tensor argument that its record would hold.
struct RecordParts {
  const Guard* type = nullptr;
  const Guard* keys = nullptr;  // optional (the builder always emits it)
  const Guard* dtype = nullptr;
  const Guard* device = nullptr;
  const Guard* layout = nullptr;
  const Guard* requires_grad = nullptr;
  const Guard* rank = nullptr;
  std::vector<const Guard*> sizes;
  int count = 0;  // record-kind guards of the argument
};

constexpr int64_t kMaxRecordRank = 64;

// The size range per dim, or false if the guards cannot be one record (no rank guard, a dim out of
// range, contradictory bounds): the argument's guards then stay in the program.
bool DimRanges(const RecordParts& p, std::vector<std::pair<int64_t, int64_t>>* ranges) {
  if (p.rank == nullptr) return p.sizes.empty();
  if (p.rank->expected < 0 || p.rank->expected > kMaxRecordRank) return false;
  ranges->assign(static_cast<size_t>(p.rank->expected), {0, INT64_MAX});
  for (const Guard* g : p.sizes) {
    if (g->dim < 0 || g->dim >= p.rank->expected || g->expected < 0) return false;
    auto& [lo, hi] = (*ranges)[g->dim];
    lo = std::max(lo, g->expected);
    if (g->kind == GuardKind::kSize) hi = std::min(hi, g->expected);
    if (lo > hi) return false;
  }
  return true;
}

bool Recordable(const RecordParts& p) {
  // Exactly one guard of each metadata kind (a second, contradictory one would be lost).
  const int singles = 5 + (p.rank != nullptr ? 1 : 0) + (p.keys != nullptr ? 1 : 0);
  if (p.type == nullptr || p.type->expected != static_cast<int64_t>(ArgType::kTensor) || p.dtype == nullptr ||
      p.device == nullptr || p.layout == nullptr || p.requires_grad == nullptr ||
      p.count != singles + static_cast<int>(p.sizes.size())) {
    return false;
  }
  const int64_t device_type = p.device->expected >> 16;
  const int64_t device_index = static_cast<int16_t>(p.device->expected & 0xffff);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  return p.dtype->expected >= 0 && p.dtype->expected < static_cast<int64_t>(c10::ScalarType::Undefined) &&
         p.layout->expected >= INT8_MIN && p.layout->expected <= INT8_MAX && device_type >= INT8_MIN &&
         device_type <= INT8_MAX && device_index >= INT8_MIN && device_index <= INT8_MAX &&
         (p.device->expected & 0xffff) == (static_cast<int64_t>(device_index) & 0xffff) &&
         DimRanges(p, &ranges);
}

// The identity guard can run right after the records when every argument it reads has one (its
// type is then checked); otherwise it stays in the program, after the type guards.
bool IdentityArgsRecorded(const Guard& g, const std::map<int, RecordParts>& parts) {
  for (size_t i = 0; i < g.same_as.size(); ++i) {
    if (g.same_as[i] < 0) continue;
    auto it = parts.find(static_cast<int>(i));
    if (it == parts.end() || !Recordable(it->second)) return false;
  }
  return true;
}

}  // namespace

HitCheck::HitCheck(const std::vector<Guard>& guards) {
  // An argument gets a record when it is guarded to be a tensor with its dtype, device, layout and
  // requires_grad (the builder always guards these together); its record-kind guards then all live
  // in the record. Everything else goes to rest_.
  std::map<int, RecordParts> parts;
  const Guard* grad = nullptr;
  const Guard* inference = nullptr;
  const Guard* included = nullptr;
  const Guard* excluded = nullptr;
  for (const Guard& g : guards) {
    if (g.kind == GuardKind::kGradMode) grad = &g;
    if (g.kind == GuardKind::kInferenceMode) inference = &g;
    if (g.kind == GuardKind::kThreadIncludedKeys) included = &g;
    if (g.kind == GuardKind::kThreadExcludedKeys) excluded = &g;
    if (g.arg < 0 || !IsRecordKind(g.kind)) continue;
    RecordParts& p = parts[g.arg];
    ++p.count;
    switch (g.kind) {
      case GuardKind::kArgType: p.type = &g; break;
      case GuardKind::kDispatchKeys: p.keys = &g; break;
      case GuardKind::kDtype: p.dtype = &g; break;
      case GuardKind::kDevice: p.device = &g; break;
      case GuardKind::kLayout: p.layout = &g; break;
      case GuardKind::kRequiresGrad: p.requires_grad = &g; break;
      case GuardKind::kRank: p.rank = &g; break;
      default: p.sizes.push_back(&g); break;
    }
  }
  const MetadataWindow& window = Window();
  window_offset_ = window.offset;
  window_mask_ = window.mask;
  const uint64_t layout_keys = (c10::sparse_ks | c10::sparse_csr_ks | c10::mkldnn_ks).raw_repr();
  for (const auto& [arg, p] : parts) {
    if (!Recordable(p)) continue;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    DimRanges(p, &ranges);
    TensorRecord r;
    r.arg = arg;
    r.first_bound = static_cast<uint32_t>(bounds_.size());
    r.rank = p.rank != nullptr ? static_cast<int32_t>(p.rank->expected) : -1;
    r.dtype = caffe2::TypeMeta::fromScalarType(static_cast<c10::ScalarType>(p.dtype->expected));
    r.device = DeviceBits(c10::Device(static_cast<c10::DeviceType>(p.device->expected >> 16),
                                      static_cast<c10::DeviceIndex>(p.device->expected & 0xffff)));
    r.layout = static_cast<int8_t>(p.layout->expected);
    r.requires_grad = p.requires_grad->expected != 0;
    r.leaf = p.requires_grad->expected != 2;
    r.check_keys = p.keys != nullptr;
    r.keys = p.keys != nullptr ? static_cast<uint64_t>(p.keys->expected) : 0;
    r.exact = r.rank >= 0 && r.rank <= kExactDims &&
              std::all_of(ranges.begin(), ranges.end(), [](const auto& b) { return b.first == b.second; });
    std::fill(std::begin(r.dims), std::end(r.dims), 0);
    if (r.exact) {
      for (size_t d = 0; d < ranges.size(); ++d) r.dims[d] = ranges[d].first;
    } else {
      for (const auto& [lo, hi] : ranges) {
        bounds_.push_back({static_cast<uint64_t>(lo), static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo)});
      }
    }
    min_args_ = std::max(min_args_, static_cast<size_t>(arg) + 1);
    // Note [Word records]: a plain strided key set (its layout follows from the keys).
    if (window.ok && r.check_keys && r.exact && !r.requires_grad && r.layout == static_cast<int8_t>(c10::kStrided) &&
        (r.keys & layout_keys) == 0 && static_cast<uint64_t>(arg) < (uint64_t{1} << 26)) {
      WordRecord w{static_cast<uint32_t>(r.arg) * static_cast<uint32_t>(sizeof(c10::IValue)), static_cast<int16_t>(r.rank), 0, r.keys,
                   WindowBytes(window, r.dtype,
                               c10::Device(static_cast<c10::DeviceType>(p.device->expected >> 16),
                                           static_cast<c10::DeviceIndex>(p.device->expected & 0xffff))),
                   {}};
      std::copy(std::begin(r.dims), std::end(r.dims), std::begin(w.dims));
      words_.push_back(w);
      continue;
    }
    tensors_.push_back(r);
  }
  const bool fuse_autograd = grad != nullptr && inference != nullptr;
  if (fuse_autograd) autograd_ = (grad->expected ? 2 : 0) | (inference->expected ? 1 : 0);
  const bool fuse_keys = included != nullptr && excluded != nullptr;
  if (fuse_keys) {
    check_keys_ = true;
    included_keys_ = static_cast<uint64_t>(included->expected);
    excluded_keys_ = static_cast<uint64_t>(excluded->expected);
  }
  std::vector<Guard> rest;
  for (const Guard& g : guards) {
    if (fuse_autograd && (&g == grad || &g == inference)) continue;
    if (fuse_keys && (&g == included || &g == excluded)) continue;
    if (g.kind == GuardKind::kArgCount && arg_count_ < 0) {
      arg_count_ = g.expected;
      continue;
    }
    if (g.kind == GuardKind::kArgIdentity && !check_identity_ && record_identity_ == kNoRecordIdentity &&
        IdentityArgsRecorded(g, parts)) {
      identity_ = IdentityCheck::Of(g.same_as);
      // All distinct and every tensor argument a record: the record loop compares them.
      const size_t records = tensors_.size() + words_.size();
      if (identity_.all_distinct && identity_.args.size() == records && records <= kMaxDistinctPointers) {
        record_identity_ = records <= kPairwiseIdentity ? kPairwiseRecordIdentity : kHashedRecordIdentity;
      } else {
        check_identity_ = true;
      }
      continue;
    }
    if (g.arg >= 0 && IsRecordKind(g.kind) && Recordable(parts.at(g.arg))) continue;
    rest.push_back(g);
  }
  rest_ = GuardProgram(std::move(rest));
  std::stable_sort(words_.begin(), words_.end(), [](const WordRecord& a, const WordRecord& b) { return a.rank < b.rank; });
  for (int32_t rank = 0; rank <= kExactDims; ++rank) {
    rank_end_[rank] = static_cast<uint32_t>(
        std::count_if(words_.begin(), words_.end(), [rank](const WordRecord& w) { return w.rank <= rank; }));
    if (rank_end_[rank] != (rank == 0 ? 0 : rank_end_[rank - 1])) word_ranks_ |= 1u << rank;
  }
  // Note [Argument identity]: each record's position in the identity set (capped: positions are
  // only read when there are at most kMaxDistinctPointers records).
  num_records_ = static_cast<uint32_t>(words_.size() + tensors_.size());
  uint32_t position = 0;
  for (WordRecord& w : words_) w.position = static_cast<uint16_t>(std::min<uint32_t>(++position, UINT16_MAX));
  for (TensorRecord& r : tensors_) r.position = ++position;
}

// Note [Word records]: one rank's records, its sizes compared without a branch per dim.
template <int kRank, class Identity>
C10_ALWAYS_INLINE bool HitCheck::WordsHold(const c10::IValue* args, Identity& identity) const noexcept {
  static_assert(kRank <= kExactDims && kExactDims < kInlineSizes, "a word record's exact sizes are inline");
  const WordRecord* r = words_.data() + (kRank == 0 ? 0 : rank_end_[kRank - 1]);
  const WordRecord* const end = words_.data() + rank_end_[kRank];
  const ptrdiff_t window_offset = window_offset_;
  const uint64_t window_mask = window_mask_;
  const char* const arg_bytes = reinterpret_cast<const char*>(args);
  for (; r != end; ++r) {
    const c10::IValue& v = *reinterpret_cast<const c10::IValue*>(arg_bytes + r->arg_offset);
    if (!v.isTensor()) return false;
    const c10::TensorImpl* t = v.unsafeToTensorImpl();
    uint64_t window;
    std::memcpy(&window, reinterpret_cast<const char*>(t) + window_offset, 8);
    const c10::impl::SizesAndStrides& ss = t->*MemberPointer(SizesMember{});
    uint64_t diff = (t->key_set().raw_repr() ^ r->keys) | ((window ^ r->window) & window_mask) |
                    (static_cast<uint64_t>(ss.size()) ^ static_cast<uint64_t>(kRank));
    // When the count is kRank (< kInlineSizes) the sizes are inline; when it is not, diff is
    // already nonzero and what is read (inside the object) does not matter.
    const int64_t* sizes = ss.*MemberPointer(InlineSizesMember{});
    for (int d = 0; d < kRank; ++d) diff |= static_cast<uint64_t>(sizes[d] ^ r->dims[d]);
    // One branch for the metadata and the autograd meta's presence (Note [Inline requires_grad]).
    const c10::AutogradMetaInterface* meta = (t->*MemberPointer(AutogradMetaMember{})).get();
    if (C10_UNLIKELY((diff | reinterpret_cast<uintptr_t>(meta)) != 0)) {
      if (diff != 0 || meta->requires_grad()) return false;
    }
    if (!identity.Add(t, r->position)) return false;
  }
  return true;
}

// Note [Lean records]
// The record loop is the part of a hit that grows with the arguments, so each record is checked
// with as few instructions as the TensorImpl's public accessors allow: the key set first (Note
// [Dispatch keys]), the TensorImpl pointer handed to the identity set whatever the record's kind,
// exact sizes up to kExactDims compared from the record itself with one branch for all of them,
// a strided layout compared against the constant (two tests on the inline path), and only then
// requires_grad (Note [Inline requires_grad]). Every guard of the record is still checked on every hit.
template <class Identity>
C10_ALWAYS_INLINE bool HitCheck::RecordsHold(const c10::IValue* args) const noexcept {
  Identity identity(num_records_);
  // Note [Word records]
  static_assert(kExactDims == 4, "one WordsHold per rank");
  const unsigned ranks = word_ranks_;
  if (((ranks & 1u) && !WordsHold<0>(args, identity)) || ((ranks & 2u) && !WordsHold<1>(args, identity)) ||
      ((ranks & 4u) && !WordsHold<2>(args, identity)) || ((ranks & 8u) && !WordsHold<3>(args, identity)) ||
      ((ranks & 16u) && !WordsHold<4>(args, identity))) {
    return false;
  }
  for (const TensorRecord& r : tensors_) {
    const c10::IValue& v = args[r.arg];
    if (!v.isTensor()) return false;
    const c10::TensorImpl* t = v.unsafeToTensorImpl();
    // Note [Dispatch keys]: before anything else of the tensor (a nested tensor's sizes() throws).
    if (r.check_keys && t->key_set().raw_repr() != r.keys) return false;
    if (!identity.Add(t, r.position)) return false;
    // The undefined tensor's dtype is Undefined, which no record expects.
    if (t->dtype() != r.dtype) return false;
    if (r.exact) {
      const c10::IntArrayRef sizes = t->sizes();
      if (sizes.size() != static_cast<size_t>(r.rank)) return false;
      uint64_t diff = 0;
      switch (r.rank) {
        case 4: diff |= static_cast<uint64_t>(sizes[3] ^ r.dims[3]); [[fallthrough]];
        case 3: diff |= static_cast<uint64_t>(sizes[2] ^ r.dims[2]); [[fallthrough]];
        case 2: diff |= static_cast<uint64_t>(sizes[1] ^ r.dims[1]); [[fallthrough]];
        case 1: diff |= static_cast<uint64_t>(sizes[0] ^ r.dims[0]); break;
        default: break;
      }
      if (diff != 0) return false;
    } else if (r.rank >= 0) {
      const c10::IntArrayRef sizes = t->sizes();
      if (sizes.size() != static_cast<size_t>(r.rank)) return false;
      const DimBound* b = bounds_.data() + r.first_bound;
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (static_cast<uint64_t>(sizes[d]) - b[d].lo > b[d].span) return false;
      }
    }
    if (r.layout == static_cast<int8_t>(c10::kStrided) ? t->layout() != c10::kStrided
                                                        : static_cast<int8_t>(t->layout()) != r.layout) {
      return false;
    }
    if (DeviceBits(t->device()) != r.device || RequiresGrad(t) != r.requires_grad) return false;
    // Note [Leaf guard]: only tensors that require grad have a leafness to check.
    if (r.requires_grad && v.toTensor().is_leaf() != r.leaf) return false;
  }
  return identity.Distinct();
}

C10_NOINLINE bool HitCheck::RecordsHoldHashed(const c10::IValue* args) const noexcept {
  return RecordsHold<HashedIdentity>(args);
}

bool HitCheck::Check(const c10::IValue* args, size_t num_args) const noexcept {
  if (arg_count_ >= 0 && static_cast<int64_t>(num_args) != arg_count_) return false;
  if (num_args < min_args_) return false;
  if (autograd_ >= 0) {
    const c10::AutogradState& state = AutogradTls();
    const int32_t now = (static_cast<int32_t>(state.get_grad_mode()) << 1) |
                        static_cast<int32_t>(state.get_inference_mode());
    if (now != autograd_) return false;
  }
  if (check_keys_) {
    const c10::impl::PODLocalDispatchKeySet& keys = c10::impl::raw_local_dispatch_key_set;
    if (keys.included_ != included_keys_ || keys.excluded_ != excluded_keys_) return false;
  }
  // Note [Argument identity]: an all-distinct identity guard is checked on the pointers the records load.
  switch (record_identity_) {
    case kPairwiseRecordIdentity:
      if (!RecordsHold<PairwiseIdentity>(args)) return false;
      break;
    case kHashedRecordIdentity:
      // Out of line: the table's kilobyte of stack stays out of the other paths' frame.
      if (!RecordsHoldHashed(args)) return false;
      break;
    default:
      if (!RecordsHold<NoIdentity>(args)) return false;
      break;
  }
  if (check_identity_ && !identity_.Holds(args)) return false;
  return rest_.size() == 0 || rest_.Check(args, num_args);
}

bool HitCheck::WordRecordsSupported() { return Window().ok; }

}  // namespace warden::guards
