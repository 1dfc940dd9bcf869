// The program generator and interpreter (program.h).
#include "tests/fuzz/program.h"

#include <algorithm>
#include <random>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

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
  return op == Op::kAddInplace || op == Op::kMulInplace || op == Op::kAddInplaceTensor;
}

at::Tensor RunStep(const Step& s, const std::vector<at::Tensor>& vals, const std::vector<c10::IValue>& args,
                   bool fp64 = false) {
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
#undef WARDEN_FUZZ_NAME
  }
  return "?";
}

std::vector<at::Tensor> Program::Run(const std::vector<c10::IValue>& in, bool fp64) const {
  std::vector<at::Tensor> vals;
  for (const c10::IValue& v : in) vals.push_back(v.isTensor() ? v.toTensor() : at::Tensor());
  for (const Step& s : steps) vals.push_back(RunStep(s, vals, in, fp64));
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
      case ArgKind::kTensor: args.emplace_back(MakeTensor(spec, gen, rng)); break;
      case ArgKind::kDouble: args.emplace_back(spec.scalar); break;
      case ArgKind::kInt: args.emplace_back(static_cast<int64_t>(spec.scalar)); break;
    }
  }
  return args;
}

Program Generate(uint64_t seed) {
  Rng rng(seed * 0x9e3779b97f4a7c15ULL + 1);
  Program p;
  p.seed = seed;
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
  if (Chance(rng, 0.3)) {
    ArgSpec s;
    s.kind = Chance(rng, 0.5) ? ArgKind::kDouble : ArgKind::kInt;
    s.scalar = s.kind == ArgKind::kDouble ? static_cast<double>(Uniform(rng, -8, 8)) / 4 : Uniform(rng, -3, 3);
    p.args.push_back(s);
  }

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
  const int num_steps = static_cast<int>(Uniform(rng, 1, 7));
  for (int tries = 0; static_cast<int>(p.steps.size()) < num_steps && tries < 60; ++tries) {
    Step s;
    s.op = static_cast<Op>(Uniform(rng, 0, num_ops - 1));
    if (s.op == Op::kAddScalarArg && scalars.empty()) continue;
    // Prefer recent values so that programs chain instead of fanning out from the arguments.
    auto pick = [&] {
      const int n = static_cast<int>(tensors.size());
      return tensors[Chance(rng, 0.6) ? n - 1 : Uniform(rng, 0, n - 1)];
    };
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
    try {
      at::Tensor out = RunStep(s, vals, args);
      if (out.numel() > 4096) continue;
      vals.push_back(out);
      p.steps.push_back(s);
      tensors.push_back(static_cast<int>(vals.size()) - 1);
    } catch (const std::exception&) {
      // An in-place step that threw may have written nothing (ATen checks first); regenerate the
      // values so that later steps see exactly what Run will see.
      args = MakeArgs(p.args, 0);
      vals.clear();
      for (const c10::IValue& v : args) vals.push_back(v.isTensor() ? v.toTensor() : at::Tensor());
      for (const Step& t : p.steps) vals.push_back(RunStep(t, vals, args));
    }
  }
  p.outputs.push_back(tensors.back());
  if (tensors.size() > 1 && Chance(rng, 0.5)) {
    const int other = tensors[Uniform(rng, 0, tensors.size() - 2)];
    p.outputs.push_back(other);
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
  return os.str();
}

std::string Program::ToString() const {
  std::ostringstream os;
  os << "program seed " << seed << "\n";
  for (size_t i = 0; i < args.size(); ++i) os << "  %" << i << " = arg " << SpecToString(args[i]) << "\n";
  int v = static_cast<int>(args.size());
  for (const Step& s : steps) {
    os << "  %" << v++ << " = " << OpName(s.op) << "(%" << s.a;
    switch (s.op) {
      case Op::kAdd: case Op::kSub: case Op::kMul: case Op::kDiv: case Op::kMaximum: case Op::kGt:
      case Op::kWhereGt: case Op::kMatmul: case Op::kAddInplaceTensor:
        os << ", %" << s.b;
        break;
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
