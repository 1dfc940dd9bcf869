// Real programs, training: the loops of the pytorch/examples cpp programs on tiny synthetic data.
// The compiled function is "forward + loss" (it returns the loss first); loss.backward(),
// gradient clipping and optimizer.step() run outside it, on the compiled output, exactly as the
// eager twin does. The parameters are closure constants of the traced function and the optimizer
// updates them in place between calls.
//
// Every step asserts: the function's outputs (loss first) equal eager's; after backward (and
// clipping) the .grad of every parameter equals eager's; after the optimizer step every
// parameter and buffer equals eager's. At the end: the number of compiles is the number of
// distinct input signatures (in-place parameter updates must not recompile), every other call
// hit, none ran eagerly. Backends: eager (control), aten, cpp.
//
// Also: a torch::data DataLoader loop, gradient accumulation, freezing the backbone mid-training,
// sparse embedding gradients, FGSM input gradients, a checkpoint loaded between calls; and the
// cases Warden documents as running eagerly (torch::autograd::grad inside: WGAN-GP; a custom
// autograd Function inside: DANN), where the results are checked the same way.
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/codegen_replay.h"
#include "runtime/warden.h"
#include "tests/models/models.h"
#include "tests/models/twin.h"

namespace {

using Args = std::vector<c10::IValue>;
using twin::Seeded;
using twin::Tol;

template <class Holder>
using Forward = std::function<std::vector<at::Tensor>(Holder&, const Args&)>;

template <class Holder>
struct Loop {
  std::function<std::unique_ptr<torch::optim::Optimizer>(Holder&)> optimizer;
  std::function<Args(int step)> batch;
  Forward<Holder> loss;  // returns {loss, ...}
  int steps = 20;
  std::function<void(Holder&)> after_backward;                     // e.g. gradient clipping
  std::function<void(int step, Holder& eager, Holder& model)> after_step;  // e.g. an evaluation
  Tol tol = twin::kTrainTol;
  std::string name = "train_step";
};

// Runs the loop on both twins; returns the side under test for the caller's cache assertions.
template <class Holder>
twin::Subject RunLoop(const std::string& backend, std::pair<Holder, Holder> twins, const Loop<Holder>& loop) {
  Holder eager = twins.first, model = twins.second;
  eager->train();
  model->train();
  const Tol tol = twin::TolFor(backend, loop.tol);
  auto opt_eager = loop.optimizer(eager);
  auto opt_model = loop.optimizer(model);
  auto loss_fn = loop.loss;
  twin::Subject subject([model, loss_fn](const Args& a) mutable { return loss_fn(model, a); }, backend, loop.name);
  for (int step = 0; step < loop.steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Args args = loop.batch(step);
    const uint64_t seed = 500 + step;

    opt_eager->zero_grad();
    const std::vector<at::Tensor> want = Seeded(seed, [&] { return loss_fn(eager, args); });
    want.at(0).backward();
    if (loop.after_backward) loop.after_backward(eager);

    opt_model->zero_grad();
    const std::vector<at::Tensor> got = Seeded(seed, [&] { return subject(args); });
    EXPECT_TRUE(twin::CloseAll(got, want, tol, "outputs")) << subject.events();
    if (got.empty() || !got[0].requires_grad()) {
      ADD_FAILURE() << "the loss returned by the function under test does not require grad";
      return subject;
    }
    got[0].backward();
    if (loop.after_backward) loop.after_backward(model);
    EXPECT_TRUE(twin::SameGrads(*model, *eager, tol));

    opt_eager->step();
    opt_model->step();
    EXPECT_TRUE(twin::SameParameters(*model, *eager, tol));
    EXPECT_TRUE(twin::SameBuffers(*model, *eager, tol));
    if (loop.after_step) loop.after_step(step, eager, model);
    if (::testing::Test::HasFatalFailure()) return subject;
  }
  twin::MaybePrintExplain(subject);
  return subject;
}

// For functions that Warden documents as not traceable (gradients computed inside, custom
// autograd Functions): either they compile once and hit afterwards, or every call runs eagerly
// and explain() says why (`reason`). The results are checked by RunLoop either way.
void ExpectCompiledOnceOrEagerWithReason(const twin::Subject& subject, const std::string& reason) {
  if (!subject.is_warden()) return;
  const warden::Stats s = subject.stats();
  if (s.eager_calls == 0) {
    EXPECT_EQ(s.compiles, 1) << subject.events();
    EXPECT_EQ(s.cache_hits, s.calls - 1);
  } else {
    EXPECT_EQ(s.eager_calls, s.calls) << subject.explain();
    EXPECT_EQ(s.compiles, 0);
    EXPECT_THAT(subject.explain(), ::testing::HasSubstr("runs eagerly"));
    EXPECT_THAT(subject.explain(), ::testing::HasSubstr(reason));
  }
}

// Every call but the first `compiles` hit; nothing ran eagerly.
void ExpectCompiles(const twin::Subject& subject, int64_t compiles) {
  if (!subject.is_warden()) return;
  const warden::Stats s = subject.stats();
  EXPECT_EQ(s.compiles, compiles) << subject.events();
  EXPECT_EQ(s.cache_hits, s.calls - compiles);
  EXPECT_EQ(s.eager_calls, 0) << subject.explain();
}

// Note [Native kernels]: on backend cpp, every one of `hits` cache hits ran its `per_hit` pools on
// Warden's kernel (`native` calls in all); on the other backends none did.
void ExpectNativePools(const std::string& backend, int64_t native, int64_t hits, int per_hit) {
  if (backend == "cpp") {
    EXPECT_GT(hits, 0);
    EXPECT_GE(native, per_hit * hits);
  } else {
    EXPECT_EQ(native, 0);
  }
}

// A fixed synthetic classification dataset: `n` batches of (inputs, int64 labels).
struct Dataset {
  std::vector<at::Tensor> inputs, labels;
  Dataset(uint64_t seed, int n, const std::vector<int64_t>& batch_sizes, std::vector<int64_t> shape, int64_t classes) {
    torch::manual_seed(seed);
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> s = shape;
      s.insert(s.begin(), batch_sizes[i % batch_sizes.size()]);
      inputs.push_back(torch::randn(s));
      labels.push_back(torch::randint(0, classes, {s[0]}, torch::kLong));
    }
  }
  Args operator()(int step) const { return {inputs[step % inputs.size()], labels[step % labels.size()]}; }
};

class ModelsTraining : public twin::BackendTest {};

// ---------------------------------------------------------------------------------------------
// MLP, cross entropy, SGD with momentum, 25 steps over 4 batches of 8.
TEST_P(ModelsTraining, MlpSgdMomentum) {
  Dataset data(11, 4, {8}, {32}, 10);
  Loop<models::Mlp> loop;
  loop.steps = 25;
  loop.optimizer = [](models::Mlp& m) {
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  loop.batch = data;
  loop.loss = [](models::Mlp& m, const Args& a) -> std::vector<at::Tensor> {
    at::Tensor logits = m->forward(a[0].toTensor());
    return {torch::nn::functional::cross_entropy(logits, a[1].toTensor()), logits};
  };
  auto subject = RunLoop(backend(), twin::MakeTwins<models::Mlp>(12, 32, 64, 10), loop);
  ExpectCompiles(subject, 1);
}

// The same with Adam and BatchNorm1d, the last batch of the epoch short (8, 8, 8, 5).
TEST_P(ModelsTraining, MlpBatchNormAdamPartialLastBatch) {
  Dataset data(13, 4, {8, 8, 8, 5}, {32}, 10);
  Loop<models::Mlp> loop;
  loop.steps = 24;
  loop.optimizer = [](models::Mlp& m) {
    return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2));
  };
  loop.batch = data;
  loop.loss = [](models::Mlp& m, const Args& a) -> std::vector<at::Tensor> {
    at::Tensor logits = m->forward(a[0].toTensor());
    return {torch::nn::functional::cross_entropy(logits, a[1].toTensor())};
  };
  auto subject = RunLoop(backend(), twin::MakeTwins<models::Mlp>(14, 32, 64, 10, true), loop);
  // 8, then 5: at most one entry per batch size (automatic dynamic may also serve 5 from a
  // dynamic entry compiled at the first miss).
  if (subject.is_warden()) {
    const warden::Stats s = subject.stats();
    EXPECT_GE(s.compiles, 1);
    EXPECT_LE(s.compiles, 2) << subject.events();
    EXPECT_EQ(s.cache_hits, s.calls - s.compiles);
    EXPECT_EQ(s.eager_calls, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// The MNIST-style loop: ConvNet (BatchNorm2d, Dropout2d, dropout) in train mode, nll_loss on
// log_softmax, Adam; every 5 steps an evaluation pass (model->eval() under NoGradGuard, both
// outside a second compiled function), then back to train(). Each compiled function only ever
// sees one mode, so this is sound without watch().
TEST_P(ModelsTraining, ConvNetAdamWithEvaluation) {
  Dataset data(21, 4, {8, 8, 8, 3}, {1, 16, 16}, 10);
  const at::Tensor test_images = Seeded(22, [] { return torch::randn({6, 1, 16, 16}); });
  const at::Tensor test_labels = Seeded(23, [] { return torch::randint(0, 10, {6}, torch::kLong); });
  std::optional<twin::Subject> evaluate;
  int evaluations = 0;
  const Tol tol = this->tol(twin::kTrainTol);

  Loop<models::ConvNet> loop;
  loop.optimizer = [](models::ConvNet& m) {
    return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-3));
  };
  loop.batch = data;
  loop.loss = [](models::ConvNet& m, const Args& a) -> std::vector<at::Tensor> {
    at::Tensor logp = m->forward(a[0].toTensor());
    return {torch::nll_loss(logp, a[1].toTensor()), logp};
  };
  loop.after_step = [&](int step, models::ConvNet& eager, models::ConvNet& model) {
    if (step % 5 != 4) return;
    if (!evaluate) {
      evaluate.emplace(
          [model](const Args& a) mutable -> std::vector<at::Tensor> {
            at::Tensor logp = model->forward(a[0].toTensor());
            at::Tensor loss = torch::nll_loss(logp, a[1].toTensor(), {}, at::Reduction::Sum);
            at::Tensor correct = logp.argmax(1).eq(a[1].toTensor()).sum();
            return {loss, correct};
          },
          backend(), "evaluate");
    }
    ++evaluations;
    eager->eval();
    model->eval();
    {
      torch::NoGradGuard no_grad;
      at::Tensor logp = eager->forward(test_images);
      std::vector<at::Tensor> want = {torch::nll_loss(logp, test_labels, {}, at::Reduction::Sum),
                                      logp.argmax(1).eq(test_labels).sum()};
      std::vector<at::Tensor> got = (*evaluate)({test_images, test_labels});
      EXPECT_TRUE(twin::CloseAll(got, want, tol, "evaluation")) << evaluate->events();
    }
    EXPECT_TRUE(twin::SameBuffers(*model, *eager, tol)) << "evaluation changed the running statistics";
    eager->train();
    model->train();
  };
  const int64_t native_before = warden::codegen::NativeCallsOnThisThread();
  auto subject = RunLoop(backend(), twin::MakeTwins<models::ConvNet>(24), loop);
  // Note [Native kernels]: on backend cpp every hit's two max pools ran Warden's kernel, with its
  // own autograd node, and the parameters still followed eager's (RunLoop compares them).
  ExpectNativePools(backend(), warden::codegen::NativeCallsOnThisThread() - native_before, subject.stats().cache_hits,
                    2);
  // Batch sizes 8 and 3 (view({x.size(0), -1}) reads the batch size: two static entries).
  ExpectCompiles(subject, 2);
  ASSERT_EQ(evaluations, 4);
  ExpectCompiles(*evaluate, 1);
}

// LeNet-5 (average pooling, tanh), cross entropy, SGD, 24 steps over batches of 8 and 5; every 6
// steps an evaluation of the same compiled function under NoGradGuard (a second entry, no history).
TEST_P(ModelsTraining, LeNet5SgdWithNoGradEvaluation) {
  Dataset data(41, 4, {8, 8, 8, 5}, {1, 16, 16}, 10);
  const at::Tensor test_images = Seeded(42, [] { return torch::randn({6, 1, 16, 16}); });
  Loop<models::LeNet5> loop;
  loop.steps = 24;
  loop.optimizer = [](models::LeNet5& m) {
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1));
  };
  loop.batch = data;
  loop.loss = [](models::LeNet5& m, const Args& a) -> std::vector<at::Tensor> {
    at::Tensor logits = m->forward(a[0].toTensor());
    return {torch::nn::functional::cross_entropy(logits, a[1].toTensor()), logits};
  };
  std::optional<twin::Subject> evaluate;
  loop.after_step = [&](int step, models::LeNet5& eager, models::LeNet5& model) {
    if (step % 6 != 5) return;
    if (!evaluate) {
      evaluate.emplace([model](const Args& a) mutable -> std::vector<at::Tensor> { return {model->forward(a[0].toTensor())}; },
                       backend(), "evaluate");
    }
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(twin::CloseAll((*evaluate)({test_images}), {eager->forward(test_images)}, this->tol(twin::kForwardTol),
                               "evaluation"))
        << evaluate->events();
  };
  const int64_t native_before = warden::codegen::NativeCallsOnThisThread();
  auto subject = RunLoop(backend(), twin::MakeTwins<models::LeNet5>(43), loop);
  ExpectCompiles(subject, 2);  // batch sizes 8 and 5
  ASSERT_TRUE(evaluate.has_value());
  ExpectCompiles(*evaluate, 1);
  // Note [Native kernels]: on backend cpp both average pools of every hit ran Warden's kernel,
  // with its autograd node in training, and the parameters still followed eager's.
  ExpectNativePools(backend(), warden::codegen::NativeCallsOnThisThread() - native_before,
                    subject.stats().cache_hits + evaluate->stats().cache_hits, 2);
}

// ---------------------------------------------------------------------------------------------
// ResNet, cross entropy, SGD with momentum and weight decay.
TEST_P(ModelsTraining, ResNetSgdWeightDecay) {
  Dataset data(31, 3, {4}, {1, 16, 16}, 10);
  Loop<models::ResNet> loop;
  loop.optimizer = [](models::ResNet& m) {
    return std::make_unique<torch::optim::SGD>(
        m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4).nesterov(true));
  };
  loop.batch = data;
  loop.loss = [](models::ResNet& m, const Args& a) -> std::vector<at::Tensor> {
    at::Tensor logits = m->forward(a[0].toTensor());
    return {torch::nn::functional::cross_entropy(logits, a[1].toTensor()), logits};
  };
  auto subject = RunLoop(backend(), twin::MakeTwins<models::ResNet>(32, 10), loop);
  ExpectCompiles(subject, 1);
}

// ---------------------------------------------------------------------------------------------
// The word language model loop: a token stream cut into [seq, batch] chunks, the LSTM state of
// one chunk passed (detached) into the next (truncated BPTT), nll_loss, gradient clipping,
// Adam. The compiled function takes (tokens, targets, h0, c0) and returns (loss, h_n, c_n).
TEST_P(ModelsTraining, LstmLmTruncatedBpttAdamClipping) {
  const int64_t seq = 6, batch = 4, vocab = 50, layers = 2, hidden = 32;
  const at::Tensor stream = Seeded(41, [&] { return torch::randint(0, vocab, {20 * seq + 1, batch}, torch::kLong); });
  at::Tensor h_eager = torch::zeros({layers, batch, hidden}), c_eager = torch::zeros({layers, batch, hidden});
  at::Tensor h_model = h_eager.clone(), c_model = c_eager.clone();

  auto [eager, model] = twin::MakeTwins<models::LstmLm>(42, vocab, 16, hidden, layers, 0.2);
  eager->train();
  model->train();
  auto opt_eager = torch::optim::Adam(eager->parameters(), torch::optim::AdamOptions(3e-3));
  auto opt_model = torch::optim::Adam(model->parameters(), torch::optim::AdamOptions(3e-3));
  auto step_fn = [](models::LstmLm& m, const Args& a) -> std::vector<at::Tensor> {
    auto [logp, h, c] = m->forward(a[0].toTensor(), a[2].toTensor(), a[3].toTensor());
    return {torch::nll_loss(logp, a[1].toTensor().reshape({-1})), h, c};
  };
  twin::Subject subject([model = model, step_fn](const Args& a) mutable { return step_fn(model, a); }, backend(),
                        "lstm_step");
  const Tol tol = this->tol(twin::kTrainTol);
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor tokens = stream.slice(0, step * seq, (step + 1) * seq);
    const at::Tensor targets = stream.slice(0, step * seq + 1, (step + 1) * seq + 1);

    opt_eager.zero_grad();
    auto want = Seeded(600 + step, [&] { return step_fn(eager, {tokens, targets, h_eager, c_eager}); });
    want[0].backward();
    torch::nn::utils::clip_grad_norm_(eager->parameters(), 0.25);
    opt_eager.step();
    h_eager = want[1].detach();
    c_eager = want[2].detach();

    opt_model.zero_grad();
    auto got = Seeded(600 + step, [&] { return subject({tokens, targets, h_model, c_model}); });
    ASSERT_TRUE(twin::CloseAll(got, want, tol, "outputs")) << subject.events();
    got[0].backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 0.25);
    EXPECT_TRUE(twin::SameGrads(*model, *eager, tol));
    opt_model.step();
    h_model = got[1].detach();
    c_model = got[2].detach();
    EXPECT_TRUE(twin::SameParameters(*model, *eager, tol));
  }
  twin::MaybePrintExplain(subject);
  ExpectCompiles(subject, 1);
}

// ---------------------------------------------------------------------------------------------
// VAE: reparameterization with randn_like inside the compiled function, BCE + KL loss, Adam.
TEST_P(ModelsTraining, VaeAdam) {
  std::vector<at::Tensor> images;
  torch::manual_seed(51);
  for (int i = 0; i < 4; ++i) images.push_back(torch::rand({8, 1, 16, 16}));
  Loop<models::Vae> loop;
  loop.optimizer = [](models::Vae& m) {
    return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-3));
  };
  loop.batch = [&](int step) -> Args { return {images[step % images.size()]}; };
  loop.loss = [](models::Vae& m, const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor x = a[0].toTensor();
    auto [recon, mu, logvar] = m->forward(x);
    return {models::VaeLoss(recon, x, mu, logvar), recon};
  };
  auto subject = RunLoop(backend(), twin::MakeTwins<models::Vae>(52, 256, 64, 8), loop);
  ExpectCompiles(subject, 1);
}

// ---------------------------------------------------------------------------------------------
// The DCGAN loop: two compiled functions (generator, discriminator), two Adam optimizers, BCE
// losses computed outside. Per step the discriminator sees real images, fake.detach() and fake
// (which requires grad: a second entry), BatchNorm2d running statistics updated on each call.
TEST_P(ModelsTraining, DcganAdam) {
  const int64_t batch = 4, nz = 16;
  auto [g_eager, g_model] = twin::MakeTwins<models::DcganGenerator>(61, nz, 16);
  auto [d_eager, d_model] = twin::MakeTwins<models::DcganDiscriminator>(62, 16, true);
  for (auto* m : {&g_eager, &g_model}) (*m)->train();
  for (auto* m : {&d_eager, &d_model}) (*m)->train();
  const auto adam = torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.999));
  torch::optim::Adam g_opt_eager(g_eager->parameters(), adam), g_opt_model(g_model->parameters(), adam);
  torch::optim::Adam d_opt_eager(d_eager->parameters(), adam), d_opt_model(d_model->parameters(), adam);
  twin::Subject generator([g = g_model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {g->forward(a[0].toTensor())};
  }, backend(), "generator");
  twin::Subject discriminator([d = d_model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {d->forward(a[0].toTensor())};
  }, backend(), "discriminator");
  const Tol tol = this->tol(twin::kTrainTol);

  // One DCGAN step on one side; returns (d_loss, g_loss).
  auto gan_step = [&](models::DcganGenerator& g, models::DcganDiscriminator& d, torch::optim::Adam& g_opt,
                      torch::optim::Adam& d_opt, const std::function<at::Tensor(const at::Tensor&)>& G,
                      const std::function<at::Tensor(const at::Tensor&)>& D, const at::Tensor& real,
                      const at::Tensor& noise) -> std::vector<at::Tensor> {
    const at::Tensor ones = torch::ones({batch}), zeros = torch::zeros({batch});
    d->zero_grad();
    at::Tensor d_loss_real = torch::binary_cross_entropy(D(real), ones);
    d_loss_real.backward();
    at::Tensor fake = G(noise);
    at::Tensor d_loss_fake = torch::binary_cross_entropy(D(fake.detach()), zeros);
    d_loss_fake.backward();
    d_opt.step();
    g->zero_grad();
    at::Tensor g_loss = torch::binary_cross_entropy(D(fake), ones);
    g_loss.backward();
    g_opt.step();
    return {d_loss_real + d_loss_fake, g_loss, fake};
  };

  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor real = Seeded(700 + step, [&] { return torch::rand({batch, 1, 16, 16}) * 2 - 1; });
    const at::Tensor noise = torch::randn({batch, nz, 1, 1});
    auto want = gan_step(
        g_eager, d_eager, g_opt_eager, d_opt_eager, [&](const at::Tensor& z) { return g_eager->forward(z); },
        [&](const at::Tensor& x) { return d_eager->forward(x); }, real, noise);
    auto got = gan_step(
        g_model, d_model, g_opt_model, d_opt_model, [&](const at::Tensor& z) { return generator({z})[0]; },
        [&](const at::Tensor& x) { return discriminator({x})[0]; }, real, noise);
    ASSERT_TRUE(twin::CloseAll(got, want, tol, "d_loss, g_loss, fake"))
        << generator.events() << discriminator.events();
    EXPECT_TRUE(twin::SameParameters(*g_model, *g_eager, tol));
    EXPECT_TRUE(twin::SameParameters(*d_model, *d_eager, tol));
    EXPECT_TRUE(twin::SameBuffers(*g_model, *g_eager, tol));
    EXPECT_TRUE(twin::SameBuffers(*d_model, *d_eager, tol));
    EXPECT_TRUE(twin::SameGrads(*g_model, *g_eager, tol));
    EXPECT_TRUE(twin::SameGrads(*d_model, *d_eager, tol));
  }
  twin::MaybePrintExplain(generator);
  twin::MaybePrintExplain(discriminator);
  ExpectCompiles(generator, 1);
  // Inputs that do not require grad (real, fake.detach()) and one that does (fake).
  ExpectCompiles(discriminator, 2);
}

// ---------------------------------------------------------------------------------------------
// WGAN-GP critic step: the gradient penalty calls torch::autograd::grad (create_graph) INSIDE
// the compiled function, on an interpolate made to require grad inside it; the loss is
// backpropagated outside (double backward through the critic). Critic without BatchNorm.
TEST_P(ModelsTraining, WganGpCriticAutogradGradInside) {
  const int64_t batch = 4;
  auto [eager, model] = twin::MakeTwins<models::DcganDiscriminator>(71, 8, false);
  auto critic_loss = [](models::DcganDiscriminator& d, const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor real = a[0].toTensor(), fake = a[1].toTensor(), alpha = a[2].toTensor();
    at::Tensor interp = (alpha * real + (1 - alpha) * fake).detach().requires_grad_(true);
    at::Tensor score = d->forward(interp);
    at::Tensor grad = torch::autograd::grad({score.sum()}, {interp}, /*grad_outputs=*/{}, /*retain_graph=*/true,
                                            /*create_graph=*/true)[0];
    at::Tensor penalty = (grad.view({grad.size(0), -1}).norm(2, 1) - 1).pow(2).mean();
    at::Tensor loss = d->forward(fake).mean() - d->forward(real).mean() + 10 * penalty;
    return {loss, penalty};
  };
  Loop<models::DcganDiscriminator> loop;
  loop.optimizer = [](models::DcganDiscriminator& d) {
    return std::make_unique<torch::optim::Adam>(d->parameters(),
                                                torch::optim::AdamOptions(1e-3).betas(std::make_tuple(0.5, 0.9)));
  };
  loop.batch = [&](int step) -> Args {
    torch::manual_seed(800 + step);
    return {torch::rand({batch, 1, 16, 16}) * 2 - 1, torch::randn({batch, 1, 16, 16}),
            torch::rand({batch, 1, 1, 1})};
  };
  loop.loss = critic_loss;
  loop.name = "critic_step";
  auto subject = RunLoop(backend(), std::make_pair(eager, model), loop);
  ExpectCompiledOnceOrEagerWithReason(subject, "torch::autograd::grad");
}

// ---------------------------------------------------------------------------------------------
// DANN: a custom autograd Function (gradient reversal) inside the compiled function. The feature
// extractor's gradients depend on its backward (-lambda times the domain head's gradient).
TEST_P(ModelsTraining, DannCustomAutogradFunction) {
  Dataset data(81, 4, {8}, {32}, 10);
  const at::Tensor domains = Seeded(82, [] { return torch::randint(0, 2, {8}, torch::kLong); });
  Loop<models::Dann> loop;
  loop.optimizer = [](models::Dann& m) {
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  loop.batch = [&](int step) -> Args {
    Args a = data(step);
    a.push_back(domains);
    return a;
  };
  loop.loss = [](models::Dann& m, const Args& a) -> std::vector<at::Tensor> {
    auto [label_logits, domain_logits] = m->forward(a[0].toTensor(), /*lambda=*/0.7);
    at::Tensor label_loss = torch::nn::functional::cross_entropy(label_logits, a[1].toTensor());
    at::Tensor domain_loss = torch::nn::functional::cross_entropy(domain_logits, a[2].toTensor());
    return {label_loss + domain_loss, label_loss, domain_loss};
  };
  loop.name = "dann_step";
  auto subject = RunLoop(backend(), twin::MakeTwins<models::Dann>(83, 32, 32, 10, 2), loop);
  ExpectCompiledOnceOrEagerWithReason(subject, "GradientReversal");
}

// ---------------------------------------------------------------------------------------------
// An inference helper with NoGradGuard INSIDE the compiled function, called between training
// steps (grad mode enabled outside): its outputs must not require grad and must follow the
// parameters the optimizer updates. The model stays in train mode (no dropout or batchnorm).
TEST_P(ModelsTraining, PredictWithNoGradGuardInsideBetweenSteps) {
  Dataset data(91, 4, {8}, {32}, 10);
  const at::Tensor probe = Seeded(92, [] { return torch::randn({5, 32}); });
  std::optional<twin::Subject> predict;
  const Tol tol = this->tol(twin::kTrainTol);
  Loop<models::Mlp> loop;
  loop.optimizer = [](models::Mlp& m) {
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1));
  };
  loop.batch = data;
  loop.loss = [](models::Mlp& m, const Args& a) -> std::vector<at::Tensor> {
    return {torch::nn::functional::cross_entropy(m->forward(a[0].toTensor()), a[1].toTensor())};
  };
  auto predict_fn = [](models::Mlp& m, const Args& a) -> std::vector<at::Tensor> {
    torch::NoGradGuard no_grad;
    at::Tensor probs = torch::softmax(m->forward(a[0].toTensor()), 1);
    return {probs, probs.argmax(1)};
  };
  loop.after_step = [&](int step, models::Mlp& eager, models::Mlp& model) {
    if (!predict) {
      predict.emplace([model, predict_fn](const Args& a) mutable { return predict_fn(model, a); }, backend(),
                      "predict");
    }
    const auto want = predict_fn(eager, {probe});
    const auto got = (*predict)({probe});
    ASSERT_FALSE(want[0].requires_grad());
    EXPECT_TRUE(twin::CloseAll(got, want, tol, "predict")) << predict->events();
  };
  auto subject = RunLoop(backend(), twin::MakeTwins<models::Mlp>(93, 32, 64, 10), loop);
  ExpectCompiles(subject, 1);
  ExpectCompiles(*predict, 1);
}

// ---------------------------------------------------------------------------------------------
// The loop of the C++ frontend tutorial: a custom torch::data Dataset, Stack<> collation, a
// sequential DataLoader (36 examples in batches of 8: the last batch of each epoch has 4),
// 5 epochs = 25 steps, SGD.
struct SyntheticDataset : torch::data::datasets::Dataset<SyntheticDataset> {
  at::Tensor x, y;
  SyntheticDataset() {
    torch::manual_seed(15);
    x = torch::randn({36, 32});
    y = torch::randint(0, 10, {36}, torch::kLong);
  }
  torch::data::Example<> get(size_t i) override { return {x[i], y[i]}; }
  torch::optional<size_t> size() const override { return 36; }
};

TEST_P(ModelsTraining, MlpDataLoaderEpochs) {
  auto dataset = SyntheticDataset().map(torch::data::transforms::Stack<>());
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(dataset), torch::data::DataLoaderOptions().batch_size(8));
  std::vector<Args> batches;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (auto& batch : *loader) batches.push_back({batch.data, batch.target});
  }
  ASSERT_EQ(batches.size(), 25u);
  Loop<models::Mlp> loop;
  loop.steps = 25;
  loop.optimizer = [](models::Mlp& m) {
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05));
  };
  loop.batch = [&](int step) { return batches[step]; };
  loop.loss = [](models::Mlp& m, const Args& a) -> std::vector<at::Tensor> {
    return {torch::nn::functional::cross_entropy(m->forward(a[0].toTensor()), a[1].toTensor())};
  };
  auto subject = RunLoop(backend(), twin::MakeTwins<models::Mlp>(16, 32, 64, 10), loop);
  if (subject.is_warden()) {
    const warden::Stats s = subject.stats();
    EXPECT_LE(s.compiles, 2) << "batches of 8 and 4\n" << subject.events();
    EXPECT_EQ(s.cache_hits, s.calls - s.compiles);
    EXPECT_EQ(s.eager_calls, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Adversarial examples (the FGSM tutorial): the input requires grad, the loss of the compiled
// forward is backpropagated to it, x + eps * sign(x.grad) goes through the same function again
// (an input that does not require grad: a second entry). The model is in eval mode.
TEST_P(ModelsTraining, ConvNetFgsmInputGradients) {
  auto [eager, model] = twin::MakeTwins<models::ConvNet>(37);
  eager->eval();
  model->eval();
  twin::Subject subject([model = model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {model->forward(a[0].toTensor())};
  }, backend(), "fgsm");
  const Tol tol = this->tol(twin::kForwardTol);
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE("example batch " + std::to_string(i));
    const at::Tensor images = torch::randn({4, 1, 16, 16});
    const at::Tensor labels = torch::randint(0, 10, {4}, torch::kLong);
    at::Tensor xe = images.clone().requires_grad_(true), xm = images.clone().requires_grad_(true);
    const at::Tensor want = eager->forward(xe);
    const at::Tensor got = subject({xm})[0];
    ASSERT_TRUE(twin::Close(got, want, tol, "clean output")) << subject.events();
    torch::nll_loss(want, labels).backward();
    torch::nll_loss(got, labels).backward();
    ASSERT_TRUE(twin::Close(xm.grad(), xe.grad(), tol, "input gradient"));
    EXPECT_TRUE(twin::SameGrads(*model, *eager, tol));
    eager->zero_grad();
    model->zero_grad();
    const at::Tensor adversarial = (images + 0.1 * xe.grad().sign()).clamp(-3, 3).detach();
    EXPECT_TRUE(twin::Close(subject({adversarial})[0], eager->forward(adversarial), tol, "adversarial output"));
  }
  ExpectCompiles(subject, 2);
}

// ---------------------------------------------------------------------------------------------
// GAN inversion: find the latent that makes a trained (eval-mode) DCGAN generator produce a target
// image, by gradient descent on z. The gradient is taken INSIDE the compiled function, through
// transposed convolutions, BatchNorm (eval) and tanh: captured into the graph (Note [Captured
// gradients]), so every step after the first is one compiled call. 20 steps; the latents must
// follow the eager twin's.
TEST_P(ModelsTraining, DcganLatentInversionGradientInside) {
  auto [eager, model] = twin::MakeTwins<models::DcganGenerator>(91, 8, 8);
  eager->eval();
  model->eval();
  auto step_of = [](models::DcganGenerator& g) {
    return [&g](const Args& a) -> std::vector<at::Tensor> {
      const at::Tensor z = a[0].toTensor().detach().requires_grad_(true);
      const at::Tensor loss = (g->forward(z) - a[1].toTensor()).pow(2).mean();
      return {loss.detach(), torch::autograd::grad({loss}, {z})[0]};
    };
  };
  twin::Subject subject(step_of(model), backend(), "invert");
  auto reference = step_of(eager);
  torch::manual_seed(92);
  const at::Tensor target = torch::tanh(torch::randn({2, 1, 16, 16}));
  at::Tensor z = torch::randn({2, 8, 1, 1}), ze = z.clone();
  const Tol tol = this->tol(twin::kTrainTol);
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<at::Tensor> got = subject({z, target});
    const std::vector<at::Tensor> want = reference({ze, target});
    ASSERT_TRUE(twin::Close(got[0], want[0], tol, "loss")) << subject.events();
    ASSERT_TRUE(twin::Close(got[1], want[1], tol, "dloss/dz")) << subject.events();
    z = z - 20.0 * got[1];
    ze = ze - 20.0 * want[1];
  }
  ASSERT_TRUE(twin::Close(z, ze, tol, "latent after 20 steps"));
  ExpectCompiles(subject, 1);
  if (subject.is_warden()) {
    EXPECT_THAT(subject.explain(), ::testing::HasSubstr("gradient captured")) << subject.explain();
  }
}

// ---------------------------------------------------------------------------------------------
// fastText-style classifier: sparse embedding gradients (compared densely), SGD, 20 steps.
TEST_P(ModelsTraining, FastTextSparseEmbeddingSgd) {
  std::vector<Args> batches;
  torch::manual_seed(38);
  for (int i = 0; i < 4; ++i) {
    batches.push_back({torch::randint(0, 100, {8, 12}, torch::kLong), torch::randint(0, 4, {8}, torch::kLong)});
  }
  Loop<models::FastText> loop;
  loop.optimizer = [](models::FastText& m) {
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.5));
  };
  loop.batch = [&](int step) { return batches[step % batches.size()]; };
  loop.loss = [](models::FastText& m, const Args& a) -> std::vector<at::Tensor> {
    return {torch::nn::functional::cross_entropy(m->forward(a[0].toTensor()), a[1].toTensor())};
  };
  loop.after_backward = [](models::FastText& m) {
    ASSERT_TRUE(m->embedding->weight.grad().is_sparse()) << "Embedding(sparse=true) must get a sparse gradient";
  };
  auto subject = RunLoop(backend(), twin::MakeTwins<models::FastText>(39, 100, 16, 4), loop);
  ExpectCompiles(subject, 1);
}

// ---------------------------------------------------------------------------------------------
// Gradient accumulation: 4 micro-batches of 2 per optimizer step (backward after each compiled
// call, one step per 4 calls), 20 steps.
TEST_P(ModelsTraining, ConvNetGradientAccumulation) {
  Dataset data(33, 8, {2}, {1, 16, 16}, 10);
  auto [eager, model] = twin::MakeTwins<models::ConvNet>(34);
  eager->train();
  model->train();
  torch::optim::Adam opt_eager(eager->parameters(), torch::optim::AdamOptions(1e-3));
  torch::optim::Adam opt_model(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto loss_fn = [](models::ConvNet& m, const Args& a) -> std::vector<at::Tensor> {
    return {torch::nll_loss(m->forward(a[0].toTensor()), a[1].toTensor()) / 4};
  };
  twin::Subject subject([model = model, loss_fn](const Args& a) mutable { return loss_fn(model, a); }, backend(),
                        "micro_step");
  const Tol tol = this->tol(twin::kTrainTol);
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    opt_eager.zero_grad();
    opt_model.zero_grad();
    for (int micro = 0; micro < 4; ++micro) {
      const Args args = data(step * 4 + micro);
      const auto want = Seeded(step * 10 + micro, [&] { return loss_fn(eager, args); });
      const auto got = Seeded(step * 10 + micro, [&] { return subject(args); });
      ASSERT_TRUE(twin::CloseAll(got, want, tol, "micro-batch loss")) << subject.events();
      want[0].backward();
      got[0].backward();
    }
    EXPECT_TRUE(twin::SameGrads(*model, *eager, tol));
    opt_eager.step();
    opt_model.step();
    EXPECT_TRUE(twin::SameParameters(*model, *eager, tol));
    EXPECT_TRUE(twin::SameBuffers(*model, *eager, tol));
  }
  ExpectCompiles(subject, 1);
}

// Fine-tuning: after 10 steps everything but the classifier is frozen (requires_grad_(false) on
// the parameters, the optimizer keeps all of them); 10 more steps. Frozen parameters get no
// gradient on either side; the model's outputs stop requiring grad only through the head.
TEST_P(ModelsTraining, ResNetFreezeBackboneMidTraining) {
  Dataset data(35, 3, {4}, {1, 16, 16}, 10);
  Loop<models::ResNet> loop;
  loop.optimizer = [](models::ResNet& m) {
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05));
  };
  loop.batch = data;
  loop.loss = [](models::ResNet& m, const Args& a) -> std::vector<at::Tensor> {
    at::Tensor logits = m->forward(a[0].toTensor());
    return {torch::nn::functional::cross_entropy(logits, a[1].toTensor()), logits};
  };
  loop.after_step = [](int step, models::ResNet& eager, models::ResNet& model) {
    if (step != 9) return;
    for (auto* m : {&eager, &model}) {
      for (auto& p : (*m)->named_parameters()) {
        if (p.key().rfind("fc.", 0) != 0) p.value().requires_grad_(false);
      }
    }
  };
  auto subject = RunLoop(backend(), twin::MakeTwins<models::ResNet>(36, 10), loop);
  if (subject.is_warden()) {
    const warden::Stats s = subject.stats();
    EXPECT_GE(s.compiles, 1);
    EXPECT_LE(s.compiles, 2) << "at most one entry per requires_grad state of the parameters\n" << subject.events();
    EXPECT_EQ(s.cache_hits, s.calls - s.compiles);
    EXPECT_EQ(s.eager_calls, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Resuming from a checkpoint: torch::load into the model between calls of its compiled forward
// (LibTorch writes the loaded values into the existing parameter tensors). The next call must
// use the loaded weights.
TEST_P(ModelsTraining, CheckpointLoadBetweenCalls) {
  auto [eager, model] = twin::MakeTwins<models::ResNet>(95, 10);
  eager->eval();
  model->eval();
  twin::Subject subject([model = model](const Args& a) mutable -> std::vector<at::Tensor> {
    return {model->forward(a[0].toTensor())};
  }, backend(), "resumed");
  const Tol tol = this->tol(twin::kForwardTol);
  const at::Tensor x = Seeded(96, [] { return torch::randn({3, 1, 16, 16}); });
  ASSERT_TRUE(twin::Close(subject({x})[0], eager->forward(x), tol, "before loading"));

  // Train the eager twin alone for a few steps (new weights and running statistics), save it.
  eager->train();
  torch::optim::SGD opt(eager->parameters(), torch::optim::SGDOptions(0.1));
  Dataset data(97, 3, {4}, {1, 16, 16}, 10);
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(eager->forward(data.inputs[step]), data.labels[step]).backward();
    opt.step();
  }
  eager->eval();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/resnet_" + backend() + ".pt";
  torch::save(eager, path);
  torch::load(model, path);
  model->eval();
  ASSERT_TRUE(twin::SameParameters(*model, *eager, twin::kExact)) << "torch::load did not restore the weights";
  ASSERT_TRUE(twin::SameBuffers(*model, *eager, twin::kExact));

  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(twin::Close(subject({x})[0], eager->forward(x), tol, "after loading")) << subject.events();
  }
  if (subject.is_warden()) {
    EXPECT_EQ(subject.stats().eager_calls, 0);
  }
}

TWIN_INSTANTIATE_BACKENDS(ModelsTraining);

}  // namespace
