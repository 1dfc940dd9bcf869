// The C++ around ops that the fuzzer's patterns need (Note [Patterns] in program.cc): RAII scopes
// for mode regions, custom autograd Functions, and the model a Model step calls. Interpreting a
// program lives in program.cc, comparing runs in differential.cc.
#ifndef WARDEN_TESTS_FUZZ_PATTERNS_H_
#define WARDEN_TESTS_FUZZ_PATTERNS_H_

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tests/fuzz/program.h"

namespace warden::fuzz {

// Open mode regions, innermost last. Each region is an RAII guard that restores the state it found;
// the destructor closes what is still open, innermost first, so a step that throws leaves the
// thread as the program found it (as a C++ scope would).
class ModeStack {
 public:
  ModeStack();
  ~ModeStack();
  ModeStack(const ModeStack&) = delete;
  ModeStack& operator=(const ModeStack&) = delete;

  void Push(const Region& region);
  // Closes every region that ends at or before step `step`.
  void CloseUntil(int step);

 private:
  class Scope;
  std::vector<std::unique_ptr<Scope>> scopes_;
  std::vector<int> ends_;
};

// The thread-local modes a program may change, as text, for a check that nothing leaked out of a
// call ("" when all are at their defaults: grad on, no inference mode, autocast off).
std::string ModesLeftOn();
void ResetModes();  // back to those defaults (after a leak was reported)

// The custom autograd Functions of Op::kGradReverse, kGradScale and kSquareFn.
at::Tensor ApplyGradReverse(const at::Tensor& x);
at::Tensor ApplyGradScale(const at::Tensor& x);
at::Tensor ApplySquareFn(const at::Tensor& x);

// A fresh model for `spec`, its parameters drawn from spec.seed: two calls give identical twins.
std::shared_ptr<torch::nn::SequentialImpl> MakeModel(const ModelSpec& spec);
at::Tensor CallModel(torch::nn::SequentialImpl& model, const at::Tensor& x);

// Training flags for the call sequence: kTrain and kEval set the whole model, the other two leave
// it in train mode except one submodule (a watched submodule's flag is guarded on its own).
enum class ModelMode { kTrain, kEval, kBatchNormEval, kDropoutEval };
void SetModelMode(torch::nn::SequentialImpl& model, ModelMode mode);
const char* ModelModeName(ModelMode mode);

// The model's parameters and buffers by name, in registration order, for comparing twins;
// `grads`: the parameters' .grad instead (undefined where none was accumulated).
struct ModelTensor {
  std::string name;
  at::Tensor value;
};
std::vector<ModelTensor> ModelState(torch::nn::SequentialImpl& model, bool grads);
// Copies `from`'s parameters, buffers and gradients into `to` in place (its tensors stay the ones
// a watch() bound).
void CopyModelState(torch::nn::SequentialImpl& from, torch::nn::SequentialImpl& to);

}  // namespace warden::fuzz

#endif  // WARDEN_TESTS_FUZZ_PATTERNS_H_
