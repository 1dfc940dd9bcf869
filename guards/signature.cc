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

uint64_t HashCall(const std::vector<Probe>& mask, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept {
  uint64_t h = kSeed;
  // The argument the previous probe read, and what was read of it.
  int32_t current = INT32_MIN;
  const c10::IValue* a = nullptr;
  int64_t type = kMissing;
  const c10::TensorImpl* t = nullptr;
  int64_t rank = -1;
  for (size_t i = 0; i < mask.size(); ++i) {
    const Probe& p = mask[i];
    if (p.arg != current) {
      current = p.arg;
      a = p.arg >= 0 && static_cast<size_t>(p.arg) < num_args ? &args[p.arg] : nullptr;
      type = a != nullptr ? TypeCode(*a) : kMissing;
      t = type == static_cast<int64_t>(ArgType::kTensor) ? a->unsafeToTensorImpl() : nullptr;
      rank = t != nullptr ? t->dim() : -1;
    }
    int64_t v = kMissing;
    switch (p.kind) {
      case GuardKind::kArgCount:
        v = static_cast<int64_t>(num_args);
        break;
      case GuardKind::kArgType:
        v = type;
        break;
      case GuardKind::kDtype:
        if (t != nullptr) v = static_cast<int64_t>(c10::typeMetaToScalarType(t->dtype()));
        break;
      case GuardKind::kRank:
        v = rank;
        break;
      case GuardKind::kSize:
        if (t != nullptr && p.dim < rank) v = t->sizes()[p.dim];
        break;
      case GuardKind::kIntValue:
        if (a != nullptr && a->isInt()) v = a->toInt();
        break;
      case GuardKind::kBoolValue:
        if (a != nullptr && a->isBool()) v = a->toBool();
        break;
      case GuardKind::kDoubleValue:
        if (a != nullptr && a->isDouble()) v = DoubleKey(a->toDouble());
        break;
      default:
        break;
    }
    values[i] = v;
    h = Mix(h, v);
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

uint64_t HashCall(const ProbePlan& plan, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept {
  // Writes values in the mask's order: per argument type, dtype, rank, sizes, then the scalar
  // value (the GuardKind order SignatureOf sorts by).
  uint64_t h = kSeed;
  int64_t* out = values;
  auto emit = [&](int64_t v) {
    *out++ = v;
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

}  // namespace warden::guards
