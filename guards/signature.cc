#include "guards/signature.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include <ATen/core/Tensor.h>

namespace warden::guards {
namespace {

constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ull;
constexpr int64_t kMissing = INT64_MIN + 17;

// Per probe only a rotate and an xor (two instructions on the dependency chain); Finish()
// spreads the bits once per call. Collisions only cost a compare: candidates are confirmed by
// their exact values.
inline uint64_t Mix(uint64_t h, int64_t v) {
  return ((h << 7) | (h >> 57)) ^ static_cast<uint64_t>(v);
}

inline uint64_t Finish(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

// Type code as the kArgType guard records it (ArgType), computed without allocation.
int64_t TypeCode(const c10::IValue& v) {
  if (v.isTensor()) {
    return static_cast<int64_t>(v.unsafeToTensorImpl() == c10::UndefinedTensorImpl::singleton()
                                    ? ArgType::kUndefinedTensor
                                    : ArgType::kTensor);
  }
  if (v.isInt()) return static_cast<int64_t>(ArgType::kInt);
  if (v.isDouble()) return static_cast<int64_t>(ArgType::kDouble);
  if (v.isBool()) return static_cast<int64_t>(ArgType::kBool);
  return static_cast<int64_t>(ArgType::kOther);
}

// Bits of a double with every NaN mapped to one key (guards treat all NaNs as equal).
int64_t DoubleKey(double d) {
  if (std::isnan(d)) return 0x7ff8dead7ff8deadll;
  int64_t v;
  std::memcpy(&v, &d, 8);
  return v;
}

}  // namespace

Signature SignatureOf(const std::vector<Guard>& guards) {
  // Probes are ordered by argument so that HashCall reads each argument once.
  std::vector<const Guard*> keyed;
  for (const Guard& g : guards) {
    if (IsKeyed(g.kind)) keyed.push_back(&g);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const Guard* a, const Guard* b) {
    if (a->arg != b->arg) return a->arg < b->arg;
    if (a->kind != b->kind) return a->kind < b->kind;
    return a->dim < b->dim;
  });
  Signature s;
  uint64_t h = kSeed;
  for (const Guard* g : keyed) {
    s.mask.push_back({g->kind, g->arg, g->dim});
    const int64_t v = g->kind == GuardKind::kDoubleValue ? DoubleKey(g->expected_double) : g->expected;
    s.values.push_back(v);
    h = Mix(h, v);
  }
  s.key = Finish(h);
  return s;
}

namespace {

// ProbeValue, inlined where it is hot. Tensor kinds read only the tensor (no type code).
inline int64_t ReadProbe(const Probe& p, const c10::IValue* args, size_t num_args) noexcept {
  if (p.kind == GuardKind::kArgCount) return static_cast<int64_t>(num_args);
  const int64_t absent = p.kind == GuardKind::kRank ? -1 : kMissing;  // as HashCall reads it
  if (p.arg < 0 || static_cast<size_t>(p.arg) >= num_args) return absent;
  const c10::IValue& a = args[p.arg];
  switch (p.kind) {
    case GuardKind::kArgType: return TypeCode(a);
    case GuardKind::kIntValue: return a.isInt() ? a.toInt() : kMissing;
    case GuardKind::kBoolValue: return a.isBool() ? a.toBool() : kMissing;
    case GuardKind::kDoubleValue: return a.isDouble() ? DoubleKey(a.toDouble()) : kMissing;
    case GuardKind::kDtype:
    case GuardKind::kRank:
    case GuardKind::kSize: break;
    default: return kMissing;
  }
  if (!a.isTensor()) return absent;
  const c10::TensorImpl* t = a.unsafeToTensorImpl();
  // A nested tensor's sizes() throws: probed as no tensor (its dispatch-key guard fails anyway).
  if (t == c10::UndefinedTensorImpl::singleton() || t->is_nested()) return absent;
  if (p.kind == GuardKind::kDtype) return static_cast<int64_t>(c10::typeMetaToScalarType(t->dtype()));
  const c10::IntArrayRef sizes = t->sizes();
  if (p.kind == GuardKind::kRank) return static_cast<int64_t>(sizes.size());
  return p.dim >= 0 && static_cast<size_t>(p.dim) < sizes.size() ? sizes[p.dim] : kMissing;
}

// ReadProbe of a kSize probe (the usual differing probe: entries for several sizes of one dim).
inline int64_t ReadSize(const Probe& p, const c10::IValue* args, size_t num_args) noexcept {
  if (p.arg < 0 || static_cast<size_t>(p.arg) >= num_args || !args[p.arg].isTensor()) return kMissing;
  const c10::TensorImpl* t = args[p.arg].unsafeToTensorImpl();
  if (t == c10::UndefinedTensorImpl::singleton() || t->is_nested()) return kMissing;
  const c10::IntArrayRef sizes = t->sizes();
  return p.dim >= 0 && static_cast<size_t>(p.dim) < sizes.size() ? sizes[p.dim] : kMissing;
}

}  // namespace

int64_t ProbeValue(const Probe& p, const c10::IValue* args, size_t num_args) noexcept {
  return ReadProbe(p, args, num_args);
}

uint64_t HashCall(const std::vector<Probe>& mask, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept {
  uint64_t h = kSeed;
  for (size_t i = 0; i < mask.size(); ++i) {
    values[i] = ProbeValue(mask[i], args, num_args);
    h = Mix(h, values[i]);
  }
  return Finish(h);
}

ProbePlan PlanOf(const std::vector<Probe>& mask) {
  ProbePlan plan;
  for (const Probe& p : mask) {
    if (plan.args.empty() || plan.args.back().arg != p.arg) {
      plan.args.push_back({p.arg, 0, static_cast<uint16_t>(plan.dims.size()), 0});
    }
    ProbePlan::Arg& a = plan.args.back();
    switch (p.kind) {
      case GuardKind::kArgCount: break;
      case GuardKind::kArgType: a.flags |= ProbePlan::kType; break;
      case GuardKind::kDtype: a.flags |= ProbePlan::kDtype; break;
      case GuardKind::kRank: a.flags |= ProbePlan::kRank; break;
      case GuardKind::kSize:
        plan.dims.push_back(p.dim);
        ++a.num_dims;
        break;
      case GuardKind::kIntValue: a.flags |= ProbePlan::kInt; break;
      case GuardKind::kDoubleValue: a.flags |= ProbePlan::kDouble; break;
      case GuardKind::kBoolValue: a.flags |= ProbePlan::kBool; break;
      default: break;
    }
  }
  plan.num_values = mask.size();
  return plan;
}

namespace {

// HashCall over a plan; `sink(i, v)` receives value i (the compiler drops an empty sink).
template <typename Sink>
inline uint64_t HashPlan(const ProbePlan& plan, const c10::IValue* args, size_t num_args, Sink sink) noexcept {
  // Values in the mask's order: per argument type, dtype, rank, sizes, then the scalar value (the
  // GuardKind order SignatureOf sorts by).
  uint64_t h = kSeed;
  size_t i = 0;
  auto emit = [&](int64_t v) {
    sink(i++, v);
    h = Mix(h, v);
  };
  for (const ProbePlan::Arg& pa : plan.args) {
    if (pa.arg < 0) {
      emit(static_cast<int64_t>(num_args));
      continue;
    }
    const c10::IValue* a = static_cast<size_t>(pa.arg) < num_args ? &args[pa.arg] : nullptr;
    const int64_t type = a != nullptr ? TypeCode(*a) : kMissing;
    const c10::TensorImpl* t =
        type == static_cast<int64_t>(ArgType::kTensor) ? a->unsafeToTensorImpl() : nullptr;
    if (t != nullptr && t->is_nested()) t = nullptr;  // as ReadProbe: sizes() would throw
    if (pa.flags & ProbePlan::kType) emit(type);
    if (t != nullptr) {
      const int64_t rank = t->dim();
      if (pa.flags & ProbePlan::kDtype) emit(static_cast<int64_t>(c10::typeMetaToScalarType(t->dtype())));
      if (pa.flags & ProbePlan::kRank) emit(rank);
      const int64_t* sizes = t->sizes().data();
      for (uint16_t k = 0; k < pa.num_dims; ++k) {
        const int32_t d = plan.dims[pa.first_dim + k];
        emit(d < rank ? sizes[d] : kMissing);
      }
    } else {
      if (pa.flags & ProbePlan::kDtype) emit(kMissing);
      if (pa.flags & ProbePlan::kRank) emit(-1);  // as the mask path reads it
      for (uint16_t k = 0; k < pa.num_dims; ++k) emit(kMissing);
    }
    if (pa.flags & ProbePlan::kInt) emit(a != nullptr && a->isInt() ? a->toInt() : kMissing);
    if (pa.flags & ProbePlan::kDouble) emit(a != nullptr && a->isDouble() ? DoubleKey(a->toDouble()) : kMissing);
    if (pa.flags & ProbePlan::kBool) emit(a != nullptr && a->isBool() ? a->toBool() : kMissing);
  }
  return Finish(h);
}

}  // namespace

uint64_t HashCall(const ProbePlan& plan, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept {
  return HashPlan(plan, args, num_args, [values](size_t i, int64_t v) { values[i] = v; });
}

SignatureIndex::SignatureIndex(const std::vector<const Signature*>& signatures) {
  if (signatures.empty()) return;
  // The probes on which some two signatures differ.
  const Signature& first = *signatures.front();
  std::vector<size_t> differing;
  for (size_t p = 0; p < first.mask.size(); ++p) {
    for (const Signature* s : signatures) {
      if (s->values[p] != first.values[p]) {
        differing.push_back(p);
        break;
      }
    }
  }
  if (differing.empty()) {
    // Every call that matches one matches all: no lookup, all are candidates.
    for (uint32_t i = 0; i < signatures.size(); ++i) ids_.push_back(i);
    return;
  }
  std::vector<Probe> mask;
  for (size_t p : differing) mask.push_back(first.mask[p]);
  // One differing probe (entries that differ in one size): its value is the key, read directly.
  // Otherwise the key is the hash HashPlan computes over the differing probes.
  single_ = differing.size() == 1;
  if (single_) probe_ = mask.front();
  plan_ = PlanOf(mask);
  std::vector<uint64_t> keys;
  for (const Signature* s : signatures) {
    uint64_t h = kSeed;
    for (size_t p : differing) h = Mix(h, s->values[p]);
    keys.push_back(single_ ? static_cast<uint64_t>(s->values[differing.front()]) : Finish(h));
  }
  int bits = 1;
  while ((size_t{1} << bits) < 2 * signatures.size()) ++bits;
  slots_.assign(size_t{1} << bits, Slot{0, 0, 0});
  slot_mask_ = slots_.size() - 1;
  shift_ = 64 - bits;
  std::vector<bool> placed(signatures.size(), false);
  for (size_t i = 0; i < signatures.size(); ++i) {
    if (placed[i]) continue;
    const uint32_t begin = static_cast<uint32_t>(ids_.size());
    for (size_t j = i; j < signatures.size(); ++j) {
      if (keys[j] != keys[i]) continue;
      placed[j] = true;
      ids_.push_back(static_cast<uint32_t>(j));
    }
    size_t slot = SlotOf(keys[i]);
    while (slots_[slot].begin != slots_[slot].end) slot = (slot + 1) & slot_mask_;
    slots_[slot] = {keys[i], begin, static_cast<uint32_t>(ids_.size())};
  }
}

SignatureIndex::Range SignatureIndex::Lookup(const c10::IValue* args, size_t num_args) const noexcept {
  const uint64_t key = !single_ ? HashPlan(plan_, args, num_args, [](size_t, int64_t) {})
                       : static_cast<uint64_t>(probe_.kind == GuardKind::kSize ? ReadSize(probe_, args, num_args)
                                                                                : ReadProbe(probe_, args, num_args));
  for (size_t slot = SlotOf(key);; slot = (slot + 1) & slot_mask_) {
    const Slot& s = slots_[slot];
    if (s.begin == s.end) return {nullptr, nullptr};
    if (s.key == key) return {ids_.data() + s.begin, ids_.data() + s.end};
  }
}

}  // namespace warden::guards
