// Note [Compiled backward]
// A training loop calls `loss.backward()` on what a compiled function returned. Without this, the
// forward replays with autograd recording every op, and LibTorch's engine runs its backward
// formulas one by one. With it, an entry whose outputs require grad runs its forward artifact with
// grad mode off (fused, nothing recorded) inside one torch::autograd::Function; that node's
// backward is a second compiled function, `<name>.backward`, whose body re-runs the user's function
// on the saved arguments and takes torch::autograd::grad of the differentiable outputs with respect
// to the tensors that require grad (arguments, and captured parameters). Its trace captures that
// gradient (Note [Captured gradients] in tracer/tracer.cc), so the backward is one graph:
// forward recomputed + derivative rules, compiled like any other, cached per guard signature.
// Save vs. recompute: the node keeps the call's arguments (their version counters, and those of
// the tensors the graph captured, checked as autograd checks saved variables, so a write between
// forward and backward raises eager's error instead of recomputing from the new values) and, on
// backend cpp, the outputs of the forward's matmuls (Note [Saved outputs]); it recomputes every
// other intermediate: the cpp backend fuses pointwise recomputation with the backward's pointwise
// work.
// Eligibility (else LibTorch's autograd over the replay, as before, reason in explain()): the graph
// has no convolution, pooling or RNN op (recomputing them costs more than autograd saves: an MLP's
// training step ran at 0.68x of eager, a small CNN's at 0.48x), has matmuls only on backend cpp
// and only where their outputs can be saved, draws no random numbers
// (a recompute would draw again: dropout in training mode), writes no argument or captured tensor
// in place (BatchNorm's running statistics in training mode would be updated twice), and returns no
// argument or captured tensor nor a view of one, no leaf it made, and no two outputs sharing
// storage. A backward whose gradient cannot be captured
// (an op without a derivative rule) runs its body eagerly once, is then switched off for later
// calls, and says so; a double backward (create_graph) runs the body eagerly with create_graph.
#include "runtime/compiled_backward.h"

#include <algorithm>
#include <set>

#include <ATen/Functions.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "absl/strings/str_cat.h"
#include "runtime/codegen_replay.h"
#include "runtime/function_impl.h"
#include "runtime/logging.h"

namespace warden::runtime {
namespace {

// What one call's node keeps besides the saved tensors.
struct CallState : torch::CustomClassHolder {
  std::shared_ptr<const CompiledBackward> self;
  std::vector<c10::IValue> args;        // the call's arguments
  std::vector<int> tensor_args;         // positions of its tensor arguments
  std::vector<uint32_t> versions;       // their version counters at the forward
  std::vector<uint32_t> captured_versions;  // CompiledBackward::captured_'s, at the forward
  std::vector<std::vector<int64_t>> output_sizes;
  std::vector<at::TensorOptions> output_options;
  std::vector<int> returned;            // per output: its position among the node's outputs, or -1
  std::vector<at::Tensor> saved;        // outputs of heavy ops the forward saved for the backward
};

// Autograd's check of a saved variable: `t` must still be at the version the forward saw.
void CheckVersion(const at::Tensor& t, uint32_t expected, const std::string& what) {
  TORCH_CHECK(t._version() == expected,
              "one of the variables needed for gradient computation has been modified by an inplace operation: [",
              t.toString(), " ", t.sizes(), "] is at version ", t._version(), "; expected version ", expected,
              " instead (Warden: ", what, ")");
}

struct ForwardFailed {
  std::string why;
};

struct WardenNode : public torch::autograd::Function<WardenNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList diff_inputs,
                                                const CompiledBackward* self, const Artifact* artifact,
                                                const std::vector<c10::IValue>* args, std::vector<at::Tensor>* all) {
    std::vector<at::Tensor>& outputs = *all;
    std::string failure;
    bool ran;
    {
      codegen::ScopedBelowAutograd below;  // Note [Below autograd]: this node is the outputs' history
      ran = artifact->Run(*args, &outputs, &failure);
    }
    if (!ran) throw ForwardFailed{failure};
    auto state = c10::make_intrusive<CallState>();
    // The artifact's extra outputs are what the backward saves (never seen by the caller).
    const size_t num_outputs = self->diff_outputs().size();
    state->saved.assign(std::make_move_iterator(outputs.begin() + static_cast<std::ptrdiff_t>(num_outputs)),
                        std::make_move_iterator(outputs.end()));
    outputs.resize(num_outputs);
    state->self = self->shared_from_this();
    // The arguments are kept by the node (not as saved variables: one node serves every output,
    // and a backward through one output without retain_graph must not free another's), and
    // checked against writes in place as autograd checks its saved variables.
    state->args = *args;
    for (size_t i = 0; i < args->size(); ++i) {
      const c10::IValue& a = (*args)[i];
      if (a.isTensor() && a.toTensor().defined()) {
        state->tensor_args.push_back(static_cast<int>(i));
        state->versions.push_back(a.toTensor()._version());
      }
    }
    // Captured tensors (parameters, buffers) too: the backward recomputes with their values then.
    for (const at::Tensor& c : self->captured()) state->captured_versions.push_back(c._version());
    // Note [Undefined outputs]: an undefined output (a function may return at::Tensor(), and a
    // gradient taken inside with allow_unused is one) is not the node's: LibTorch's Function
    // machinery cannot take it (1.13 throws from a noexcept path: the process ends). The node
    // returns the defined outputs; Run() puts them back in their positions.
    std::vector<at::Tensor> returned, non_differentiable;
    for (size_t j = 0; j < outputs.size(); ++j) {
      const at::Tensor& o = outputs[j];
      state->output_sizes.push_back(o.defined() ? o.sizes().vec() : std::vector<int64_t>());
      state->output_options.push_back(o.defined() ? o.options() : at::TensorOptions());
      state->returned.push_back(o.defined() ? static_cast<int>(returned.size()) : -1);
      if (o.defined()) returned.push_back(o);
      if (o.defined() && !self->diff_outputs()[j]) non_differentiable.push_back(o);
    }
    if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);
    ctx->saved_data["warden"] = c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(state));
    return returned;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto state = c10::static_intrusive_pointer_cast<CallState>(ctx->saved_data["warden"].toCapsule());
    for (size_t k = 0; k < state->tensor_args.size(); ++k) {
      CheckVersion(state->args[state->tensor_args[k]].toTensor(), state->versions[k],
                   absl::StrCat("argument ", state->tensor_args[k],
                                " of the compiled function was written between its call and this backward"));
    }
    const std::vector<at::Tensor>& captured = state->self->captured();
    for (size_t k = 0; k < captured.size(); ++k) {
      CheckVersion(captured[k], state->captured_versions[k],
                   "a tensor the compiled function captured (a parameter or buffer) was written between its call "
                   "and this backward, which recomputes the forward from it; call backward() before writing it, "
                   "e.g. before optimizer.step()");
    }
    const std::vector<c10::IValue>& args = state->args;
    std::vector<at::Tensor> all_grads(state->returned.size());  // per output, undefined ones included
    for (size_t j = 0; j < state->returned.size(); ++j) {
      if (state->returned[j] >= 0) all_grads[j] = grads.at(state->returned[j]);
    }
    std::vector<at::Tensor> result =
        state->self->Backward(args, all_grads, state->output_sizes, state->output_options, state->saved);
    result.resize(result.size() + 4);  // the four non-tensor arguments of forward()
    return result;
  }
};

}  // namespace

std::shared_ptr<CompiledBackward> CompiledBackward::Make(const Fn& fn, const tracer::Graph& g, const Options& options,
                                                         std::string* why) {
  why->clear();
  static const bool enabled = [] {
    const char* v = std::getenv("WARDEN_COMPILED_BACKWARD");
    return v == nullptr || std::string(v) != "0";
  }();
  bool any_output = false;
  for (tracer::ValueId o : g.outputs) any_output |= o != tracer::kNoValue && g.value(o).meta.requires_grad;
  if (!any_output || !g.entry_mode.grad_mode || g.entry_mode.inference_mode) return nullptr;
  if (!enabled) {
    *why = "WARDEN_COMPILED_BACKWARD=0";
    return nullptr;
  }
  std::vector<int> heavy;  // nodes whose outputs the forward saves (checked below)
  for (const tracer::Node& n : g.nodes) {
    // Recomputing pointwise work is cheaper than saving it (it fuses with the backward's);
    // recomputing matmuls, convolutions or pooling costs more than LibTorch's autograd saves
    // (measured: an MLP's training step at 0.68x of eager, a small CNN's at 0.48x). Matmuls are
    // saved instead (Note [Saved outputs]), on backend cpp, which fuses the backward's pointwise
    // work (the MLP step then ran at 1.02x; replayed op by op on "aten" at 0.83x). Convolutions and
    // pooling keep LibTorch's autograd: saved, the small CNN's step still ran at 0.55-0.75x.
    for (const char* op : {"conv", "pool", "lstm", "gru", "rnn", "einsum", "tensordot", "attention"}) {
      if (n.op.find(op) != std::string::npos) {
        *why = absl::StrCat(n.op, " at %", n.index,
                            ": a compiled backward would run it again or save it, both slower than LibTorch's "
                            "autograd here");
        return nullptr;
      }
    }
    for (const char* op : {"mm", "matmul", "linear"}) {
      if (n.op.find(op) == std::string::npos) continue;
      if (options.backend != "cpp") {
        *why = absl::StrCat(n.op, " at %", n.index, ": on backend '", options.backend,
                            "' a compiled backward of a graph with matmuls is slower than LibTorch's autograd (its "
                            "pointwise work is replayed op by op); backend cpp compiles it");
        return nullptr;
      }
      heavy.push_back(n.index);
      break;
    }
    if (n.random) {
      *why = absl::StrCat(n.op, " at %", n.index, " draws random numbers (a recompute would draw again)");
      return nullptr;
    }
    if (!n.mutates || n.op == "aten::requires_grad_") continue;
    // Writes to tensors the function made are repeated harmlessly by the recompute (LibTorch's
    // `scalar - tensor` fills a fresh tensor); writes to arguments or captured tensors are not.
    // Every input of the op counts, not only those its schema marks written (conservative).
    for (tracer::ValueId v : tracer::InputValues(n)) {
      if (v == tracer::kNoValue) continue;
      const tracer::ValueKind root = g.value(g.RootOf(v)).kind;
      if (root == tracer::ValueKind::kInput || root == tracer::ValueKind::kConstant) {
        *why = absl::StrCat(n.op, " at %", n.index,
                            " writes an argument or captured tensor in place (a recompute would write again)");
        return nullptr;
      }
    }
  }
  // Outputs that are one tensor twice, or views of one another, share history in eager; one node
  // giving each its own would not.
  std::set<tracer::ValueId> roots;
  for (tracer::ValueId o : g.outputs) {
    if (o != tracer::kNoValue && !roots.insert(g.RootOf(o)).second) {
      *why = "two outputs are the same tensor or views of one storage";
      return nullptr;
    }
  }
  // A heavy op's output can be saved if it is one tensor of its own storage that nothing writes
  // later (an in-place activation would change it: the saved tensor must be the op's result) and
  // the caller never sees (a caller's write in place would change it too).
  std::set<tracer::ValueId> written, returned_roots;
  for (const tracer::Node& n : g.nodes) {
    if (!n.mutates) continue;
    for (tracer::ValueId v : tracer::WrittenValues(n)) {
      if (v != tracer::kNoValue) written.insert(g.RootOf(v));
    }
  }
  for (tracer::ValueId o : g.outputs) {
    if (o != tracer::kNoValue) returned_roots.insert(g.RootOf(o));
  }
  std::vector<int> saved_nodes;
  std::vector<tracer::ValueId> saved_values;
  for (int k : heavy) {
    const tracer::Node& n = g.nodes[k];
    const tracer::ValueId v = tracer::SingleTensorResult(n);
    std::string problem;
    if (v == tracer::kNoValue) {
      problem = "returns several tensors";
    } else if (g.RootOf(v) != v) {
      problem = "returns a view";
    } else if (written.count(v)) {
      problem = "has its output written in place later (an in-place activation?)";
    } else if (returned_roots.count(v)) {
      problem = "has its output returned by the function";
    }
    if (!problem.empty()) {
      *why = absl::StrCat(n.op, " at %", n.index, " ", problem,
                          ": the compiled backward cannot save it and would recompute it, which costs more than "
                          "LibTorch's autograd saves");
      return nullptr;
    }
    saved_nodes.push_back(k);
    saved_values.push_back(v);
  }
  // Note [Saved activations]: with the matmuls saved, the backward would still recompute, op by
  // op, what feeds them (a relu's output, read by the weight's gradient matmul and by relu's own
  // backward, is a lone replayed step in the backward graph: its other readers come much later) and
  // the softmax family's results (non-pointwise, read by their backward). The forward computes
  // them anyway, so it saves them too when they can be saved (as above); otherwise they are
  // recomputed. Saved tensors are what eager's autograd saves for the same ops.
  if (!saved_nodes.empty()) {
    std::set<int> extra;
    for (int k : heavy) {
      for (tracer::ValueId v : tracer::InputValues(g.nodes[k])) {
        if (v != tracer::kNoValue && g.value(v).kind == tracer::ValueKind::kNode) extra.insert(g.value(v).node);
      }
    }
    for (const tracer::Node& n : g.nodes) {
      for (const char* op : {"aten::log_softmax", "aten::_log_softmax", "aten::softmax", "aten::_softmax"}) {
        if (n.op == op || n.op.rfind(std::string(op) + ".", 0) == 0) extra.insert(n.index);
      }
    }
    for (int k : saved_nodes) extra.erase(k);
    for (int k : extra) {
      const tracer::Node& n = g.nodes[k];
      const tracer::ValueId v = tracer::SingleTensorResult(n);
      if (v == tracer::kNoValue || g.RootOf(v) != v || written.count(v) || returned_roots.count(v) || n.random ||
          n.mode) {
        continue;
      }
      saved_nodes.push_back(k);
      saved_values.push_back(v);
    }
    // In graph order, for explain().
    std::vector<std::pair<int, tracer::ValueId>> order;
    for (size_t i = 0; i < saved_nodes.size(); ++i) order.emplace_back(saved_nodes[i], saved_values[i]);
    std::sort(order.begin(), order.end());
    for (size_t i = 0; i < order.size(); ++i) std::tie(saved_nodes[i], saved_values[i]) = order[i];
  }
  auto b = std::shared_ptr<CompiledBackward>(new CompiledBackward());
  for (size_t j = 0; j < g.outputs.size(); ++j) {
    const tracer::ValueId o = g.outputs[j];
    const bool diff = o != tracer::kNoValue && g.value(o).meta.requires_grad;
    b->diff_outputs_.push_back(diff);
    if (!diff) continue;
    const tracer::Value& root = g.value(g.RootOf(o));
    if (root.kind != tracer::ValueKind::kNode) {
      *why = absl::StrCat("output ", j, " is an argument or a captured tensor, or a view of one");
      return nullptr;
    }
    const tracer::Value& out = g.value(o);
    if (out.kind == tracer::ValueKind::kNode && g.nodes[out.node].op == "aten::requires_grad_") {
      *why = absl::StrCat("output ", j, " is a leaf the function made (requires_grad_), not a result of its inputs");
      return nullptr;
    }
    b->out_positions_.push_back(static_cast<int>(j));
  }
  for (size_t i = 0; i < g.arg_values.size(); ++i) {
    const tracer::ValueId v = g.arg_values[i];
    if (v != tracer::kNoValue && g.value(v).meta.requires_grad) b->diff_args_.push_back(static_cast<int>(i));
  }
  for (const tracer::Value& v : g.values) {
    if (v.kind != tracer::ValueKind::kConstant || !v.constant.defined()) continue;
    if (v.meta.requires_grad) b->params_.push_back(v.constant);
    b->captured_.push_back(v.constant);
  }
  if (b->diff_args_.empty() && b->params_.empty()) return nullptr;
  b->saved_nodes_ = saved_nodes;
  if (!saved_nodes.empty()) {
    auto forward = std::make_shared<tracer::Graph>(g);
    forward->outputs.insert(forward->outputs.end(), saved_values.begin(), saved_values.end());
    b->forward_graph_ = std::move(forward);
  }
  b->fn_ = fn;
  b->name_ = options.name + ".backward";
  b->num_args_ = g.arg_kinds.size();
  Options bo = options;
  bo.name = b->name_;
  bo.arg_names.clear();
  const CompiledBackward* raw = b.get();
  b->backward_ = std::make_unique<CompiledFunction>(compile(
      [raw](const std::vector<c10::IValue>& a) { return raw->Body(a, /*create_graph=*/false); }, bo));
  if (!saved_nodes.empty()) {
    ImplAccess::Of(*b->backward_).post_trace_ = [raw](tracer::TraceResult* t) { raw->UseSaved(t); };
  }
  // Note [Below autograd]: the backward graph's artifacts (not the user's code it traces or runs
  // eagerly) replay with nothing recording the gradients' history, whether or not the forward saves
  // anything for them.
  ImplAccess::Of(*b->backward_).below_autograd_ = true;
  return b;
}

// Note [Saved outputs]: the backward's trace recomputes the forward (its first nodes, after the
// detach + requires_grad_ pair Body makes of each differentiated argument, are the forward graph's
// nodes in the same order: the same function on arguments that pass the same guards). Each saved
// heavy node is turned into `aten::alias` of the backward argument that carries the forward's
// result, so the compiled backward reads it instead of computing it again; the derivative rules
// recorded after it (which read the node's inputs and output as values) are unchanged. Anything
// unexpected (a different op sequence or shape) leaves the graph recomputing everything, which is
// correct, and says so in explain().
void CompiledBackward::UseSaved(tracer::TraceResult* t) const {
  tracer::Graph& b = *t->graph;
  std::string problem;
  size_t end = b.nodes.size();
  for (size_t i = 0; i < b.nodes.size(); ++i) {
    if (b.nodes[i].grad_of >= 0) {
      end = i;
      break;
    }
  }
  const std::vector<tracer::Node>& forward = forward_graph_->nodes;  // set: UseSaved runs when something is saved
  const size_t prefix = end >= forward.size() ? end - forward.size() : 0;
  if (end < forward.size()) problem = "the backward's trace has fewer forward ops than the forward";
  for (size_t i = 0; problem.empty() && i < prefix; ++i) {
    if (b.nodes[i].op != "aten::detach" && b.nodes[i].op != "aten::requires_grad_") {
      problem = absl::StrCat("unexpected ", b.nodes[i].op, " at %", i, " before the recomputed forward");
    }
  }
  for (size_t i = 0; problem.empty() && i < forward.size(); ++i) {
    if (b.nodes[prefix + i].op != forward[i].op) {
      problem = absl::StrCat("the recomputed forward has ", b.nodes[prefix + i].op, " where the forward has ",
                             forward[i].op, " at %", i);
    }
  }
  const size_t first_saved_arg = num_args_ + out_positions_.size();
  for (size_t k = 0; problem.empty() && k < saved_nodes_.size(); ++k) {
    const tracer::Node& n = b.nodes[prefix + saved_nodes_[k]];
    const tracer::ValueId out = tracer::SingleTensorResult(n);
    const tracer::ValueId in = first_saved_arg + k < b.arg_values.size() ? b.arg_values[first_saved_arg + k]
                                                                         : tracer::kNoValue;
    if (out == tracer::kNoValue || in == tracer::kNoValue) {
      problem = absl::StrCat("no saved value for ", n.op, " at %", n.index);
      break;
    }
    const tracer::TensorMeta& want = b.value(out).meta;
    const tracer::TensorMeta& have = b.value(in).meta;
    if (want.sizes != have.sizes || want.dtype != have.dtype || want.device != have.device) {
      problem = absl::StrCat("the saved output of ", n.op, " at %", n.index, " differs in shape or dtype");
    }
  }
  if (!problem.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    saved_note_ = absl::StrCat("saved outputs not used, the forward is recomputed: ", problem);
    return;
  }
  for (size_t i = 0; i < forward.size(); ++i) b.nodes[prefix + i].recomputed = true;
  static const c10::OperatorHandle alias = c10::Dispatcher::singleton().findSchemaOrThrow("aten::alias", "");
  for (size_t k = 0; k < saved_nodes_.size(); ++k) {
    tracer::Node& n = b.nodes[prefix + saved_nodes_[k]];
    const tracer::ValueId out = n.returns[0].values[0];
    tracer::NodeArg arg;
    arg.kind = tracer::NodeArg::Kind::kValue;
    arg.value = b.arg_values[first_saved_arg + k];
    n.op = "aten::alias";
    n.handle = alias;
    n.kind = tracer::NodeKind::kRule;
    n.args = {arg};
    n.mutates = n.random = n.factory = false;
    b.values[out].alias_of = arg.value;
  }
}

std::vector<at::Tensor> CompiledBackward::Body(const std::vector<c10::IValue>& a, bool create_graph) const {
  std::vector<c10::IValue> args(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(num_args_));
  std::vector<at::Tensor> inputs;
  for (int i : diff_args_) {
    // create_graph: the arguments themselves, so the gradient's history reaches them.
    const at::Tensor original = args[i].toTensor();
    at::Tensor t = create_graph ? original : original.detach().requires_grad_(true);
    // The same tensor passed in several positions (Note [Argument identity]) stays one tensor: the
    // copy replaces it everywhere, so the gradient counts every use (x + x: 2, not 1).
    for (size_t j = 0; j < num_args_; ++j) {
      if (args[j].isTensor() && a[j].toTensor().is_same(original)) args[j] = t;
    }
    inputs.push_back(t);
  }
  inputs.insert(inputs.end(), params_.begin(), params_.end());
  const std::vector<at::Tensor> outs = fn_(args);
  std::vector<at::Tensor> roots, grads;
  for (size_t k = 0; k < out_positions_.size(); ++k) {
    roots.push_back(outs.at(out_positions_[k]));
    grads.push_back(a.at(num_args_ + k).toTensor());
  }
  return torch::autograd::grad(roots, inputs, grads, /*retain_graph=*/create_graph, create_graph,
                               /*allow_unused=*/true);
}

bool CompiledBackward::Run(const Artifact& forward, const std::vector<c10::IValue>& args,
                           std::vector<at::Tensor>* outputs, std::string* value_guard_failure) const {
  if (disabled_.load(std::memory_order_relaxed)) {
    if (!forward.Run(args, outputs, value_guard_failure)) return false;
    outputs->resize(diff_outputs_.size());  // the saved outputs (Note [Saved outputs]) are not the caller's
    return true;
  }
  std::vector<at::Tensor> diff_inputs;
  for (int i : diff_args_) diff_inputs.push_back(args[i].toTensor());
  diff_inputs.insert(diff_inputs.end(), params_.begin(), params_.end());
  std::vector<at::Tensor> all;
  std::vector<at::Tensor> returned;
  try {
    // A TensorList (not a std::vector) is what Function::apply counts as its inputs.
    returned = WardenNode::apply(at::TensorList(diff_inputs), this, &forward, &args, &all);
  } catch (const ForwardFailed& f) {
    *value_guard_failure = f.why;
    return false;
  }
  // Note [Undefined outputs]: the node's outputs (now with history) in their positions, the
  // undefined ones between them.
  size_t k = 0;
  for (at::Tensor& o : all) {
    if (o.defined()) o = returned.at(k++);
  }
  *outputs = std::move(all);
  return true;
}

std::vector<at::Tensor> CompiledBackward::Backward(const std::vector<c10::IValue>& args,
                                                   const std::vector<at::Tensor>& grads,
                                                   const std::vector<std::vector<int64_t>>& output_sizes,
                                                   const std::vector<at::TensorOptions>& output_options,
                                                   const std::vector<at::Tensor>& saved) const {
  std::vector<c10::IValue> a = args;
  for (int j : out_positions_) {
    const at::Tensor& g = grads.at(j);
    a.emplace_back(g.defined() ? g : at::zeros(output_sizes.at(j), output_options.at(j)));
  }
  // Note [Saved outputs]: read by the compiled backward's graph, ignored by Body (which recomputes).
  a.insert(a.end(), saved.begin(), saved.end());
  std::vector<at::Tensor> result;
  if (c10::GradMode::is_enabled()) {
    // create_graph: the gradient must itself be differentiable; eager, with history.
    result = Body(a, /*create_graph=*/true);
  } else {
    c10::AutoGradMode enable(true);  // the body differentiates; its graph is recorded grad-on
    const int64_t eager_before = backward_->stats().eager_calls;
    result = (*backward_)(a);
    if (backward_->stats().eager_calls > eager_before && !disabled_.exchange(true)) {
      std::lock_guard<std::mutex> lock(mu_);
      disabled_why_ = "its gradient could not be captured (explain() of the backward function says why)";
      LogToStderr(absl::StrCat("warden: function '", name_, "' ran eagerly; later calls use LibTorch's autograd ",
                               "over the replayed forward instead"));
    }
  }
  // Gradients of inputs the outputs do not reach stay undefined, as eager leaves them.
  result.resize(diff_args_.size() + params_.size());
  return result;
}

std::string CompiledBackward::ExplainBackward() const { return backward_->explain(); }

std::string CompiledBackward::SavedText() const {
  std::string text;
  for (int k : saved_nodes_) absl::StrAppend(&text, text.empty() ? "" : ", ", forward_graph_->nodes.at(k).op, " at %", k);
  return text;
}

std::string CompiledBackward::Describe() const {
  std::string inputs;
  for (int i : diff_args_) absl::StrAppend(&inputs, inputs.empty() ? "" : ", ", "arg", i);
  if (!params_.empty()) {
    absl::StrAppend(&inputs, inputs.empty() ? "" : ", ", params_.size(), " captured tensor",
                    params_.size() == 1 ? "" : "s");
  }
  const Stats s = backward_->stats();
  std::string saving = "forward recomputed";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!saved_nodes_.empty()) {
      saving = saved_note_.empty()
                   ? absl::StrCat("saves the outputs of ", saved_nodes_.size(), " op",
                                  saved_nodes_.size() == 1 ? "" : "s", " (", SavedText(), "), recomputes the rest")
                   : saved_note_;
    }
  }
  std::string out = absl::StrCat("compiled: function '", name_, "' (d outputs / d(", inputs, "), ", saving, "; ",
                                 s.calls, " backward calls, ", s.compiles, " compiles, ", s.eager_calls, " eager)");
  if (disabled_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StrAppend(&out, "; switched off: ", disabled_why_);
    const std::vector<RecompileEvent> events = backward_->recompiles();
    if (!events.empty()) absl::StrAppend(&out, ": ", events.back().action);
  }
  return out;
}

}  // namespace warden::runtime
