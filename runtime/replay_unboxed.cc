// Note [Unboxed replay]
// A boxed call (OperatorHandle::callBoxed) costs what eager does not: every argument becomes an
// IValue on a stack, and the kernel's boxed wrapper converts each back (an int[] into a fresh
// vector) before the kernel runs. On a small model at batch 1, whose ops take ~1.5 us each in
// eager, that was a few hundred ns per op. So the steps of the ops real models spend their calls
// in (linear, addmm, convolution, batch_norm, pooling, activations, views, softmax, embedding, ...)
// call the ATen C++ function of exactly that operator and overload, which is the unboxed
// dispatcher call eager makes: the same kernels, the same autograd recording, the same aliasing.
// Constant int[] arguments were converted once when the step was built (OpStepArg::ints).
//
// A step takes this path only when it is an exact match: the schema's name and overload are in
// the table below with the argument count the table's function reads, every argument has the kind
// the function reads (tensors from slots or captured constants, everything else a constant, int[]
// possibly with run-time sizes), the op returns one tensor, and no data-dependent shape is checked
// after it. Anything else stays boxed. Thread modes (Note [Thread modes]) are applied around the
// call exactly as for a boxed call (RunOpStep).
#include <ATen/ops/adaptive_avg_pool2d.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/avg_pool2d.h>
#include <ATen/ops/batch_norm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/conv_transpose2d.h>
#include <ATen/ops/div.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/flatten.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/reshape.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/t.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/transpose.h>
#include <ATen/ops/view.h>

#include <map>
#include <string>
#include <utility>

#include "runtime/codegen_replay.h"

namespace warden::codegen {
namespace {

using Slots = std::vector<c10::IValue>;
using Kind = OpStepArg::Kind;

thread_local int64_t unboxed_calls = 0;

const at::Tensor& T(const OpStep& s, const Slots& sl, int i) {
  const OpStepArg& a = s.args[i];
  return a.kind == Kind::kSlot ? sl[a.slot].toTensor() : a.constant.toTensor();
}

c10::optional<at::Tensor> OptT(const OpStep& s, const Slots& sl, int i) {
  const OpStepArg& a = s.args[i];
  if (a.kind == Kind::kSlot) return sl[a.slot].toTensor();
  if (a.constant.isNone()) return c10::nullopt;
  return a.constant.toTensor();
}

// An int[]: the constant converted at build time, or with this run's argument sizes patched in.
struct IntsArg {
  c10::SmallVector<int64_t, 8> patched;
  at::IntArrayRef ref;
  IntsArg(const OpStep& s, const Slots& sl, int i) {
    const OpStepArg& a = s.args[i];
    if (a.kind != Kind::kRunTimeSizes) {
      ref = a.ints;
      return;
    }
    patched.assign(a.ints.begin(), a.ints.end());
    PatchRunTimeSizes(a, sl, patched.data());
    ref = patched;
  }
};

int64_t I(const OpStep& s, int i) { return s.args[i].constant.toInt(); }
double D(const OpStep& s, int i) { return s.args[i].constant.toDouble(); }
bool B(const OpStep& s, int i) { return s.args[i].constant.toBool(); }
at::Scalar S(const OpStep& s, int i) { return s.args[i].constant.toScalar(); }
c10::optional<at::ScalarType> OptDtype(const OpStep& s, int i) {
  const c10::IValue& v = s.args[i].constant;
  return v.isNone() ? c10::nullopt : c10::optional<at::ScalarType>(v.toScalarType());
}

// Ops of one tensor, and of two tensors, that take nothing else.
template <at::Tensor (*F)(const at::Tensor&)>
at::Tensor Unary(const OpStep& s, const Slots& sl) {
  return F(T(s, sl, 0));
}
template <at::Tensor (*F)(const at::Tensor&, const at::Tensor&)>
at::Tensor Binary(const OpStep& s, const Slots& sl) {
  return F(T(s, sl, 0), T(s, sl, 1));
}

// What each argument of a table entry must be.
enum class Want : uint8_t { kTensor, kOptTensor, kInts, kInt, kDouble, kBool, kScalar, kOptDtype, kString };

struct Entry {
  UnboxedFn fn;
  std::vector<Want> args;
};

const std::map<std::pair<std::string, std::string>, Entry>& Table() {
  using W = Want;
  static const auto* table = new std::map<std::pair<std::string, std::string>, Entry>{
      {{"aten::linear", ""},
       {[](const OpStep& s, const Slots& sl) { return at::linear(T(s, sl, 0), T(s, sl, 1), OptT(s, sl, 2)); },
        {W::kTensor, W::kTensor, W::kOptTensor}}},
      {{"aten::addmm", ""},
       {[](const OpStep& s, const Slots& sl) { return at::addmm(T(s, sl, 0), T(s, sl, 1), T(s, sl, 2), S(s, 3), S(s, 4)); },
        {W::kTensor, W::kTensor, W::kTensor, W::kScalar, W::kScalar}}},
      {{"aten::mm", ""}, {Binary<at::mm>, {W::kTensor, W::kTensor}}},
      {{"aten::bmm", ""}, {Binary<at::bmm>, {W::kTensor, W::kTensor}}},
      {{"aten::matmul", ""}, {Binary<at::matmul>, {W::kTensor, W::kTensor}}},
      {{"aten::conv2d", ""},
       {[](const OpStep& s, const Slots& sl) {
          return at::conv2d(T(s, sl, 0), T(s, sl, 1), OptT(s, sl, 2), IntsArg(s, sl, 3).ref, IntsArg(s, sl, 4).ref,
                            IntsArg(s, sl, 5).ref, I(s, 6));
        },
        {W::kTensor, W::kTensor, W::kOptTensor, W::kInts, W::kInts, W::kInts, W::kInt}}},
      {{"aten::conv_transpose2d", "input"},
       {[](const OpStep& s, const Slots& sl) {
          return at::conv_transpose2d(T(s, sl, 0), T(s, sl, 1), OptT(s, sl, 2), IntsArg(s, sl, 3).ref,
                                      IntsArg(s, sl, 4).ref, IntsArg(s, sl, 5).ref, I(s, 6), IntsArg(s, sl, 7).ref);
        },
        {W::kTensor, W::kTensor, W::kOptTensor, W::kInts, W::kInts, W::kInts, W::kInt, W::kInts}}},
      {{"aten::batch_norm", ""},
       {[](const OpStep& s, const Slots& sl) {
          return at::batch_norm(T(s, sl, 0), OptT(s, sl, 1), OptT(s, sl, 2), OptT(s, sl, 3), OptT(s, sl, 4), B(s, 5),
                                D(s, 6), D(s, 7), B(s, 8));
        },
        {W::kTensor, W::kOptTensor, W::kOptTensor, W::kOptTensor, W::kOptTensor, W::kBool, W::kDouble, W::kDouble,
         W::kBool}}},
      {{"aten::layer_norm", ""},
       {[](const OpStep& s, const Slots& sl) {
          return at::layer_norm(T(s, sl, 0), IntsArg(s, sl, 1).ref, OptT(s, sl, 2), OptT(s, sl, 3), D(s, 4), B(s, 5));
        },
        {W::kTensor, W::kInts, W::kOptTensor, W::kOptTensor, W::kDouble, W::kBool}}},
      {{"aten::max_pool2d", ""},
       {[](const OpStep& s, const Slots& sl) {
          return at::max_pool2d(T(s, sl, 0), IntsArg(s, sl, 1).ref, IntsArg(s, sl, 2).ref, IntsArg(s, sl, 3).ref,
                                IntsArg(s, sl, 4).ref, B(s, 5));
        },
        {W::kTensor, W::kInts, W::kInts, W::kInts, W::kInts, W::kBool}}},
      {{"aten::adaptive_avg_pool2d", ""},
       {[](const OpStep& s, const Slots& sl) { return at::adaptive_avg_pool2d(T(s, sl, 0), IntsArg(s, sl, 1).ref); },
        {W::kTensor, W::kInts}}},
      {{"aten::relu", ""}, {Unary<at::relu>, {W::kTensor}}},
      {{"aten::sigmoid", ""}, {Unary<at::sigmoid>, {W::kTensor}}},
      {{"aten::tanh", ""}, {Unary<at::tanh>, {W::kTensor}}},
      {{"aten::exp", ""}, {Unary<at::exp>, {W::kTensor}}},
      {{"aten::leaky_relu", ""},
       {[](const OpStep& s, const Slots& sl) { return at::leaky_relu(T(s, sl, 0), S(s, 1)); }, {W::kTensor, W::kScalar}}},
      {{"aten::gelu", ""},
       {[](const OpStep& s, const Slots& sl) { return at::gelu(T(s, sl, 0), s.args[1].constant.toStringRef()); },
        {W::kTensor, W::kString}}},
      {{"aten::add", "Tensor"},
       {[](const OpStep& s, const Slots& sl) { return at::add(T(s, sl, 0), T(s, sl, 1), S(s, 2)); },
        {W::kTensor, W::kTensor, W::kScalar}}},
      {{"aten::sub", "Tensor"},
       {[](const OpStep& s, const Slots& sl) { return at::sub(T(s, sl, 0), T(s, sl, 1), S(s, 2)); },
        {W::kTensor, W::kTensor, W::kScalar}}},
      {{"aten::mul", "Tensor"}, {Binary<at::mul>, {W::kTensor, W::kTensor}}},
      {{"aten::mul", "Scalar"},
       {[](const OpStep& s, const Slots& sl) { return at::mul(T(s, sl, 0), S(s, 1)); }, {W::kTensor, W::kScalar}}},
      {{"aten::div", "Tensor"}, {Binary<at::div>, {W::kTensor, W::kTensor}}},
      {{"aten::view", ""},
       {[](const OpStep& s, const Slots& sl) { return T(s, sl, 0).view(IntsArg(s, sl, 1).ref); }, {W::kTensor, W::kInts}}},
      {{"aten::reshape", ""},
       {[](const OpStep& s, const Slots& sl) { return at::reshape(T(s, sl, 0), IntsArg(s, sl, 1).ref); },
        {W::kTensor, W::kInts}}},
      {{"aten::flatten", "using_ints"},
       {[](const OpStep& s, const Slots& sl) { return at::flatten(T(s, sl, 0), I(s, 1), I(s, 2)); },
        {W::kTensor, W::kInt, W::kInt}}},
      {{"aten::t", ""}, {Unary<at::t>, {W::kTensor}}},
      {{"aten::transpose", "int"},
       {[](const OpStep& s, const Slots& sl) { return at::transpose(T(s, sl, 0), I(s, 1), I(s, 2)); },
        {W::kTensor, W::kInt, W::kInt}}},
      {{"aten::softmax", "int"},
       {[](const OpStep& s, const Slots& sl) { return at::softmax(T(s, sl, 0), I(s, 1), OptDtype(s, 2)); },
        {W::kTensor, W::kInt, W::kOptDtype}}},
      {{"aten::log_softmax", "int"},
       {[](const OpStep& s, const Slots& sl) { return at::log_softmax(T(s, sl, 0), I(s, 1), OptDtype(s, 2)); },
        {W::kTensor, W::kInt, W::kOptDtype}}},
      {{"aten::dropout", ""},
       {[](const OpStep& s, const Slots& sl) { return at::dropout(T(s, sl, 0), D(s, 1), B(s, 2)); },
        {W::kTensor, W::kDouble, W::kBool}}},
      {{"aten::embedding", ""},
       {[](const OpStep& s, const Slots& sl) { return at::embedding(T(s, sl, 0), T(s, sl, 1), I(s, 2), B(s, 3), B(s, 4)); },
        {W::kTensor, W::kTensor, W::kInt, W::kBool, W::kBool}}},
  };
  return *table;
}

bool Matches(const OpStepArg& a, Want want) {
  const c10::IValue& c = a.constant;
  switch (want) {
    case Want::kTensor:
      return a.kind == Kind::kSlot || (a.kind == Kind::kConstant && c.isTensor() && c.toTensor().defined());
    case Want::kOptTensor:
      return a.kind == Kind::kSlot || (a.kind == Kind::kConstant && (c.isNone() || (c.isTensor() && c.toTensor().defined())));
    case Want::kInts:
      return (a.kind == Kind::kConstant || a.kind == Kind::kRunTimeSizes) && c.isIntList();
    case Want::kInt:
      return a.kind == Kind::kConstant && c.isInt();
    case Want::kDouble:
      return a.kind == Kind::kConstant && c.isDouble();
    case Want::kBool:
      return a.kind == Kind::kConstant && c.isBool();
    case Want::kScalar:
      return a.kind == Kind::kConstant && (c.isInt() || c.isDouble() || c.isBool() || c.isComplexDouble());
    case Want::kOptDtype:
      return a.kind == Kind::kConstant && (c.isNone() || c.isInt());
    case Want::kString:
      return a.kind == Kind::kConstant && c.isString();
  }
  return false;
}

}  // namespace

void SetUnboxed(OpStep* s) {
  s->unboxed = nullptr;
  const c10::FunctionSchema& schema = s->op.schema();
  const auto& table = Table();
  auto it = table.find({schema.name(), schema.overload_name()});
  if (it == table.end() || s->check_shapes || s->args.size() != it->second.args.size()) return;
  if (s->returns.size() != 1 || s->returns[0].kind != tracer::NodeReturn::Kind::kTensor ||
      s->returns[0].slots.size() != 1 || s->returns[0].slots[0] < 0) {
    return;
  }
  for (size_t i = 0; i < s->args.size(); ++i) {
    if (!Matches(s->args[i], it->second.args[i])) return;
  }
  s->unboxed = it->second.fn;
}

void CountUnboxedCall() { ++unboxed_calls; }

int64_t UnboxedCallsOnThisThread() { return unboxed_calls; }

}  // namespace warden::codegen
