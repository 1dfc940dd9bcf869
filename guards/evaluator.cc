#include "guards/evaluator.h"

#include <algorithm>
#include <array>
#include <map>
#include <cmath>
#include <cstring>

#include <ATen/core/Tensor.h>
#include <c10/core/AutogradState.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

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
    code_.push_back(in);
  }
}

bool GuardProgram::Check(const c10::IValue* args, size_t num_args) const noexcept {
  // Every instruction after kArgCount may index args; kArgType of an argument precedes its tensor
  // and scalar checks, so the unchecked accessors below see the type they expect.
  for (const Instr& in : code_) {
    if (in.op == kFusedAutogradState) {
      const c10::AutogradState& state = c10::AutogradState::get_tls_state();
      const int64_t now = (static_cast<int64_t>(state.get_grad_mode()) << 1) |
                          static_cast<int64_t>(state.get_inference_mode());
      if (now != in.expected) return false;
      continue;
    }
    if (in.op == kFusedTensorMeta) {
      // expected: device code; aux: layout << 1 | requires_grad.
      const c10::TensorImpl* t = args[in.arg].unsafeToTensorImpl();
      const c10::Device d = t->device();
      const int64_t code = (static_cast<int64_t>(d.type()) << 16) | (static_cast<int64_t>(d.index()) & 0xffff);
      const int32_t meta = (static_cast<int32_t>(t->layout()) << 1) | static_cast<int32_t>(t->requires_grad());
      if (code != in.expected || meta != in.aux) return false;
      continue;
    }
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
        if (args[in.arg].unsafeToTensorImpl()->requires_grad() != static_cast<bool>(in.expected))
          return false;
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
        const Relation& r = relations_[in.aux];
        int64_t values[kMaxRelationSymbols];
        const size_t n = std::min(r.symbols.size(), kMaxRelationSymbols);
        for (size_t k = 0; k < n; ++k) {
          values[k] = args[r.symbols[k].first].unsafeToTensorImpl()->sizes()[r.symbols[k].second];
        }
        if (r.lhs.Evaluate(values) != r.rhs.Evaluate(values)) return false;
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
    }
  }
  return true;
}

GuardProgram GuardProgram::AfterSignatureMatch(const std::vector<Guard>& guards) {
  std::vector<Guard> rest;
  // Per tensor argument: device, layout, requires_grad, merged when all three are present.
  std::map<int, std::array<const Guard*, 3>> meta;
  const Guard* grad = nullptr;
  const Guard* inference = nullptr;
  for (const Guard& g : guards) {
    if (g.kind == GuardKind::kGradMode) grad = &g;
    if (g.kind == GuardKind::kInferenceMode) inference = &g;
  }
  const bool fuse_autograd = grad != nullptr && inference != nullptr;
  for (const Guard& g : guards) {
    if (IsKeyed(g.kind)) continue;
    if (fuse_autograd && (&g == grad || &g == inference)) continue;
    if (g.kind == GuardKind::kDevice || g.kind == GuardKind::kLayout ||
        g.kind == GuardKind::kRequiresGrad) {
      auto& slot = meta[g.arg];
      slot[g.kind == GuardKind::kDevice ? 0 : g.kind == GuardKind::kLayout ? 1 : 2] = &g;
      continue;
    }
    rest.push_back(g);
  }
  GuardProgram p(rest);
  std::vector<Instr> fused;
  for (const auto& [arg, parts] : meta) {
    if (parts[0] && parts[1] && parts[2]) {
      fused.push_back({kFusedTensorMeta, arg,
                       static_cast<int32_t>((parts[1]->expected << 1) | (parts[2]->expected ? 1 : 0)),
                       parts[0]->expected});
      continue;
    }
    for (const Guard* g : parts) {
      if (g == nullptr) continue;
      fused.push_back({static_cast<uint8_t>(g->kind), g->arg, g->dim, g->expected});
    }
  }
  // Globals first (they are cheapest and fail for whole call sites), then the fused metadata,
  // then everything else in kind order.
  auto globals_end = std::find_if(p.code_.begin(), p.code_.end(), [](const Instr& in) {
    return in.op > static_cast<uint8_t>(GuardKind::kDefaultDtype);
  });
  p.code_.insert(globals_end, fused.begin(), fused.end());
  if (fuse_autograd) {
    p.code_.insert(p.code_.begin(), Instr{kFusedAutogradState, -1, 0,
                                          (grad->expected ? 2 : 0) | (inference->expected ? 1 : 0)});
  }
  return p;
}

std::string GuardProgram::FirstFailure(const std::vector<c10::IValue>& args,
                                       const std::vector<std::string>& names) const {
  for (const Guard& g : guards_) {
    std::string reason = FailureReason(g, args, names);
    if (!reason.empty()) return reason;
  }
  return "";
}

}  // namespace warden::guards
