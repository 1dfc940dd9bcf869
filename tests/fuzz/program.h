// Random programs over the ops Warden supports, for differential fuzzing (tests/fuzz/differential.h).
// A Program is data: a list of steps over a value list whose first entries are the arguments. The
// same interpreter (Program::Run) is the eager reference and the function handed to
// warden::compile, so any difference between the two is Warden's. Everything is a pure function
// of a seed: a failure reproduces from the seed alone and prints as text (ToString).
// Besides ops, a program may carry the C++ around them that a trace cannot see (Note [Patterns] in
// program.cc): thread-local mode regions, requires_grad_ on intermediates, custom autograd
// Functions, identity-aliased arguments with is_same branches, and a watched module.
#ifndef WARDEN_TESTS_FUZZ_PROGRAM_H_
#define WARDEN_TESTS_FUZZ_PROGRAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace torch::nn {
class SequentialImpl;  // <torch/nn/modules/container/sequential.h>
}  // namespace torch::nn

namespace warden::fuzz {

// How an argument tensor is laid out in memory.
enum class Layout {
  kContiguous,
  kTransposed,  // the last two dims of a contiguous base, swapped (rank >= 2)
  kStrided,     // every other element of a base twice as long in dim 0 (rank >= 1)
  kExpanded,    // dim 0 expanded from size 1: stride 0 (rank >= 1)
};

enum class ArgKind { kTensor, kDouble, kInt };

// How a tensor argument shares identity or storage with an earlier argument (`alias_of`); the
// call sequence passes it so (differential.cc), the generator never does.
enum class Alias {
  kNone,
  kSame,     // the very tensor of argument alias_of (a.is_same(b))
  kView,     // a view with the sizes and strides of argument alias_of (is_alias_of, not is_same)
  kSibling,  // argument alias_of and this one are the two halves of one contiguous base: one
             // storage, no element in common
};

struct ArgSpec {
  ArgKind kind = ArgKind::kTensor;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes;
  Layout layout = Layout::kContiguous;
  bool requires_grad = false;
  double scalar = 0;  // kDouble / kInt
  Alias alias = Alias::kNone;
  int alias_of = -1;  // an earlier tensor argument with the same sizes and dtype
};

// Thread-local state a range of steps runs under, set as C++ code sets it: an RAII guard opened
// before the range and closed after it, on every way out (Note [Thread modes] in
// tracer/thread_mode.cc is what Warden must replay).
#define WARDEN_FUZZ_MODES(X)                                                          \
  X(NoGrad)        /* torch::NoGradGuard */                                           \
  X(GradOff)       /* torch::AutoGradMode(false) */                                   \
  X(GradOn)        /* torch::AutoGradMode(true), nested in one of the two above */    \
  X(Inference)     /* c10::InferenceMode */                                           \
  X(InferenceOff)  /* c10::InferenceMode(false), nested in Inference */               \
  X(Autocast)      /* at::autocast::set_cpu_enabled(true), as torch.autocast does it */ \
  X(AutocastOff)   /* set_cpu_enabled(false), nested in Autocast */

enum class Mode {
#define WARDEN_FUZZ_ENUM(name) k##name,
  WARDEN_FUZZ_MODES(WARDEN_FUZZ_ENUM)
#undef WARDEN_FUZZ_ENUM
};
const char* ModeName(Mode mode);

// Steps [begin, end) run under `mode`. A program's regions are nested or disjoint.
struct Region {
  int begin = 0;
  int end = 0;
  Mode mode = Mode::kNoGrad;
};

// Sequential(Linear(in, out), BatchNorm1d(out), Dropout(dropout)), parameters drawn from `seed`.
// The differential check builds two twins (eager's and Warden's), watches Warden's and switches
// both between train and eval modes between calls.
struct ModelSpec {
  int64_t in = 0;  // 0: the program uses no model
  int64_t out = 3;
  double dropout = 0.5;
  uint64_t seed = 0;
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

// Steps only the patterns place (Note [Patterns] in program.cc), never drawn with the ops above,
// so that a program without patterns is what its seed gave before they existed.
#define WARDEN_FUZZ_PATTERN_OPS(X)                                                             \
  X(DetachRequiresGrad)  /* a.detach().requires_grad_(true): a new leaf */                     \
  X(RequiresGrad)        /* a.requires_grad_(true) in place (a leaf, or a no-op) */            \
  X(GradReverse)         /* custom autograd Function: forward clone, backward -g */            \
  X(GradScale)           /* custom autograd Function: forward x * 1, backward 2 g */           \
  X(SquareFn)            /* custom autograd Function with a saved input: x * x, 2 x g */       \
  X(IsSameBranch)        /* a.is_same(b) ? a * 3 : a + b */                                    \
  X(IsAliasBranch)       /* a.is_alias_of(b) ? a + 1 : a * b */                                \
  X(Model)               /* model(a.reshape({-1, in}).to(float)) */

enum class Op {
#define WARDEN_FUZZ_ENUM(name) k##name,
  WARDEN_FUZZ_OPS(WARDEN_FUZZ_ENUM)
  WARDEN_FUZZ_PATTERN_OPS(WARDEN_FUZZ_ENUM)
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
  bool forced = false;  // generated with every pattern likelier (Generate's `force_patterns`)
  std::vector<ArgSpec> args;
  std::vector<Step> steps;
  std::vector<int> outputs;  // indices into the value list
  std::vector<Region> regions;  // ordered by begin, an enclosing region before those inside it
  ModelSpec model;              // used by Model steps
  // Tensor arguments with equal specs that the call sequence also passes as one tensor, as a view
  // of one another and as two halves of one storage (-1: none).
  int alias_a = -1;
  int alias_b = -1;

  // The traced function: ordinary LibTorch code over `args`. `fp64`: ToFloat converts to double
  // instead (with double arguments, a higher-precision reference run of the same program).
  // `model`: what Model steps call (required if there are any; the caller owns its state).
  std::vector<at::Tensor> Run(const std::vector<c10::IValue>& args, bool fp64 = false,
                              torch::nn::SequentialImpl* model = nullptr) const;
  std::string ToString() const;
};

// A program whose steps all run eagerly on MakeArgs(program.args, 0) (shapes are chosen by trying;
// mode regions may make the program raise, which both sides then must). Each pattern is drawn with
// a small probability; `force_patterns` gives every program one (chosen by the seed) and makes the
// others likelier, for a budget aimed at them.
Program Generate(uint64_t seed, bool force_patterns = false);

// The arguments for `specs`, with values drawn from `value_seed`: the same seed gives identical
// tensors (values, sizes, strides, and which arguments share identity or storage: Alias), so eager
// and Warden each get their own identical copy.
std::vector<c10::IValue> MakeArgs(const std::vector<ArgSpec>& specs, uint64_t value_seed);

std::string SpecToString(const ArgSpec& spec);

}  // namespace warden::fuzz

#endif  // WARDEN_TESTS_FUZZ_PROGRAM_H_
