// Small LibTorch models in the style of the PyTorch C++ frontend tutorials and the
// pytorch/examples cpp programs, written for Warden's "real programs" suite (tests/models/).
// Every model is a TORCH_MODULE holder around an Impl, registers its submodules by name, and
// uses nothing but the public C++ frontend: what a user would hand to warden::compile.
// Sizes are tiny (images 1x16x16, hidden sizes <= 64) so that the suite stays fast.
#ifndef WARDEN_TESTS_MODELS_MODELS_H_
#define WARDEN_TESTS_MODELS_MODELS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>

#include <torch/torch.h>

namespace models {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

// ---------------------------------------------------------------------------------------------
// MLP: Linear + ReLU stack, optionally with BatchNorm1d after the hidden layers (then batch size 1
// in train mode is an error in eager LibTorch: "Expected more than 1 value per channel").
struct MlpImpl : nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out, bool batchnorm = false)
      : fc1(register_module("fc1", nn::Linear(in, hidden))),
        fc2(register_module("fc2", nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", nn::Linear(hidden, out))),
        use_bn(batchnorm) {
    if (use_bn) {
      bn1 = register_module("bn1", nn::BatchNorm1d(hidden));
      bn2 = register_module("bn2", nn::BatchNorm1d(hidden));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = fc1->forward(x);
    if (use_bn) x = bn1->forward(x);
    x = torch::relu(x);
    x = fc2->forward(x);
    if (use_bn) x = bn2->forward(x);
    x = torch::relu(x);
    return fc3->forward(x);
  }

  nn::Linear fc1, fc2, fc3;
  nn::BatchNorm1d bn1{nullptr}, bn2{nullptr};
  bool use_bn;
};
TORCH_MODULE(Mlp);

// ---------------------------------------------------------------------------------------------
// CNN for 1x16x16 images in the style of the MNIST example: conv -> batchnorm -> relu -> pool,
// conv -> dropout2d -> pool, flatten with view({x.size(0), -1}), fc -> relu -> dropout -> fc,
// log_softmax.
struct ConvNetImpl : nn::Module {
  ConvNetImpl()
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 8, 3)))),
        bn1(register_module("bn1", nn::BatchNorm2d(8))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(8, 16, 3)))),
        conv2_drop(register_module("conv2_drop", nn::Dropout2d(0.25))),
        fc1(register_module("fc1", nn::Linear(16 * 2 * 2, 32))),
        fc2(register_module("fc2", nn::Linear(32, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1->forward(conv1->forward(x))), 2);         // 8x7x7
    x = torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2);              // 16x2x2
    x = torch::relu(x);
    x = x.view({x.size(0), -1});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, /*p=*/0.5, /*train=*/is_training());
    return torch::log_softmax(fc2->forward(x), /*dim=*/1);
  }

  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::Dropout2d conv2_drop;
  nn::Linear fc1, fc2;
};
TORCH_MODULE(ConvNet);

// ---------------------------------------------------------------------------------------------
// LeNet-5 as LeCun et al. drew it (the classic tutorials' variant): 5x5 convolutions, tanh and
// 2x2 average pooling, 16x16 grayscale input here: conv(1->6, 5, padding 2) -> tanh -> avg_pool2d
// -> conv(6->16, 5) -> tanh -> avg_pool2d -> flatten(1) -> fc 64 -> 32 -> 10.
struct LeNet5Impl : nn::Module {
  LeNet5Impl()
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 6, 5).padding(2)))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(6, 16, 5)))),
        fc1(register_module("fc1", nn::Linear(16 * 2 * 2, 32))),
        fc2(register_module("fc2", nn::Linear(32, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::avg_pool2d(torch::tanh(conv1->forward(x)), 2);  // 6x8x8
    x = torch::avg_pool2d(torch::tanh(conv2->forward(x)), 2);  // 16x2x2
    x = torch::flatten(x, 1);
    return fc2->forward(torch::tanh(fc1->forward(x)));
  }

  nn::Conv2d conv1, conv2;
  nn::Linear fc1, fc2;
};
TORCH_MODULE(LeNet5);

// ---------------------------------------------------------------------------------------------
// ResNet basic block: conv3x3-bn-relu-conv3x3-bn plus the shortcut, which is a 1x1 conv + bn
// (the "downsample" path) when the stride or the channel count changes.
struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride = 1)
      : conv1(register_module(
            "conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module(
            "conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).stride(1).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      downsample = register_module(
          "downsample",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                         nn::BatchNorm2d(out)));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = x;
    torch::Tensor out = torch::relu(bn1->forward(conv1->forward(x)));
    out = bn2->forward(conv2->forward(out));
    if (!downsample.is_empty()) identity = downsample->forward(x);
    out += identity;
    return torch::relu(out);
  }

  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

// A two-stage ResNet for 1x16x16 images: stem, a plain block, a downsampling block, global
// average pooling, classifier.
struct ResNetImpl : nn::Module {
  explicit ResNetImpl(int64_t classes = 10)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(8))),
        layer1(register_module("layer1", BasicBlock(8, 8, 1))),
        layer2(register_module("layer2", BasicBlock(8, 16, 2))),
        fc(register_module("fc", nn::Linear(16, classes))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1->forward(conv1->forward(x)));  // 8x16x16
    x = layer1->forward(x);                             // 8x16x16
    x = layer2->forward(x);                             // 16x8x8
    x = torch::adaptive_avg_pool2d(x, {1, 1});
    x = torch::flatten(x, 1);
    return fc->forward(x);
  }

  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  BasicBlock layer1, layer2;
  nn::Linear fc;
};
TORCH_MODULE(ResNet);

// ---------------------------------------------------------------------------------------------
// Word-level LSTM language model (the word_language_model example): embedding, dropout, a
// two-layer LSTM (dropout between layers), dropout, decoder, log_softmax over the vocabulary.
// Input: int64 token ids [seq_len, batch]; output: log-probabilities [seq_len * batch, vocab].
struct LstmLmImpl : nn::Module {
  LstmLmImpl(int64_t vocab, int64_t embed, int64_t hidden, int64_t layers = 2, double dropout = 0.2)
      : encoder(register_module("encoder", nn::Embedding(vocab, embed))),
        drop(register_module("drop", nn::Dropout(dropout))),
        rnn(register_module("rnn", nn::LSTM(nn::LSTMOptions(embed, hidden).num_layers(layers).dropout(dropout)))),
        decoder(register_module("decoder", nn::Linear(hidden, vocab))),
        vocab_size(vocab) {}

  // Returns (log_probs, h_n, c_n). Without h0/c0 the LSTM starts from zeros; a training loop
  // over a long sequence passes the (detached) state of the previous batch (truncated BPTT).
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(torch::Tensor tokens, torch::Tensor h0 = {},
                                                                  torch::Tensor c0 = {}) {
    torch::Tensor emb = drop->forward(encoder->forward(tokens));
    auto [output, state] = h0.defined() ? rnn->forward(emb, std::make_tuple(h0, c0)) : rnn->forward(emb);
    output = drop->forward(output);
    torch::Tensor logits = decoder->forward(output.view({-1, output.size(2)}));
    return {torch::log_softmax(logits, /*dim=*/1), std::get<0>(state), std::get<1>(state)};
  }

  nn::Embedding encoder;
  nn::Dropout drop;
  nn::LSTM rnn;
  nn::Linear decoder;
  int64_t vocab_size;
};
TORCH_MODULE(LstmLm);

// ---------------------------------------------------------------------------------------------
// Variational autoencoder (the VAE example) on flattened 16x16 images: encoder to (mu, logvar),
// reparameterization z = mu + eps * std with eps = randn_like(std) in training (z = mu in eval),
// decoder with a sigmoid output.
struct VaeImpl : nn::Module {
  VaeImpl(int64_t in = 256, int64_t hidden = 64, int64_t latent = 8)
      : fc1(register_module("fc1", nn::Linear(in, hidden))),
        fc21(register_module("fc21", nn::Linear(hidden, latent))),
        fc22(register_module("fc22", nn::Linear(hidden, latent))),
        fc3(register_module("fc3", nn::Linear(latent, hidden))),
        fc4(register_module("fc4", nn::Linear(hidden, in))),
        in_features(in) {}

  std::pair<torch::Tensor, torch::Tensor> encode(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(fc1->forward(x));
    return {fc21->forward(h), fc22->forward(h)};
  }

  torch::Tensor reparameterize(const torch::Tensor& mu, const torch::Tensor& logvar) {
    if (!is_training()) return mu;
    torch::Tensor std = torch::exp(0.5 * logvar);
    torch::Tensor eps = torch::randn_like(std);
    return mu + eps * std;
  }

  torch::Tensor decode(const torch::Tensor& z) {
    return torch::sigmoid(fc4->forward(torch::relu(fc3->forward(z))));
  }

  // Returns (reconstruction, mu, logvar).
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    auto [mu, logvar] = encode(x.view({-1, in_features}));
    torch::Tensor z = reparameterize(mu, logvar);
    return {decode(z), mu, logvar};
  }

  nn::Linear fc1, fc21, fc22, fc3, fc4;
  int64_t in_features;
};
TORCH_MODULE(Vae);

// Reconstruction + KL divergence losses summed over all elements (as in the VAE example).
inline torch::Tensor VaeLoss(const torch::Tensor& recon, const torch::Tensor& x, const torch::Tensor& mu,
                             const torch::Tensor& logvar) {
  torch::Tensor bce = torch::binary_cross_entropy(recon, x.view({-1, recon.size(1)}), /*weight=*/{},
                                                  at::Reduction::Sum);
  torch::Tensor kld = -0.5 * torch::sum(1 + logvar - mu.pow(2) - logvar.exp());
  return bce + kld;
}

// ---------------------------------------------------------------------------------------------
// DCGAN (the dcgan example) scaled to 1x16x16 images.
// Generator: noise [N, nz, 1, 1] -> ConvTranspose2d/BatchNorm2d/ReLU x2 -> ConvTranspose2d -> Tanh.
struct DcganGeneratorImpl : nn::Module {
  explicit DcganGeneratorImpl(int64_t nz = 16, int64_t ngf = 16)
      : conv1(register_module("conv1", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(nz, ngf * 2, 4).bias(false)))),
        batch_norm1(register_module("batch_norm1", nn::BatchNorm2d(ngf * 2))),
        conv2(register_module("conv2", nn::ConvTranspose2d(
                                           nn::ConvTranspose2dOptions(ngf * 2, ngf, 4).stride(2).padding(1).bias(false)))),
        batch_norm2(register_module("batch_norm2", nn::BatchNorm2d(ngf))),
        conv3(register_module("conv3", nn::ConvTranspose2d(
                                           nn::ConvTranspose2dOptions(ngf, 1, 4).stride(2).padding(1).bias(false)))) {}

  torch::Tensor forward(torch::Tensor z) {
    torch::Tensor x = torch::relu(batch_norm1->forward(conv1->forward(z)));  // 4x4
    x = torch::relu(batch_norm2->forward(conv2->forward(x)));                // 8x8
    return torch::tanh(conv3->forward(x));                                   // 16x16
  }

  nn::ConvTranspose2d conv1;
  nn::BatchNorm2d batch_norm1;
  nn::ConvTranspose2d conv2;
  nn::BatchNorm2d batch_norm2;
  nn::ConvTranspose2d conv3;
};
TORCH_MODULE(DcganGenerator);

// Discriminator: image [N, 1, 16, 16] -> probability [N] that it is real. With batchnorm = false
// (WGAN-GP style critics) the middle BatchNorm2d is left out and the sigmoid too (raw scores).
struct DcganDiscriminatorImpl : nn::Module {
  explicit DcganDiscriminatorImpl(int64_t ndf = 16, bool batchnorm = true)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, ndf, 4).stride(2).padding(1).bias(false)))),
        conv2(register_module("conv2",
                              nn::Conv2d(nn::Conv2dOptions(ndf, ndf * 2, 4).stride(2).padding(1).bias(false)))),
        conv3(register_module("conv3", nn::Conv2d(nn::Conv2dOptions(ndf * 2, 1, 4).stride(1).padding(0).bias(false)))),
        use_bn(batchnorm) {
    if (use_bn) batch_norm = register_module("batch_norm", nn::BatchNorm2d(ndf * 2));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::leaky_relu(conv1->forward(x), 0.2);  // 8x8
    x = conv2->forward(x);                          // 4x4
    if (use_bn) x = batch_norm->forward(x);
    x = torch::leaky_relu(x, 0.2);
    x = conv3->forward(x);  // 1x1
    if (use_bn) x = torch::sigmoid(x);
    return x.view(-1);
  }

  nn::Conv2d conv1, conv2, conv3;
  nn::BatchNorm2d batch_norm{nullptr};
  bool use_bn;
};
TORCH_MODULE(DcganDiscriminator);

// ---------------------------------------------------------------------------------------------
// Transformer language model (the word_language_model example's TransformerModel): embedding
// scaled by sqrt(d_model), a two-layer nn::TransformerEncoder (multi-head self-attention, dropout,
// layer norm), decoder, log_softmax. Input: tokens [seq, batch] (int64), an additive causal mask
// [seq, seq] (-inf above the diagonal) and a key padding mask [batch, seq] (bool, true = padding).
struct TransformerLmImpl : nn::Module {
  TransformerLmImpl(int64_t vocab = 50, int64_t d_model = 32, int64_t heads = 4, int64_t layers = 2)
      : encoder(register_module("encoder", nn::Embedding(vocab, d_model))),
        transformer(register_module(
            "transformer",
            nn::TransformerEncoder(nn::TransformerEncoderOptions(
                nn::TransformerEncoderLayerOptions(d_model, heads).dim_feedforward(64).dropout(0.1), layers)))),
        decoder(register_module("decoder", nn::Linear(d_model, vocab))),
        scale(std::sqrt(static_cast<double>(d_model))) {}

  torch::Tensor forward(torch::Tensor tokens, torch::Tensor causal_mask, torch::Tensor padding_mask) {
    torch::Tensor x = encoder->forward(tokens) * scale;
    x = transformer->forward(x, causal_mask, padding_mask);
    return torch::log_softmax(decoder->forward(x), /*dim=*/-1);
  }

  nn::Embedding encoder;
  nn::TransformerEncoder transformer;
  nn::Linear decoder;
  double scale;
};
TORCH_MODULE(TransformerLm);

// A model holder switched to eval mode (for serving-style callers).
template <typename Holder>
Holder Eval(Holder m) {
  m->eval();
  return m;
}

// The masks of a causal LM over `seq` tokens, the last `padded` positions of batch element 0
// padding.
inline std::pair<torch::Tensor, torch::Tensor> CausalMasks(int64_t seq, int64_t batch, int64_t padded = 1) {
  torch::Tensor causal = torch::triu(torch::full({seq, seq}, -std::numeric_limits<float>::infinity()), 1);
  torch::Tensor padding = torch::zeros({batch, seq}, torch::kBool);
  if (padded > 0) padding[0].slice(0, seq - padded).fill_(true);
  return {causal, padding};
}

// ---------------------------------------------------------------------------------------------
// Sequence tagger: an embedding with padding_idx and max_norm (renormalizes the looked-up rows of
// the weight in place during forward), a two-layer bidirectional GRU (batch_first, dropout between
// layers), a per-token linear classifier. Input: tokens [batch, seq]; output: [batch, seq, tags].
struct GruTaggerImpl : nn::Module {
  GruTaggerImpl(int64_t vocab = 20, int64_t embed = 8, int64_t hidden = 16, int64_t tags = 5)
      : embedding(register_module("embedding",
                                  nn::Embedding(nn::EmbeddingOptions(vocab, embed).padding_idx(0).max_norm(1.0)))),
        gru(register_module("gru", nn::GRU(nn::GRUOptions(embed, hidden)
                                               .num_layers(2)
                                               .bidirectional(true)
                                               .batch_first(true)
                                               .dropout(0.3)))),
        classifier(register_module("classifier", nn::Linear(2 * hidden, tags))) {}

  torch::Tensor forward(torch::Tensor tokens) {
    auto [output, h_n] = gru->forward(embedding->forward(tokens));
    return classifier->forward(output);
  }

  nn::Embedding embedding;
  nn::GRU gru;
  nn::Linear classifier;
};
TORCH_MODULE(GruTagger);

// ---------------------------------------------------------------------------------------------
// fastText-style text classifier: a sparse embedding (sparse gradients, trained with SGD),
// averaged over the tokens of each example, and a linear classifier.
struct FastTextImpl : nn::Module {
  FastTextImpl(int64_t vocab = 100, int64_t embed = 16, int64_t classes = 4)
      : embedding(register_module("embedding", nn::Embedding(nn::EmbeddingOptions(vocab, embed).sparse(true)))),
        fc(register_module("fc", nn::Linear(embed, classes))) {}

  torch::Tensor forward(torch::Tensor tokens) {  // [batch, words]
    return fc->forward(embedding->forward(tokens).mean(1));
  }

  nn::Embedding embedding;
  nn::Linear fc;
};
TORCH_MODULE(FastText);

// ---------------------------------------------------------------------------------------------
// Domain-adversarial network (DANN): a shared feature extractor, a label classifier, and a domain
// classifier behind a gradient reversal layer, a custom autograd Function that is the identity
// forward and multiplies the gradient by -lambda backward.
struct GradientReversal : torch::autograd::Function<GradientReversal> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, double lambda) {
    ctx->saved_data["lambda"] = lambda;
    return x.view_as(x);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const double lambda = ctx->saved_data["lambda"].toDouble();
    return {grads[0] * -lambda, torch::Tensor()};
  }
};

struct DannImpl : nn::Module {
  DannImpl(int64_t in = 32, int64_t hidden = 32, int64_t classes = 10, int64_t domains = 2)
      : features(register_module("features", nn::Sequential(nn::Linear(in, hidden), nn::ReLU(),
                                                            nn::Linear(hidden, hidden), nn::ReLU()))),
        label_head(register_module("label_head", nn::Linear(hidden, classes))),
        domain_head(register_module("domain_head",
                                    nn::Sequential(nn::Linear(hidden, 16), nn::ReLU(), nn::Linear(16, domains)))) {}

  // Returns (label logits, domain logits).
  std::pair<torch::Tensor, torch::Tensor> forward(torch::Tensor x, double lambda) {
    torch::Tensor f = features->forward(x);
    torch::Tensor reversed = GradientReversal::apply(f, lambda);
    return {label_head->forward(f), domain_head->forward(reversed)};
  }

  nn::Sequential features;
  nn::Linear label_head;
  nn::Sequential domain_head;
};
TORCH_MODULE(Dann);

}  // namespace models

#endif  // WARDEN_TESTS_MODELS_MODELS_H_
