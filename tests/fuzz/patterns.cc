// Mode scopes, custom autograd Functions and the model (patterns.h).
#include "tracer/autocast_compat.h"
#include "tests/fuzz/patterns.h"

#include <optional>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "tracer/torch_compat.h"

namespace warden::fuzz {

class ModeStack::Scope {
 public:
  explicit Scope(Mode mode) : mode_(mode) {
    switch (mode) {
      case Mode::kNoGrad: no_grad_.emplace(); break;
      case Mode::kGradOff: grad_.emplace(false); break;
      case Mode::kGradOn: grad_.emplace(true); break;
      case Mode::kInference: inference_.emplace(true); break;
      case Mode::kInferenceOff: inference_.emplace(false); break;
      case Mode::kAutocast:
      case Mode::kAutocastOff:
        // What torch.autocast's __enter__ does on CPU: set the flag, count the nesting; __exit__
        // restores the flag and clears the cast cache when the outermost region closes.
        autocast_before_ = warden::compat::AutocastCpuEnabled();
        warden::compat::SetAutocastCpuEnabled(mode == Mode::kAutocast);
        at::autocast::increment_nesting();
        break;
    }
  }
  ~Scope() {
    if (mode_ == Mode::kAutocast || mode_ == Mode::kAutocastOff) {
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      warden::compat::SetAutocastCpuEnabled(autocast_before_);
    }
  }

 private:
  Mode mode_;
  std::optional<torch::NoGradGuard> no_grad_;
  std::optional<torch::AutoGradMode> grad_;
  std::optional<c10::InferenceMode> inference_;
  bool autocast_before_ = false;
};

ModeStack::ModeStack() = default;

ModeStack::~ModeStack() {
  // Innermost first: each scope restores the state the one around it set.
  while (!scopes_.empty()) scopes_.pop_back();
}

void ModeStack::Push(const Region& region) {
  scopes_.push_back(std::make_unique<Scope>(region.mode));
  ends_.push_back(region.end);
}

void ModeStack::CloseUntil(int step) {
  while (!ends_.empty() && ends_.back() <= step) {
    scopes_.pop_back();
    ends_.pop_back();
  }
}

std::string ModesLeftOn() {
  std::string s;
  if (!at::GradMode::is_enabled()) s += " grad mode off;";
  if (c10::InferenceMode::is_enabled()) s += " inference mode on;";
  if (warden::compat::AutocastCpuEnabled()) s += " autocast (cpu) on;";
  // InferenceMode and the tracer both change the dispatch-key TLS; outside either it is default.
  const c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  if (keys.included_ != c10::default_included_set) s += " included dispatch keys " + c10::toString(keys.included_) + ";";
  if (keys.excluded_ != c10::default_excluded_set) s += " excluded dispatch keys " + c10::toString(keys.excluded_) + ";";
  return s;
}

void ResetModes() {
#if WARDEN_TORCH_AT_LEAST(2, 0)
  c10::AutogradState::set_tls_state(c10::AutogradState(/*grad_mode=*/true, /*inference_mode=*/false,
                                                       /*fw_grad_mode=*/true, /*multithreading_enabled=*/true));
#else
  c10::AutogradState::set_tls_state(c10::AutogradState(/*grad_mode=*/true, /*inference_mode=*/false,
                                                       /*fw_grad_mode=*/true));
#endif
  c10::impl::_force_tls_local_dispatch_key_set(c10::impl::PODLocalDispatchKeySet{0, 0});  // the defaults
  warden::compat::SetAutocastCpuEnabled(false);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Gradient reversal (domain-adversarial training): the identity forward, -g backward.
struct GradReverseFn : torch::autograd::Function<GradReverseFn> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list g) { return {-g[0]}; }
};

// Gradient scaling: the identity forward (a new tensor, x * 1), 2 g backward.
struct GradScaleFn : torch::autograd::Function<GradScaleFn> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) { return x * 1; }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0] * 2}; }
};

// x * x with x saved for backward: a later in-place write of x makes backward raise, in both.
struct SquareFn : torch::autograd::Function<SquareFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {g[0] * 2 * x};
  }
};

}  // namespace

at::Tensor ApplyGradReverse(const at::Tensor& x) { return GradReverseFn::apply(x); }
at::Tensor ApplyGradScale(const at::Tensor& x) { return GradScaleFn::apply(x); }
at::Tensor ApplySquareFn(const at::Tensor& x) { return SquareFn::apply(x); }

std::shared_ptr<torch::nn::SequentialImpl> MakeModel(const ModelSpec& spec) {
  torch::nn::Sequential net(torch::nn::Linear(spec.in, spec.out), torch::nn::BatchNorm1d(spec.out),
                            torch::nn::Dropout(spec.dropout));
  // Values from the spec's own generator (not the global one, which the calls seed for dropout).
  at::Generator gen = at::detail::createCPUGenerator(spec.seed);
  torch::NoGradGuard no_grad;
  for (at::Tensor& p : net->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.5 + (p.dim() == 1 ? 0.5 : 0));
  return net.ptr();
}

at::Tensor CallModel(torch::nn::SequentialImpl& model, const at::Tensor& x) { return model.forward(x); }

void SetModelMode(torch::nn::SequentialImpl& model, ModelMode mode) {
  model.train(mode != ModelMode::kEval);
  if (mode == ModelMode::kBatchNormEval) model[1]->eval();
  if (mode == ModelMode::kDropoutEval) model[2]->eval();
}

const char* ModelModeName(ModelMode mode) {
  switch (mode) {
    case ModelMode::kTrain: return "train()";
    case ModelMode::kEval: return "eval()";
    case ModelMode::kBatchNormEval: return "train(), BatchNorm eval()";
    case ModelMode::kDropoutEval: return "train(), Dropout eval()";
  }
  return "?";
}

std::vector<ModelTensor> ModelState(torch::nn::SequentialImpl& model, bool grads) {
  std::vector<ModelTensor> out;
  for (const auto& p : model.named_parameters()) out.push_back({p.key(), grads ? p.value().grad() : p.value()});
  if (!grads) {
    for (const auto& b : model.named_buffers()) out.push_back({b.key(), b.value()});
  }
  return out;
}

void CopyModelState(torch::nn::SequentialImpl& from, torch::nn::SequentialImpl& to) {
  torch::NoGradGuard no_grad;
  const std::vector<ModelTensor> src = ModelState(from, false), dst = ModelState(to, false);
  for (size_t i = 0; i < src.size() && i < dst.size(); ++i) dst[i].value.copy_(src[i].value);
  const std::vector<at::Tensor> src_params = from.parameters(), dst_params = to.parameters();
  for (size_t i = 0; i < src_params.size() && i < dst_params.size(); ++i) {
    dst_params[i].mutable_grad() = src_params[i].grad().defined() ? src_params[i].grad().clone() : at::Tensor();
  }
}

}  // namespace warden::fuzz
