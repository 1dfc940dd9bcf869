#include "tracer/sym_expr.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace warden::tracer {

SymExpr::SymExpr(int64_t constant) {
  if (constant != 0) terms_.push_back({{}, constant});
}

SymExpr SymExpr::Symbol(int id) {
  SymExpr e;
  e.terms_.push_back({{id}, 1});
  return e;
}

int64_t SymExpr::constant() const {
  for (const auto& [m, c] : terms_) {
    if (m.empty()) return c;
  }
  return 0;
}

std::optional<int> SymExpr::as_symbol() const {
  if (terms_.size() == 1 && terms_[0].first.size() == 1 && terms_[0].second == 1) {
    return terms_[0].first[0];
  }
  return std::nullopt;
}

std::vector<int> SymExpr::symbols() const {
  std::vector<int> out;
  for (const auto& [m, c] : terms_) out.insert(out.end(), m.begin(), m.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void SymExpr::Canonicalize() {
  std::map<Monomial, int64_t> merged;
  for (auto& [m, c] : terms_) {
    std::sort(m.begin(), m.end());
    merged[m] += c;
  }
  terms_.clear();
  for (auto& [m, c] : merged) {
    if (c != 0) terms_.push_back({m, c});
  }
}

SymExpr operator+(const SymExpr& a, const SymExpr& b) {
  SymExpr r = a;
  r.terms_.insert(r.terms_.end(), b.terms_.begin(), b.terms_.end());
  r.Canonicalize();
  return r;
}

SymExpr operator-(const SymExpr& a, const SymExpr& b) {
  SymExpr r = a;
  for (const auto& [m, c] : b.terms_) r.terms_.push_back({m, -c});
  r.Canonicalize();
  return r;
}

SymExpr operator*(const SymExpr& a, const SymExpr& b) {
  SymExpr r;
  for (const auto& [ma, ca] : a.terms_) {
    for (const auto& [mb, cb] : b.terms_) {
      SymExpr::Monomial m = ma;
      m.insert(m.end(), mb.begin(), mb.end());
      r.terms_.push_back({std::move(m), ca * cb});
    }
  }
  r.Canonicalize();
  return r;
}

std::optional<SymExpr> SymExpr::ExactDiv(const SymExpr& a, const SymExpr& b) {
  if (b.terms_.size() != 1) {
    if (a == b && !b.terms_.empty()) return SymExpr(1);
    return std::nullopt;
  }
  const Monomial& bm = b.terms_[0].first;
  const int64_t bc = b.terms_[0].second;
  SymExpr r;
  for (const auto& [m, c] : a.terms_) {
    if (c % bc != 0) return std::nullopt;
    // Remove bm's symbols from m (multiset difference); each must be present.
    Monomial rest = m;
    for (int s : bm) {
      auto it = std::find(rest.begin(), rest.end(), s);
      if (it == rest.end()) return std::nullopt;
      rest.erase(it);
    }
    r.terms_.push_back({std::move(rest), c / bc});
  }
  r.Canonicalize();
  return r;
}

std::optional<int64_t> SymExpr::LowerBound(int64_t symbol_min) const {
  int64_t total = 0;
  for (const auto& [m, c] : terms_) {
    if (!m.empty() && c < 0) return std::nullopt;
    int64_t v = c;
    for (size_t i = 0; i < m.size(); ++i) v *= symbol_min;
    total += v;
  }
  return total;
}

SymExpr SymExpr::Substitute(int id, const SymExpr& by) const {
  SymExpr r;
  for (const auto& [m, c] : terms_) {
    SymExpr term(c);
    Monomial rest;
    for (int s : m) {
      if (s == id) {
        term = term * by;
      } else {
        rest.push_back(s);
      }
    }
    SymExpr mono;
    mono.terms_.push_back({rest, 1});
    r = r + term * mono;
  }
  return r;
}

SymExpr SymExpr::Map(const std::function<SymExpr(int)>& f) const {
  SymExpr r;
  for (const auto& [m, c] : terms_) {
    SymExpr term(c);
    for (int s : m) term = term * f(s);
    r = r + term;
  }
  return r;
}

int64_t SymExpr::Evaluate(const int64_t* values) const {
  uint64_t total = 0;
  for (const auto& [m, c] : terms_) {
    uint64_t v = static_cast<uint64_t>(c);
    for (int s : m) v *= static_cast<uint64_t>(values[s]);
    total += v;
  }
  return static_cast<int64_t>(total);
}

bool SymExpr::TryEvaluate(const int64_t* values, int64_t* out) const {
  int64_t total = 0;
  for (const auto& [m, c] : terms_) {
    int64_t v = c;
    for (int s : m) {
      if (__builtin_mul_overflow(v, values[s], &v)) return false;
    }
    if (__builtin_add_overflow(total, v, &total)) return false;
  }
  *out = total;
  return true;
}

std::string SymExpr::ToString() const {
  return ToString([](int id) { return absl::StrCat("s", id); });
}

std::string SymExpr::ToString(const std::function<std::string(int)>& name) const {
  if (terms_.empty()) return "0";
  std::string out;
  // Highest-degree terms first, constant last: "s0*s1 + 2*s0 + 1".
  std::vector<const std::pair<Monomial, int64_t>*> order;
  for (const auto& t : terms_) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](auto* x, auto* y) { return x->first.size() > y->first.size(); });
  bool first = true;
  for (const auto* t : order) {
    int64_t c = t->second;
    if (!first) {
      absl::StrAppend(&out, c < 0 ? " - " : " + ");
      c = c < 0 ? -c : c;
    } else if (c < 0 && !t->first.empty()) {
      absl::StrAppend(&out, "-");
      c = -c;
    }
    first = false;
    std::vector<std::string> factors;
    if (t->first.empty() || c != 1) factors.push_back(absl::StrCat(c));
    for (int s : t->first) factors.push_back(name(s));
    absl::StrAppend(&out, absl::StrJoin(factors, "*"));
  }
  return out;
}

std::string SymShapeString(const SymShape& shape, const std::function<std::string(int)>& name) {
  std::vector<std::string> parts;
  for (const SymExpr& e : shape) parts.push_back(name ? e.ToString(name) : e.ToString());
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

}  // namespace warden::tracer
