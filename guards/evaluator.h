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

class GuardProgram {
 public:
  GuardProgram() = default;
  // Orders guards cheapest first (the kind table's order, then by argument and dim) and flattens
  // them into instructions.
  explicit GuardProgram(std::vector<Guard> guards);

  // The program that still has to run after the call matched the entry's signature exactly
  // (guards/signature.h): the keyed guards (count, types, dtypes, ranks, static sizes, scalar
  // values) are dropped, and each tensor's device, layout and requires_grad checks are fused into
  // one instruction that reads the TensorImpl once. Only valid after an exact signature match.
  static GuardProgram AfterSignatureMatch(const std::vector<Guard>& guards);

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
  // Internal opcode: a GuardKind, kFusedTensorMeta, or kFusedAutogradState (grad mode and
  // inference mode from one read of c10::AutogradState; expected = grad << 1 | inference).
  static constexpr uint8_t kFusedTensorMeta = 0xF0;
  static constexpr uint8_t kFusedAutogradState = 0xF1;
  struct Instr {
    uint8_t op;
    int32_t arg;
    int32_t aux;       // dim for kSize/kStride, other argument for kAliasing
    int64_t expected;  // kDoubleValue: the bit pattern of the double
  };
  struct Relation {
    tracer::SymExpr lhs, rhs;
    std::vector<std::pair<int, int>> symbols;  // (arg, dim) of each expression symbol
  };
  // Relations evaluate with symbol values on the stack; more symbols than this in one relation
  // are not supported by the fast path (the builder never makes such guards).
  static constexpr size_t kMaxRelationSymbols = 16;

  std::vector<Guard> guards_;  // in evaluation order; code_[i] comes from guards_[i]
  std::vector<Instr> code_;
  std::vector<Relation> relations_;
};

}  // namespace warden::guards

#endif  // WARDEN_GUARDS_EVALUATOR_H_
