// The program generator and interpreter (program.h).
#include "tests/fuzz/program.h"

#include <algorithm>
#include <random>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/container/sequential.h>

#include "tests/fuzz/patterns.h"

// Note [Patterns]
// The ops alone never leave the dispatcher's view, but real programs also run C++ around them that
// a trace does not record and a replay must still honour: a NoGradGuard, InferenceMode or autocast
// scope over some of the steps, requires_grad_ on an intermediate, a custom autograd Function, a
// branch on whether two arguments are the same tensor, a module whose train()/eval() flag decides
// what batch_norm and dropout do. Each is a pattern the generator adds to a program now and then:
//   modes          a Region over a sub-range of the steps, sometimes with a nested one that undoes
//                  it (AutoGradMode(true), InferenceMode(false), autocast off) or sets another
//                  mode; an autocast region covers a matmul, whose result is bfloat16; a grad or
//                  inference region makes a floating argument require grad, or it changes little;
//   requires_grad  a DetachRequiresGrad or RequiresGrad step, whose leaf is often returned so
//                  that its .grad is compared;
//   function       a custom autograd Function step (Warden runs such a function eagerly);
//   alias          two tensor arguments with equal specs (alias_a, alias_b) that the call
//                  sequence also passes as one tensor, as views of one another and as halves of
//                  one storage, often with an IsSameBranch/IsAliasBranch step on them and an
//                  in-place write of one of them;
//   model          a Model step over a watched Sequential(Linear, BatchNorm1d, Dropout) whose mode
//                  the call sequence switches.
// Pattern decisions draw from their own generator, and their steps are not among the ops drawn at
// random, so a program whose seed draws no pattern is exactly what that seed gave before patterns
// existed (the seeds named in the README still reproduce).

namespace warden::fuzz {
namespace {

using Rng = std::mt19937_64;

int64_t Uniform(Rng& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
bool Chance(Rng& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

// Sizes 0 and 1 specialize and 2+ may go symbolic: all three kinds must appear often.
int64_t RandomSize(Rng& rng) {
  static const int64_t kSizes[] = {0, 1, 1, 2, 2, 3, 3, 4, 5, 7};
  return kSizes[Uniform(rng, 0, 9)];
}

at::ScalarType RandomDtype(Rng& rng) {
  const int64_t r = Uniform(rng, 0, 19);
  if (r < 11) return at::kFloat;
  if (r < 13) return at::kDouble;
  if (r < 16) return at::kLong;
  if (r < 18) return at::kInt;
  return at::kBool;
}

at::Tensor Fill(const std::vector<int64_t>& sizes, at::ScalarType dtype, at::Generator& gen, Rng& rng) {
  at::Tensor t;
  if (at::isFloatingType(dtype)) {
    t = at::randn(sizes, gen, at::TensorOptions().dtype(dtype));
    // Now and then a NaN, an Inf or a -0.0: fused kernels must propagate them as ATen does.
    if (t.numel() > 0 && Chance(rng, 0.08)) {
      static const double kSpecial[] = {NAN, INFINITY, -INFINITY, -0.0};
      t.view(-1)[Uniform(rng, 0, t.numel() - 1)] = kSpecial[Uniform(rng, 0, 3)];
    }
  } else if (dtype == at::kBool) {
    t = at::randint(0, 2, sizes, gen, at::TensorOptions().dtype(at::kLong)).to(at::kBool);
  } else {
    t = at::randint(-5, 6, sizes, gen, at::TensorOptions().dtype(dtype));
  }
  return t;
}

at::Tensor MakeTensor(const ArgSpec& spec, at::Generator& gen, Rng& rng) {
  std::vector<int64_t> base = spec.sizes;
  const size_t r = base.size();
  switch (spec.layout) {
    case Layout::kContiguous:
      break;
    case Layout::kTransposed:
      if (r >= 2) std::swap(base[r - 1], base[r - 2]);
      break;
    case Layout::kStrided:
      if (r >= 1) base[0] *= 2;
      break;
    case Layout::kExpanded:
      if (r >= 1) base[0] = std::min<int64_t>(base[0], 1);
      break;
  }
  at::Tensor t = Fill(base, spec.dtype, gen, rng);
  if (spec.layout == Layout::kTransposed && r >= 2) t = t.transpose(-1, -2);
  if (spec.layout == Layout::kStrided && r >= 1) t = t.slice(0, 0, c10::nullopt, 2);
  if (spec.layout == Layout::kExpanded && r >= 1) t = t.expand(spec.sizes);
  if (spec.requires_grad) t.requires_grad_(true);
  return t;
}

bool IsInplace(Op op) {
  return op == Op::kAddInplace || op == Op::kMulInplace || op == Op::kAddInplaceTensor || op == Op::kRequiresGrad;
}

at::Tensor RunStep(const Step& s, const std::vector<at::Tensor>& vals, const std::vector<c10::IValue>& args,
                   bool fp64 = false, torch::nn::SequentialImpl* model = nullptr) {
  const at::Tensor& a = vals[s.a];
  const at::Tensor& b = vals[s.b];
  switch (s.op) {
    case Op::kRelu: return at::relu(a);
    case Op::kNeg: return a.neg();
    case Op::kAbs: return a.abs();
    case Op::kExp: return a.exp();
    case Op::kSigmoid: return a.sigmoid();
    case Op::kTanh: return a.tanh();
    case Op::kSin: return a.sin();
    case Op::kAdd: return a + b;
    case Op::kSub: return a - b;
    case Op::kMul: return a * b;
    case Op::kDiv: return a / b;
    case Op::kMaximum: return at::maximum(a, b);
    case Op::kGt: return a.gt(b);
    case Op::kWhereGt: return at::where(a.gt(0), a, b);
    case Op::kAddScalar: return a + s.c;
    case Op::kMulScalar: return a * s.c;
    case Op::kPowScalar: return a.pow(s.i0);
    case Op::kAddScalarArg: {
      const c10::IValue& v = args[s.i0];
      return v.isInt() ? a + v.toInt() : a + v.toDouble();
    }
    case Op::kSum: return a.sum(s.i0, s.i1 != 0);
    case Op::kSumAll: return a.sum();
    case Op::kMean: return a.mean(s.i0, s.c != 0);
    case Op::kLogSoftmax: return a.log_softmax(s.i0);
    case Op::kLayerNorm: return at::layer_norm(a, {a.dim() > 0 ? a.size(-1) : 1});
    case Op::kSumDims: return a.sum({s.i0, s.i1}, s.c != 0);
    case Op::kAmax: return a.amax(s.i0, s.i1 != 0);
    case Op::kSoftmax: return a.softmax(s.i0);
    case Op::kTranspose: return a.transpose(s.i0, s.i1);
    case Op::kUnsqueeze: return a.unsqueeze(s.i0);
    case Op::kFlatten: return a.reshape(-1);
    case Op::kNarrow: return a.narrow(s.i0, s.i1, static_cast<int64_t>(s.c));
    case Op::kSelect: return a.select(s.i0, s.i1);
    case Op::kExpand: {
      std::vector<int64_t> sizes(a.dim() + 1, -1);
      sizes[0] = 2;
      return a.unsqueeze(0).expand(sizes);
    }
    case Op::kMatmul: return a.matmul(b);
    case Op::kMatmulSelfT: return a.matmul(a.transpose(-1, -2));
    case Op::kCat: return at::cat({a, b}, s.i0);
    case Op::kAddInplace: return vals[s.a].add_(s.c);
    case Op::kMulInplace: return vals[s.a].mul_(s.c);
    case Op::kAddInplaceTensor: return vals[s.a].add_(b);
    case Op::kItemBranch:
      // Data-dependent control flow: Warden must guard the value it read.
      if (a.sum().item<double>() > s.c) return a * 2;
      return a - 1;
    case Op::kClone: return a.clone();
    case Op::kToDouble: return a.to(at::kDouble);
    case Op::kToFloat: return a.to(fp64 ? at::kDouble : at::kFloat);
    case Op::kDetachRequiresGrad: return a.detach().requires_grad_(true);
    case Op::kRequiresGrad: return vals[s.a].requires_grad_(true);
    case Op::kGradReverse: return ApplyGradReverse(a);
    case Op::kGradScale: return ApplyGradScale(a);
    case Op::kSquareFn: return ApplySquareFn(a);
    // Identity and storage sharing are C++ facts about the arguments, not values in any op.
    case Op::kIsSameBranch: return a.is_same(b) ? a * 3 : a + b;
    case Op::kIsAliasBranch: return a.is_alias_of(b) ? a + 1 : a * b;
    case Op::kModel:
      if (model == nullptr) throw std::logic_error("fuzz: a Model step needs a model");
      return CallModel(*model, a.reshape({-1, s.i0}).to(at::kFloat));
  }
  return a;
}

}  // namespace

const char* OpName(Op op) {
  switch (op) {
#define WARDEN_FUZZ_NAME(name) \
  case Op::k##name:            \
    return #name;
    WARDEN_FUZZ_OPS(WARDEN_FUZZ_NAME)
    WARDEN_FUZZ_PATTERN_OPS(WARDEN_FUZZ_NAME)
#undef WARDEN_FUZZ_NAME
  }
  return "?";
}

const char* ModeName(Mode mode) {
  switch (mode) {
#define WARDEN_FUZZ_NAME(name) \
  case Mode::k##name:          \
    return #name;
    WARDEN_FUZZ_MODES(WARDEN_FUZZ_NAME)
#undef WARDEN_FUZZ_NAME
  }
  return "?";
}

std::vector<at::Tensor> Program::Run(const std::vector<c10::IValue>& in, bool fp64,
                                     torch::nn::SequentialImpl* model) const {
  std::vector<at::Tensor> vals;
  for (const c10::IValue& v : in) vals.push_back(v.isTensor() ? v.toTensor() : at::Tensor());
  ModeStack modes;  // closes the open regions however Run exits
  size_t next = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    modes.CloseUntil(static_cast<int>(k));
    for (; next < regions.size() && regions[next].begin == static_cast<int>(k); ++next) modes.Push(regions[next]);
    vals.push_back(RunStep(steps[k], vals, in, fp64, model));
  }
  modes.CloseUntil(static_cast<int>(steps.size()));
  std::vector<at::Tensor> out;
  for (int i : outputs) out.push_back(vals[i]);
  return out;
}

std::vector<c10::IValue> MakeArgs(const std::vector<ArgSpec>& specs, uint64_t value_seed) {
  at::Generator gen = at::detail::createCPUGenerator(value_seed);
  Rng rng(value_seed ^ 0x5bd1e995u);
  std::vector<c10::IValue> args;
  for (const ArgSpec& spec : specs) {
    switch (spec.kind) {
      case ArgKind::kTensor:
        args.emplace_back(spec.alias == Alias::kNone ? MakeTensor(spec, gen, rng) : at::Tensor());
        break;
      case ArgKind::kDouble: args.emplace_back(spec.scalar); break;
      case ArgKind::kInt: args.emplace_back(static_cast<int64_t>(spec.scalar)); break;
    }
  }
  // Aliases after every independent tensor, so that their draws do not shift the others' values.
  for (size_t i = 0; i < specs.size(); ++i) {
    const ArgSpec& spec = specs[i];
    if (spec.kind != ArgKind::kTensor || spec.alias == Alias::kNone) continue;
    const at::Tensor src = args.at(spec.alias_of).toTensor();
    switch (spec.alias) {
      case Alias::kNone: break;
      case Alias::kSame: args[i] = src; break;
      case Alias::kView: args[i] = src.as_strided(src.sizes(), src.strides(), src.storage_offset()); break;
      case Alias::kSibling: {
        std::vector<int64_t> sizes = spec.sizes;
        sizes.insert(sizes.begin(), 2);
        const at::Tensor base = Fill(sizes, spec.dtype, gen, rng);
        // Views of a base that does not require grad are leaves, so each half may require grad.
        const at::Tensor first = base.select(0, 0), second = base.select(0, 1);
        if (specs[spec.alias_of].requires_grad) first.requires_grad_(true);
        if (spec.requires_grad) second.requires_grad_(true);
        args[spec.alias_of] = first;
        args[i] = second;
        break;
      }
    }
  }
  return args;
}

namespace {

// Which patterns a program gets (Note [Patterns]), drawn from a generator of its own.
struct Patterns {
  bool modes = false;
  bool requires_grad = false;
  bool function = false;
  bool alias = false;
  bool model = false;
};

Patterns DrawPatterns(Rng& frng, uint64_t seed, bool force) {
  // About one program in 20 gets each pattern, so the CI seeds cost about what they did; a forced
  // program gets the one its seed names and each other one time in four.
  const double p = force ? 0.25 : 0.05;
  Patterns pt;
  pt.modes = Chance(frng, p);
  pt.requires_grad = Chance(frng, p);
  pt.function = Chance(frng, p);
  pt.alias = Chance(frng, p);
  pt.model = Chance(frng, p);
  if (force) {
    switch (seed % 5) {
      case 0: pt.modes = true; break;
      case 1: pt.requires_grad = true; break;
      case 2: pt.function = true; break;
      case 3: pt.alias = true; break;
      default: pt.model = true; break;
    }
  }
  return pt;
}

// A step a pattern wants placed, with the operands it insists on (-1: any).
struct Pending {
  Op op;
  int a = -1;
  int b = -1;
  int attempts = 0;  // failed tries (an op the operands do not fit); dropped after a few
};

Mode Reverse(Mode m) {
  switch (m) {
    case Mode::kNoGrad: case Mode::kGradOff: return Mode::kGradOn;
    case Mode::kInference: return Mode::kInferenceOff;
    case Mode::kAutocast: return Mode::kAutocastOff;
    default: return m;
  }
}

}  // namespace

Program Generate(uint64_t seed, bool force_patterns) {
  Rng rng(seed * 0x9e3779b97f4a7c15ULL + 1);
  Rng frng(seed * 0xd1b54a32d192ed03ULL + 7);  // pattern decisions only
  const Patterns pt = DrawPatterns(frng, seed, force_patterns);
  Program p;
  p.seed = seed;
  p.forced = force_patterns;
  const int num_tensors = static_cast<int>(Uniform(rng, 1, 3));
  const int64_t base_rank = Uniform(rng, 0, 3);
  std::vector<int64_t> base_sizes;
  for (int64_t d = 0; d < base_rank; ++d) base_sizes.push_back(RandomSize(rng));
  for (int i = 0; i < num_tensors; ++i) {
    ArgSpec spec;
    spec.dtype = Chance(rng, 0.7) && i > 0 ? p.args[0].dtype : RandomDtype(rng);
    // Mostly shapes that broadcast against the first argument: equal, a suffix, or with 1s.
    spec.sizes = base_sizes;
    if (i > 0 && Chance(rng, 0.3) && !spec.sizes.empty()) spec.sizes.erase(spec.sizes.begin());
    if (i > 0 && Chance(rng, 0.2) && !spec.sizes.empty()) spec.sizes[Uniform(rng, 0, spec.sizes.size() - 1)] = 1;
    if (Chance(rng, 0.1)) {
      spec.sizes.clear();
      for (int64_t d = Uniform(rng, 0, 4); d > 0; --d) spec.sizes.push_back(RandomSize(rng));
    }
    const int64_t r = static_cast<int64_t>(spec.sizes.size());
    const int64_t layout = Uniform(rng, 0, 9);
    if (layout == 7 && r >= 2) spec.layout = Layout::kTransposed;
    if (layout == 8 && r >= 1) spec.layout = Layout::kStrided;
    if (layout == 9 && r >= 1) spec.layout = Layout::kExpanded;
    spec.requires_grad =
        spec.layout == Layout::kContiguous && at::isFloatingType(spec.dtype) && Chance(rng, 0.25);
    p.args.push_back(spec);
  }
  if (pt.alias) {
    // Argument 1 becomes argument 0's twin (inserted if there is none), so that passing one tensor
    // twice changes nothing but identity.
    ArgSpec twin = p.args[0];
    twin.requires_grad = twin.requires_grad && Chance(frng, 0.5);
    if (num_tensors >= 2) {
      p.args[1] = twin;
    } else {
      p.args.insert(p.args.begin() + 1, twin);
    }
    p.alias_a = 0;
    p.alias_b = 1;
  }
  if (Chance(rng, 0.3)) {
    ArgSpec s;
    s.kind = Chance(rng, 0.5) ? ArgKind::kDouble : ArgKind::kInt;
    s.scalar = s.kind == ArgKind::kDouble ? static_cast<double>(Uniform(rng, -8, 8)) / 4 : Uniform(rng, -3, 3);
    p.args.push_back(s);
  }

  // The pattern steps to place among the random ones.
  std::vector<Pending> pending;
  Mode mode = Mode::kNoGrad;
  if (pt.modes) {
    static const Mode kModes[] = {Mode::kNoGrad, Mode::kNoGrad, Mode::kGradOff, Mode::kInference,
                                  Mode::kInference, Mode::kAutocast, Mode::kAutocast};
    mode = kModes[Uniform(frng, 0, 6)];
    // Autocast changes what matmul returns (bfloat16) and almost nothing else.
    if (mode == Mode::kAutocast) pending.push_back({Op::kMatmulSelfT});
    // Grad and inference modes change little unless some input requires grad.
    if (mode != Mode::kAutocast) {
      for (ArgSpec& a : p.args) {
        if (a.kind == ArgKind::kTensor && a.layout == Layout::kContiguous && at::isFloatingType(a.dtype)) {
          a.requires_grad = true;
          break;
        }
      }
    }
  }
  if (pt.requires_grad) pending.push_back({Chance(frng, 0.5) ? Op::kDetachRequiresGrad : Op::kRequiresGrad});
  if (pt.function) {
    static const Op kFunctions[] = {Op::kGradReverse, Op::kGradScale, Op::kSquareFn};
    pending.push_back({kFunctions[Uniform(frng, 0, 2)]});
  }
  if (pt.alias) {
    // Maybe a branch on the twins' identity, maybe an in-place write of one of them (which the
    // other sees when they are one tensor), in either order.
    std::vector<Pending> steps;
    if (Chance(frng, 0.7)) {
      const bool swap = Chance(frng, 0.5);
      steps.push_back({Chance(frng, 0.5) ? Op::kIsSameBranch : Op::kIsAliasBranch, swap ? p.alias_b : p.alias_a,
                       swap ? p.alias_a : p.alias_b});
    }
    if (Chance(frng, 0.5)) steps.push_back({Op::kAddInplace, Chance(frng, 0.5) ? p.alias_a : p.alias_b});
    if (steps.size() == 2 && Chance(frng, 0.5)) std::swap(steps[0], steps[1]);
    pending.insert(pending.end(), steps.begin(), steps.end());
  }
  if (pt.model) {
    p.model.out = Uniform(frng, 2, 4);
    p.model.dropout = Chance(frng, 0.5) ? 0.5 : 0.25;
    p.model.seed = seed;
    pending.push_back({Op::kModel});
  }
  std::shared_ptr<torch::nn::SequentialImpl> model;  // made once Model's input width is known

  // Build the steps by trying them on real values: a step that throws is dropped.
  std::vector<c10::IValue> args = MakeArgs(p.args, 0);
  std::vector<at::Tensor> vals;
  std::vector<int> tensors, scalars;
  for (size_t i = 0; i < args.size(); ++i) {
    vals.push_back(args[i].isTensor() ? args[i].toTensor() : at::Tensor());
    (args[i].isTensor() ? tensors : scalars).push_back(static_cast<int>(i));
  }
  const int num_ops = 0
#define WARDEN_FUZZ_COUNT(name) +1
      WARDEN_FUZZ_OPS(WARDEN_FUZZ_COUNT)
#undef WARDEN_FUZZ_COUNT
      ;
  const int num_steps = static_cast<int>(Uniform(rng, 1, 7) + pending.size());
  int anchor = -1;  // the step an autocast region must cover
  for (int tries = 0; static_cast<int>(p.steps.size()) < num_steps && tries < 60; ++tries) {
    Step s;
    // Prefer recent values so that programs chain instead of fanning out from the arguments.
    auto pick = [&] {
      const int n = static_cast<int>(tensors.size());
      return tensors[Chance(rng, 0.6) ? n - 1 : Uniform(rng, 0, n - 1)];
    };
    const int left = num_steps - static_cast<int>(p.steps.size());
    Pending* want = nullptr;
    if (!pending.empty() && (static_cast<int>(pending.size()) >= left || Chance(frng, 0.3))) want = &pending.back();
    if (want != nullptr) {
      s.op = want->op;
      // Operands the pattern names, else a recent floating value (requires_grad_ and the custom
      // Functions need one; matmul under autocast only casts float).
      s.a = want->a;
      if (s.a < 0) {
        s.a = pick();
        for (int k = 0; k < 4 && !at::isFloatingType(vals[s.a].scalar_type()); ++k) s.a = pick();
      }
      s.b = want->b >= 0 ? want->b : pick();
      const at::Tensor& a = vals[s.a];
      if (s.op == Op::kMatmulSelfT && a.dim() < 2) {
        s.op = Op::kMatmul;  // a vector: a dot product
        s.b = s.a;
      }
      if (s.op == Op::kAddInplace) s.c = static_cast<double>(Uniform(frng, 1, 6)) / 2;
      if (s.op == Op::kModel) {
        // Rows of the last dim, or single features when that leaves one row: batch_norm in train
        // mode needs two rows or more.
        if (p.model.in == 0) p.model.in = a.dim() >= 2 && a.size(-1) > 0 && a.numel() >= 2 * a.size(-1) ? a.size(-1) : 1;
        s.i0 = p.model.in;
        if (model == nullptr) model = MakeModel(p.model);
      }
    } else {
      s.op = static_cast<Op>(Uniform(rng, 0, num_ops - 1));
      if (s.op == Op::kAddScalarArg && scalars.empty()) continue;
      s.a = pick();
      s.b = pick();
      const at::Tensor& a = vals[s.a];
      const int64_t rank = a.dim();
      const int64_t d0 = rank > 0 ? Uniform(rng, -rank, rank - 1) : 0;
      const int64_t d1 = rank > 0 ? Uniform(rng, -rank, rank - 1) : 0;
      s.i0 = d0;
      s.i1 = d1;
      switch (s.op) {
        case Op::kAddScalar: case Op::kMulScalar: case Op::kAddInplace: case Op::kMulInplace:
          s.c = static_cast<double>(Uniform(rng, -6, 6)) / 2;
          break;
        case Op::kPowScalar: s.i0 = Uniform(rng, 2, 3); break;
        case Op::kAddScalarArg: s.i0 = scalars[Uniform(rng, 0, scalars.size() - 1)]; break;
        case Op::kSum: case Op::kAmax: s.i1 = Uniform(rng, 0, 1); break;
        case Op::kMean: s.c = static_cast<double>(Uniform(rng, 0, 1)); break;
        case Op::kSumDims: s.c = static_cast<double>(Uniform(rng, 0, 1)); break;
        case Op::kUnsqueeze: s.i0 = Uniform(rng, -rank - 1, rank); break;
        case Op::kNarrow: case Op::kSelect: {
          if (rank == 0) continue;
          const int64_t size = a.size(d0);
          s.i1 = size > 0 ? Uniform(rng, 0, size - 1) : 0;
          s.c = static_cast<double>(Uniform(rng, 0, size - s.i1));
          break;
        }
        case Op::kItemBranch: s.c = static_cast<double>(Uniform(rng, -2, 2)); break;
        default: break;
      }
    }
    try {
      at::Tensor out = RunStep(s, vals, args, false, model.get());
      if (out.numel() > 4096) continue;
      vals.push_back(out);
      p.steps.push_back(s);
      tensors.push_back(static_cast<int>(vals.size()) - 1);
      if (want != nullptr) {
        if (want->op == Op::kMatmulSelfT) anchor = static_cast<int>(p.steps.size()) - 1;
        pending.pop_back();
      }
    } catch (const std::exception&) {
      if (want != nullptr && ++want->attempts >= 4) pending.pop_back();
      // An in-place step that threw may have written nothing (ATen checks first); regenerate the
      // values so that later steps see exactly what Run will see.
      args = MakeArgs(p.args, 0);
      vals.clear();
      for (const c10::IValue& v : args) vals.push_back(v.isTensor() ? v.toTensor() : at::Tensor());
      for (const Step& t : p.steps) vals.push_back(RunStep(t, vals, args, false, model.get()));
    }
  }
  p.outputs.push_back(tensors.back());
  if (tensors.size() > 1 && Chance(rng, 0.5)) {
    const int other = tensors[Uniform(rng, 0, tensors.size() - 2)];
    p.outputs.push_back(other);
  }
  if (std::none_of(p.steps.begin(), p.steps.end(), [](const Step& s) { return s.op == Op::kModel; })) {
    p.model = ModelSpec();  // its step never fit
  }
  // A new leaf is returned, most of the time, so that the check compares its .grad; a branch on
  // identity always, so that the branch taken is seen.
  const int first_value = static_cast<int>(p.args.size());
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const Op op = p.steps[k].op;
    const int v = first_value + static_cast<int>(k);
    const bool leaf = op == Op::kDetachRequiresGrad || op == Op::kRequiresGrad;
    const bool branch = op == Op::kIsSameBranch || op == Op::kIsAliasBranch;
    if (((leaf && Chance(frng, 0.7)) || branch) && std::find(p.outputs.begin(), p.outputs.end(), v) == p.outputs.end()) {
      p.outputs.push_back(v);
    }
  }

  // Mode regions last, over steps that already run. A region that makes the program raise is
  // tried elsewhere a few times, then kept: eager's error is a result Warden must reproduce too.
  const int n = static_cast<int>(p.steps.size());
  if (pt.modes && n > 0 && !(mode == Mode::kAutocast && anchor < 0)) {
    for (int attempt = 0; attempt < 4; ++attempt) {
      const int at = anchor >= 0 ? anchor : static_cast<int>(Uniform(frng, 0, n - 1));
      Region outer{static_cast<int>(Uniform(frng, 0, at)), static_cast<int>(Uniform(frng, at + 1, n)), mode};
      p.regions = {outer};
      if (outer.end - outer.begin >= 2 && Chance(frng, 0.35)) {
        // Nested: one that undoes the outer mode, or another mode inside it.
        static const Mode kInner[] = {Mode::kNoGrad, Mode::kInference, Mode::kAutocast};
        Region inner;
        inner.mode = Chance(frng, 0.6) ? Reverse(mode) : kInner[Uniform(frng, 0, 2)];
        inner.begin = static_cast<int>(Uniform(frng, outer.begin, outer.end - 1));
        inner.end = static_cast<int>(Uniform(frng, inner.begin + 1, outer.end));
        p.regions.push_back(inner);
      }
      std::shared_ptr<torch::nn::SequentialImpl> fresh = p.model.in > 0 ? MakeModel(p.model) : nullptr;
      try {
        p.Run(MakeArgs(p.args, 0), false, fresh.get());
        break;
      } catch (const std::exception&) {
      }
    }
  }
  return p;
}

std::string SpecToString(const ArgSpec& s) {
  std::ostringstream os;
  if (s.kind == ArgKind::kDouble) {
    os << "double " << s.scalar;
    return os.str();
  }
  if (s.kind == ArgKind::kInt) {
    os << "int " << static_cast<int64_t>(s.scalar);
    return os.str();
  }
  os << c10::toString(s.dtype) << "[";
  for (size_t i = 0; i < s.sizes.size(); ++i) os << (i ? ", " : "") << s.sizes[i];
  os << "]";
  static const char* kLayouts[] = {"", " transposed", " strided", " expanded"};
  os << kLayouts[static_cast<int>(s.layout)];
  if (s.requires_grad) os << " requires_grad";
  switch (s.alias) {
    case Alias::kNone: break;
    case Alias::kSame: return "the tensor of %" + std::to_string(s.alias_of);
    case Alias::kView: return "a view of %" + std::to_string(s.alias_of) + " (same sizes and strides)";
    case Alias::kSibling:
      os << ", with %" << s.alias_of << " the halves of one contiguous " << c10::toString(s.dtype) << " storage";
      break;
  }
  return os.str();
}

std::string Program::ToString() const {
  std::ostringstream os;
  os << "program seed " << seed << (forced ? " (patterns forced: --force_patterns)" : "") << "\n";
  for (size_t i = 0; i < args.size(); ++i) os << "  %" << i << " = arg " << SpecToString(args[i]) << "\n";
  if (alias_b >= 0) {
    os << "  calls also pass %" << alias_b << " as the tensor of %" << alias_a << ", a view of it, and the other half of"
       << " one storage with it\n";
  }
  if (model.in > 0) {
    os << "  model = Sequential(Linear(" << model.in << ", " << model.out << "), BatchNorm1d(" << model.out
       << "), Dropout(" << model.dropout << ")), parameters from seed " << model.seed
       << "; watched, train()/eval() switched between calls\n";
  }
  int v = static_cast<int>(args.size());
  std::vector<int> open_ends;  // of the regions open before the next step
  size_t next = 0;
  auto indent = [&] { return std::string(2 + 2 * open_ends.size(), ' '); };
  for (size_t k = 0; k <= steps.size(); ++k) {
    while (!open_ends.empty() && open_ends.back() <= static_cast<int>(k)) {
      open_ends.pop_back();
      os << indent() << "}\n";
    }
    if (k == steps.size()) break;
    for (; next < regions.size() && regions[next].begin == static_cast<int>(k); ++next) {
      os << indent() << ModeName(regions[next].mode) << " {\n";
      open_ends.push_back(regions[next].end);
    }
    const Step& s = steps[k];
    os << indent() << "%" << v++ << " = " << OpName(s.op) << "(%" << s.a;
    switch (s.op) {
      case Op::kAdd: case Op::kSub: case Op::kMul: case Op::kDiv: case Op::kMaximum: case Op::kGt:
      case Op::kWhereGt: case Op::kMatmul: case Op::kAddInplaceTensor: case Op::kIsSameBranch:
      case Op::kIsAliasBranch:
        os << ", %" << s.b;
        break;
      case Op::kModel: os << " reshaped to [-1, " << s.i0 << "]"; break;
      case Op::kCat: os << ", %" << s.b << ", dim=" << s.i0; break;
      case Op::kAddScalar: case Op::kMulScalar: case Op::kAddInplace: case Op::kMulInplace:
      case Op::kItemBranch:
        os << ", " << s.c;
        break;
      case Op::kPowScalar: os << ", " << s.i0; break;
      case Op::kAddScalarArg: os << ", %" << s.i0; break;
      case Op::kSum: case Op::kAmax: os << ", dim=" << s.i0 << ", keepdim=" << s.i1; break;
      case Op::kMean: os << ", dim=" << s.i0 << ", keepdim=" << (s.c != 0); break;
      case Op::kSumDims: os << ", dims=[" << s.i0 << ", " << s.i1 << "], keepdim=" << (s.c != 0); break;
      case Op::kSoftmax: case Op::kLogSoftmax: case Op::kUnsqueeze: os << ", dim=" << s.i0; break;
      case Op::kTranspose: os << ", " << s.i0 << ", " << s.i1; break;
      case Op::kNarrow: os << ", dim=" << s.i0 << ", start=" << s.i1 << ", len=" << s.c; break;
      case Op::kSelect: os << ", dim=" << s.i0 << ", index=" << s.i1; break;
      default: break;
    }
    os << ")" << (IsInplace(s.op) ? "  (in place)" : "") << "\n";
  }
  os << "  return";
  for (int o : outputs) os << " %" << o;
  os << "\n";
  return os.str();
}

}  // namespace warden::fuzz
