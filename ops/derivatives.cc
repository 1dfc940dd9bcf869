// Derivative rules (ops/derivatives.h). Formulas follow autograd's (derivatives.yaml) so that
// captured gradients round like eager's; each is written only with ops whose own rules exist, so
// a gradient of a gradient (create_graph) can be captured too.
#include "ops/derivatives.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <ATen/ATen.h>

namespace warden::ops {
namespace {

using Grads = std::vector<at::Tensor>;

const at::Tensor& Arg(const GradContext& c, size_t i) { return c.args.at(i).toTensor(); }
const at::Tensor& G(const GradContext& c) { return c.grads.at(0); }
const at::Tensor& Out(const GradContext& c) { return c.outputs.at(0); }
bool Need(const GradContext& c, size_t i) { return i < c.needs.size() && c.needs[i]; }

bool IsOne(const at::Scalar& s) {
  if (s.isIntegral(/*includeBool=*/false)) return s.toLong() == 1;
  if (s.isFloatingPoint()) return s.toDouble() == 1.0;
  return false;
}
at::Tensor Scale(const at::Tensor& g, const at::Scalar& s) { return IsOne(s) ? g : g * s; }

int64_t WrapDim(int64_t d, int64_t rank) { return d < 0 ? d + std::max<int64_t>(rank, 1) : d; }

// Sums a broadcast gradient back to the shape of `like` (the input it was broadcast from).
at::Tensor SumTo(const GradContext& c, at::Tensor g, const at::Tensor& like) {
  if (!g.defined()) return g;
  const std::vector<int64_t> gs = c.sizes(g);
  const std::vector<int64_t> ls = c.sizes(like);
  if (gs == ls) return g;
  if (ls.size() > gs.size()) throw std::runtime_error("gradient of lower rank than its input");
  const int64_t lead = static_cast<int64_t>(gs.size() - ls.size());
  std::vector<int64_t> ones;
  for (size_t i = 0; i < ls.size(); ++i) {
    if (ls[i] == 1 && gs[lead + i] != 1) ones.push_back(lead + static_cast<int64_t>(i));
  }
  if (!ones.empty()) g = g.sum(ones, /*keepdim=*/true);
  if (lead > 0) {
    std::vector<int64_t> dims(lead);
    std::iota(dims.begin(), dims.end(), 0);
    g = g.sum(dims, /*keepdim=*/false);
  }
  return g;
}

at::Tensor ZerosWhere(const at::Tensor& cond, const at::Tensor& g) { return at::where(cond, at::zeros_like(g), g); }
at::Tensor KeepWhere(const at::Tensor& cond, const at::Tensor& g) { return at::where(cond, g, at::zeros_like(g)); }

// The reduced dims of sum.dim_IntList / mean.dim as a sorted list (empty: all).
std::vector<int64_t> ReducedDims(const c10::IValue& v, int64_t rank) {
  std::vector<int64_t> dims;
  if (v.isNone()) return dims;
  for (int64_t d : v.toIntVector()) dims.push_back(WrapDim(d, rank));
  std::sort(dims.begin(), dims.end());
  return dims;
}

// The gradient of a reduction over `dims` (empty: all) back to its input's shape.
at::Tensor ExpandReduced(const GradContext& c, at::Tensor g, const at::Tensor& self, const std::vector<int64_t>& dims,
                         bool keepdim) {
  if (!keepdim && !dims.empty()) {
    for (int64_t d : dims) g = g.unsqueeze(d);
  }
  return g.expand_as(self);
}

Grads Add(const GradContext& c) {
  return {Need(c, 0) ? SumTo(c, G(c), Arg(c, 0)) : at::Tensor(),
          Need(c, 1) ? SumTo(c, Scale(G(c), c.args[2].toScalar()), Arg(c, 1)) : at::Tensor()};
}
Grads Sub(const GradContext& c) {
  return {Need(c, 0) ? SumTo(c, G(c), Arg(c, 0)) : at::Tensor(),
          Need(c, 1) ? SumTo(c, Scale(G(c).neg(), c.args[2].toScalar()), Arg(c, 1)) : at::Tensor()};
}
Grads RsubTensor(const GradContext& c) {  // other - alpha * self
  return {Need(c, 0) ? SumTo(c, Scale(G(c).neg(), c.args[2].toScalar()), Arg(c, 0)) : at::Tensor(),
          Need(c, 1) ? SumTo(c, G(c), Arg(c, 1)) : at::Tensor()};
}
Grads Identity(const GradContext& c) { return {G(c)}; }
Grads RsubScalar(const GradContext& c) { return {Scale(G(c).neg(), c.args[2].toScalar())}; }
Grads Mul(const GradContext& c) {
  return {Need(c, 0) ? SumTo(c, G(c) * Arg(c, 1), Arg(c, 0)) : at::Tensor(),
          Need(c, 1) ? SumTo(c, G(c) * Arg(c, 0), Arg(c, 1)) : at::Tensor()};
}
Grads MulScalar(const GradContext& c) { return {G(c) * c.args[1].toScalar()}; }
Grads Div(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  const at::Tensor& other = Arg(c, 1);
  return {Need(c, 0) ? SumTo(c, G(c) / other, self) : at::Tensor(),
          Need(c, 1) ? SumTo(c, G(c).neg() * self / (other * other), other) : at::Tensor()};
}
Grads DivScalar(const GradContext& c) { return {G(c) / c.args[1].toScalar()}; }
Grads Neg(const GradContext& c) { return {G(c).neg()}; }
Grads Exp(const GradContext& c) { return {G(c) * Out(c)}; }
Grads Expm1(const GradContext& c) { return {G(c) * (Out(c) + 1)}; }
Grads Log(const GradContext& c) { return {G(c) / Arg(c, 0)}; }
Grads Log1p(const GradContext& c) { return {G(c) / (Arg(c, 0) + 1)}; }
Grads Sqrt(const GradContext& c) { return {G(c) / (2 * Out(c))}; }
Grads Rsqrt(const GradContext& c) { return {-0.5 * G(c) * Out(c).pow(3)}; }
Grads Reciprocal(const GradContext& c) { return {G(c).neg() * (Out(c) * Out(c))}; }
Grads Square(const GradContext& c) { return {G(c) * (2 * Arg(c, 0))}; }
Grads PowScalar(const GradContext& c) {
  const at::Scalar e = c.args[1].toScalar();
  const bool zero = e.isIntegral(false) ? e.toLong() == 0 : e.toDouble() == 0.0;
  if (zero) return {at::zeros_like(Arg(c, 0))};
  const at::Scalar e1 = e.isIntegral(false) ? at::Scalar(e.toLong() - 1) : at::Scalar(e.toDouble() - 1.0);
  return {G(c) * (e * Arg(c, 0).pow(e1))};
}
Grads Tanh(const GradContext& c) { return {G(c) * (1 - Out(c) * Out(c))}; }
Grads Sigmoid(const GradContext& c) { return {G(c) * (Out(c) * (1 - Out(c)))}; }
// Comparisons as ATen's backward kernels make them, so NaN inputs get eager's gradient
// (threshold_backward: 0 where out <= 0, else the gradient, also for NaN).
Grads Relu(const GradContext& c) { return {ZerosWhere(Out(c) <= 0, G(c))}; }
Grads Silu(const GradContext& c) {
  const at::Tensor& x = Arg(c, 0);
  const at::Tensor s = at::sigmoid(x);
  return {G(c) * (s * (1 + x * (1 - s)))};
}
Grads Sin(const GradContext& c) { return {G(c) * Arg(c, 0).cos()}; }
Grads Cos(const GradContext& c) { return {G(c) * Arg(c, 0).sin().neg()}; }
Grads Abs(const GradContext& c) { return {G(c) * Arg(c, 0).sgn()}; }
Grads ClampMin(const GradContext& c) { return {KeepWhere(Arg(c, 0) >= c.args[1].toScalar(), G(c))}; }
Grads ClampMax(const GradContext& c) { return {KeepWhere(Arg(c, 0) <= c.args[1].toScalar(), G(c))}; }

Grads Sum(const GradContext& c) { return {G(c).expand_as(Arg(c, 0))}; }
Grads SumDim(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  const auto dims = ReducedDims(c.args[1], static_cast<int64_t>(c.sizes(self).size()));
  return {ExpandReduced(c, G(c), self, dims, c.args[2].toBool())};
}
Grads Mean(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  return {G(c).expand_as(self) / static_cast<double>(std::max<int64_t>(self.numel(), 1))};
}
Grads MeanDim(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  const auto dims = ReducedDims(c.args[1], static_cast<int64_t>(c.sizes(self).size()));
  const int64_t n = std::max<int64_t>(self.numel(), 1) / std::max<int64_t>(Out(c).numel(), 1);
  return {ExpandReduced(c, G(c), self, dims, c.args[2].toBool()) / static_cast<double>(std::max<int64_t>(n, 1))};
}

Grads IndexSelect(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  return {at::zeros_like(self).index_add(c.args[1].toInt(), Arg(c, 2), G(c)), at::Tensor()};
}
Grads Gather(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  return {at::zeros_like(self).scatter_add(c.args[1].toInt(), Arg(c, 2), G(c)), at::Tensor()};
}
Grads Select(const GradContext& c) {
  return {at::select_scatter(at::zeros_like(Arg(c, 0)), G(c), c.args[1].toInt(), c.args[2].toInt())};
}
Grads Slice(const GradContext& c) {
  auto opt = [&](size_t i) -> c10::optional<int64_t> {
    if (c.args[i].isNone()) return c10::nullopt;
    return c.args[i].toInt();
  };
  return {at::slice_scatter(at::zeros_like(Arg(c, 0)), G(c), c.args[1].toInt(), opt(2), opt(3), c.args[4].toInt())};
}
Grads ReshapeBack(const GradContext& c) { return {G(c).reshape_as(Arg(c, 0))}; }
Grads Expand(const GradContext& c) { return {SumTo(c, G(c), Arg(c, 0))}; }
Grads Unsqueeze(const GradContext& c) {
  return {G(c).squeeze(WrapDim(c.args[1].toInt(), static_cast<int64_t>(c.sizes(Out(c)).size())))};
}
Grads SqueezeDim(const GradContext& c) {
  const std::vector<int64_t> s = c.sizes(Arg(c, 0));
  const int64_t d = WrapDim(c.args[1].toInt(), static_cast<int64_t>(s.size()));
  if (s.empty() || s[d] != 1) return {G(c)};
  return {G(c).unsqueeze(d)};
}
Grads Permute(const GradContext& c) {
  const std::vector<int64_t> dims = c.args[1].toIntVector();
  const int64_t rank = static_cast<int64_t>(dims.size());
  std::vector<int64_t> inverse(dims.size());
  for (int64_t i = 0; i < rank; ++i) inverse[WrapDim(dims[i], rank)] = i;
  return {G(c).permute(inverse)};
}
Grads Transpose(const GradContext& c) { return {G(c).transpose(c.args[1].toInt(), c.args[2].toInt())}; }
Grads T(const GradContext& c) { return {G(c).t()}; }
Grads ToCopy(const GradContext& c) { return {G(c)}; }  // the engine casts to the input's dtype

// True if a matrix is the transpose of a contiguous one (nn::Linear's weight.t()). Autograd's mm
// backward then computes the gradient as a transposed product, so that it comes out with the
// matrix's own layout (and the weight's gradient contiguous, which AccumulateGrad can keep
// without a copy); the values are the same either way.
bool TransposedContiguous(const GradContext& c, const at::Tensor& m) {
  if (!c.strides) return false;
  const std::vector<int64_t> sizes = c.sizes(m), strides = c.strides(m);
  return sizes.size() == 2 && sizes[0] > 1 && sizes[1] > 1 && strides[0] == 1 && strides[1] == sizes[0];
}
at::Tensor Mat1Grad(const GradContext& c, const at::Tensor& g, const at::Tensor& mat1, const at::Tensor& mat2) {
  return TransposedContiguous(c, mat1) ? mat2.mm(g.t()).t() : g.mm(mat2.t());
}
at::Tensor Mat2Grad(const GradContext& c, const at::Tensor& g, const at::Tensor& mat1, const at::Tensor& mat2) {
  return TransposedContiguous(c, mat2) ? g.t().mm(mat1).t() : mat1.t().mm(g);
}
Grads Mm(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  const at::Tensor& mat2 = Arg(c, 1);
  return {Need(c, 0) ? Mat1Grad(c, G(c), self, mat2) : at::Tensor(),
          Need(c, 1) ? Mat2Grad(c, G(c), self, mat2) : at::Tensor()};
}
Grads Addmm(const GradContext& c) {
  const at::Tensor& bias = Arg(c, 0);
  const at::Tensor& m1 = Arg(c, 1);
  const at::Tensor& m2 = Arg(c, 2);
  const at::Scalar beta = c.args[3].toScalar();
  const at::Scalar alpha = c.args[4].toScalar();
  return {Need(c, 0) ? SumTo(c, Scale(G(c), beta), bias) : at::Tensor(),
          Need(c, 1) ? Scale(Mat1Grad(c, G(c), m1, m2), alpha) : at::Tensor(),
          Need(c, 2) ? Scale(Mat2Grad(c, G(c), m1, m2), alpha) : at::Tensor()};
}
Grads Bmm(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  const at::Tensor& mat2 = Arg(c, 1);
  return {Need(c, 0) ? G(c).bmm(mat2.transpose(1, 2)) : at::Tensor(),
          Need(c, 1) ? self.transpose(1, 2).bmm(G(c)) : at::Tensor()};
}
Grads Mv(const GradContext& c) {
  return {Need(c, 0) ? G(c).unsqueeze(1) * Arg(c, 1) : at::Tensor(), Need(c, 1) ? Arg(c, 0).t().mv(G(c)) : at::Tensor()};
}
Grads Dot(const GradContext& c) {
  return {Need(c, 0) ? G(c) * Arg(c, 1) : at::Tensor(), Need(c, 1) ? G(c) * Arg(c, 0) : at::Tensor()};
}
Grads LogSoftmax(const GradContext& c) {
  const int64_t dim = c.args[1].toInt();
  return {G(c) - at::exp(Out(c)) * G(c).sum(dim, /*keepdim=*/true)};
}
Grads Softmax(const GradContext& c) {
  const int64_t dim = c.args[1].toInt();
  return {Out(c) * (G(c) - (G(c) * Out(c)).sum(dim, /*keepdim=*/true))};
}
Grads Where(const GradContext& c) {
  const at::Tensor& cond = Arg(c, 0);
  return {at::Tensor(), Need(c, 1) ? SumTo(c, KeepWhere(cond, G(c)), Arg(c, 1)) : at::Tensor(),
          Need(c, 2) ? SumTo(c, ZerosWhere(cond, G(c)), Arg(c, 2)) : at::Tensor()};
}
Grads MaskedFill(const GradContext& c) { return {ZerosWhere(Arg(c, 1), G(c)), at::Tensor()}; }
Grads MaskedFillTensor(const GradContext& c) { return {ZerosWhere(Arg(c, 1), G(c)), at::Tensor(), at::Tensor()}; }
Grads Cat(const GradContext& c) {
  const std::vector<at::Tensor> tensors = c.args[0].toTensorVector();
  const int64_t dim = WrapDim(c.args[1].toInt(), static_cast<int64_t>(c.sizes(Out(c)).size()));
  Grads out;
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (c.sizes(tensors[i]).size() != c.sizes(Out(c)).size()) throw std::runtime_error("cat of a legacy empty tensor");
    const int64_t n = tensors[i].size(dim);  // a recorded read
    out.push_back(Need(c, i) ? G(c).narrow(dim, offset, n) : at::Tensor());
    offset += n;
  }
  return out;
}


Grads Narrow(const GradContext& c) {
  const int64_t dim = c.args[1].toInt();
  const int64_t start = c.args[2].toInt();
  const int64_t length = c.args[3].toInt();
  const std::vector<int64_t> s = c.sizes(Arg(c, 0));
  const int64_t d = WrapDim(dim, static_cast<int64_t>(s.size()));
  const int64_t begin = start < 0 ? start + s.at(d) : start;
  return {at::slice_scatter(at::zeros_like(Arg(c, 0)), G(c), d, begin, begin + length, 1)};
}
Grads ReshapeBackFirst(const GradContext& c) {  // view_as, reshape_as, expand_as-free views of arg 0
  Grads out(c.needs.size());
  out[0] = G(c).reshape_as(Arg(c, 0));
  return out;
}
Grads ExpandAs(const GradContext& c) { return {SumTo(c, G(c), Arg(c, 0)), at::Tensor()}; }
Grads TypeAs(const GradContext& c) { return {G(c), at::Tensor()}; }
Grads Swap(const GradContext& c) { return {G(c).transpose(c.args[1].toInt(), c.args[2].toInt())}; }
Grads LogSoftmaxInt(const GradContext& c) {
  const int64_t dim = c.args[1].toInt();
  const at::Tensor g = G(c).to(Out(c).scalar_type());
  return {g - at::exp(Out(c)) * g.sum(dim, /*keepdim=*/true)};
}
Grads SoftmaxInt(const GradContext& c) {
  const int64_t dim = c.args[1].toInt();
  const at::Tensor g = G(c).to(Out(c).scalar_type());
  return {Out(c) * (g - (g * Out(c)).sum(dim, /*keepdim=*/true))};
}
// matmul by the ranks of its operands (the forward's guards fix them).
Grads Matmul(const GradContext& c) {
  const at::Tensor& a = Arg(c, 0);
  const at::Tensor& b = Arg(c, 1);
  const size_t ra = c.sizes(a).size(), rb = c.sizes(b).size();
  const at::Tensor& g = G(c);
  at::Tensor ga, gb;
  if (ra == 1 && rb == 1) {
    ga = g * b;
    gb = g * a;
  } else if (ra == 2 && rb == 1) {
    ga = g.unsqueeze(1) * b;
    gb = a.t().mv(g);
  } else if (ra == 1 && rb == 2) {
    ga = b.mv(g);
    gb = a.unsqueeze(1) * g.unsqueeze(0);
  } else if (ra >= 2 && rb >= 2) {
    ga = SumTo(c, g.matmul(b.transpose(-1, -2)), a);
    gb = SumTo(c, a.transpose(-1, -2).matmul(g), b);
  } else {
    throw std::runtime_error("matmul of a vector with a batch");
  }
  return {Need(c, 0) ? ga : at::Tensor(), Need(c, 1) ? gb : at::Tensor()};
}
// linear(input, weight, bias) = input @ weight^T + bias.
Grads Linear(const GradContext& c) {
  const at::Tensor& x = Arg(c, 0);
  const at::Tensor& w = Arg(c, 1);
  const at::Tensor& g = G(c);
  const size_t rx = c.sizes(x).size();
  Grads out(3);
  if (Need(c, 0)) out[0] = rx == 1 ? w.t().mv(g) : g.matmul(w);
  if (Need(c, 1)) {
    if (rx == 1) {
      out[1] = g.unsqueeze(1) * x.unsqueeze(0);
    } else if (rx == 2) {
      out[1] = g.t().mm(x);
    } else {
      out[1] = g.flatten(0, -2).t().mm(x.flatten(0, -2));
    }
  }
  if (Need(c, 2) && c.args[2].isTensor()) out[2] = SumTo(c, g, Arg(c, 2));
  return out;
}
Grads Outer(const GradContext& c) {
  return {Need(c, 0) ? G(c).mv(Arg(c, 1)) : at::Tensor(), Need(c, 1) ? G(c).t().mv(Arg(c, 0)) : at::Tensor()};
}
Grads Dropout(const GradContext& c) {
  if (c.args[2].toBool()) throw std::runtime_error("dropout in training mode draws a mask the rule cannot see");
  return {G(c)};
}
Grads MseLoss(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  const at::Tensor& target = Arg(c, 1);
  const int64_t reduction = c.args[2].toInt();  // 0 none, 1 mean, 2 sum
  at::Tensor d = (self - target) * 2;
  at::Tensor g = reduction == 0 ? G(c) : G(c).expand_as(d);
  if (reduction == 1) g = g / static_cast<double>(std::max<int64_t>(self.numel(), 1));
  const at::Tensor gd = d * g;
  return {Need(c, 0) ? SumTo(c, gd, self) : at::Tensor(), Need(c, 1) ? SumTo(c, gd.neg(), target) : at::Tensor()};
}
Grads LeakyRelu(const GradContext& c) {
  const at::Tensor& x = Arg(c, 0);
  return {at::where(x > 0, G(c), G(c) * c.args[1].toScalar())};
}
Grads Hardtanh(const GradContext& c) {
  const at::Tensor& x = Arg(c, 0);
  return {ZerosWhere(at::logical_or(x <= c.args[1].toScalar(), x >= c.args[2].toScalar()), G(c))};
}
Grads Relu6(const GradContext& c) {
  const at::Tensor& x = Arg(c, 0);
  return {ZerosWhere(at::logical_or(x <= 0, x >= 6), G(c))};
}
Grads Gelu(const GradContext& c) { return {at::gelu_backward(G(c), Arg(c, 0), c.args[1].toStringRef())}; }
Grads Erf(const GradContext& c) {
  const at::Tensor& x = Arg(c, 0);
  return {G(c) * (at::exp((x * x).neg()) * (2.0 / std::sqrt(M_PI)))};
}
Grads Log2(const GradContext& c) { return {G(c) / (Arg(c, 0) * std::log(2.0))}; }
Grads Log10(const GradContext& c) { return {G(c) / (Arg(c, 0) * std::log(10.0))}; }
Grads Sinh(const GradContext& c) { return {G(c) * Arg(c, 0).cosh()}; }
Grads Cosh(const GradContext& c) { return {G(c) * Arg(c, 0).sinh()}; }
Grads Tan(const GradContext& c) { return {G(c) * (1 + Out(c) * Out(c))}; }
Grads Logsumexp(const GradContext& c) {
  const at::Tensor& self = Arg(c, 0);
  const auto dims = ReducedDims(c.args[1], static_cast<int64_t>(c.sizes(self).size()));
  at::Tensor g = G(c), out = Out(c);
  if (!c.args[2].toBool()) {
    for (int64_t d : dims) {
      g = g.unsqueeze(d);
      out = out.unsqueeze(d);
    }
  }
  return {g * at::exp(self - out)};
}
Grads WhereScalarOther(const GradContext& c) { return {at::Tensor(), SumTo(c, KeepWhere(Arg(c, 0), G(c)), Arg(c, 1))}; }
Grads WhereScalarSelf(const GradContext& c) { return {at::Tensor(), SumTo(c, ZerosWhere(Arg(c, 0), G(c)), Arg(c, 2))}; }
Grads Addcmul(const GradContext& c) {
  const at::Scalar value = c.args[3].toScalar();
  return {Need(c, 0) ? SumTo(c, G(c), Arg(c, 0)) : at::Tensor(),
          Need(c, 1) ? SumTo(c, Scale(G(c) * Arg(c, 2), value), Arg(c, 1)) : at::Tensor(),
          Need(c, 2) ? SumTo(c, Scale(G(c) * Arg(c, 1), value), Arg(c, 2)) : at::Tensor()};
}
Grads Stack(const GradContext& c) {
  const std::vector<at::Tensor> tensors = c.args[0].toTensorVector();
  const int64_t d = WrapDim(c.args[1].toInt(), static_cast<int64_t>(c.sizes(Out(c)).size()));
  Grads out;
  for (size_t i = 0; i < tensors.size(); ++i) out.push_back(Need(c, i) ? G(c).select(d, static_cast<int64_t>(i)) : at::Tensor());
  return out;
}
// The gradients of several results of one input, zero where a result got none.
std::vector<at::Tensor> Filled(const GradContext& c) {
  std::vector<at::Tensor> gs;
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    gs.push_back(c.grads[i].defined() ? c.grads[i] : at::zeros_like(c.outputs[i]));
  }
  return gs;
}
Grads SplitCat(const GradContext& c) {  // split.Tensor, split_with_sizes, chunk, unsafe_*: (self, _, dim)
  const int64_t d = WrapDim(c.args[2].toInt(), static_cast<int64_t>(c.sizes(Arg(c, 0)).size()));
  return {at::cat(Filled(c), d)};
}
Grads Unbind(const GradContext& c) {
  const int64_t d = WrapDim(c.args[1].toInt(), static_cast<int64_t>(c.sizes(Arg(c, 0)).size()));
  return {at::stack(Filled(c), d)};
}


// The layers of real models: each gradient is ATen's own backward kernel (recomputing what the
// forward kept, like the pooling indices or layer_norm's statistics).
Grads Convolution(const GradContext& c) {  // conv1d/2d/3d(input, weight, bias, stride, padding, dilation, groups)
  const at::Tensor& x = Arg(c, 0);
  const at::Tensor& w = Arg(c, 1);
  if (c.sizes(x).size() != c.sizes(w).size()) throw std::runtime_error("unbatched convolution input");
  if (!c.args[4].isIntList()) throw std::runtime_error("string padding");
  const bool has_bias = c.args[2].isTensor();
  const std::vector<int64_t> stride = c.args[3].toIntVector(), padding = c.args[4].toIntVector(),
                             dilation = c.args[5].toIntVector();
  const std::vector<int64_t> output_padding(stride.size(), 0);
  const std::vector<int64_t> bias_sizes = {c.sizes(w).at(0)};
  auto grads = at::convolution_backward(G(c), x, w, has_bias ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt,
                                        stride, padding, dilation, /*transposed=*/false, output_padding,
                                        c.args[6].toInt(), {Need(c, 0), Need(c, 1), has_bias && Need(c, 2)});
  return {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)};
}
Grads ConvTranspose(const GradContext& c) {
  // conv_transpose1d/2d/3d(input, weight, bias, stride, padding, output_padding, groups, dilation);
  // the weight is [in, out / groups, k...].
  const at::Tensor& x = Arg(c, 0);
  const at::Tensor& w = Arg(c, 1);
  if (c.sizes(x).size() != c.sizes(w).size()) throw std::runtime_error("unbatched transposed convolution input");
  const bool has_bias = c.args[2].isTensor();
  const std::vector<int64_t> stride = c.args[3].toIntVector(), padding = c.args[4].toIntVector(),
                             output_padding = c.args[5].toIntVector(), dilation = c.args[7].toIntVector();
  const int64_t groups = c.args[6].toInt();
  const std::vector<int64_t> bias_sizes = {c.sizes(w).at(1) * groups};
  auto grads = at::convolution_backward(G(c), x, w, has_bias ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt,
                                        stride, padding, dilation, /*transposed=*/true, output_padding, groups,
                                        {Need(c, 0), Need(c, 1), has_bias && Need(c, 2)});
  return {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)};
}
Grads AvgPool2d(const GradContext& c) {
  // (self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
  const c10::optional<int64_t> divisor =
      c.args.size() > 6 && !c.args[6].isNone() ? c10::optional<int64_t>(c.args[6].toInt()) : c10::nullopt;
  return {at::avg_pool2d_backward(G(c), Arg(c, 0), c.args[1].toIntVector(), c.args[2].toIntVector(),
                                  c.args[3].toIntVector(), c.args[4].toBool(), c.args[5].toBool(), divisor)};
}
// The 1-d pools as their 2-d kernels over a height of 1 (how ATen computes them).
std::vector<int64_t> OneHigh(const c10::IValue& v, int64_t one) {
  std::vector<int64_t> r = v.toIntVector();
  if (r.empty()) return r;  // stride []: the kernel size
  return {one, r.at(0)};
}
Grads AvgPool1d(const GradContext& c) {  // (self, kernel_size, stride, padding, ceil_mode, count_include_pad)
  const at::Tensor& x = Arg(c, 0);
  const std::vector<int64_t> k = OneHigh(c.args[1], 1);
  std::vector<int64_t> stride = OneHigh(c.args[2], 1);
  if (stride.empty()) stride = k;
  return {at::avg_pool2d_backward(G(c).unsqueeze(-2), x.unsqueeze(-2), k, stride,
                                  OneHigh(c.args[3], 0), c.args[4].toBool(), c.args[5].toBool(), c10::nullopt)
              .squeeze(-2)};
}
Grads MaxPool1d(const GradContext& c) {  // (self, kernel_size, stride, padding, dilation, ceil_mode)
  const at::Tensor x = Arg(c, 0).unsqueeze(-2);
  const std::vector<int64_t> k = OneHigh(c.args[1], 1), p = OneHigh(c.args[3], 0), d = OneHigh(c.args[4], 1);
  std::vector<int64_t> st = OneHigh(c.args[2], 1);
  if (st.empty()) st = k;
  const bool ceil = c.args[5].toBool();
  const at::Tensor indices = std::get<1>(at::max_pool2d_with_indices(x, k, st, p, d, ceil));
  return {at::max_pool2d_with_indices_backward(G(c).unsqueeze(-2), x, k, st, p, d, ceil, indices).squeeze(-2)};
}
Grads MaxPool2d(const GradContext& c) {  // (self, kernel_size, stride, padding, dilation, ceil_mode)
  const at::Tensor& x = Arg(c, 0);
  const std::vector<int64_t> k = c.args[1].toIntVector(), st = c.args[2].toIntVector(), p = c.args[3].toIntVector(),
                             d = c.args[4].toIntVector();
  const bool ceil = c.args[5].toBool();
  const at::Tensor indices = std::get<1>(at::max_pool2d_with_indices(x, k, st, p, d, ceil));
  return {at::max_pool2d_with_indices_backward(G(c), x, k, st, p, d, ceil, indices)};
}
Grads AdaptiveAvgPool2d(const GradContext& c) { return {at::_adaptive_avg_pool2d_backward(G(c), Arg(c, 0))}; }
Grads BatchNorm(const GradContext& c) {
  // (input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled)
  const at::Tensor& x = Arg(c, 0);
  const size_t rank = c.sizes(x).size();
  if (rank < 2) throw std::runtime_error("batch_norm of a tensor of rank < 2");
  std::vector<int64_t> dims, shape(rank, 1);
  shape[1] = -1;
  for (size_t d = 0; d < rank; ++d) {
    if (d != 1) dims.push_back(static_cast<int64_t>(d));
  }
  const bool training = c.args[5].toBool();
  const double eps = c.args[7].toDouble();
  const at::Tensor& g = G(c);
  at::Tensor mean, invstd;
  if (training) {
    mean = x.mean(dims, /*keepdim=*/true);
    invstd = (x - mean).pow(2).mean(dims, /*keepdim=*/true).add(eps).rsqrt();
  } else {
    mean = Arg(c, 3).view(shape);
    invstd = Arg(c, 4).add(eps).rsqrt().view(shape);
  }
  const at::Tensor xhat = (x - mean) * invstd;
  const bool has_weight = c.args[1].isTensor();
  const at::Tensor scale = has_weight ? invstd * Arg(c, 1).view(shape) : invstd;
  Grads out(5);
  if (Need(c, 0)) {
    out[0] = training ? scale * (g - g.mean(dims, true) - xhat * (g * xhat).mean(dims, true)) : g * scale;
  }
  if (Need(c, 1) && has_weight) out[1] = (g * xhat).sum(dims);
  if (Need(c, 2) && c.args[2].isTensor()) out[2] = g.sum(dims);
  return out;
}
Grads LayerNorm(const GradContext& c) {  // (input, normalized_shape, weight, bias, eps, cudnn_enable)
  const at::Tensor& x = Arg(c, 0);
  const std::vector<int64_t> shape = c.args[1].toIntVector();
  const c10::optional<at::Tensor> w = c.args[2].isTensor() ? c10::optional<at::Tensor>(Arg(c, 2)) : c10::nullopt;
  const c10::optional<at::Tensor> b = c.args[3].isTensor() ? c10::optional<at::Tensor>(Arg(c, 3)) : c10::nullopt;
  const auto fwd = at::native_layer_norm(x, shape, w, b, c.args[4].toDouble());
  auto grads = at::native_layer_norm_backward(G(c), x, shape, std::get<1>(fwd), std::get<2>(fwd), w, b,
                                              {Need(c, 0), w.has_value() && Need(c, 1), b.has_value() && Need(c, 2)});
  return {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)};
}
Grads NllLoss(const GradContext& c) {  // nll_loss / nll_loss_nd(self, target, weight, reduction, ignore_index)
  const at::Tensor& x = Arg(c, 0);
  const c10::optional<at::Tensor> w = c.args[2].isTensor() ? c10::optional<at::Tensor>(Arg(c, 2)) : c10::nullopt;
  const int64_t reduction = c.args[3].toInt(), ignore = c.args[4].toInt();
  if (c.sizes(x).size() > 2) throw std::runtime_error("nll_loss over more than 2 dims");
  const at::Tensor total = std::get<1>(at::nll_loss_forward(x, Arg(c, 1), w, reduction, ignore));
  return {at::nll_loss_backward(G(c), x, Arg(c, 1), w, reduction, ignore, total), at::Tensor(), at::Tensor()};
}
Grads CrossEntropy(const GradContext& c) {
  // (self, target, weight, reduction, ignore_index, label_smoothing): class indices only.
  const at::Tensor& x = Arg(c, 0);
  const at::Tensor& target = Arg(c, 1);
  if (c.args[5].toDouble() != 0.0) throw std::runtime_error("cross_entropy with label smoothing");
  if (at::isFloatingType(target.scalar_type())) throw std::runtime_error("cross_entropy with probability targets");
  if (c.sizes(x).size() != 2) throw std::runtime_error("cross_entropy of a tensor of rank other than 2");
  const c10::optional<at::Tensor> w = c.args[2].isTensor() ? c10::optional<at::Tensor>(Arg(c, 2)) : c10::nullopt;
  const int64_t reduction = c.args[3].toInt(), ignore = c.args[4].toInt();
  const at::Tensor lsm = at::log_softmax(x, 1);
  const at::Tensor total = std::get<1>(at::nll_loss_forward(lsm, target, w, reduction, ignore));
  const at::Tensor g = at::nll_loss_backward(G(c), lsm, target, w, reduction, ignore, total);
  return {g - at::exp(lsm) * g.sum(1, /*keepdim=*/true), at::Tensor(), at::Tensor()};
}
Grads Embedding(const GradContext& c) {  // (weight, indices, padding_idx, scale_grad_by_freq, sparse)
  if (c.args[4].toBool()) throw std::runtime_error("sparse embedding");
  const int64_t num = c.sizes(Arg(c, 0)).at(0);
  return {at::embedding_backward(G(c), Arg(c, 1), num, c.args[2].toInt(), c.args[3].toBool(), false), at::Tensor()};
}

const std::map<std::string, DerivativeRule>& Rules() {
  static const auto* rules = new std::map<std::string, DerivativeRule>{
      {"aten::add.Tensor", Add},
      {"aten::add.Scalar", Identity},
      {"aten::sub.Tensor", Sub},
      {"aten::sub.Scalar", Identity},
      {"aten::rsub.Tensor", RsubTensor},
      {"aten::rsub.Scalar", RsubScalar},
      {"aten::mul.Tensor", Mul},
      {"aten::mul.Scalar", MulScalar},
      {"aten::div.Tensor", Div},
      {"aten::div.Scalar", DivScalar},
      {"aten::neg", Neg},
      {"aten::exp", Exp},
      {"aten::expm1", Expm1},
      {"aten::log", Log},
      {"aten::log1p", Log1p},
      {"aten::sqrt", Sqrt},
      {"aten::rsqrt", Rsqrt},
      {"aten::reciprocal", Reciprocal},
      {"aten::square", Square},
      {"aten::pow.Tensor_Scalar", PowScalar},
      {"aten::tanh", Tanh},
      {"aten::sigmoid", Sigmoid},
      {"aten::relu", Relu},
      {"aten::silu", Silu},
      {"aten::sin", Sin},
      {"aten::cos", Cos},
      {"aten::abs", Abs},
      {"aten::clamp_min", ClampMin},
      {"aten::clamp_max", ClampMax},
      {"aten::sum", Sum},
      {"aten::sum.dim_IntList", SumDim},
      {"aten::mean", Mean},
      {"aten::mean.dim", MeanDim},
      {"aten::index_select", IndexSelect},
      {"aten::gather", Gather},
      {"aten::select.int", Select},
      {"aten::slice.Tensor", Slice},
      {"aten::view", ReshapeBack},
      {"aten::_unsafe_view", ReshapeBack},
      {"aten::_reshape_alias", ReshapeBack},
      {"aten::reshape", ReshapeBack},
      {"aten::expand", Expand},
      {"aten::unsqueeze", Unsqueeze},
      {"aten::squeeze.dim", SqueezeDim},
      {"aten::squeeze", ReshapeBack},
      {"aten::permute", Permute},
      {"aten::transpose.int", Transpose},
      {"aten::t", T},
      {"aten::clone", Identity},
      {"aten::alias", Identity},
      {"aten::_to_copy", ToCopy},
      {"aten::mm", Mm},
      {"aten::addmm", Addmm},
      {"aten::bmm", Bmm},
      {"aten::mv", Mv},
      {"aten::dot", Dot},
      {"aten::_log_softmax", LogSoftmax},
      {"aten::_softmax", Softmax},
      {"aten::where.self", Where},
      {"aten::masked_fill.Scalar", MaskedFill},
      {"aten::masked_fill.Tensor", MaskedFillTensor},
      {"aten::cat", Cat},
      {"aten::concat", Cat},
      // In place: only rules that read no data of the written input (its old value is gone).
      // LibTorch's `scalar - tensor` is empty_like(tensor).fill_(scalar).sub_(tensor).
      {"aten::add_.Tensor", Add},
      {"aten::add_.Scalar", Identity},
      {"aten::sub_.Tensor", Sub},
      {"aten::sub_.Scalar", Identity},
      {"aten::narrow", Narrow},
      {"aten::view_as", ReshapeBackFirst},
      {"aten::reshape_as", ReshapeBackFirst},
      {"aten::flatten.using_ints", ReshapeBack},
      {"aten::unflatten.int", ReshapeBack},
      {"aten::expand_as", ExpandAs},
      {"aten::contiguous", Identity},
      {"aten::positive", Identity},
      {"aten::lift_fresh", Identity},
      {"aten::to.dtype", Identity},
      {"aten::to.dtype_layout", Identity},
      {"aten::to.device", Identity},
      {"aten::to.other", TypeAs},
      {"aten::type_as", TypeAs},
      {"aten::swapaxes", Swap},
      {"aten::swapdims", Swap},
      {"aten::log_softmax.int", LogSoftmaxInt},
      {"aten::softmax.int", SoftmaxInt},
      {"aten::matmul", Matmul},
      {"aten::linear", Linear},
      {"aten::outer", Outer},
      {"aten::ger", Outer},
      {"aten::dropout", Dropout},
      {"aten::feature_dropout", Dropout},
      {"aten::mse_loss", MseLoss},
      {"aten::leaky_relu", LeakyRelu},
      {"aten::hardtanh", Hardtanh},
      {"aten::relu6", Relu6},
      {"aten::gelu", Gelu},
      {"aten::erf", Erf},
      {"aten::log2", Log2},
      {"aten::log10", Log10},
      {"aten::sinh", Sinh},
      {"aten::cosh", Cosh},
      {"aten::tan", Tan},
      {"aten::logsumexp", Logsumexp},
      {"aten::true_divide.Tensor", Div},
      {"aten::true_divide.Scalar", DivScalar},
      {"aten::where.ScalarOther", WhereScalarOther},
      {"aten::where.ScalarSelf", WhereScalarSelf},
      {"aten::addcmul", Addcmul},
      {"aten::stack", Stack},
      {"aten::split.Tensor", SplitCat},
      {"aten::split_with_sizes", SplitCat},
      {"aten::split.sizes", SplitCat},
      {"aten::chunk", SplitCat},
      {"aten::unsafe_chunk", SplitCat},
      {"aten::unsafe_split.Tensor", SplitCat},
      {"aten::unsafe_split_with_sizes", SplitCat},
      {"aten::unbind.int", Unbind},
      {"aten::squeeze.dims", ReshapeBack},
      {"aten::conv1d", Convolution},
      {"aten::conv2d", Convolution},
      {"aten::conv3d", Convolution},
      {"aten::conv_transpose1d", ConvTranspose},
      {"aten::conv_transpose2d.input", ConvTranspose},
      {"aten::conv_transpose3d.input", ConvTranspose},
      {"aten::max_pool2d", MaxPool2d},
      {"aten::max_pool1d", MaxPool1d},
      {"aten::avg_pool2d", AvgPool2d},
      {"aten::avg_pool1d", AvgPool1d},
      {"aten::adaptive_avg_pool2d", AdaptiveAvgPool2d},
      {"aten::_adaptive_avg_pool2d", AdaptiveAvgPool2d},
      {"aten::batch_norm", BatchNorm},
      {"aten::layer_norm", LayerNorm},
      {"aten::nll_loss", NllLoss},
      {"aten::nll_loss_nd", NllLoss},
      {"aten::cross_entropy_loss", CrossEntropy},
      {"aten::embedding", Embedding},
  };
  return *rules;
}

}  // namespace

DerivativeRule FindDerivative(const std::string& op) {
  auto it = Rules().find(op);
  return it == Rules().end() ? nullptr : it->second;
}

std::vector<std::string> DerivativeOps() {
  std::vector<std::string> ops;
  for (const auto& [name, rule] : Rules()) ops.push_back(name);
  return ops;
}

}  // namespace warden::ops
