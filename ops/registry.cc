#include "ops/registry.h"

#include <algorithm>

#include <ATen/core/dispatch/Dispatcher.h>

#include "absl/strings/str_cat.h"

namespace warden::ops {

const Shape& ShapeContext::shape(size_t i) const {
  static const Shape kEmpty;
  if (!is_tensor(i)) return kEmpty;
  return args_[i].shape;
}

const std::vector<Shape>& ShapeContext::shapes(size_t i) const {
  static const std::vector<Shape> kEmpty;
  if (i >= args_.size()) return kEmpty;
  return args_[i].list;
}

int64_t ShapeContext::Int(size_t i) const {
  Took(i, kTakenAsInts);
  if (i >= args_.size()) return 0;
  const c10::IValue& v = args_[i].constant;
  if (v.isInt()) return v.toInt();
  if (v.isBool()) return v.toBool() ? 1 : 0;
  if (v.isIntList()) {
    auto list = v.toIntVector();
    return list.empty() ? 0 : list[0];
  }
  return 0;
}

std::vector<int64_t> ShapeContext::Ints(size_t i) const {
  Took(i, kTakenAsInts);
  return IntsOf(i);
}

std::vector<int64_t> ShapeContext::IntsOf(size_t i) const {
  if (i >= args_.size()) return {};
  const c10::IValue& v = args_[i].constant;
  if (v.isIntList()) return v.toIntVector();
  if (v.isInt()) return {v.toInt()};
  return {};
}

std::vector<Dim> ShapeContext::Dims(size_t i) const {
  Took(i, kTakenAsSizes);
  if (i < args_.size() && !args_[i].dims.empty()) return args_[i].dims;
  const std::vector<int64_t> ints = IntsOf(i);
  return std::vector<Dim>(ints.begin(), ints.end());
}

bool ShapeContext::Bool(size_t i) const {
  Took(i, kTakenAsInts);
  if (i >= args_.size()) return false;
  const c10::IValue& v = args_[i].constant;
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt() != 0;
  return false;
}

absl::Status ShapeContext::RequireEqual(Dim a, Dim b, absl::string_view why) const {
  const Dim diff = a - b;
  if (diff.is_constant()) {
    if (diff.constant() == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(op_, ": ", why, " requires ", a.ToString(), " == ", b.ToString()));
  }
  if (facts_ == nullptr) {
    return absl::InternalError(absl::StrCat(op_, ": symbolic sizes without a symbolic context"));
  }
  facts_->requirements.push_back({a, b, std::string(why)});
  return absl::OkStatus();
}

Registry& Registry::Global() {
  static Registry* registry = new Registry();
  return *registry;
}

// Rules are written for the union of the LibTorch versions Warden supports; an op the running
// LibTorch does not have (aten::frobenius_norm left in 2.x, scaled_dot_product_attention came) is
// skipped, so a rule never claims a name the dispatcher cannot produce (Note [Which LibTorch]).
// The dispatcher has every aten op by now: libtorch_cpu's registrations are static initializers of
// a library Warden depends on, so they run before Warden's.
void Registry::Add(OpInfo info) {
  std::string name = info.name;
  const size_t dot = name.find('.');
  const std::string base = name.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
  if (!c10::Dispatcher::singleton().findSchema({base, overload}).has_value()) {
    absent_.push_back(std::move(name));
    return;
  }
  ops_[name] = std::move(info);
}

std::vector<std::string> Registry::Absent() const {
  std::vector<std::string> names = absent_;
  std::sort(names.begin(), names.end());
  return names;
}

const OpInfo* Registry::Find(absl::string_view name) const {
  auto it = ops_.find(std::string(name));
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::Names() const {
  std::vector<std::string> names;
  names.reserve(ops_.size());
  for (const auto& [name, info] : ops_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank, absl::string_view op) {
  const int64_t r = std::max<int64_t>(rank, 1);
  if (dim < -r || dim >= r) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dim ", dim, " out of range for rank ", rank));
  }
  return dim < 0 ? dim + r : dim;
}

absl::StatusOr<Shape> Broadcast(const ShapeContext& ctx, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    // Align from the right.
    const bool has_a = i < a.size();
    const bool has_b = i < b.size();
    const Dim da = has_a ? a[a.size() - 1 - i] : 1;
    const Dim db = has_b ? b[b.size() - 1 - i] : 1;
    Dim d;
    if (da == 1) {
      d = db;
    } else if (db == 1) {
      d = da;
    } else {
      auto st = ctx.RequireEqual(da, db, "broadcast");
      if (!st.ok()) return st;
      d = da;
    }
    out[n - 1 - i] = d;
  }
  return out;
}

ShapeRule SameAs(size_t i) {
  return [i](const ShapeContext& ctx) -> absl::StatusOr<std::vector<Shape>> {
    return std::vector<Shape>{ctx.shape(i)};
  };
}

ShapeRule BroadcastAll() {
  return [](const ShapeContext& ctx) -> absl::StatusOr<std::vector<Shape>> {
    Shape out;
    for (size_t i = 0; i < ctx.num_args(); ++i) {
      if (!ctx.is_tensor(i)) continue;
      auto b = Broadcast(ctx, out, ctx.shape(i));
      if (!b.ok()) return b.status();
      out = *std::move(b);
    }
    return std::vector<Shape>{out};
  };
}

ShapeRule InPlaceBroadcast() {
  return [](const ShapeContext& ctx) -> absl::StatusOr<std::vector<Shape>> {
    const Shape& self = ctx.shape(0);
    for (size_t i = 1; i < ctx.num_args(); ++i) {
      if (!ctx.is_tensor(i)) continue;
      absl::Status st = RequireExpandable(ctx, ctx.shape(i), self, "in-place broadcast");
      if (!st.ok()) return st;
    }
    return std::vector<Shape>{self};
  };
}

absl::Status RequireExpandable(const ShapeContext& ctx, const Shape& from, const Shape& to,
                               absl::string_view why) {
  if (from.size() > to.size()) {
    return ShapeError(ctx, why, ": shape of rank ", from.size(), " cannot expand to rank ",
                      to.size());
  }
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    // A size-1 dim stretches to anything; any other size must already match.
    if (SizeEquals(ctx, from[i], 1, why)) continue;
    absl::Status st = ctx.RequireEqual(from[i], to[lead + i], why);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status RequireSameShape(const ShapeContext& ctx, const Shape& a, const Shape& b,
                              absl::string_view why) {
  if (a.size() != b.size()) {
    return ShapeError(ctx, why, " requires equal ranks, got ", a.size(), " and ", b.size());
  }
  for (size_t i = 0; i < a.size(); ++i) {
    absl::Status st = ctx.RequireEqual(a[i], b[i], why);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

Dim Numel(const Shape& shape) {
  Dim n = 1;
  for (const Dim& d : shape) n = n * d;
  return n;
}

namespace {

// A lower bound of an expression's value given that every symbol is >= 2 (sizes 0 and 1 are
// always specialized), or nullopt when it is not monotone.
std::optional<int64_t> LowerBound(const Dim& d) { return d.LowerBound(2); }

void Specialize(const ShapeContext& ctx, const Dim& d, absl::string_view why) {
  if (ctx.facts() == nullptr) return;
  for (int s : d.symbols()) ctx.facts()->specialized.emplace(s, std::string(why));
}

int64_t Value(const ShapeContext& ctx, const Dim& d) {
  if (d.is_constant()) return d.constant();
  return ctx.facts() != nullptr && ctx.facts()->evaluate ? ctx.facts()->evaluate(d) : 0;
}

}  // namespace

Shape ToShape(const std::vector<int64_t>& sizes) { return Shape(sizes.begin(), sizes.end()); }

std::optional<std::vector<int64_t>> ConcreteShape(const Shape& shape) {
  std::vector<int64_t> out;
  out.reserve(shape.size());
  for (const Dim& d : shape) {
    if (!d.is_constant()) return std::nullopt;
    out.push_back(d.constant());
  }
  return out;
}

bool SizeEquals(const ShapeContext& ctx, Dim a, Dim b, absl::string_view why) {
  const Dim diff = a - b;
  if (diff.is_constant()) return diff.constant() == 0;
  // Provably different when one side's minimum exceeds the other, e.g. s0 vs 1.
  const auto lo_ab = LowerBound(a - b), lo_ba = LowerBound(b - a);
  if ((lo_ab && *lo_ab > 0) || (lo_ba && *lo_ba > 0)) return false;
  Specialize(ctx, a, why);
  Specialize(ctx, b, why);
  return Value(ctx, a) == Value(ctx, b);
}

bool SizeLess(const ShapeContext& ctx, Dim a, Dim b, absl::string_view why) {
  const Dim diff = b - a;
  if (diff.is_constant()) return diff.constant() > 0;
  if (const auto lo = LowerBound(diff); lo && *lo > 0) return true;
  if (const auto lo = LowerBound(a - b); lo && *lo >= 0) return false;
  // a constant bound no size can reach (INT64_MAX as "to the end").
  if (b.is_constant() && b.constant() >= (int64_t{1} << 62)) return true;
  Specialize(ctx, a, why);
  Specialize(ctx, b, why);
  return Value(ctx, a) < Value(ctx, b);
}

int64_t SpecializeSize(const ShapeContext& ctx, Dim d, absl::string_view why) {
  if (d.is_constant()) return d.constant();
  Specialize(ctx, d, why);
  return Value(ctx, d);
}

Dim DivFloor(const ShapeContext& ctx, const Dim& a, const Dim& b, absl::string_view why) {
  if (a.is_constant() && b.is_constant()) {
    return b.constant() == 0 ? Dim(0) : Dim(a.constant() / b.constant());
  }
  if (auto q = Dim::ExactDiv(a, b)) return *q;
  // Specializing one symbol is often enough (reshape(-1, 4) of [s0, s1] needs only s1 = 8):
  // try the innermost ones first, since reshapes usually merge or split trailing dims.
  if (b.is_constant() && ctx.facts() != nullptr && ctx.facts()->evaluate) {
    const std::vector<int> syms = a.symbols();
    for (auto it = syms.rbegin(); it != syms.rend(); ++it) {
      const Dim fixed = a.Substitute(*it, Dim(ctx.facts()->evaluate(Dim::Symbol(*it))));
      if (auto q = Dim::ExactDiv(fixed, b)) {
        ctx.facts()->specialized.emplace(*it, std::string(why));
        return *q;
      }
    }
    // Then trailing runs of them (view(x, [-1, 256]) of [s0, 1, s2, s3] needs s2 and s3).
    Dim fixed = a;
    std::vector<int> given_up;
    for (auto it = syms.rbegin(); it != syms.rend(); ++it) {
      fixed = fixed.Substitute(*it, Dim(ctx.facts()->evaluate(Dim::Symbol(*it))));
      given_up.push_back(*it);
      if (auto q = Dim::ExactDiv(fixed, b)) {
        for (int s : given_up) ctx.facts()->specialized.emplace(s, std::string(why));
        return *q;
      }
    }
  }
  // A symbolic divisor (view(x, [s0, -1]) with s0 a size read at run time): the symbols only the
  // dividend has are the ones to give up first, so that the divisor's stay symbolic.
  if (!b.is_constant() && ctx.facts() != nullptr && ctx.facts()->evaluate) {
    const std::vector<int> in_b = b.symbols();
    Dim fixed = a;
    std::vector<int> given_up;
    for (int s : a.symbols()) {
      if (std::find(in_b.begin(), in_b.end(), s) != in_b.end()) continue;
      fixed = fixed.Substitute(s, Dim(ctx.facts()->evaluate(Dim::Symbol(s))));
      given_up.push_back(s);
    }
    if (auto q = Dim::ExactDiv(fixed, b)) {
      for (int s : given_up) ctx.facts()->specialized.emplace(s, std::string(why));
      return *q;
    }
  }
  Specialize(ctx, a, why);
  Specialize(ctx, b, why);
  const int64_t den = Value(ctx, b);
  return den == 0 ? Dim(0) : Dim(Value(ctx, a) / den);
}

double ScalarArg(const ShapeContext& ctx, size_t i) {
  if (i >= ctx.num_args()) return 0;
  const c10::IValue& v = ctx.arg(i).constant;
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1 : 0;
  return 0;
}

}  // namespace warden::ops
