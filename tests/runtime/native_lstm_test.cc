// Note [Native LSTM] (runtime/native_lstm.cc) through warden::compile on backend "cpp": nn::LSTM
// modules of every supported form (layers, biases, batch-first, given or zero initial state,
// hidden sizes that are and are not a multiple of 8) against eager within a tolerance, with
// eager's sizes and strides; NaN and infinities; the fallbacks to ATen (gradients wanted, f64,
// a projection, a large hidden size or cell step). Each test asserts whether the
// kernel ran.
#include <tuple>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/codegen_replay.h"
#include "runtime/warden.h"
#include "tests/test_env.h"
#include "tracer/autocast_compat.h"

namespace warden {
namespace {

using Args = std::vector<c10::IValue>;
using Outputs = std::vector<at::Tensor>;
using test_util::ScopedCacheDir;

Options CppStatic(const std::string& name, Dynamic dynamic = Dynamic::kStatic) {
  Options o;
  o.name = name;
  o.backend = "cpp";
  o.dynamic = dynamic;
  return o;
}

struct LstmCase {
  std::string name;
  int64_t in, hidden, layers;
  bool bias, batch_first, with_state;
  int64_t steps, batch;
};

// The module's three results, eagerly.
Outputs RunLstm(torch::nn::LSTM& lstm, const Args& a, bool with_state) {
  auto [out, state] = with_state ? lstm->forward(a[0].toTensor(), std::make_tuple(a[1].toTensor(), a[2].toTensor()))
                                 : lstm->forward(a[0].toTensor());
  return {out, std::get<0>(state), std::get<1>(state)};
}

void ExpectClose(const Outputs& got, const Outputs& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what << " #" << i;
    EXPECT_EQ(got[i].strides(), want[i].strides()) << what << " #" << i;
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << what << " #" << i;
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-5, /*equal_nan=*/true))
        << what << " #" << i << " max diff " << (got[i] - want[i]).abs().nan_to_num(0).max().item<float>();
  }
}

// Compiles the module's forward, calls it three times with fresh inputs of the same shapes, and
// compares each call with eager. Returns how many native kernel calls the hits made.
int64_t CheckAgainstEager(const LstmCase& c, torch::nn::LSTM lstm, at::ScalarType dtype = at::kFloat) {
  ScopedCacheDir cache;
  lstm->eval();
  const bool with_state = c.with_state;
  CompiledFunction f = compile([lstm, with_state](const Args& a) mutable { return RunLstm(lstm, a, with_state); },
                               CppStatic("lstm_" + c.name));
  const auto options = torch::TensorOptions().dtype(dtype);
  int64_t native = 0;
  for (int call = 0; call < 3; ++call) {
    Args args = {c.batch_first ? torch::randn({c.batch, c.steps, c.in}, options)
                               : torch::randn({c.steps, c.batch, c.in}, options)};
    if (with_state) {
      args.push_back(torch::randn({c.layers, c.batch, c.hidden}, options));
      args.push_back(torch::randn({c.layers, c.batch, c.hidden}, options));
    }
    const Outputs want = RunLstm(lstm, args, with_state);
    const int64_t before = codegen::NativeCallsOnThisThread();
    const Outputs got = f(args);
    native += codegen::NativeCallsOnThisThread() - before;
    ExpectClose(got, want, c.name + " call " + std::to_string(call));
  }
  EXPECT_EQ(f.stats().compiles, 1) << c.name;
  return native;
}

torch::nn::LSTM MakeLstm(const LstmCase& c) {
  torch::manual_seed(11);
  return torch::nn::LSTM(
      torch::nn::LSTMOptions(c.in, c.hidden).num_layers(c.layers).bias(c.bias).batch_first(c.batch_first));
}

// Calls f twice with args, the trace and then a hit; returns the hit's outputs and sets *native to
// the native kernel calls it made.
Outputs HitOnce(CompiledFunction& f, const Args& args, int64_t* native) {
  f(args);  // the trace
  const int64_t before = codegen::NativeCallsOnThisThread();
  Outputs got = f(args);
  *native = codegen::NativeCallsOnThisThread() - before;
  return got;
}

torch::nn::LSTM EvalLstm(const LstmCase& c) {
  torch::nn::LSTM lstm = MakeLstm(c);
  lstm->eval();
  return lstm;
}

// The case's module in eval mode, compiled with its initial state as arguments.
CompiledFunction CompileWithState(const LstmCase& c, Dynamic dynamic = Dynamic::kStatic) {
  torch::nn::LSTM lstm = EvalLstm(c);
  return compile([lstm](const Args& a) mutable { return RunLstm(lstm, a, true); }, CppStatic(c.name, dynamic));
}

TEST(NativeLstm, MatchesEagerForEveryForm) {
  torch::NoGradGuard no_grad;
  const std::vector<LstmCase> cases = {
      {"lm", 16, 24, 2, true, false, false, 7, 1},
      {"lm_batch8", 16, 24, 2, true, false, false, 7, 8},
      {"lm_step_state", 16, 24, 2, true, false, true, 1, 3},
      {"one_layer", 5, 8, 1, true, false, true, 4, 2},
      {"three_layers", 6, 16, 3, true, false, true, 5, 2},
      {"no_bias", 7, 12, 2, false, false, true, 3, 2},
      {"hidden_13", 4, 13, 2, true, false, true, 6, 3},   // 4H = 52: padded gates, a partial vector
      {"hidden_1", 3, 1, 1, true, false, true, 2, 2},
      {"batch_first", 9, 10, 2, true, true, true, 5, 4},
      {"batch_first_zero_state", 9, 16, 1, true, true, false, 3, 2},
  };
  for (const LstmCase& c : cases) {
    // One native call per hit: the first call is the trace, eagerly.
    EXPECT_EQ(CheckAgainstEager(c, MakeLstm(c)), 2) << c.name;
  }
}

// NaN and infinities in the input, large gate values (saturated sigmoid and tanh): as eager.
TEST(NativeLstm, NanInfinityAndSaturation) {
  torch::NoGradGuard no_grad;
  const LstmCase c{"special", 4, 8, 2, true, false, true, 4, 3};
  torch::nn::LSTM lstm = EvalLstm(c);
  ScopedCacheDir cache;
  CompiledFunction f = CompileWithState(c);
  at::Tensor x = torch::randn({4, 3, 4}) * 100;  // saturates every gate
  x[0][0][0] = NAN;
  x[1][1][2] = INFINITY;
  x[2][2][3] = -INFINITY;
  const Args args = {x, torch::zeros({2, 3, 8}), torch::zeros({2, 3, 8})};
  int64_t native = 0;
  const Outputs got = HitOnce(f, args, &native);
  EXPECT_EQ(native, 1);
  ExpectClose(got, RunLstm(lstm, args, true), "special values");
  EXPECT_TRUE(torch::isnan(got[0][0][0]).all().item<bool>());  // batch row 0 is NaN from step 0
}

// An initial state that is contiguous but has another stride on its size-1 batch dim: h_n and
// c_n still have eager's canonical strides.
TEST(NativeLstm, CanonicalStateStrides) {
  torch::NoGradGuard no_grad;
  const LstmCase c{"strides", 5, 7, 2, true, false, true, 3, 1};
  torch::nn::LSTM lstm = EvalLstm(c);
  ScopedCacheDir cache;
  CompiledFunction f = CompileWithState(c);
  const at::Tensor h0 = torch::randn({2, 7, 1}).transpose(1, 2), c0 = torch::randn({2, 7, 1}).transpose(1, 2);
  ASSERT_TRUE(h0.is_contiguous());
  const Args args = {torch::randn({3, 1, 5}), h0, c0};
  int64_t native = 0;
  const Outputs got = HitOnce(f, args, &native);
  EXPECT_EQ(native, 1);
  ExpectClose(got, RunLstm(lstm, args, true), "state strides");
}

// Found by review: CPU autocast at the call site (2.x's eager LSTM then runs in bfloat16). The
// kernel declines, so the hit's dtypes and values are eager's.
TEST(NativeLstm, DeclinesUnderAutocast) {
  torch::NoGradGuard no_grad;
  const LstmCase c{"autocast", 5, 8, 1, true, false, true, 3, 2};
  torch::nn::LSTM lstm = EvalLstm(c);
  ScopedCacheDir cache;
  CompiledFunction f = CompileWithState(c);
  const Args args = {torch::randn({3, 2, 5}), torch::randn({1, 2, 8}), torch::randn({1, 2, 8})};
  warden::compat::SetAutocastCpuEnabled(true);
  const Outputs want = RunLstm(lstm, args, true);
  int64_t native = -1;
  const Outputs got = HitOnce(f, args, &native);
  warden::compat::SetAutocastCpuEnabled(false);
  EXPECT_EQ(native, 0);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << i;
    EXPECT_TRUE(torch::allclose(got[i].to(at::kFloat), want[i].to(at::kFloat), 1e-2, 1e-2)) << i;
  }
}

TEST(NativeLstm, FallsBackToAtenOutsideItsForms) {
  {
    // Gradients wanted: ATen's LSTM and its autograd.
    const LstmCase c{"grad", 4, 8, 1, true, false, true, 3, 2};
    EXPECT_EQ(CheckAgainstEager(c, MakeLstm(c)), 0);
  }
  torch::NoGradGuard no_grad;
  {
    const LstmCase c{"f64", 4, 8, 1, true, false, true, 3, 2};
    torch::nn::LSTM lstm = MakeLstm(c);
    lstm->to(torch::kDouble);
    EXPECT_EQ(CheckAgainstEager(c, lstm, at::kDouble), 0);
  }
  {
    const LstmCase c{"proj", 4, 8, 1, true, false, false, 3, 2};
    torch::manual_seed(11);
    torch::nn::LSTM lstm(torch::nn::LSTMOptions(4, 8).proj_size(5));
    lstm->eval();
    ScopedCacheDir cache;
    CompiledFunction f = compile([lstm](const Args& a) mutable { return RunLstm(lstm, a, false); }, CppStatic("proj"));
    const Args args = {torch::randn({3, 2, 4})};
    int64_t native = -1;
    ExpectClose(HitOnce(f, args, &native), RunLstm(lstm, args, false), "proj");
    EXPECT_EQ(native, 0);
  }
  {
    const LstmCase c{"wide", 4, 300, 1, true, false, true, 2, 1};  // hidden > kMaxHidden
    EXPECT_EQ(CheckAgainstEager(c, MakeLstm(c)), 0);
  }
  {
    const LstmCase c{"big_cell", 128, 128, 1, true, false, true, 2, 64};  // > kMaxCellWork per step
    EXPECT_EQ(CheckAgainstEager(c, MakeLstm(c)), 0);
    const LstmCase under{"under_limit", 64, 64, 1, true, false, true, 2, 8};  // 8 * 128 * 256
    EXPECT_EQ(CheckAgainstEager(under, MakeLstm(under)), 2);
  }
}

// A batch sweep under Dynamic::kAuto: the recompiled (batch-dynamic) entry runs the kernel too,
// on every hit (nn::LSTM reads the batch size in C++, so each new size is first verified by a
// trace: Note [Verified size reads]).
TEST(NativeLstm, DynamicBatch) {
  torch::NoGradGuard no_grad;
  const LstmCase c{"dyn", 16, 24, 2, true, false, true, 7, 1};
  torch::nn::LSTM lstm = EvalLstm(c);
  ScopedCacheDir cache;
  CompiledFunction f = CompileWithState(c, Dynamic::kAuto);
  int64_t native = 0;
  for (int64_t b : {1, 2, 3, 5, 2, 3, 5, 8}) {
    const Args args = {torch::randn({7, b, 16}), torch::randn({2, b, 24}), torch::randn({2, b, 24})};
    const int64_t before = codegen::NativeCallsOnThisThread();
    const Outputs got = f(args);
    native += codegen::NativeCallsOnThisThread() - before;
    ExpectClose(got, RunLstm(lstm, args, true), "batch " + std::to_string(b));
  }
  EXPECT_LE(f.stats().compiles, 2);
  EXPECT_GE(native, 3) << f.explain();
  EXPECT_NE(f.explain().find("aten::lstm"), std::string::npos);
}

}  // namespace
}  // namespace warden
