// The backward of a compiled forward (Note [Compiled backward] in compiled_backward.cc).
#ifndef WARDEN_RUNTIME_COMPILED_BACKWARD_H_
#define WARDEN_RUNTIME_COMPILED_BACKWARD_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "runtime/backend.h"
#include "runtime/warden.h"
#include "tracer/graph.h"
#include "tracer/tracer.h"

namespace warden::runtime {

class CompiledBackward : public std::enable_shared_from_this<CompiledBackward> {
 public:
  // The compiled backward of an entry whose graph is `graph`, or null when the entry keeps
  // LibTorch's autograd over the replay (*why says why, empty when no output requires grad).
  static std::shared_ptr<CompiledBackward> Make(const Fn& fn, const tracer::Graph& graph, const Options& options,
                                                std::string* why);

  // Runs the forward artifact with grad mode off and attaches one autograd node to its outputs
  // whose backward is the compiled backward. Same contract as Artifact::Run.
  bool Run(const Artifact& forward, const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
           std::string* value_guard_failure) const;

  // "compiled: d(out0) / d(arg0, 4 captured tensors) by function 'fn.backward' (...)" for explain().
  std::string Describe() const;
  // explain() of the backward function (its graph: the forward recomputed and the backward).
  std::string ExplainBackward() const;

  // The backward pass of one call (called by the autograd node).
  std::vector<at::Tensor> Backward(const std::vector<c10::IValue>& args, const std::vector<at::Tensor>& grads,
                                   const std::vector<std::vector<int64_t>>& output_sizes,
                                   const std::vector<at::TensorOptions>& output_options,
                                   const std::vector<at::Tensor>& saved) const;

  // The graph the forward artifact is compiled from: the entry's graph with the saved heavy
  // outputs appended to its outputs (Note [Saved outputs]); null when nothing is saved.
  const std::shared_ptr<const tracer::Graph>& forward_graph() const { return forward_graph_; }

  const std::vector<bool>& diff_outputs() const { return diff_outputs_; }
  // Every tensor the graph captured: version-checked between a call and its backward.
  const std::vector<at::Tensor>& captured() const { return captured_; }

 private:
  CompiledBackward() = default;
  // The backward's body: re-runs the function on the saved arguments and takes the gradient of
  // its differentiable outputs (captured when compiled: Note [Captured gradients]).
  std::vector<at::Tensor> Body(const std::vector<c10::IValue>& a, bool create_graph) const;
  // The backward function's post-trace step: reads the saved outputs instead of recomputing them.
  void UseSaved(tracer::TraceResult* t) const;
  std::string SavedText() const;  // "aten::addmm at %1, ..."

  Fn fn_;
  std::string name_;
  size_t num_args_ = 0;
  std::vector<int> diff_args_;       // tensor arguments that require grad
  std::vector<at::Tensor> params_;   // captured tensors that require grad
  std::vector<at::Tensor> captured_; // every captured tensor (params_ among them)
  std::vector<bool> diff_outputs_;   // per output: requires grad
  std::vector<int> out_positions_;   // outputs that require grad, in order
  std::vector<int> saved_nodes_;     // forward nodes whose outputs are saved (Note [Saved outputs])
  std::shared_ptr<const tracer::Graph> forward_graph_;  // the entry's graph + the saved outputs
  mutable std::unique_ptr<CompiledFunction> backward_;
  mutable std::atomic<bool> disabled_{false};
  mutable std::mutex mu_;
  mutable std::string disabled_why_;
  mutable std::string saved_note_;  // why the saved outputs are not used, if they are not
};

}  // namespace warden::runtime

#endif  // WARDEN_RUNTIME_COMPILED_BACKWARD_H_
