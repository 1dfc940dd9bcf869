// SymExpr: symbolic sizes as canonical integer polynomials over size symbols (s0, s1, ...), the
// algebra shape rules compute with. Canonical means structurally equal iff algebraically equal:
// terms sorted by monomial, like terms merged, zero coefficients dropped. Division is exact only
// (a rule that needs a non-exact quotient specializes instead). Symbols stand for sizes >= 2.
#ifndef WARDEN_TRACER_SYM_EXPR_H_
#define WARDEN_TRACER_SYM_EXPR_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace warden::tracer {

class SymExpr {
 public:
  SymExpr() = default;  // 0
  SymExpr(int64_t constant);  // NOLINT: sizes mix freely with integer literals
  static SymExpr Symbol(int id);

  bool is_constant() const { return terms_.empty() || (terms_.size() == 1 && terms_[0].first.empty()); }
  int64_t constant() const;            // the constant term (the whole value if is_constant())
  std::optional<int> as_symbol() const;  // set iff the expression is exactly 1*s_k
  std::vector<int> symbols() const;    // sorted, unique

  friend SymExpr operator+(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator-(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator*(const SymExpr& a, const SymExpr& b);
  SymExpr operator-() const { return SymExpr(0) - *this; }
  SymExpr& operator+=(const SymExpr& b) { return *this = *this + b; }
  SymExpr& operator*=(const SymExpr& b) { return *this = *this * b; }
  friend bool operator==(const SymExpr& a, const SymExpr& b) { return a.terms_ == b.terms_; }
  friend bool operator!=(const SymExpr& a, const SymExpr& b) { return !(a == b); }

  // a / b when it is exact for every value of the symbols (b a nonzero constant dividing every
  // coefficient, or a monomial times a constant dividing every term); nullopt otherwise.
  static std::optional<SymExpr> ExactDiv(const SymExpr& a, const SymExpr& b);

  // The smallest value over all symbol values >= symbol_min (>= 0), when every non-constant term
  // has a non-negative coefficient (the polynomial is then monotone); nullopt otherwise.
  std::optional<int64_t> LowerBound(int64_t symbol_min) const;

  // Replaces symbol `id` by `by` and re-canonicalizes.
  SymExpr Substitute(int id, const SymExpr& by) const;
  // Replaces every symbol s by f(s) at once (the result may use any ids; no clash with this
  // expression's own) and re-canonicalizes.
  SymExpr Map(const std::function<SymExpr(int)>& f) const;

  // Value for concrete symbol values (values[id]); allocation-free. Wraps on int64 overflow: for
  // values already known to be in range (traced sizes) and for display.
  int64_t Evaluate(const int64_t* values) const;

  // The same, false if any product or sum overflows int64 (sizes of expanded tensors can reach
  // 2^62): guards compare with this, so a wrapped value never makes a relation hold.
  bool TryEvaluate(const int64_t* values, int64_t* out) const;

  // "s0*s1 + 2", or with a namer "arg0.size(0)*arg1.size(1) + 2".
  std::string ToString() const;
  std::string ToString(const std::function<std::string(int)>& name) const;

 private:
  using Monomial = std::vector<int>;  // symbol ids, sorted, with repetition for powers
  void Canonicalize();
  std::vector<std::pair<Monomial, int64_t>> terms_;  // sorted by monomial, no zero coefficients
};

using SymShape = std::vector<SymExpr>;

std::string SymShapeString(const SymShape& shape,
                           const std::function<std::string(int)>& name = nullptr);

}  // namespace warden::tracer

#endif  // WARDEN_TRACER_SYM_EXPR_H_
