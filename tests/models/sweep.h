// The batch sweep of the "real programs" suite (tests/models/) and the inputs and forward
// functions of each model of models.h, shared by models_forward_test and models_inference_test.
//
// CheckSweep runs a model's forward over a batch sweep (default 1, 2, 3, 8) twice, on the eager
// twin and through the side under test (twin::Subject), with the generator seeded identically
// before each side's call. Each call asserts: outputs equal eager's (values, dtype, sizes,
// requires_grad, is_inference); the module's buffers (BatchNorm running statistics) and
// parameters equal eager's after the call; after ProbeLoss(outputs).backward() on both sides, the
// .grad of every parameter equals eager's. After the second sweep: no compile happened in it
// (every call hit an entry of the first sweep) and no call ran eagerly (unless `eager_reason`
// allows it and explain() gives that reason).
#ifndef WARDEN_TESTS_MODELS_SWEEP_H_
#define WARDEN_TESTS_MODELS_SWEEP_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"
#include "tests/models/models.h"
#include "tests/models/twin.h"

namespace sweep {

using Args = std::vector<c10::IValue>;
using twin::Seeded;
using twin::Tol;

template <class Holder>
using Forward = std::function<std::vector<at::Tensor>(Holder&, const Args&)>;

struct Sweep {
  bool train = false;
  bool backward = true;
  std::vector<int64_t> batches = {1, 2, 3, 8};
  Tol tol = twin::kForwardTol;
  warden::Dynamic dynamic = warden::Dynamic::kAuto;
  bool inference_mode = false;  // both sides' calls under c10::InferenceMode (then no backward)
  bool no_grad = false;         // both sides' calls under NoGradGuard (then no backward)
  // Non-empty: Warden may run every call eagerly, if explain() gives this reason (a documented
  // limitation); the results are checked either way.
  std::string eager_reason;
};

// The sweep described at the top of this file. `make_args(batch)` draws the inputs (it may use
// the generator: it is called before the seeded calls).
template <class Holder>
void CheckSweep(const std::string& backend, std::pair<Holder, Holder> twins,
                const std::function<Args(int64_t)>& make_args, const Forward<Holder>& forward, const Sweep& sweep) {
  Holder eager = twins.first, model = twins.second;
  eager->train(sweep.train);
  model->train(sweep.train);
  const Tol tol = twin::TolFor(backend, sweep.tol);
  twin::Subject subject([model, forward](const Args& a) mutable { return forward(model, a); }, backend,
                        sweep.train ? "forward_train" : "forward_eval", sweep.dynamic);
  int64_t compiles_after_first = 0, hits_after_first = 0;
  for (int round = 0; round < 2; ++round) {
    for (int64_t batch : sweep.batches) {
      SCOPED_TRACE("round " + std::to_string(round) + ", batch " + std::to_string(batch));
      const Args args = make_args(batch);
      const uint64_t seed = 1000 + 100 * round + batch;
      std::optional<c10::InferenceMode> inference;
      if (sweep.inference_mode) inference.emplace();
      std::optional<torch::NoGradGuard> no_grad;
      if (sweep.no_grad) no_grad.emplace();
      const std::vector<at::Tensor> want = Seeded(seed, [&] { return forward(eager, args); });
      const std::vector<at::Tensor> got = Seeded(seed, [&] { return subject(args); });
      ASSERT_TRUE(twin::CloseAll(got, want, tol, "output")) << subject.events();
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].is_inference(), want[i].is_inference()) << "output " << i;
      }
      EXPECT_TRUE(twin::SameBuffers(*model, *eager, tol));
      if (sweep.backward && !sweep.inference_mode && !sweep.no_grad) {
        eager->zero_grad();
        model->zero_grad();
        twin::ProbeLoss(want).backward();
        twin::ProbeLoss(got).backward();
        EXPECT_TRUE(twin::SameGrads(*model, *eager, tol));
      }
      EXPECT_TRUE(twin::SameParameters(*model, *eager, tol)) << "parameters differ after a forward";
    }
    if (round == 0) {
      compiles_after_first = subject.stats().compiles;
      hits_after_first = subject.stats().cache_hits;
    }
  }
  if (subject.is_warden() && !sweep.eager_reason.empty() && subject.stats().eager_calls > 0) {
    const warden::Stats s = subject.stats();
    EXPECT_EQ(s.eager_calls, s.calls) << subject.events();
    EXPECT_THAT(subject.explain(), ::testing::HasSubstr("runs eagerly"));
    EXPECT_THAT(subject.explain(), ::testing::HasSubstr(sweep.eager_reason));
  } else if (subject.is_warden()) {
    const warden::Stats s = subject.stats();
    EXPECT_EQ(s.compiles, compiles_after_first) << "the second sweep recompiled:\n" << subject.events();
    EXPECT_EQ(s.cache_hits - hits_after_first, static_cast<int64_t>(sweep.batches.size()));
    EXPECT_EQ(s.eager_calls, 0) << subject.explain();
    EXPECT_GE(s.compiles, 1);
  }
  twin::MaybePrintExplain(subject);
}

inline Args Images(int64_t batch) { return {torch::randn({batch, 1, 16, 16})}; }

// Inputs and forward functions of each model.

inline Forward<models::Mlp> MlpForward() {
  return [](models::Mlp& m, const Args& a) -> std::vector<at::Tensor> { return {m->forward(a[0].toTensor())}; };
}
inline Args MlpInput(int64_t batch) { return {torch::randn({batch, 32})}; }
inline Forward<models::ConvNet> ConvNetForward() {
  return [](models::ConvNet& m, const Args& a) -> std::vector<at::Tensor> { return {m->forward(a[0].toTensor())}; };
}
inline Forward<models::ResNet> ResNetForward() {
  return [](models::ResNet& m, const Args& a) -> std::vector<at::Tensor> { return {m->forward(a[0].toTensor())}; };
}
inline Forward<models::LstmLm> LstmForward() {
  return [](models::LstmLm& m, const Args& a) -> std::vector<at::Tensor> {
    auto [logp, h, c] = m->forward(a[0].toTensor());
    return {logp, h, c};
  };
}
inline Args Tokens(int64_t batch) { return {torch::randint(0, 50, {6, batch}, torch::kLong)}; }
inline Forward<models::Vae> VaeForward() {
  return [](models::Vae& m, const Args& a) -> std::vector<at::Tensor> {
    auto [recon, mu, logvar] = m->forward(a[0].toTensor());
    return {recon, mu, logvar};
  };
}
inline Args UnitImages(int64_t batch) { return {torch::rand({batch, 1, 16, 16})}; }
inline Forward<models::DcganGenerator> GeneratorForward() {
  return [](models::DcganGenerator& m, const Args& a) -> std::vector<at::Tensor> {
    return {m->forward(a[0].toTensor())};
  };
}
inline Args Noise(int64_t batch) { return {torch::randn({batch, 16, 1, 1})}; }
inline Forward<models::DcganDiscriminator> DiscriminatorForward() {
  return [](models::DcganDiscriminator& m, const Args& a) -> std::vector<at::Tensor> {
    return {m->forward(a[0].toTensor())};
  };
}
inline Forward<models::TransformerLm> TransformerForward() {
  return [](models::TransformerLm& m, const Args& a) -> std::vector<at::Tensor> {
    return {m->forward(a[0].toTensor(), a[1].toTensor(), a[2].toTensor())};
  };
}
inline Args TransformerInput(int64_t batch) {
  auto [causal, padding] = models::CausalMasks(6, batch);
  return {torch::randint(0, 50, {6, batch}, torch::kLong), causal, padding};
}
inline Forward<models::GruTagger> GruForward() {
  return [](models::GruTagger& m, const Args& a) -> std::vector<at::Tensor> { return {m->forward(a[0].toTensor())}; };
}
inline Args TagInput(int64_t batch) { return {torch::randint(0, 20, {batch, 7}, torch::kLong)}; }

}  // namespace sweep

#endif  // WARDEN_TESTS_MODELS_SWEEP_H_
