#include "guards/signature.h"

#include <cmath>
#include <cstring>

#include <ATen/core/Tensor.h>

namespace warden::guards {
namespace {

constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ull;
constexpr int64_t kMissing = INT64_MIN + 17;

inline uint64_t Mix(uint64_t h, int64_t v) {
  h ^= static_cast<uint64_t>(v) + kSeed + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
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
  Signature s;
  uint64_t h = kSeed;
  for (const Guard& g : guards) {
    if (!IsKeyed(g.kind)) continue;
    s.mask.push_back({g.kind, g.arg, g.dim});
    int64_t v = g.expected;
    if (g.kind == GuardKind::kDoubleValue) v = DoubleKey(g.expected_double);
    s.values.push_back(v);
    h = Mix(h, v);
  }
  s.key = h;
  return s;
}

uint64_t HashCall(const std::vector<Probe>& mask, const c10::IValue* args, size_t num_args,
                  int64_t* values) noexcept {
  uint64_t h = kSeed;
  for (size_t i = 0; i < mask.size(); ++i) {
    const Probe& p = mask[i];
    int64_t v = kMissing;
    if (p.kind == GuardKind::kArgCount) {
      v = static_cast<int64_t>(num_args);
    } else if (p.arg >= 0 && static_cast<size_t>(p.arg) < num_args) {
      const c10::IValue& a = args[p.arg];
      switch (p.kind) {
        case GuardKind::kArgType:
          v = TypeCode(a);
          break;
        case GuardKind::kIntValue:
          if (a.isInt()) v = a.toInt();
          break;
        case GuardKind::kBoolValue:
          if (a.isBool()) v = a.toBool();
          break;
        case GuardKind::kDoubleValue:
          if (a.isDouble()) v = DoubleKey(a.toDouble());
          break;
        default: {
          if (TypeCode(a) != static_cast<int64_t>(ArgType::kTensor)) break;
          const c10::TensorImpl* t = a.unsafeToTensorImpl();
          if (p.kind == GuardKind::kDtype) {
            v = static_cast<int64_t>(c10::typeMetaToScalarType(t->dtype()));
          } else if (p.kind == GuardKind::kRank) {
            v = t->dim();
          } else if (p.kind == GuardKind::kSize && p.dim < t->dim()) {
            v = t->sizes()[p.dim];
          }
          break;
        }
      }
    }
    values[i] = v;
    h = Mix(h, v);
  }
  return h;
}

}  // namespace warden::guards
