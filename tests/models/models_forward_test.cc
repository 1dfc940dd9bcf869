// Real programs, forward (+ backward outside the compiled function): every model of models.h in
// eval and in train mode, over the batch sweep of sweep.h (1, 2, 3, 8, done twice), eagerly and
// through Warden (backends "aten" and "cpp"; "eager" is the harness's own control, see twin.h).
// Then the same programs under other conditions: Dynamic::kDynamic, a sequence-length sweep,
// non-contiguous inputs, model->to(kDouble) and back, batch size 1 rejected by BatchNorm1d in
// train mode; and self-tests of the harness. Inference-only programs: models_inference_test.
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"
#include "tests/models/models.h"
#include "tests/models/sweep.h"
#include "tests/models/twin.h"

namespace {

using namespace sweep;  // NOLINT: the sweep and the models' inputs and forward functions

class ModelsForward : public twin::BackendTest {};

// ---------------------------------------------------------------------------------------------
// The models of models.h, eval and train.

TEST_P(ModelsForward, MlpEval) {
  CheckSweep<models::Mlp>(backend(), twin::MakeTwins<models::Mlp>(1, 32, 64, 10), MlpInput, MlpForward(),
                          {.train = false});
}

TEST_P(ModelsForward, MlpTrain) {
  CheckSweep<models::Mlp>(backend(), twin::MakeTwins<models::Mlp>(1, 32, 64, 10), MlpInput, MlpForward(),
                          {.train = true});
}

TEST_P(ModelsForward, MlpBatchNormEval) {
  CheckSweep<models::Mlp>(backend(), twin::MakeTwins<models::Mlp>(2, 32, 64, 10, true), MlpInput, MlpForward(),
                          {.train = false});
}

TEST_P(ModelsForward, MlpBatchNormTrainWithoutBatchOne) {
  CheckSweep<models::Mlp>(backend(), twin::MakeTwins<models::Mlp>(2, 32, 64, 10, true), MlpInput, MlpForward(),
                          {.train = true, .batches = {2, 3, 8}});
}

// BatchNorm1d in train mode rejects a batch of one ("Expected more than 1 value per channel when
// training"): the compiled function raises the same c10::Error as eager, before and after other
// batch sizes were compiled, and leaves the running statistics as eager leaves them.
TEST_P(ModelsForward, MlpBatchNormTrainBatchOneRaisesAsEager) {
  auto [eager, model] = twin::MakeTwins<models::Mlp>(3, 32, 64, 10, true);
  eager->train();
  model->train();
  twin::Subject subject([model = model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {model->forward(a[0].toTensor())};
  }, backend(), "bn_batch_one");
  const Tol tol = this->tol(twin::kForwardTol);
  for (int64_t batch : {1, 4, 1, 5, 1}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const Args args = MlpInput(batch);
    if (batch == 1) {
      std::string eager_error, subject_error;
      try {
        eager->forward(args[0].toTensor());
      } catch (const c10::Error& e) {
        eager_error = e.what_without_backtrace();
      }
      try {
        subject(args);
      } catch (const c10::Error& e) {
        subject_error = e.what_without_backtrace();
      }
      ASSERT_THAT(eager_error, ::testing::HasSubstr("Expected more than 1 value per channel"));
      EXPECT_THAT(subject_error, ::testing::HasSubstr("Expected more than 1 value per channel"));
    } else {
      const auto want = eager->forward(args[0].toTensor());
      const auto got = subject(args);
      ASSERT_TRUE(twin::CloseAll(got, {want}, tol, "output")) << subject.events();
    }
    EXPECT_TRUE(twin::SameBuffers(*model, *eager, tol));
  }
}

// ---------------------------------------------------------------------------------------------

TEST_P(ModelsForward, ConvNetEval) {
  CheckSweep<models::ConvNet>(backend(), twin::MakeTwins<models::ConvNet>(4), Images, ConvNetForward(),
                              {.train = false});
}

// Dropout2d, dropout and BatchNorm2d in train mode: outputs equal under identical seeds, running
// statistics follow eager's.
TEST_P(ModelsForward, ConvNetTrain) {
  CheckSweep<models::ConvNet>(backend(), twin::MakeTwins<models::ConvNet>(4), Images, ConvNetForward(),
                              {.train = true});
}

TEST_P(ModelsForward, ResNetEval) {
  CheckSweep<models::ResNet>(backend(), twin::MakeTwins<models::ResNet>(5, 10), Images, ResNetForward(),
                             {.train = false});
}

TEST_P(ModelsForward, ResNetTrain) {
  CheckSweep<models::ResNet>(backend(), twin::MakeTwins<models::ResNet>(5, 10), Images, ResNetForward(),
                             {.train = true});
}

// ---------------------------------------------------------------------------------------------

TEST_P(ModelsForward, LstmLmEval) {
  CheckSweep<models::LstmLm>(backend(), twin::MakeTwins<models::LstmLm>(6, 50, 16, 32, 2, 0.2), Tokens,
                             LstmForward(), {.train = false});
}

// Dropout on the embeddings, between the LSTM layers and on the LSTM output.
TEST_P(ModelsForward, LstmLmTrain) {
  CheckSweep<models::LstmLm>(backend(), twin::MakeTwins<models::LstmLm>(6, 50, 16, 32, 2, 0.2), Tokens,
                             LstmForward(), {.train = true});
}

// ---------------------------------------------------------------------------------------------

TEST_P(ModelsForward, VaeEval) {
  CheckSweep<models::Vae>(backend(), twin::MakeTwins<models::Vae>(7, 256, 64, 8), UnitImages, VaeForward(),
                          {.train = false});
}

// Reparameterization with randn_like: the same draws under the same seed.
TEST_P(ModelsForward, VaeTrain) {
  CheckSweep<models::Vae>(backend(), twin::MakeTwins<models::Vae>(7, 256, 64, 8), UnitImages, VaeForward(),
                          {.train = true});
}

// ---------------------------------------------------------------------------------------------

TEST_P(ModelsForward, DcganGeneratorEval) {
  CheckSweep<models::DcganGenerator>(backend(), twin::MakeTwins<models::DcganGenerator>(8, 16, 16), Noise,
                                     GeneratorForward(), {.train = false});
}

TEST_P(ModelsForward, DcganGeneratorTrain) {
  CheckSweep<models::DcganGenerator>(backend(), twin::MakeTwins<models::DcganGenerator>(8, 16, 16), Noise,
                                     GeneratorForward(), {.train = true});
}

TEST_P(ModelsForward, DcganDiscriminatorEval) {
  CheckSweep<models::DcganDiscriminator>(backend(), twin::MakeTwins<models::DcganDiscriminator>(9, 16, true), Images,
                                         DiscriminatorForward(), {.train = false});
}

TEST_P(ModelsForward, DcganDiscriminatorTrain) {
  CheckSweep<models::DcganDiscriminator>(backend(), twin::MakeTwins<models::DcganDiscriminator>(9, 16, true), Images,
                                         DiscriminatorForward(), {.train = true});
}

// ---------------------------------------------------------------------------------------------

TEST_P(ModelsForward, TransformerLmEval) {
  CheckSweep<models::TransformerLm>(backend(), twin::MakeTwins<models::TransformerLm>(10, 50, 32, 4, 2),
                                    TransformerInput, TransformerForward(), {.train = false});
}

// In train mode LibTorch's multi_head_attention_forward tests torch::equal(query, key) (which
// path: self-attention or not) after the previous layer's dropout drew random numbers; Warden
// documents that such a data-dependent read after a random op makes the function run eagerly.
TEST_P(ModelsForward, TransformerLmTrain) {
  CheckSweep<models::TransformerLm>(backend(), twin::MakeTwins<models::TransformerLm>(10, 50, 32, 4, 2),
                                    TransformerInput, TransformerForward(),
                                    {.train = true, .eager_reason = "aten::equal"});
}

// Embedding max_norm renormalizes rows of the weight in place inside forward (compared after each
// call); bidirectional two-layer GRU.
TEST_P(ModelsForward, GruTaggerEval) {
  CheckSweep<models::GruTagger>(backend(), twin::MakeTwins<models::GruTagger>(11, 20, 8, 16, 5), TagInput,
                                GruForward(), {.train = false});
}

TEST_P(ModelsForward, GruTaggerTrain) {
  CheckSweep<models::GruTagger>(backend(), twin::MakeTwins<models::GruTagger>(11, 20, 8, 16, 5), TagInput,
                                GruForward(), {.train = true});
}

// ---------------------------------------------------------------------------------------------
// Other shape policies and modes on the same programs.

// Every dim symbolic from the first compile (sizes 0 and 1 still specialize).
TEST_P(ModelsForward, MlpTrainDynamic) {
  CheckSweep<models::Mlp>(backend(), twin::MakeTwins<models::Mlp>(1, 32, 64, 10), MlpInput, MlpForward(),
                          {.train = true, .dynamic = warden::Dynamic::kDynamic});
}

TEST_P(ModelsForward, VaeTrainDynamic) {
  CheckSweep<models::Vae>(backend(), twin::MakeTwins<models::Vae>(7, 256, 64, 8), UnitImages, VaeForward(),
                          {.train = true, .dynamic = warden::Dynamic::kDynamic});
}

TEST_P(ModelsForward, LstmLmTrainDynamic) {
  CheckSweep<models::LstmLm>(backend(), twin::MakeTwins<models::LstmLm>(6, 50, 16, 32, 2, 0.2), Tokens,
                             LstmForward(), {.train = true, .dynamic = warden::Dynamic::kDynamic});
}

// The sequence length varies instead of the batch (batch 3): 1, 2, 5, 9 tokens.
TEST_P(ModelsForward, LstmLmSequenceLengthSweep) {
  CheckSweep<models::LstmLm>(
      backend(), twin::MakeTwins<models::LstmLm>(6, 50, 16, 32, 2, 0.2),
      [](int64_t seq) { return Args{torch::randint(0, 50, {seq, 3}, torch::kLong)}; }, LstmForward(),
      {.train = true, .batches = {1, 2, 5, 9}});
}

// Non-contiguous images (transposed H/W views, every other row of a taller image) mixed with
// contiguous ones of the same sizes. (Channels-last inputs, e.g. NHWC tensors permuted to NCHW,
// are not used: conv2d keeps their memory format and the model's view({x.size(0), -1}) then
// raises in eager LibTorch too.)
TEST_P(ModelsForward, ConvNetTrainNonContiguousInputs) {
  int64_t call = 0;
  CheckSweep<models::ConvNet>(
      backend(), twin::MakeTwins<models::ConvNet>(16), [&](int64_t batch) -> Args {
        switch (call++ % 3) {
          case 0: return {torch::randn({batch, 1, 16, 16}).transpose(2, 3)};
          case 1: return {torch::randn({batch, 1, 16, 16})};
          default: return {torch::randn({batch, 1, 32, 16}).slice(2, 0, 32, 2)};
        }
      },
      ConvNetForward(), {.train = true, .batches = {2, 2, 2, 5, 5, 5}});
}

// model->to(kDouble) between calls (a gradient-check program), then back to kFloat: the
// parameters keep their tensor objects (set_data), their dtype changes. Each call equals eager
// (or raises the same c10::Error when the input dtype does not match the parameters').
TEST_P(ModelsForward, MlpToDoubleAndBack) {
  auto [eager, model] = twin::MakeTwins<models::Mlp>(15, 32, 64, 10);
  twin::Subject subject([model = model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {model->forward(a[0].toTensor())};
  }, backend(), "to_double");
  const Tol tol = this->tol(twin::kForwardTol);
  struct Call {
    torch::Dtype model_dtype;
    torch::Dtype input_dtype;
  };
  for (const Call& c : {Call{torch::kFloat, torch::kFloat}, Call{torch::kDouble, torch::kDouble},
                        Call{torch::kDouble, torch::kFloat}, Call{torch::kFloat, torch::kFloat},
                        Call{torch::kDouble, torch::kDouble}, Call{torch::kFloat, torch::kDouble}}) {
    SCOPED_TRACE(std::string("model ") + c10::toString(c.model_dtype) + ", input " +
                 c10::toString(c.input_dtype));
    eager->to(c.model_dtype);
    model->to(c.model_dtype);
    const at::Tensor x = torch::randn({4, 32}).to(c.input_dtype);
    if (c.model_dtype != c.input_dtype) {
      EXPECT_THROW(eager->forward(x), c10::Error);
      EXPECT_THROW(subject({x}), c10::Error);
      continue;
    }
    const auto want = eager->forward(x);
    const auto got = subject({x});
    ASSERT_TRUE(twin::CloseAll(got, {want}, tol, "output")) << subject.events();
    eager->zero_grad();
    model->zero_grad();
    twin::ProbeLoss({want}).backward();
    twin::ProbeLoss(got).backward();
    EXPECT_TRUE(twin::SameGrads(*model, *eager, tol));
  }
}

TWIN_INSTANTIATE_BACKENDS(ModelsForward);

// ---------------------------------------------------------------------------------------------
// The harness itself: its comparisons see small differences, and seeding reproduces dropout.
TEST(TwinHarness, ComparisonsDetectDifferences) {
  const at::Tensor a = torch::randn({3, 4});
  EXPECT_TRUE(twin::Close(a, a.clone(), twin::kExact, "a"));
  EXPECT_FALSE(twin::Close(a + 1e-3, a, twin::kForwardTol, "a"));
  EXPECT_FALSE(twin::Close(a.to(torch::kDouble), a, twin::kForwardTol, "a"));
  EXPECT_FALSE(twin::Close(a.view({4, 3}), a, twin::kForwardTol, "a"));
  EXPECT_FALSE(twin::CloseAll({a.detach().requires_grad_()}, {a}, twin::kForwardTol, "a"));

  auto [eager, model] = twin::MakeTwins<models::Mlp>(1, 4, 8, 2);
  EXPECT_TRUE(twin::SameParameters(*model, *eager, twin::kExact));
  {
    torch::NoGradGuard no_grad;
    model->fc1->weight.add_(0.1);
  }
  EXPECT_FALSE(twin::SameParameters(*model, *eager, twin::kForwardTol));
  const at::Tensor x = torch::randn({2, 4});
  twin::ProbeLoss({eager->forward(x)}).backward();
  EXPECT_FALSE(twin::SameGrads(*model, *eager, twin::kForwardTol)) << "grads defined on one side only";
  twin::ProbeLoss({model->forward(x)}).backward();
  EXPECT_FALSE(twin::SameGrads(*model, *eager, twin::kExact));
}

TEST(TwinHarness, SeedingReproducesDropoutAndTwoEagerRunsAgree) {
  auto [a, b] = twin::MakeTwins<models::ConvNet>(3);
  a->train();
  b->train();
  const at::Tensor x = torch::randn({4, 1, 16, 16});
  const at::Tensor ya = Seeded(5, [&] { return a->forward(x); });
  const at::Tensor yb = Seeded(5, [&] { return b->forward(x); });
  EXPECT_TRUE(twin::Close(yb, ya, twin::kExact, "same seed"));
  EXPECT_TRUE(twin::SameBuffers(*b, *a, twin::kExact));
  const at::Tensor yc = Seeded(6, [&] { return b->forward(x); });
  EXPECT_FALSE(twin::Close(yc, ya, twin::kForwardTol, "other seed")) << "dropout did not draw";
}

}  // namespace
