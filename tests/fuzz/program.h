// Random programs over the ops Warden supports, for differential fuzzing (tests/fuzz/differential.h).
// A Program is data: a list of steps over a value list whose first entries are the arguments. The
// same interpreter (Program::Run) is the eager reference and the function handed to
// warden::compile, so any difference between the two is Warden's. Everything is a pure function
// of a seed: a failure reproduces from the seed alone and prints as text (ToString).
#ifndef WARDEN_TESTS_FUZZ_PROGRAM_H_
#define WARDEN_TESTS_FUZZ_PROGRAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace warden::fuzz {

// How an argument tensor is laid out in memory.
enum class Layout {
  kContiguous,
  kTransposed,  // the last two dims of a contiguous base, swapped (rank >= 2)
  kStrided,     // every other element of a base twice as long in dim 0 (rank >= 1)
  kExpanded,    // dim 0 expanded from size 1: stride 0 (rank >= 1)
};

enum class ArgKind { kTensor, kDouble, kInt };

struct ArgSpec {
  ArgKind kind = ArgKind::kTensor;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes;
  Layout layout = Layout::kContiguous;
  bool requires_grad = false;
  double scalar = 0;  // kDouble / kInt
};

#define WARDEN_FUZZ_OPS(X)                                                                     \
  X(Relu) X(Neg) X(Abs) X(Exp) X(Sigmoid) X(Tanh) X(Sin)                                       \
  X(Add) X(Sub) X(Mul) X(Div) X(Maximum) X(Gt) X(WhereGt)                                      \
  X(AddScalar) X(MulScalar) X(PowScalar) X(AddScalarArg)                                       \
  X(Sum) X(SumAll) X(Mean) X(Amax) X(Softmax) X(LogSoftmax) X(LayerNorm) X(SumDims)           \
  X(Transpose) X(Unsqueeze) X(Flatten) X(Narrow) X(Select) X(Expand)                           \
  X(Matmul) X(MatmulSelfT) X(Cat)                                                              \
  X(AddInplace) X(MulInplace) X(AddInplaceTensor)                                              \
  X(ItemBranch) X(Clone) X(ToDouble) X(ToFloat)

enum class Op {
#define WARDEN_FUZZ_ENUM(name) k##name,
  WARDEN_FUZZ_OPS(WARDEN_FUZZ_ENUM)
#undef WARDEN_FUZZ_ENUM
};
const char* OpName(Op op);

// vals[a] op vals[b] (or a scalar / dims in i0, i1, c); the result is appended to vals, except for
// in-place ops, which write vals[a] and append it again (the same tensor).
struct Step {
  Op op;
  int a = 0;
  int b = 0;
  int64_t i0 = 0;
  int64_t i1 = 0;
  double c = 0;
};

struct Program {
  uint64_t seed = 0;
  std::vector<ArgSpec> args;
  std::vector<Step> steps;
  std::vector<int> outputs;  // indices into the value list

  // The traced function: ordinary LibTorch code over `args`. `fp64`: ToFloat converts to double
  // instead (with double arguments, a higher-precision reference run of the same program).
  std::vector<at::Tensor> Run(const std::vector<c10::IValue>& args, bool fp64 = false) const;
  std::string ToString() const;
};

// A program whose steps all run eagerly on MakeArgs(program.args, 0) (shapes are chosen by trying).
Program Generate(uint64_t seed);

// The arguments for `specs`, with values drawn from `value_seed`: the same seed gives identical
// tensors (values, sizes, strides), so eager and Warden each get their own identical copy.
std::vector<c10::IValue> MakeArgs(const std::vector<ArgSpec>& specs, uint64_t value_seed);

std::string SpecToString(const ArgSpec& spec);

}  // namespace warden::fuzz

#endif  // WARDEN_TESTS_FUZZ_PROGRAM_H_
