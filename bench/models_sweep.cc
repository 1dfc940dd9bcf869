// Batch sweeps through the real-program models (tests/models/models.h): each model in eval mode
// under NoGradGuard, batch sizes 1..12 in order, twice (the second round is what a warm server
// sees), eagerly and through Warden, per backend ("aten", "cpp") and dynamic mode (kAuto, kDynamic).
// Reports compiles, size verifications (Note [Verified size reads]: sizes the model's C++ reads,
// verified by a re-trace instead of recompiled), eager calls and hits, the wall time of each
// round against eager's, and minor page faults per call in the last round. Every output is checked against eager (torch::allclose) as the sweep
// runs; exit code 1 on a mismatch.
//
//   bazel run -c opt //bench:models_sweep [-- --rounds=2 --max_batch=12 --events --model=MLP]
// (--events prints each function's miss events: what compiled, verified or stayed static, and why)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench/workloads.h"
#include "runtime/warden.h"
#include "tests/models/models.h"
#include "tools/libtorch_info.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Model {
  std::string name;
  std::string reads;  // what its C++ reads, or ""
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::function<at::Tensor(int64_t)> input;
  std::shared_ptr<torch::nn::Module> module;  // watched: its eval() flag is C++ state
};

std::vector<Model> Models() {
  torch::manual_seed(0);
  std::vector<Model> out;
  auto mlp = models::Eval(models::Mlp(12, 16, 4, true));
  out.push_back({"MLP + BatchNorm1d", "", [mlp](const at::Tensor& x) mutable { return mlp->forward(x); },
                 [](int64_t b) { return torch::randn({b, 12}); }, mlp.ptr()});
  auto cnn = models::Eval(models::ConvNet());
  out.push_back({"CNN (MNIST style)", "view({x.size(0), -1})", [cnn](const at::Tensor& x) mutable { return cnn->forward(x); },
                 [](int64_t b) { return torch::randn({b, 1, 16, 16}); }, cnn.ptr()});
  auto resnet = models::Eval(models::ResNet(10));
  out.push_back({"ResNet (2 blocks)", "", [resnet](const at::Tensor& x) mutable { return resnet->forward(x); },
                 [](int64_t b) { return torch::randn({b, 1, 16, 16}); }, resnet.ptr()});
  auto lstm = models::Eval(models::LstmLm(40, 16, 24));
  out.push_back({"LSTM LM (2 layers, seq 7)", "nn::LSTM: input.size(1)",
                 [lstm](const at::Tensor& t) mutable { return std::get<0>(lstm->forward(t)); },
                 [](int64_t b) { return torch::randint(40, {7, b}, torch::kLong); }, lstm.ptr()});
  auto transformer = models::Eval(models::TransformerLm(50, 32, 4, 2));
  out.push_back({"Transformer LM (2 layers, 4 heads, seq 6)", "nn::MultiheadAttention: batch*heads",
                 [transformer](const at::Tensor& t) mutable {
                   auto [causal, padding] = models::CausalMasks(t.size(0), t.size(1));
                   return transformer->forward(t, causal, padding);
                 },
                 [](int64_t b) { return torch::randint(50, {6, b}, torch::kLong); }, transformer.ptr()});
  auto gru = models::Eval(models::GruTagger());
  out.push_back({"GRU tagger (Embedding max_norm, 2-layer biGRU, seq 5)", "strides (max_norm), nn::GRU: batch",
                 [gru](const at::Tensor& t) mutable { return gru->forward(t); },
                 [](int64_t b) { return torch::randint(20, {b, 5}, torch::kLong); }, gru.ptr()});
  auto vae = models::Eval(models::Vae());
  out.push_back({"VAE", "", [vae](const at::Tensor& x) mutable { return std::get<0>(vae->forward(x)); },
                 [](int64_t b) { return torch::rand({b, 1, 16, 16}); }, vae.ptr()});
  auto gen = models::Eval(models::DcganGenerator());
  out.push_back({"DCGAN generator", "", [gen](const at::Tensor& z) mutable { return gen->forward(z); },
                 [](int64_t b) { return torch::randn({b, 16, 1, 1}); }, gen.ptr()});
  return out;
}

double Ms(Clock::time_point since) { return std::chrono::duration<double, std::milli>(Clock::now() - since).count(); }

}  // namespace

int main(int argc, char** argv) {
  int rounds = 2;
  int64_t max_batch = 12;
  bool events = false;
  std::string only;  // --model=: only models whose name contains it
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) {
      rounds = std::atoi(argv[i] + 9);
    } else if (std::strcmp(argv[i], "--events") == 0) {
      events = true;
    } else if (std::strncmp(argv[i], "--model=", 8) == 0) {
      only = argv[i] + 8;
    } else if (std::strncmp(argv[i], "--max_batch=", 12) == 0) {
      max_batch = std::atoll(argv[i] + 12);
    } else {
      std::fprintf(stderr, "unknown flag %s (supported: --rounds=N --max_batch=N --events --model=NAME)\n", argv[i]);
      return 2;
    }
  }
  if (rounds < 1 || max_batch < 1) {
    std::fprintf(stderr, "--rounds and --max_batch must be positive\n");
    return 2;
  }
  at::set_num_threads(1);
  warden::tools::SetBlasThreads(1);
  std::printf("models_sweep: %s, BLAS %s; batch 1..%lld, %d rounds, eval mode under NoGradGuard, 1 intra-op thread\n",
              warden::tools::LibTorchDescription().c_str(), warden::tools::BlasDescription().c_str(),
              static_cast<long long>(max_batch), rounds);
  std::printf("| model | C++ reads | backend | mode | compiles | verifications | eager calls | hits | "
              "round 1 ms (eager) | round %d ms (eager) | last round vs eager | minor faults per call, last round (eager) |\n",
              rounds);
  std::printf("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  bool ok = true;
  torch::NoGradGuard no_grad;
  for (const Model& m : Models()) {
    if (!only.empty() && m.name.find(only) == std::string::npos) continue;
    // Inputs fixed up front, so every configuration sees the same calls.
    std::vector<at::Tensor> inputs;
    for (int64_t b = 1; b <= max_batch; ++b) inputs.push_back(m.input(b));
    std::vector<double> eager_ms(rounds);
    std::vector<at::Tensor> want;
    double eager_faults = 0;
    for (int r = 0; r < rounds; ++r) {
      const auto start = Clock::now();
      const long faults = warden::bench::MinorFaults();
      // Both sides keep a round's outputs until it ends (the same allocator traffic) and are
      // checked after the clock stops.
      std::vector<at::Tensor> outs(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) outs[i] = m.forward(inputs[i]);
      eager_ms[r] = Ms(start);
      if (r == 0) want = outs;
      eager_faults = static_cast<double>(warden::bench::MinorFaults() - faults) / inputs.size();
    }
    for (const char* backend : {"aten", "cpp"}) {
      for (warden::Dynamic mode : {warden::Dynamic::kAuto, warden::Dynamic::kDynamic}) {
        warden::Options o;
        o.name = m.name;
        o.backend = backend;
        o.dynamic = mode;
        auto fn = m.forward;
        warden::CompiledFunction f = warden::compile(
            [fn](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> { return {fn(a[0].toTensor())}; }, o);
        f.watch(*m.module, "model");
        std::vector<double> ms(rounds);
        double faults_per_call = 0;
        for (int r = 0; r < rounds; ++r) {
          const auto start = Clock::now();
          const long faults = warden::bench::MinorFaults();
          std::vector<at::Tensor> outs(inputs.size());
          for (size_t i = 0; i < inputs.size(); ++i) outs[i] = f({inputs[i]})[0];
          ms[r] = Ms(start);
          faults_per_call = static_cast<double>(warden::bench::MinorFaults() - faults) / inputs.size();
          for (size_t i = 0; i < inputs.size(); ++i) {
            if (!outs[i].sizes().equals(want[i].sizes()) || !torch::allclose(outs[i], want[i], 1e-4, 1e-5)) {
              std::printf("MISMATCH %s %s batch %zu\n", m.name.c_str(), backend, i + 1);
              ok = false;
            }
          }
        }
        const warden::Stats s = f.stats();
        std::printf("| %s | %s | %s | %s | %lld | %lld | %lld | %lld | %.2f (%.2f) | %.2f (%.2f) | %.2fx | %.0f (%.0f) |\n",
                    m.name.c_str(), m.reads.empty() ? "-" : m.reads.c_str(), backend,
                    mode == warden::Dynamic::kAuto ? "kAuto" : "kDynamic", static_cast<long long>(s.compiles),
                    static_cast<long long>(s.size_verifications), static_cast<long long>(s.eager_calls),
                    static_cast<long long>(s.cache_hits), ms[0], eager_ms[0], ms[rounds - 1], eager_ms[rounds - 1],
                    eager_ms[rounds - 1] / ms[rounds - 1], faults_per_call, eager_faults);
        if (events) {
          for (const warden::RecompileEvent& e : f.recompiles()) {
            std::printf("    call %lld: %s\n", static_cast<long long>(e.call_index), e.action.c_str());
          }
        }
        std::fflush(stdout);
      }
    }
  }
  return ok ? 0 : 1;
}
