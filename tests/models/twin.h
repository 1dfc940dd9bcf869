// Comparison harness of the "real programs" suite (tests/models/): a model is built twice with
// identical weights; one twin runs eagerly, the other through the side under test, and outputs,
// buffers (BatchNorm running statistics), gradients and parameters after optimizer steps are
// compared with float tolerances.
//
// The side under test is a backend name: "aten" or "cpp" run the function through
// warden::compile; "eager" runs it directly and is the control of the harness itself: every
// scenario also runs with "eager" on both sides, where everything must be bitwise equal. A
// scenario that passes for "eager" and fails for "aten"/"cpp" is a Warden problem, not a harness
// problem (the harness is deterministic).
//
// Random ops (dropout, randn_like): the CPU generator is re-seeded identically before the eager
// call and before the call under test (Seeded). A Warden cache hit replays the random ops of the
// trace in the same order, consuming the generator as eager does, so both sides draw the same
// numbers.
#ifndef WARDEN_TESTS_MODELS_TWIN_H_
#define WARDEN_TESTS_MODELS_TWIN_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"

namespace twin {

// ---------------------------------------------------------------------------------------------
// Tolerances.

struct Tol {
  double rtol;
  double atol;
};
inline constexpr Tol kExact{0.0, 0.0};
inline constexpr Tol kForwardTol{1e-4, 1e-5};  // one forward (+ backward)
inline constexpr Tol kTrainTol{1e-3, 1e-4};    // after 20+ optimizer steps

inline bool IsWarden(const std::string& backend) { return backend != "eager"; }

// The tolerance for a backend: the eager control must match bitwise. TWIN_EXACT=1 in the
// environment demands bitwise equality from every backend (to measure how far they are).
inline Tol TolFor(const std::string& backend, Tol tol) {
  const char* exact = std::getenv("TWIN_EXACT");
  if (exact != nullptr && *exact == '1') return kExact;
  return IsWarden(backend) ? tol : kExact;
}

// ---------------------------------------------------------------------------------------------
// Comparisons. Each returns an AssertionResult naming what differs and by how much.

inline double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

inline ::testing::AssertionResult Close(const at::Tensor& got, const at::Tensor& want, Tol tol,
                                        const std::string& what) {
  if (got.defined() != want.defined()) {
    return ::testing::AssertionFailure() << what << ": defined " << got.defined() << " vs eager "
                                         << want.defined();
  }
  if (!want.defined()) return ::testing::AssertionSuccess();
  if (got.scalar_type() != want.scalar_type()) {
    return ::testing::AssertionFailure() << what << ": dtype " << got.scalar_type() << " vs eager "
                                         << want.scalar_type();
  }
  if (got.sizes() != want.sizes()) {
    return ::testing::AssertionFailure() << what << ": sizes " << got.sizes() << " vs eager " << want.sizes();
  }
  if (got.layout() != want.layout()) {
    return ::testing::AssertionFailure() << what << ": layout " << got.layout() << " vs eager " << want.layout();
  }
  if (want.is_sparse()) {  // sparse gradients (Embedding(sparse=true)): compare the dense values
    return Close(got.detach().coalesce().to_dense(), want.detach().coalesce().to_dense(), tol, what);
  }
  const at::Tensor g = got.detach(), w = want.detach();
  bool ok;
  if (tol.rtol == 0.0 && tol.atol == 0.0) {
    ok = torch::equal(g, w) || (g.is_floating_point() && torch::allclose(g, w, 0.0, 0.0, /*equal_nan=*/true));
  } else if (g.is_floating_point()) {
    ok = torch::allclose(g, w, tol.rtol, tol.atol, /*equal_nan=*/true);
  } else {
    ok = torch::equal(g, w);
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": values differ, max |diff| " << MaxAbsDiff(g, w)
                                       << " (rtol " << tol.rtol << ", atol " << tol.atol << "), max |eager| "
                                       << (w.numel() ? w.abs().max().item<double>() : 0.0);
}

inline ::testing::AssertionResult CloseAll(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                                           Tol tol, const std::string& what) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << what << ": " << got.size() << " tensors vs eager " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    auto r = Close(got[i], want[i], tol, what + "[" + std::to_string(i) + "]");
    if (!r) return r;
    if (got[i].defined() && got[i].requires_grad() != want[i].requires_grad()) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: requires_grad " << got[i].requires_grad()
                                           << " vs eager " << want[i].requires_grad();
    }
  }
  return ::testing::AssertionSuccess();
}

// Which part of a module's state to compare.
enum class Part { kParameters, kBuffers, kGrads };

inline ::testing::AssertionResult SameState(const torch::nn::Module& got, const torch::nn::Module& want, Part part,
                                            Tol tol) {
  const char* label = part == Part::kParameters ? "parameter" : part == Part::kBuffers ? "buffer" : "grad of";
  auto g = part == Part::kBuffers ? got.named_buffers() : got.named_parameters();
  auto w = part == Part::kBuffers ? want.named_buffers() : want.named_parameters();
  if (g.size() != w.size()) {
    return ::testing::AssertionFailure() << label << " count " << g.size() << " vs eager " << w.size();
  }
  for (const auto& item : w) {
    const at::Tensor* other = g.find(item.key());
    if (other == nullptr) return ::testing::AssertionFailure() << label << " '" << item.key() << "' missing";
    at::Tensor a = *other, b = item.value();
    if (part == Part::kGrads) {
      a = a.grad();
      b = b.grad();
    }
    auto r = Close(a, b, tol, std::string(label) + " '" + item.key() + "'");
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult SameParameters(const torch::nn::Module& got, const torch::nn::Module& want,
                                                 Tol tol) {
  return SameState(got, want, Part::kParameters, tol);
}
inline ::testing::AssertionResult SameBuffers(const torch::nn::Module& got, const torch::nn::Module& want,
                                              Tol tol) {
  return SameState(got, want, Part::kBuffers, tol);
}
inline ::testing::AssertionResult SameGrads(const torch::nn::Module& got, const torch::nn::Module& want, Tol tol) {
  return SameState(got, want, Part::kGrads, tol);
}

// ---------------------------------------------------------------------------------------------
// Twins: the same constructor run twice from the same seed gives identical weights (checked).

template <class Holder, class... Args>
std::pair<Holder, Holder> MakeTwins(uint64_t seed, const Args&... args) {
  torch::manual_seed(seed);
  Holder eager(args...);
  torch::manual_seed(seed);
  Holder subject(args...);
  EXPECT_TRUE(SameParameters(*subject, *eager, kExact)) << "twins differ at construction";
  EXPECT_TRUE(SameBuffers(*subject, *eager, kExact)) << "twins differ at construction";
  return {eager, subject};
}

// Runs f() with the CPU generator seeded to `seed`.
template <class F>
auto Seeded(uint64_t seed, F&& f) {
  torch::manual_seed(seed);
  return f();
}

// A fixed, RNG-free scalar loss over every floating output: sum_i (out_i * w_i).sum() with
// w_i = cos(0, 1, 2, ...) shaped like out_i, so that every output element gets its own gradient.
inline at::Tensor ProbeLoss(const std::vector<at::Tensor>& outs) {
  at::Tensor loss;
  for (const at::Tensor& out : outs) {
    if (!out.defined() || !out.is_floating_point() || !out.requires_grad()) continue;
    at::Tensor w = torch::cos(torch::arange(out.numel(), out.options().requires_grad(false))).view(out.sizes());
    at::Tensor term = (out * w).sum();
    loss = loss.defined() ? loss + term : term;
  }
  return loss;
}

// Kernel libraries of the "cpp" backend go to the test's own directory.
inline void UseTestCacheDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/warden-models";
  setenv("WARDEN_CACHE_DIR", dir.c_str(), 1);
}

// ---------------------------------------------------------------------------------------------
// The side under test: warden::compile(fn) for "aten"/"cpp", the function itself for "eager".

class Subject {
 public:
  Subject(warden::Fn fn, const std::string& backend, const std::string& name,
          warden::Dynamic dynamic = warden::Dynamic::kAuto)
      : fn_(std::move(fn)) {
    if (IsWarden(backend)) {
      UseTestCacheDir();
      warden::Options o;
      o.name = name;
      o.backend = backend;
      o.dynamic = dynamic;
      compiled_.emplace(warden::compile(fn_, o));
    }
  }

  std::vector<at::Tensor> operator()(const std::vector<c10::IValue>& args) {
    ++calls_;
    return compiled_ ? (*compiled_)(args) : fn_(args);
  }

  bool is_warden() const { return compiled_.has_value(); }
  warden::CompiledFunction& compiled() { return compiled_.value(); }

  // Guards the training flags of `module` (no-op for the eager control).
  Subject& watch(const torch::nn::Module& module, const std::string& name = "model") {
    if (compiled_) compiled_->watch(module, name);
    return *this;
  }

  // For the eager control: calls only.
  warden::Stats stats() const {
    if (compiled_) return compiled_->stats();
    warden::Stats s;
    s.calls = calls_;
    s.eager_calls = calls_;
    return s;
  }

  std::string explain() const { return compiled_ ? compiled_->explain() : std::string(); }

  // The recompile reasons of every event, one line each (for failure messages).
  std::string events() const {
    if (!compiled_) return {};
    std::ostringstream os;
    for (const auto& e : compiled_->recompiles()) {
      os << "call " << e.call_index << ": " << e.action << "\n";
      for (const auto& r : e.reasons) os << "    - " << r << "\n";
    }
    return os.str();
  }

 private:
  warden::Fn fn_;
  std::optional<warden::CompiledFunction> compiled_;
  int64_t calls_ = 0;
};

// With TWIN_EXPLAIN=1 in the environment, prints explain() of a subject (for debugging).
inline void MaybePrintExplain(const Subject& subject) {
  const char* flag = std::getenv("TWIN_EXPLAIN");
  if (flag != nullptr && *flag == '1' && subject.is_warden()) {
    std::cerr << subject.explain() << "\n" << subject.events() << std::endl;
  }
}

// Fixture of every parameterized suite: GetParam() is the backend ("eager", "aten", "cpp").
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& backend() const { return GetParam(); }
  bool warden() const { return IsWarden(GetParam()); }
  Tol tol(Tol t) const { return TolFor(GetParam(), t); }
};

#define TWIN_INSTANTIATE_BACKENDS(Suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::Values("eager", "aten", "cpp"),     \
                           [](const ::testing::TestParamInfo<std::string>& info) { return info.param; })

}  // namespace twin

#endif  // WARDEN_TESTS_MODELS_TWIN_H_
