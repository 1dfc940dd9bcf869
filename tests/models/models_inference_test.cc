// Real programs, inference: the models of models.h in eval mode under NoGradGuard or
// InferenceMode (where the "cpp" backend runs fused C++ kernels; with grad enabled it replays ATen
// calls so that autograd records them), text generation with multinomial sampling inside the
// compiled step, an inference server with more batch sizes than cache entries, four serving
// threads with different thread-local modes, CPU autocast switched on and off. Backends: eager
// (control), aten, cpp. See sweep.h for what each sweep asserts.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/autocast_mode.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tracer/autocast_compat.h"
#include "runtime/warden.h"
#include "tests/models/models.h"
#include "tests/models/sweep.h"
#include "tests/models/twin.h"

namespace {

using namespace sweep;  // NOLINT: the sweep and the models' inputs and forward functions

class ModelsInference : public twin::BackendTest {};

// Inference under NoGradGuard, where the "cpp" backend runs fused kernels (with grad enabled it
// replays ATen calls so that autograd records them): every model in eval mode.
TEST_P(ModelsInference, InferenceNoGradAllModels) {
  const Sweep s{.train = false, .backward = false, .batches = {1, 2, 8}, .no_grad = true};
  {
    SCOPED_TRACE("Mlp");
    CheckSweep<models::Mlp>(backend(), twin::MakeTwins<models::Mlp>(2, 32, 64, 10, true), MlpInput, MlpForward(), s);
  }
  {
    SCOPED_TRACE("LstmLm");
    CheckSweep<models::LstmLm>(backend(), twin::MakeTwins<models::LstmLm>(6, 50, 16, 32, 2, 0.2), Tokens,
                               LstmForward(), s);
  }
  {
    SCOPED_TRACE("Vae");
    CheckSweep<models::Vae>(backend(), twin::MakeTwins<models::Vae>(7, 256, 64, 8), UnitImages, VaeForward(), s);
  }
  {
    SCOPED_TRACE("DcganGenerator");
    CheckSweep<models::DcganGenerator>(backend(), twin::MakeTwins<models::DcganGenerator>(8, 16, 16), Noise,
                                       GeneratorForward(), s);
  }
  {
    SCOPED_TRACE("DcganDiscriminator");
    CheckSweep<models::DcganDiscriminator>(backend(), twin::MakeTwins<models::DcganDiscriminator>(9, 16, true),
                                           Images, DiscriminatorForward(), s);
  }
  {
    SCOPED_TRACE("GruTagger");
    CheckSweep<models::GruTagger>(backend(), twin::MakeTwins<models::GruTagger>(11, 20, 8, 16, 5), TagInput,
                                  GruForward(), s);
  }
  {
    SCOPED_TRACE("TransformerLm");
    CheckSweep<models::TransformerLm>(backend(), twin::MakeTwins<models::TransformerLm>(10, 50, 32, 4, 2),
                                      TransformerInput, TransformerForward(), s);
  }
}

// Text generation (the word_language_model generate program): under NoGradGuard, one token at a
// time, the LSTM state carried between calls, the next token drawn INSIDE the compiled step with
// multinomial over softmax(logits / temperature). Seeded once before each side's whole loop:
// the 40 tokens must be the same (the replay consumes the generator exactly as eager does).
TEST_P(ModelsInference, LstmLmGenerateWithMultinomial) {
  auto [eager, model] = twin::MakeTwins<models::LstmLm>(20, 50, 16, 32, 2, 0.2);
  eager->eval();
  model->eval();
  auto step = [](models::LstmLm& m, const Args& a) -> std::vector<at::Tensor> {
    auto [logp, h, c] = m->forward(a[0].toTensor(), a[1].toTensor(), a[2].toTensor());
    at::Tensor weights = logp.div(0.8).exp();
    return {torch::multinomial(weights, 1), h, c};
  };
  twin::Subject subject([model = model, step](const Args& a) mutable { return step(model, a); }, backend(),
                        "generate");
  torch::NoGradGuard no_grad;
  auto generate = [&](const std::function<std::vector<at::Tensor>(const Args&)>& fn) {
    torch::manual_seed(21);
    at::Tensor token = torch::randint(0, 50, {1, 1}, torch::kLong);
    at::Tensor h = torch::zeros({2, 1, 32}), c = torch::zeros({2, 1, 32});
    std::vector<at::Tensor> tokens;
    for (int i = 0; i < 40; ++i) {
      auto out = fn({token, h, c});
      token = out[0].view({1, 1});
      h = out[1];
      c = out[2];
      tokens.push_back(token);
    }
    return torch::cat(tokens).view(-1);
  };
  const at::Tensor want = generate([&](const Args& a) { return step(eager, a); });
  const at::Tensor got = generate([&](const Args& a) { return subject(a); });
  EXPECT_TRUE(twin::Close(got, want, twin::kExact, "generated tokens")) << got << want;
  if (subject.is_warden()) {
    EXPECT_EQ(subject.stats().compiles, 1) << subject.events();
    EXPECT_EQ(subject.stats().cache_hits, 39);
  }
}

// Serving: every call under c10::InferenceMode (outputs are inference tensors on both sides).
TEST_P(ModelsInference, ResNetEvalUnderInferenceMode) {
  CheckSweep<models::ResNet>(backend(), twin::MakeTwins<models::ResNet>(5, 10), Images, ResNetForward(),
                             {.train = false, .backward = false, .inference_mode = true});
}

TEST_P(ModelsInference, ConvNetEvalUnderNoGrad) {
  torch::NoGradGuard no_grad;
  CheckSweep<models::ConvNet>(backend(), twin::MakeTwins<models::ConvNet>(4), Images, ConvNetForward(),
                              {.train = false, .backward = false});
}

// An inference server: 12 distinct batch sizes (more than cache_size_limit = 8 entries if every
// size needs its own), several rounds. Every result equals eager's, every call is accounted for
// (hit, compile or eager run), and the function never compiles more than the limit.
TEST_P(ModelsInference, ResNetServingManyBatchSizes) {
  auto [eager, model] = twin::MakeTwins<models::ResNet>(17, 10);
  eager->eval();
  model->eval();
  twin::Subject subject([model = model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {torch::softmax(model->forward(a[0].toTensor()), 1)};
  }, backend(), "serve");
  const Tol tol = this->tol(twin::kForwardTol);
  testing::internal::CaptureStderr();
  for (int round = 0; round < 2; ++round) {
    for (int64_t batch = 1; batch <= 12; ++batch) {
      SCOPED_TRACE("round " + std::to_string(round) + ", batch " + std::to_string(batch));
      c10::InferenceMode guard;
      const at::Tensor x = torch::randn({batch, 1, 16, 16});
      const auto want = torch::softmax(eager->forward(x), 1);
      ASSERT_TRUE(twin::CloseAll(subject({x}), {want}, tol, "output")) << subject.events();
    }
  }
  testing::internal::GetCapturedStderr();
  twin::MaybePrintExplain(subject);
  if (subject.is_warden()) {
    const warden::Stats s = subject.stats();
    EXPECT_EQ(s.calls, 24);
    EXPECT_EQ(s.cache_hits + s.compiles + s.eager_calls, s.calls);
    // conv, batch_norm, pooling, flatten and linear all keep the batch symbolic: one static
    // entry for batch 1 (sizes 0 and 1 always specialize) and one dynamic entry for the rest.
    // SWEEP_EXPLAIN=1 in the test environment prints the function's explain() (for debugging).
    if (std::getenv("SWEEP_EXPLAIN")) std::cerr << subject.explain() << std::endl;
    EXPECT_LE(s.compiles, 2) << subject.events();
    EXPECT_EQ(s.eager_calls, 0) << subject.events();
    EXPECT_EQ(s.cache_hits, 24 - s.compiles) << "every call after a size's first must hit";
  }
}

// Batch sweeps of 12 sizes in kAuto: at most two compiles each, never an eager call, results
// equal to eager on every call. Models whose C++ reads the batch size (ConvNet's
// view({x.size(0), -1}), nn::LSTM's zero state) verify each new size by re-tracing instead of
// recompiling (Note [Verified size reads]); the others need no verification at all.
template <typename Model, typename... Ctor>
void SweepBatches(const std::string& backend, const Tol& tol, std::function<at::Tensor(int64_t)> input,
                  std::function<at::Tensor(Model&, const at::Tensor&)> forward, bool reads_sizes,
                  const Ctor&... ctor) {
  auto [eager, model] = twin::MakeTwins<Model>(23, ctor...);
  eager->eval();
  model->eval();
  twin::Subject subject([model = model, forward](const Args& a) mutable -> std::vector<at::Tensor> {
    return {forward(model, a[0].toTensor())};
  }, backend, "sweep");
  testing::internal::CaptureStderr();
  for (int round = 0; round < 2; ++round) {
    for (int64_t batch = 1; batch <= 12; ++batch) {
      SCOPED_TRACE("round " + std::to_string(round) + ", batch " + std::to_string(batch));
      torch::NoGradGuard no_grad;
      const at::Tensor x = input(batch);
      ASSERT_TRUE(twin::CloseAll(subject({x}), {forward(eager, x)}, tol, "output")) << subject.events();
    }
  }
  testing::internal::GetCapturedStderr();
  if (subject.is_warden()) {
    const warden::Stats s = subject.stats();
    // SWEEP_EXPLAIN=1 in the test environment prints the function's explain() (for debugging).
    if (std::getenv("SWEEP_EXPLAIN")) std::cerr << subject.explain() << std::endl;
    EXPECT_LE(s.compiles, 2) << subject.events();
    EXPECT_EQ(s.eager_calls, 0) << subject.events();
    EXPECT_EQ(s.size_verifications, reads_sizes ? 12 - s.compiles : 0) << subject.events();
    EXPECT_EQ(s.cache_hits, s.calls - s.compiles - s.size_verifications) << subject.events();
  }
}

template <typename Model>
at::Tensor Forward(Model& m, const at::Tensor& x) {
  return m->forward(x);
}

TEST_P(ModelsInference, BatchSweepCompilesAtMostTwice) {
  const Tol tol = this->tol(twin::kForwardTol);
  {
    SCOPED_TRACE("MLP with BatchNorm1d");
    SweepBatches<models::Mlp>(backend(), tol, [](int64_t b) { return torch::randn({b, 12}); },
                              Forward<models::Mlp>, false, 12, 16, 4, true);
  }
  {
    SCOPED_TRACE("DCGAN generator (conv_transpose2d, batch_norm)");
    SweepBatches<models::DcganGenerator>(backend(), tol, [](int64_t b) { return torch::randn({b, 16, 1, 1}); },
                                         Forward<models::DcganGenerator>, false);
  }
  {
    SCOPED_TRACE("DCGAN discriminator (strided conv2d, view(-1))");
    SweepBatches<models::DcganDiscriminator>(backend(), tol, [](int64_t b) { return torch::randn({b, 1, 16, 16}); },
                                             Forward<models::DcganDiscriminator>, false);
  }
}

// The VAE in eval mode (reparameterize returns mu): view({-1, in_features}) reads no size.
TEST_P(ModelsInference, VaeBatchSweepCompilesAtMostTwice) {
  SweepBatches<models::Vae>(
      backend(), this->tol(twin::kForwardTol), [](int64_t b) { return torch::rand({b, 1, 16, 16}); },
      [](models::Vae& m, const at::Tensor& x) { return std::get<0>(m->forward(x)); }, false);
}

// fastText averages embeddings over words: token inputs [batch, 6].
TEST_P(ModelsInference, FastTextBatchSweep) {
  SweepBatches<models::FastText>(backend(), this->tol(twin::kForwardTol),
                                 [](int64_t b) { return torch::randint(20, {b, 6}, torch::kLong); },
                                 Forward<models::FastText>, false);
}

// The GRU tagger: its Embedding's max_norm makes LibTorch read the tokens' strides in C++ (and
// renormalize the weight rows in place), nn::GRU reads the batch size: sizes and strides are
// verified per batch size.
TEST_P(ModelsInference, GruTaggerBatchSweepVerifiesSizesAndStrides) {
  SweepBatches<models::GruTagger>(backend(), this->tol(twin::kForwardTol),
                                  [](int64_t b) { return torch::randint(20, {b, 5}, torch::kLong); },
                                  Forward<models::GruTagger>, true);
}

// The tutorial CNN flattens with view({x.size(0), -1}): C++ reads the batch size.
TEST_P(ModelsInference, ConvNetBatchSweepVerifiesTheSizeItReads) {
  SweepBatches<models::ConvNet>(backend(), this->tol(twin::kForwardTol),
                                [](int64_t b) { return torch::randn({b, 1, 16, 16}); }, Forward<models::ConvNet>, true);
}

// nn::LSTM (two layers) builds its zero state from input.size(1) and checks it in C++: a batch
// sweep at a fixed sequence length.
TEST_P(ModelsInference, LstmLmBatchSweepAtAFixedLengthVerifiesTheSizeItReads) {
  SweepBatches<models::LstmLm>(
      backend(), this->tol(twin::kForwardTol), [](int64_t b) { return torch::randint(40, {7, b}, torch::kLong); },
      [](models::LstmLm& m, const at::Tensor& tokens) { return std::get<0>(m->forward(tokens)); }, true, 40, 16, 24);
}

// A transformer LM whose masks are built from the tokens' sizes, as a serving loop does:
// nn::MultiheadAttention views its projections as [seq, batch * heads, head_dim], a multiple of
// the batch size C++ read, which verification expresses (the size times 4 at run time).
TEST_P(ModelsInference, TransformerLmBatchSweepVerifiesBatchTimesHeads) {
  SweepBatches<models::TransformerLm>(
      backend(), this->tol(twin::kForwardTol), [](int64_t b) { return torch::randint(50, {6, b}, torch::kLong); },
      [](models::TransformerLm& m, const at::Tensor& tokens) {
        auto [causal, padding] = models::CausalMasks(tokens.size(0), tokens.size(1));
        return m->forward(tokens, causal, padding);
      },
      true, 50, 32, 4, 2);
}

// A thread pool serving one compiled model: 4 threads, 15 requests each, batch 1..3; half of the
// threads under NoGradGuard, half under InferenceMode (thread-local modes, guarded per call).
TEST_P(ModelsInference, ResNetServingFromFourThreads) {
  auto [eager, model] = twin::MakeTwins<models::ResNet>(18, 10);
  eager->eval();
  model->eval();
  twin::Subject subject([model = model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {model->forward(a[0].toTensor())};
  }, backend(), "pool");
  subject.watch(*model, "model");
  const Tol tol = this->tol(twin::kForwardTol);
  // Inputs and eager results are computed up front, so the threads run only the compiled function.
  std::vector<std::vector<at::Tensor>> inputs(4), wants(4);
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 15; ++i) {
      inputs[t].push_back(torch::randn({1 + (i + t) % 3, 1, 16, 16}));
      torch::NoGradGuard no_grad;
      wants[t].push_back(eager->forward(inputs[t].back()));
    }
  }
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::optional<torch::NoGradGuard> no_grad;
      std::optional<c10::InferenceMode> inference;
      if (t % 2 == 1) {
        no_grad.emplace();
      } else {
        inference.emplace();
      }
      for (int i = 0; i < 15; ++i) {
        const at::Tensor got = subject({inputs[t][i]})[0];
        auto r = twin::Close(got, wants[t][i], tol, "thread " + std::to_string(t) + " call " + std::to_string(i));
        if (!r && failures[t].empty()) failures[t] = r.message();
        if (got.requires_grad() || got.is_inference() != (t % 2 == 0)) {
          failures[t] = "thread " + std::to_string(t) + ": autograd state of the output differs from eager's";
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");
  if (subject.is_warden()) {
    const warden::Stats s = subject.stats();
    EXPECT_EQ(s.calls, 60);
    EXPECT_EQ(s.cache_hits + s.compiles + s.eager_calls, s.calls);
    EXPECT_LE(s.compiles, 6) << "3 batch sizes x 2 thread-local modes\n" << subject.events();
    EXPECT_EQ(s.eager_calls, 0);
  }
}

// CPU autocast (bfloat16) switched on and off between calls: linear runs in bfloat16 under
// autocast in eager; the compiled function must follow (dtype and values).
TEST_P(ModelsInference, MlpCpuAutocastOnAndOff) {
  auto [eager, model] = twin::MakeTwins<models::Mlp>(19, 32, 64, 10);
  twin::Subject subject([model = model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {model->forward(a[0].toTensor())};
  }, backend(), "autocast");
  for (bool on : {false, true, true, false, true}) {
    SCOPED_TRACE(on ? "autocast on" : "autocast off");
    const at::Tensor x = torch::randn({4, 32});
    warden::compat::SetAutocastCpuEnabled(on);
    const at::Tensor want = eager->forward(x);
    const auto got = subject({x});
    warden::compat::SetAutocastCpuEnabled(false);
    ASSERT_EQ(want.scalar_type(), on ? torch::kBFloat16 : torch::kFloat);
    EXPECT_TRUE(twin::CloseAll(got, {want}, this->tol(twin::kForwardTol), "output")) << subject.events();
  }
}

TWIN_INSTANTIATE_BACKENDS(ModelsInference);

}  // namespace
