// Differential and guard-soundness checks (differential.h).
#include "tests/fuzz/differential.h"

#include <chrono>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/core/DefaultDtype.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/sequential.h>

#include "tests/fuzz/patterns.h"

namespace warden::fuzz {
namespace {

struct Outcome {
  std::vector<at::Tensor> outputs;
  bool threw = false;
  bool c10_error = false;
  bool warden_error = false;  // warden::Error: Warden's own refusal, not an error eager raised
  std::string error;
};

template <typename F>
Outcome Capture(F&& f) {
  Outcome o;
  try {
    o.outputs = f();
  } catch (const c10::Error& e) {
    o.threw = true;
    o.c10_error = true;
    o.error = e.what_without_backtrace();
  } catch (const warden::Error& e) {
    o.threw = true;
    o.warden_error = true;
    o.error = e.what();
  } catch (const std::exception& e) {
    o.threw = true;
    o.error = e.what();
  }
  return o;
}

std::string Sizes(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// The lowest precision a floating value of the program may carry, which sets the tolerances: a
// double computed from float values carries their rounding (the "cpp" backend's libmvec functions
// are within 4 ulp where ATen's SLEEF ones are within 1), and a float computed from a bfloat16
// matmul under autocast carries bfloat16's (a fused region may round once where ATen rounds
// after every op).
enum class Precision { kDouble, kFloat, kBFloat16 };

// Empty if `got` is what eager computed. Floating values compare with the tolerances of the lower
// of `precision` and their own dtype's.
std::string CompareTensor(const at::Tensor& got, const at::Tensor& want, Precision precision) {
  if (got.defined() != want.defined()) return "defined() differs";
  if (!want.defined()) return "";
  std::ostringstream os;
  if (got.scalar_type() != want.scalar_type()) {
    os << "dtype " << got.scalar_type() << ", eager " << want.scalar_type();
    return os.str();
  }
  if (got.sizes() != want.sizes()) return "sizes " + Sizes(got) + ", eager " + Sizes(want);
  if (got.requires_grad() != want.requires_grad()) {
    os << "requires_grad " << got.requires_grad() << ", eager " << want.requires_grad();
    return os.str();
  }
  // Whether .grad accumulates on it, and whether autograd may use it later (Note [Thread modes]).
  if (want.requires_grad() && got.is_leaf() != want.is_leaf()) {
    os << "is_leaf " << got.is_leaf() << ", eager " << want.is_leaf();
    return os.str();
  }
  if (got.is_inference() != want.is_inference()) {
    os << "is_inference " << got.is_inference() << ", eager " << want.is_inference();
    return os.str();
  }
  at::Tensor g = got.detach(), w = want.detach();
  bool same;
  if (at::isFloatingType(w.scalar_type())) {
    Precision p = precision;
    if (w.scalar_type() == at::kFloat) p = std::max(p, Precision::kFloat);
    if (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf) p = Precision::kBFloat16;
    static const double kRtol[] = {1e-9, 1e-4, 3e-2}, kAtol[] = {1e-12, 1e-5, 1e-2};
    const int i = static_cast<int>(p);
    if (p == Precision::kBFloat16) {
      g = g.to(at::kDouble);
      w = w.to(at::kDouble);
    }
    same = at::allclose(g, w, kRtol[i], kAtol[i], /*equal_nan=*/true);
  } else {
    same = at::equal(g, w);
  }
  if (same) return "";
  os << "values differ:\n    warden " << g.reshape(-1).slice(0, 0, 12) << "\n    eager  "
     << w.reshape(-1).slice(0, 0, 12);
  return os.str();
}

// Empty if Warden's call matched eager's: outputs, mutated arguments, errors.
std::string CompareCall(const Outcome& got, const Outcome& want, const std::vector<c10::IValue>& got_args,
                        const std::vector<c10::IValue>& want_args, Precision precision) {
  if (want.threw) {
    if (!got.threw) return "eager raised \"" + want.error + "\" but Warden returned";
    if (want.c10_error && !got.c10_error) return "eager raised c10::Error \"" + want.error + "\", Warden raised \"" + got.error + "\"";
    if (want.c10_error && got.error != want.error) {
      return "eager raised \"" + want.error + "\", Warden raised another c10::Error \"" + got.error + "\"";
    }
    return "";
  }
  if (got.threw) return "Warden raised \"" + got.error + "\" but eager returned";
  if (got.outputs.size() != want.outputs.size()) return "number of outputs differs";
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    const std::string d = CompareTensor(got.outputs[i], want.outputs[i], precision);
    if (!d.empty()) return "output " + std::to_string(i) + ": " + d;
  }
  for (size_t i = 0; i < want_args.size(); ++i) {
    if (!want_args[i].isTensor()) continue;
    const std::string d = CompareTensor(got_args[i].toTensor(), want_args[i].toTensor(), precision);
    if (!d.empty()) return "argument " + std::to_string(i) + " after the call: " + d;
  }
  return "";
}

// Back-propagates the same loss through `outputs` (a weighted sum of every floating output that
// requires grad); false if none does. Sets *error if backward raised.
bool Backward(const std::vector<at::Tensor>& outputs, std::string* error) {
  bool any = false;
  try {
    // Building the loss may raise too: an output that is a view made in no-grad mode whose base
    // was written in place with grad on refuses to give its gradient edge.
    at::Tensor loss;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const at::Tensor& o = outputs[i];
      if (!o.defined() || !o.requires_grad() || !at::isFloatingType(o.scalar_type())) continue;
      any = true;
      at::Tensor term = o.to(at::kDouble).sum() * static_cast<double>(i + 1);
      loss = loss.defined() ? loss + term : term;
    }
    if (loss.defined()) loss.backward();
  } catch (const std::exception& e) {
    *error = e.what();
  }
  return any;
}

// Empty if the twins' parameters and buffers (running statistics) are equal, or with `grads`, the
// gradients accumulated on their parameters.
std::string CompareModels(torch::nn::SequentialImpl* got, torch::nn::SequentialImpl* want, bool grads,
                          Precision precision) {
  if (got == nullptr) return "";
  const std::vector<ModelTensor> g = ModelState(*got, grads), w = ModelState(*want, grads);
  for (size_t i = 0; i < w.size() && i < g.size(); ++i) {
    const std::string d = CompareTensor(g[i].value, w[i].value, precision);
    if (!d.empty()) return std::string(grads ? "grad of model." : "model.") + w[i].name + ": " + d;
  }
  return "";
}

// Empty if backward through Warden's outputs did what it did through eager's: both raised, or
// both left equal gradients on every argument, on every returned leaf (a requires_grad_ the
// function made) and on the twin models' parameters.
std::string CompareBackward(const Outcome& got, const Outcome& want, const std::vector<c10::IValue>& got_args,
                            const std::vector<c10::IValue>& want_args, torch::nn::SequentialImpl* got_model,
                            torch::nn::SequentialImpl* want_model, Precision precision, int64_t* count) {
  std::string want_error, got_error;
  const bool want_ran = Backward(want.outputs, &want_error);
  const bool got_ran = Backward(got.outputs, &got_error);
  if (!want_ran && !got_ran) return "";
  if (want_ran != got_ran) return "backward: only one side has outputs that require grad";
  ++*count;
  if (!want_error.empty() || !got_error.empty()) {
    if (want_error.empty()) return "backward: Warden raised \"" + got_error.substr(0, 200) + "\" but eager did not";
    if (got_error.empty()) return "backward: eager raised \"" + want_error.substr(0, 200) + "\" but Warden did not";
    return "";
  }
  for (size_t i = 0; i < want_args.size(); ++i) {
    // .grad is only populated on leaves (an argument an in-place op with a grad-requiring operand
    // made a non-leaf has none, and reading it only warns).
    if (!want_args[i].isTensor()) continue;
    if (got_args[i].toTensor().is_leaf() != want_args[i].toTensor().is_leaf()) {
      return "backward: argument " + std::to_string(i) + " is a leaf on one side only";
    }
    if (!want_args[i].toTensor().is_leaf()) continue;
    const std::string d = CompareTensor(got_args[i].toTensor().grad(), want_args[i].toTensor().grad(), precision);
    if (!d.empty()) return "backward: grad of argument " + std::to_string(i) + ": " + d;
  }
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    const at::Tensor& w = want.outputs[i];
    if (!w.defined() || !w.requires_grad() || !w.is_leaf()) continue;  // CompareCall matched the leafness
    const std::string d = CompareTensor(got.outputs[i].grad(), w.grad(), precision);
    if (!d.empty()) return "backward: grad of output " + std::to_string(i) + " (a leaf): " + d;
  }
  const std::string d = CompareModels(got_model, want_model, /*grads=*/true, precision);
  if (!d.empty()) return "backward: " + d;
  return "";
}

// Note [Gradients inside]
// A sampler's dlogp or a gradient penalty takes gradients inside the function it compiles. With
// Config::grad_inside the fuzzer's function runs the program, then, if some floating output
// requires grad and some tensor argument does, takes torch::autograd::grad of the weighted sum
// of those outputs (output i weighted i + 1) with respect to those arguments (unused ones give
// undefined gradients; retain_graph so that the backward check after the call can still run,
// as eager lets it) and returns the program's outputs followed by the gradients. Programs that
// write in place take no gradient inside (the ordinary mode covers them): LibTorch's own gradient
// with respect to a transposed view written in place, followed by a backward through it, counts
// the write twice (seed 110582), where Warden's graph counts it once. Which arguments the gradient
// is taken for is decided by requires_grad alone, which Warden guards; a choice by is_leaf() would
// be a C++ branch on autograd state that no guard sees. Warden captures
// the gradient computation into the graph (Note [Captured gradients]) or runs eagerly; either way
// every output, gradients included, must equal eager's, and an error raised by either side must
// be raised by both.
std::vector<at::Tensor> RunProgram(const Program& program, const std::vector<c10::IValue>& args, bool fp64,
                                   torch::nn::SequentialImpl* model, bool grad_inside, bool* took_grads = nullptr) {
  std::vector<at::Tensor> outputs = program.Run(args, fp64, model);
  if (!grad_inside) return outputs;
  for (const Step& s : program.steps) {
    if (s.op == Op::kAddInplace || s.op == Op::kMulInplace || s.op == Op::kAddInplaceTensor) return outputs;
  }
  at::Tensor loss;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& o = outputs[i];
    if (!o.defined() || !o.requires_grad() || !at::isFloatingType(o.scalar_type())) continue;
    const at::Tensor term = o.sum() * static_cast<double>(i + 1);
    loss = loss.defined() ? loss + term : term;
  }
  std::vector<at::Tensor> inputs;
  for (const c10::IValue& a : args) {
    if (a.isTensor() && a.toTensor().requires_grad()) inputs.push_back(a.toTensor());
  }
  if (!loss.defined() || inputs.empty()) return outputs;
  const std::vector<at::Tensor> grads = torch::autograd::grad({loss}, inputs, /*grad_outputs=*/{},
                                                              /*retain_graph=*/true, /*create_graph=*/false,
                                                              /*allow_unused=*/true);
  outputs.insert(outputs.end(), grads.begin(), grads.end());
  if (took_grads != nullptr) *took_grads = true;
  return outputs;
}

// Note [Float reference]
// Warden's fused kernels sum in another order than ATen and use other vector math, so a float
// result of an ill-conditioned program (sin of a large float sum, a difference of near-equal
// sums) can differ from eager's by more than any fixed tolerance while both are equally right.
// When float outputs differ, the program runs once more on double copies of the arguments (the
// same values; ToFloat and promotion to the default dtype give double): the difference is accepted
// only if every floating output of Warden is within 2x eager's own distance from that reference
// (plus the float atol), with NaN and Inf where eager has them. Any other difference (dtype, shape, integers, NaN
// placement, a Warden error far beyond eager's) still fails. The gradients the backward check
// leaves on float arguments are judged the same way (BackwardCloseToReference).
// Double copies of the float arguments (an argument passed twice stays one tensor, so is_same
// branches go the same way); with `requires_grad`, each requires grad where the original does.
std::vector<c10::IValue> ReferenceArgs(const std::vector<c10::IValue>& args, bool requires_grad) {
  std::vector<c10::IValue> ref_args;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& a = args[i];
    if (a.isTensor() && a.toTensor().scalar_type() == at::kFloat) {
      size_t same = 0;
      while (same < i && !(args[same].isTensor() && args[same].toTensor().is_same(a.toTensor()))) ++same;
      ref_args.push_back(same < i ? ref_args[same]
                                  : c10::IValue(a.toTensor().detach().to(at::kDouble).requires_grad_(
                                        requires_grad && a.toTensor().requires_grad())));
    } else {
      ref_args.push_back(a);
    }
  }
  return ref_args;
}

// Whether `got` is no further from a double reference than `want` is (Note [Float reference]):
// NaN and Inf where `want` has them, finite elements within `factor` x `want`'s distance plus
// `atol`.
bool NoFurtherFromReference(const at::Tensor& got, const at::Tensor& want, const at::Tensor& ref, double factor = 2,
                            double atol = 1e-5) {
  const at::Tensor r = ref.detach().to(at::kDouble);
  const at::Tensor wd = want.detach().to(at::kDouble), gd = got.detach().to(at::kDouble);
  if (!at::equal(at::isnan(gd), at::isnan(wd)) || !at::equal(at::isinf(gd), at::isinf(wd)) ||
      !at::equal(gd.masked_select(at::isinf(gd)), wd.masked_select(at::isinf(wd)))) {
    return false;
  }
  const at::Tensor finite = at::isfinite(wd).logical_and(at::isfinite(r));
  if (finite.sum().item<int64_t>() == 0) return true;
  const double eager_err = (wd - r).abs().masked_select(finite).max().item<double>();
  const double warden_err = (gd - r).abs().masked_select(finite).max().item<double>();
  return warden_err <= factor * eager_err + atol;
}

bool CloseToReference(const Program& program, const std::vector<c10::IValue>& args, const Outcome& got,
                      const Outcome& want, Precision precision, bool grad_inside) {
  // A model's parameters are float, and its dropout draws from the generator: no double twin.
  if (program.model.in > 0) return false;
  const std::vector<c10::IValue> ref_args = ReferenceArgs(args, grad_inside);
  // Integral and bool arguments promote to the default dtype: double for the reference run.
  const caffe2::TypeMeta default_dtype = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  const Outcome ref = Capture([&] { return RunProgram(program, ref_args, /*fp64=*/true, nullptr, grad_inside); });
  c10::set_default_dtype(default_dtype);
  if (ref.threw || ref.outputs.size() != want.outputs.size() || got.outputs.size() != want.outputs.size()) {
    return false;
  }
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    const at::Tensor& w = want.outputs[i];
    const at::Tensor& g = got.outputs[i];
    if (!w.defined() || !at::isFloatingType(w.scalar_type())) {
      if (!CompareTensor(g, w, precision).empty()) return false;
      continue;
    }
    if (!g.defined() || g.sizes() != w.sizes() || g.scalar_type() != w.scalar_type() ||
        !ref.outputs[i].defined() || ref.outputs[i].sizes() != w.sizes()) {
      return false;
    }
    // With gradients inside, outputs include gradients: BackwardCloseToReference's bound.
    if (!(grad_inside ? NoFurtherFromReference(g, w, ref.outputs[i], 4, 1e-4)
                      : NoFurtherFromReference(g, w, ref.outputs[i]))) {
      return false;
    }
  }
  return true;
}

// The same for the gradients the backward check left on the arguments: the program runs on double
// copies of the arguments (requiring grad as the originals do), the same loss is back-propagated,
// and every argument gradient of Warden's must be within 4x eager's distance from the reference's,
// plus 1e-4 (a gradient sums more rounded products than an output: program seed 12055, d((sin x /
// sin x)^3)/dx, is 0 exactly and 1e-15 in double, while float eager gave up to 1.5e-5 and Warden
// up to 6.1e-5, both rounding noise of g / sin x). Where a gradient is noise amplified by the
// function both sides are equally right; a wrong gradient is far from the reference where eager
// is close.
bool BackwardCloseToReference(const Program& program, const std::vector<c10::IValue>& args,
                              const std::vector<c10::IValue>& got_args, const std::vector<c10::IValue>& want_args,
                              bool grad_inside) {
  if (program.model.in > 0) return false;
  const std::vector<c10::IValue> ref_args = ReferenceArgs(args, /*requires_grad=*/true);
  const caffe2::TypeMeta default_dtype = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  const Outcome ref = Capture([&] { return RunProgram(program, ref_args, /*fp64=*/true, nullptr, grad_inside); });
  c10::set_default_dtype(default_dtype);
  if (ref.threw) return false;
  std::string error;
  Backward(ref.outputs, &error);
  if (!error.empty()) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].isTensor()) continue;
    const at::Tensor g = got_args[i].toTensor().grad(), w = want_args[i].toTensor().grad();
    if (!g.defined() && !w.defined()) continue;
    if (!g.defined() || !w.defined() || g.sizes() != w.sizes()) return false;
    if (!at::isFloatingType(w.scalar_type()) || args[i].toTensor().scalar_type() != at::kFloat) {
      if (!CompareTensor(g, w, Precision::kDouble).empty()) return false;  // not a float question
      continue;
    }
    const at::Tensor r = ref_args[i].toTensor().grad();
    if (!r.defined() || r.sizes() != w.sizes() || !NoFurtherFromReference(g, w, r, 4, 1e-4)) return false;
  }
  return true;
}

std::string DescribeSpecs(const std::vector<ArgSpec>& specs) {
  std::string s;
  for (size_t i = 0; i < specs.size(); ++i) s += (i ? ", " : "") + SpecToString(specs[i]);
  return s;
}

at::ScalarType OtherDtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return at::kDouble;
    case at::kDouble: return at::kFloat;
    case at::kLong: return at::kInt;
    case at::kInt: return at::kLong;
    default: return at::kLong;
  }
}

// The inputs that break exactly the property one guard checks, or false if the guard is not one
// of the kinds probed. `what` names the change.
bool BreakGuard(const std::string& guard, std::vector<ArgSpec> specs, std::vector<ArgSpec>* out, std::string* what) {
  static const std::regex kDtype(R"(^arg(\d+)\.dtype == \w+$)");
  static const std::regex kGrad(R"(^arg(\d+)\.requires_grad == (true|false)$)");
  static const std::regex kDim(R"(^arg(\d+)\.dim\(\) == (\d+)$)");
  static const std::regex kSize(R"(^arg(\d+)\.size\((\d+)\) == (\d+)$)");
  static const std::regex kScalar(R"(^arg(\d+) == \S+$)");
  const std::string text = guard.substr(0, guard.find("  #"));
  std::smatch m;
  auto arg = [&](size_t k) -> ArgSpec* {
    const size_t i = std::stoul(m[k]);
    return i < specs.size() ? &specs[i] : nullptr;
  };
  if (std::regex_match(text, m, kDtype)) {
    ArgSpec* s = arg(1);
    if (s == nullptr || s->kind != ArgKind::kTensor) return false;
    s->dtype = OtherDtype(s->dtype);
    s->requires_grad = s->requires_grad && at::isFloatingType(s->dtype);
  } else if (std::regex_match(text, m, kGrad)) {
    ArgSpec* s = arg(1);
    if (s == nullptr || !at::isFloatingType(s->dtype) || s->layout != Layout::kContiguous) return false;
    s->requires_grad = !s->requires_grad;
  } else if (std::regex_match(text, m, kDim)) {
    ArgSpec* s = arg(1);
    if (s == nullptr) return false;
    s->sizes.push_back(2);
  } else if (std::regex_match(text, m, kSize)) {
    ArgSpec* s = arg(1);
    const size_t d = std::stoul(m[2]);
    if (s == nullptr || d >= s->sizes.size()) return false;
    const int64_t n = std::stoll(m[3]);
    s->sizes[d] = n <= 1 ? 2 : (n == 2 ? 3 : n - 1);
  } else if (std::regex_match(text, m, kScalar)) {
    ArgSpec* s = arg(1);
    if (s == nullptr || s->kind == ArgKind::kTensor) return false;
    s->scalar += s->kind == ArgKind::kInt ? 1 : 0.5;
  } else {
    return false;
  }
  *what = "broke guard `" + text + "`";
  *out = std::move(specs);
  return true;
}

}  // namespace

std::string ConfigName(const Config& c) {
  const char* mode = c.dynamic == Dynamic::kStatic ? "static" : c.dynamic == Dynamic::kAuto ? "auto" : "dynamic";
  return c.backend + "/" + mode + (c.mark_dynamic ? "+mark_dynamic" : "") + (c.grad_inside ? "+grad_inside" : "");
}

std::vector<Config> GradInsideConfigsOf(const std::string& backend) {
  return {{backend, Dynamic::kStatic, false, /*grad_inside=*/true}, {backend, Dynamic::kAuto, false, true}};
}

std::vector<Config> ConfigsOf(const std::string& backend) {
  std::vector<Config> all;
  for (Dynamic d : {Dynamic::kStatic, Dynamic::kAuto, Dynamic::kDynamic}) all.push_back({backend, d});
  all.push_back({backend, Dynamic::kStatic, /*mark_dynamic=*/true});
  return all;
}

std::vector<Config> AllConfigs() {
  std::vector<Config> all = ConfigsOf("aten");
  for (const Config& c : ConfigsOf("cpp")) all.push_back(c);
  return all;
}

std::vector<std::string> CheckProgram(const Program& program, const std::vector<Config>& configs,
                                      CheckCounts* counts, std::vector<std::string>* limitations) {
  std::vector<std::string> failures;
  std::mt19937_64 rng(program.seed ^ 0xa0761d6478bd642fULL);
  const std::vector<ArgSpec>& base = program.args;

  // The call sequence, the same for every configuration: (specs, value seed, what changed, the
  // twin models' training flags).
  struct Call {
    std::vector<ArgSpec> specs;
    uint64_t value_seed;
    std::string what;
    ModelMode model_mode = ModelMode::kTrain;
  };
  std::vector<Call> calls = {{base, 1, "first call"}, {base, 2, "new values"}};
  if (program.alias_b >= 0) {
    // One tensor in two argument positions, a view of it, two halves of one storage, between
    // distinct tensors of the same specs; half of the programs trace the aliased call first.
    const int a = program.alias_a, b = program.alias_b;
    auto aliased = [&](Alias kind) {
      std::vector<ArgSpec> s = base;
      const bool requires_grad = s[b].requires_grad;
      s[b] = s[a];
      s[b].alias = kind;
      s[b].alias_of = a;
      if (kind == Alias::kSibling) {
        s[a].layout = s[b].layout = Layout::kContiguous;  // both halves of one contiguous base
        s[b].requires_grad = requires_grad;
      }
      return s;
    };
    const std::string pa = "%" + std::to_string(a), pb = "%" + std::to_string(b);
    if ((program.seed / 5) % 2 == 1) calls[0] = {aliased(Alias::kSame), 1, "first call, " + pb + " is " + pa};
    std::vector<Call> more = {{aliased(Alias::kSame), 11, pb + " is " + pa},
                              {aliased(Alias::kView), 12, pb + " is a view of " + pa},
                              {aliased(Alias::kSibling), 13, pa + " and " + pb + " share one storage"},
                              {base, 14, "distinct tensors again"},
                              {aliased(Alias::kSame), 15, pb + " is " + pa + " again"}};
    calls.insert(calls.end(), more.begin(), more.end());
  }
  std::vector<int> tensor_args;
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i].kind == ArgKind::kTensor) tensor_args.push_back(static_cast<int>(i));
  }
  auto pick_tensor = [&] { return tensor_args[rng() % tensor_args.size()]; };
  {
    std::vector<ArgSpec> s = base;
    ArgSpec& t = s[pick_tensor()];
    if (!t.sizes.empty()) {
      static const int64_t kSizes[] = {0, 1, 2, 3, 5, 6};
      t.sizes[rng() % t.sizes.size()] = kSizes[rng() % 6];
      calls.push_back({s, 3, "one size changed"});
    }
  }
  calls.push_back({base, 4, "first shapes again"});
  {
    std::vector<ArgSpec> s = base;
    ArgSpec& t = s[pick_tensor()];
    const Layout before = t.layout;
    if (t.layout != Layout::kContiguous) {
      t.layout = Layout::kContiguous;
    } else if (t.sizes.size() >= 2 && !t.requires_grad) {
      t.layout = Layout::kTransposed;
    } else if (!t.sizes.empty() && !t.requires_grad) {
      t.layout = Layout::kStrided;
    }
    if (t.layout != before) calls.push_back({s, 5, "another layout"});
  }
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i].kind == ArgKind::kTensor) continue;
    std::vector<ArgSpec> s = base;
    s[i].scalar += 1;
    calls.push_back({s, 6, "scalar value changed"});
  }
  if (program.model.in > 0) {
    // The same shapes under every training flag, and back: each switch must miss (or hit the entry
    // traced under that flag), never reuse another flag's graph (Note [Watched modules]).
    calls.push_back({base, 21, "model eval()", ModelMode::kEval});
    calls.push_back({base, 22, "model eval() again", ModelMode::kEval});
    calls.push_back({base, 23, "model train() again", ModelMode::kTrain});
    calls.push_back({base, 24, "model BatchNorm alone eval()", ModelMode::kBatchNormEval});
    calls.push_back({base, 25, "model Dropout alone eval()", ModelMode::kDropoutEval});
    calls.push_back({base, 26, "model eval() once more", ModelMode::kEval});
  }

  // Float values anywhere: a float argument, a conversion to float, or an integral or bool
  // argument (which promotes to the default dtype, float, with a floating scalar), or a model
  // (float parameters); bfloat16 ones from a matmul under autocast.
  Precision precision = Precision::kDouble;
  for (const ArgSpec& a : base) {
    if (a.kind == ArgKind::kTensor && a.dtype != at::kDouble) precision = Precision::kFloat;
  }
  for (const Step& st : program.steps) {
    if (st.op == Op::kToFloat || st.op == Op::kModel) precision = Precision::kFloat;
  }
  for (const Region& r : program.regions) {
    if (r.mode == Mode::kAutocast) precision = Precision::kBFloat16;
  }

  // The twin models of the current configuration (null without a Model step).
  std::shared_ptr<torch::nn::SequentialImpl> eager_model, warden_model;

  auto check = [&](CompiledFunction& f, const Config& config, const std::vector<ArgSpec>& specs,
                   uint64_t value_seed, const std::string& what, int index,
                   ModelMode model_mode = ModelMode::kTrain) -> bool {
    std::vector<c10::IValue> want_args = MakeArgs(specs, value_seed);
    std::vector<c10::IValue> got_args = MakeArgs(specs, value_seed);
    if (eager_model != nullptr) {
      SetModelMode(*eager_model, model_mode);
      SetModelMode(*warden_model, model_mode);
    }
    // Both sides start from one generator state (dropout's masks), and must leave it alike.
    const uint64_t generator_seed = value_seed * 1000003 + static_cast<uint64_t>(index + 1);
    at::manual_seed(generator_seed);
    bool took_grads = false;
    const Outcome want = Capture(
        [&] { return RunProgram(program, want_args, false, eager_model.get(), config.grad_inside, &took_grads); });
    counts->grads_inside += took_grads;
    const int64_t want_next = at::randint(1 << 30, {1}, at::kLong).item<int64_t>();
    std::string diff;
    if (const std::string leak = ModesLeftOn(); !leak.empty()) {
      ResetModes();
      diff = "fuzzer bug: the eager run left thread modes on:" + leak;
    }
    at::manual_seed(generator_seed);
    const Outcome got = Capture([&] { return f(got_args); });
    const int64_t got_next = at::randint(1 << 30, {1}, at::kLong).item<int64_t>();
    if (const std::string leak = ModesLeftOn(); !leak.empty() && diff.empty()) {
      ResetModes();
      diff = "thread modes after Warden's call differ from the caller's:" + leak;
    }
    ++counts->calls;
    counts->eager_errors += want.threw;
    if (diff.empty()) diff = CompareCall(got, want, got_args, want_args, precision);
    if (diff.rfind("output ", 0) == 0 && diff.find("values differ") != std::string::npos &&
        precision != Precision::kDouble && CloseToReference(program, MakeArgs(specs, value_seed), got, want, precision,
                                                         config.grad_inside)) {
      ++counts->reference_accepts;  // Note [Float reference]
      diff.clear();
    }
    if (diff.empty()) diff = CompareModels(warden_model.get(), eager_model.get(), /*grads=*/false, precision);
    if (diff.empty() && want_next != got_next) {
      diff = "the global generator is in another state after the call (random numbers drawn differently)";
    }
    if (diff.empty() && !want.threw) {
      diff = CompareBackward(got, want, got_args, want_args, warden_model.get(), eager_model.get(), precision,
                             &counts->backward);
      if (diff.rfind("backward: grad of argument ", 0) == 0 && diff.find("values differ") != std::string::npos &&
          precision != Precision::kDouble &&
          BackwardCloseToReference(program, MakeArgs(specs, value_seed), got_args, want_args, config.grad_inside)) {
        ++counts->reference_accepts;  // Note [Float reference]
        diff.clear();
      }
    }
    if (diff.empty()) return true;
    std::ostringstream os;
    os << "[" << ConfigName(config) << "] call " << index << " (" << what << "; args " << DescribeSpecs(specs)
       << "; value seed " << value_seed;
    if (eager_model != nullptr) os << "; model " << ModelModeName(model_mode);
    os << "): " << diff << "\n";
    // Documented (README "Run eagerly, and said so"): a custom Function, a .grad access or a raw
    // data read after the function wrote an argument or a captured tensor cannot be re-run, and
    // Warden says so instead of returning. Counted and kept apart; the later calls still run (a
    // model in eval mode writes nothing), from twin models made alike again.
    // (Whether eager returned or raised: the refusal comes before Warden could know.)
    if (got.warden_error && got.error.find("cannot be re-run eagerly") != std::string::npos) {
      ++counts->limitations;
      if (limitations != nullptr) limitations->push_back(os.str());
      if (eager_model != nullptr) CopyModelState(*eager_model, *warden_model);
      return true;
    }
    os << f.explain();
    failures.push_back(os.str());
    return false;
  };

  // What the mark_dynamic configurations mark: one dim of one tensor argument, and every scalar.
  std::vector<std::pair<int, int>> marks;
  {
    std::vector<std::pair<int, int>> dims;
    for (int i : tensor_args) {
      for (size_t d = 0; d < base[i].sizes.size(); ++d) dims.emplace_back(i, static_cast<int>(d));
    }
    if (!dims.empty()) marks.push_back(dims[rng() % dims.size()]);
    for (size_t i = 0; i < base.size(); ++i) {
      if (base[i].kind != ArgKind::kTensor) marks.emplace_back(static_cast<int>(i), 0);
    }
  }

  for (const Config& config : configs) {
    Options options;
    options.name = "fuzz" + std::to_string(program.seed);
    options.backend = config.backend;
    options.dynamic = config.dynamic;
    if (program.model.in > 0) {
      eager_model = MakeModel(program.model);
      warden_model = MakeModel(program.model);
    }
    CompiledFunction f = compile(
        [program, model = warden_model, grad_inside = config.grad_inside](const std::vector<c10::IValue>& a) {
          return RunProgram(program, a, false, model.get(), grad_inside);
        },
        options);
    if (warden_model != nullptr) f.watch(*warden_model, "model");
    if (config.mark_dynamic) {
      for (const auto& [arg, dim] : marks) f.mark_dynamic(arg, dim);
    }
    bool ok = true;
    for (size_t i = 0; i < calls.size() && ok; ++i) {
      ok = check(f, config, calls[i].specs, calls[i].value_seed, calls[i].what, static_cast<int>(i), calls[i].model_mode);
    }
    if (!ok) continue;
    const Stats s = f.stats();
    if (s.calls != static_cast<int64_t>(calls.size()) || s.cache_hits + s.compiles + s.eager_calls > s.calls) {
      std::ostringstream os;
      os << "[" << ConfigName(config) << "] stats do not add up: calls " << s.calls << " (made " << calls.size()
         << "), hits " << s.cache_hits << ", compiles " << s.compiles << ", eager " << s.eager_calls;
      failures.push_back(os.str());
      continue;
    }

    // Guard probes: one entry, one broken guard, a miss.
    for (int probe = 0; probe < 2 && ok; ++probe) {
      f.reset();
      const Stats s0 = f.stats();
      if (!check(f, config, base, 7, "probe base", -1)) break;
      const Stats s1 = f.stats();
      if (s1.compiles != s0.compiles + 1) break;  // ran eagerly or raised: nothing to probe
      std::vector<std::string> guards = f.guards(0);
      std::vector<std::pair<std::vector<ArgSpec>, std::string>> breaks;
      for (const std::string& g : guards) {
        std::vector<ArgSpec> specs;
        std::string what;
        if (BreakGuard(g, base, &specs, &what)) breaks.emplace_back(std::move(specs), std::move(what));
      }
      if (breaks.empty()) break;
      const auto& [specs, what] = breaks[rng() % breaks.size()];
      ++counts->probes;
      ok = check(f, config, specs, 7, what, -1);
      const Stats s2 = f.stats();
      if (ok && s2.cache_hits != s1.cache_hits) {
        std::ostringstream os;
        os << "[" << ConfigName(config) << "] guard probe: " << what << " (args " << DescribeSpecs(specs)
           << ") hit the only entry\n"
           << f.explain();
        failures.push_back(os.str());
        ok = false;
      }
    }
  }
  return failures;
}

bool HasPatterns(const Program& p) {
  if (!p.regions.empty() || p.model.in > 0 || p.alias_b >= 0) return true;
  for (const Step& s : p.steps) {
#define WARDEN_FUZZ_IS(name) s.op == Op::k##name ||
    if (WARDEN_FUZZ_PATTERN_OPS(WARDEN_FUZZ_IS) false) return true;
#undef WARDEN_FUZZ_IS
  }
  return false;
}

FuzzSummary RunFuzz(const FuzzBudget& budget) {
  FuzzSummary summary;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  for (int64_t i = 0; i < budget.programs; ++i) {
    if (budget.seconds > 0 && elapsed() >= budget.seconds) break;
    const Program p = Generate(budget.seed + static_cast<uint64_t>(i), budget.force_patterns);
    if (budget.verbose) std::cerr << p.ToString();
    summary.with_patterns += HasPatterns(p);
    std::vector<std::string> limitations;
    for (const std::string& f : CheckProgram(p, budget.configs, &summary.counts, &limitations)) {
      summary.failures.push_back(p.ToString() + f);
      if (budget.verbose) std::cerr << "FAILURE " << summary.failures.back() << "\n";
    }
    // One example per program is enough to read what the limitation was.
    if (!limitations.empty() && summary.limitations.size() < 50) summary.limitations.push_back(p.ToString() + limitations[0]);
    ++summary.programs;
  }
  summary.seconds = elapsed();
  return summary;
}

}  // namespace warden::fuzz
