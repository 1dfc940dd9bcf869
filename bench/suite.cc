// The benchmark suite (issue 5): eager LibTorch, Warden's replay backend ("aten") and its fused
// C++ backend ("cpp") side by side on the same workloads, in one process and one run.
//
//   bazel run -c opt //bench:all                                        # everything, ~5 min
//   bazel run -c opt //bench:all -- --benchmark_filter=radon            # one group
//   bazel run -c opt //bench:all -- --benchmark_format=json > /tmp/bench.json
//   bazel run //tools:bench_report -- /tmp/bench.json                   # the Markdown table
//
// Benchmarks are named <group>/<workload>/<path>, path = eager | aten | cpp (| copy):
//   dispatch/  chain10_16, chain50_16 (10- and 50-op pointwise chains on 16 floats), tiny_mlp_b1
//   memory/    chain10_1M, chain10_16M, plus copy/ of the same bytes (the bandwidth reference)
//   blocks/    mlp (linear+gelu+linear), layer_norm, softmax, attention (pre-LN multi-head block)
//   train/     a training step (loss compiled, backward() outside) of an MLP and a small CNN
//   radon/     logp, logp_grad (gradient outside the function) and logp_and_grad_inside (gradient
//              captured inside it) of the radon hierarchical model (bench/radon.h), N=919, J=85
//   dynamic/   sweep_{static,auto,dynamic}: L = 1..512 once each through the attention block;
//              one iteration = the whole sweep, counters compiles / hits / eager_calls
//   guard/     args_{1,4,16,64} and entries_{1,8,64}: a passthrough (no ops), so a hit is only
//              the guard check, lookup and bookkeeping
//   threads/   chain10_16 called from 1, 2, 4 threads through one compiled function; counter
//              calls_per_s_per_thread
//
// Before any Warden path is timed, its compiled function's output (compile call and a cache hit)
// is checked against eager with torch::allclose; a mismatch fails that benchmark with an error
// (and its row in the report says so). Every timed Warden call must be a cache hit (else error).
// Warden functions use Dynamic::kStatic outside dynamic/. Stdout carries only Google Benchmark's
// output, so --benchmark_format=json gives clean JSON; diagnostics go to stderr.
//
// Defaults added when not given: --benchmark_min_time=0.1; LibTorch's intra-op threads = 1
// (--intra_op_threads=N changes it); --sweep_max_len=N (default 512) shortens the sweep.
// The JSON context gets: libtorch and blas (bench/libtorch_context.cc), intra_op_threads,
// torch_version, cpu_model, warden_cache_dir.
#include <dlfcn.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "bench/radon.h"
#include "bench/reporting.h"
#include "bench/workloads.h"
#include "runtime/warden.h"
#include "tools/libtorch_info.h"

namespace {

using Args = std::vector<c10::IValue>;
using Outputs = std::vector<at::Tensor>;
using Call = std::function<Outputs(const Args&)>;

const char* const kBackends[] = {"aten", "cpp"};

// --- Workloads ----------------------------------------------------------------------------------

// A workload: the traced function, its arguments, and optionally what one call does around the
// function (the gradient for radon/logp_grad). `inference` runs the calls in c10::InferenceMode.
struct Workload {
  std::string name;  // <group>/<workload>
  warden::Fn fn;
  Args args;
  std::function<Outputs(const Call&, const Args&)> step;  // default: the call itself
  bool inference = true;
  int64_t bytes = 0;  // bytes a fused kernel must move (reads + writes), for bytes_per_second

  Outputs Run(const Call& call) const { return step ? step(call, args) : call(args); }
};

at::Tensor Chain50(const at::Tensor& x, const at::Tensor& w) {
  at::Tensor y = x;
  for (int i = 0; i < 5; ++i) y = warden::bench::Chain10(y, w);
  return y;
}

// A pre-LN multi-head self-attention block: layer_norm, q/k/v projections, heads split with view
// (-1 for the sequence length, so it can stay symbolic), softmax(q k^T / sqrt(dh)) v, heads
// merged, output projection, residual. x: [batch, seq, d].
struct AttentionBlock {
  int64_t d, heads;
  at::Tensor ln_w, ln_b, wq, wk, wv, wo, bq, bk, bv, bo;

  AttentionBlock(int64_t dim, int64_t n_heads) : d(dim), heads(n_heads) {
    const double s = 1.0 / std::sqrt(static_cast<double>(dim));
    ln_w = 1 + torch::randn({dim}) * 0.1;
    ln_b = torch::randn({dim}) * 0.1;
    for (at::Tensor* w : {&wq, &wk, &wv, &wo}) *w = torch::randn({dim, dim}) * s;
    for (at::Tensor* b : {&bq, &bk, &bv, &bo}) *b = torch::randn({dim}) * 0.1;
  }

  at::Tensor operator()(const at::Tensor& x) const {
    const int64_t b = x.size(0), dh = d / heads;
    const at::Tensor h = torch::layer_norm(x, {d}, ln_w, ln_b);
    auto split = [&](const at::Tensor& t) { return t.view({b, -1, heads, dh}).transpose(1, 2); };
    const at::Tensor q = split(torch::linear(h, wq, bq));
    const at::Tensor k = split(torch::linear(h, wk, bk));
    const at::Tensor v = split(torch::linear(h, wv, bv));
    const at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
    const at::Tensor attn = torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).reshape({b, -1, d});
    return x + torch::linear(attn, wo, bo);
  }
};

warden::Fn Unary(std::function<at::Tensor(const at::Tensor&)> f) {
  return [f](const Args& a) -> Outputs { return {f(a[0].toTensor())}; };
}

warden::Fn Binary(at::Tensor (*f)(const at::Tensor&, const at::Tensor&)) {
  return [f](const Args& a) -> Outputs { return {f(a[0].toTensor(), a[1].toTensor())}; };
}

// The function of guard/: its N tensor arguments returned unchanged (no op in the graph).
Outputs Passthrough(const Args& a) {
  Outputs out;
  out.reserve(a.size());
  for (const c10::IValue& v : a) out.push_back(v.toTensor());
  return out;
}

Args RandomTensors(int n, at::IntArrayRef shape) {
  Args args;
  for (int i = 0; i < n; ++i) args.emplace_back(torch::randn(shape));
  return args;
}

// All workloads of the fixed-shape groups (dispatch, memory, blocks, radon, guard, threads), made
// once with a fixed seed.
std::vector<Workload>& Workloads() {
  static auto* all = [] {
    auto* w = new std::vector<Workload>();
    torch::manual_seed(0);
    // Dispatch-bound.
    w->push_back({"dispatch/chain10_16", Binary(warden::bench::Chain10), RandomTensors(2, {16})});
    w->push_back({"dispatch/chain50_16", Binary(Chain50), RandomTensors(2, {16})});
    {
      const at::Tensor w1 = torch::randn({64, 32}) * 0.18, b1 = torch::randn({64}) * 0.1,
                       w2 = torch::randn({64, 64}) * 0.12, b2 = torch::randn({64}) * 0.1,
                       w3 = torch::randn({10, 64}) * 0.12, b3 = torch::randn({10}) * 0.1;
      w->push_back({"dispatch/tiny_mlp_b1", Unary([=](const at::Tensor& x) {
                      const at::Tensor h = torch::relu(torch::linear(x, w1, b1));
                      return torch::linear(torch::relu(torch::linear(h, w2, b2)), w3, b3);
                    }),
                    RandomTensors(1, {1, 32})});
    }
    // Memory-bound: the chain reads x and w and writes one output.
    for (auto [label, n] : {std::pair{"1M", int64_t{1} << 20}, std::pair{"16M", int64_t{16} << 20}}) {
      Workload chain{std::string("memory/chain10_") + label, Binary(warden::bench::Chain10),
                     RandomTensors(2, {n})};
      chain.bytes = 3 * n * static_cast<int64_t>(sizeof(float));
      w->push_back(chain);
    }
    // Model blocks.
    {
      const at::Tensor w1 = torch::randn({512, 128}) * 0.09, b1 = torch::randn({512}) * 0.1,
                       w2 = torch::randn({128, 512}) * 0.044, b2 = torch::randn({128}) * 0.1;
      w->push_back({"blocks/mlp_32x128", Unary([=](const at::Tensor& x) {
                      return torch::linear(torch::gelu(torch::linear(x, w1, b1)), w2, b2);
                    }),
                    RandomTensors(1, {32, 128})});
    }
    {
      const at::Tensor g = 1 + torch::randn({1024}) * 0.1, b = torch::randn({1024}) * 0.1;
      w->push_back({"blocks/layer_norm_64x1024",
                    Unary([=](const at::Tensor& x) { return torch::layer_norm(x, {1024}, g, b); }),
                    RandomTensors(1, {64, 1024})});
    }
    w->push_back({"blocks/softmax_64x1024", Unary([](const at::Tensor& x) { return torch::softmax(x, -1); }),
                  RandomTensors(1, {64, 1024})});
    // Pooling of a small CNN's first activation (Note [Native kernels] on backend cpp).
    w->push_back({"blocks/max_pool2d_16x8x28x28", Unary([](const at::Tensor& x) { return torch::max_pool2d(x, 2); }),
                  RandomTensors(1, {16, 8, 28, 28})});
    w->push_back({"blocks/avg_pool2d_16x8x28x28", Unary([](const at::Tensor& x) { return torch::avg_pool2d(x, 2); }),
                  RandomTensors(1, {16, 8, 28, 28})});
    {
      auto block = std::make_shared<AttentionBlock>(64, 4);
      w->push_back({"blocks/attention_4x32x64", Unary([block](const at::Tensor& x) { return (*block)(x); }),
                    RandomTensors(1, {4, 32, 64})});
    }
    // The radon model: logp, and logp + its gradient (what a gradient-based sampler calls).
    {
      auto data = std::make_shared<warden::bench::RadonData>(warden::bench::MakeRadonData());
      const at::Tensor theta = warden::bench::RadonTheta(*data);
      const warden::Fn logp = Unary([data](const at::Tensor& t) { return warden::bench::RadonLogp(t, *data); });
      w->push_back({"radon/logp", logp, {theta}});
      Workload grad{"radon/logp_grad", logp, {theta.clone().requires_grad_(true)}};
      grad.step = [](const Call& call, const Args& a) -> Outputs {
        const at::Tensor lp = call(a)[0];
        return {lp, torch::autograd::grad({lp}, {a[0].toTensor()})[0]};
      };
      grad.inference = false;
      w->push_back(grad);
      // The same, with the gradient taken inside the function (captured: one graph, Note
      // [Captured gradients]): what a sampler's dlogp should be.
      Workload inside{"radon/logp_and_grad_inside",
                      [data](const Args& a) -> Outputs {
                        const at::Tensor t = a[0].toTensor().detach().requires_grad_(true);
                        const at::Tensor lp = warden::bench::RadonLogp(t, *data);
                        return {lp.detach(), torch::autograd::grad({lp}, {t})[0]};
                      },
                      {theta}};
      inside.inference = false;
      w->push_back(inside);
    }
    // Training steps: forward and loss compiled, loss.backward() outside (the compiled backward,
    // Note [Compiled backward]); a step returns the loss and every parameter's gradient (checked
    // against eager before timing), then clears the gradients.
    {
      torch::manual_seed(17);
      auto mlp = std::make_shared<torch::nn::Sequential>(torch::nn::Linear(64, 128), torch::nn::ReLU(),
                                                         torch::nn::Linear(128, 128), torch::nn::ReLU(),
                                                         torch::nn::Linear(128, 10));
      auto cnn = std::make_shared<torch::nn::Sequential>(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
          torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
          torch::nn::Flatten(), torch::nn::Linear(16 * 7 * 7, 10));
      auto add = [w](const std::string& name, std::shared_ptr<torch::nn::Sequential> m, const at::Tensor& x,
                     const at::Tensor& y) {
        Workload t{name,
                   [m](const Args& a) -> Outputs {
                     return {torch::nll_loss(torch::log_softmax((*m)->forward(a[0].toTensor()), 1), a[1].toTensor())};
                   },
                   {x, y}};
        t.step = [m](const Call& call, const Args& a) -> Outputs {
          Outputs out = {call(a)[0]};
          out[0].backward();
          for (auto& p : (*m)->parameters()) {
            out.push_back(p.grad());
            p.mutable_grad() = at::Tensor();
          }
          out[0] = out[0].detach();
          return out;
        };
        t.inference = false;
        w->push_back(t);
      };
      add("train/mlp_b32", mlp, torch::randn({32, 64}), torch::randint(10, {32}));
      add("train/cnn_b16", cnn, torch::randn({16, 1, 28, 28}), torch::randint(10, {16}));
    }
    // Guard and lookup overhead (entries_E adds E - 1 entries before the hit's; see Prepare).
    for (int n : {1, 4, 16, 64}) {
      w->push_back({"guard/args_" + std::to_string(n), Passthrough, RandomTensors(n, {4, 4})});
    }
    for (int e : {1, 8, 64}) {
      w->push_back({"guard/entries_" + std::to_string(e), Passthrough, RandomTensors(4, {4, 4})});
    }
    // Threads.
    w->push_back({"threads/chain10_16", Binary(warden::bench::Chain10), RandomTensors(2, {16})});
    return w;
  }();
  return *all;
}

int EntriesOf(const Workload& w) {
  const std::string prefix = "guard/entries_";
  return w.name.rfind(prefix, 0) == 0 ? std::atoi(w.name.c_str() + prefix.size()) : 1;
}

// --- Correctness --------------------------------------------------------------------------------

// Empty if `got` equals `want` (torch::allclose per output), else what differs.
std::string Compare(const Outputs& got, const Outputs& want) {
  if (got.size() != want.size()) {
    return "expected " + std::to_string(want.size()) + " outputs, got " + std::to_string(got.size());
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (!got[i].defined() || got[i].sizes() != want[i].sizes() || got[i].scalar_type() != want[i].scalar_type()) {
      return "output " + std::to_string(i) + ": shape or dtype differs";
    }
    const bool f64 = want[i].scalar_type() == at::kDouble;
    if (!torch::allclose(got[i], want[i], f64 ? 1e-9 : 1e-4, f64 ? 1e-9 : 1e-5)) {
      const double diff = (got[i] - want[i]).abs().max().item<double>();
      return "output " + std::to_string(i) + ": max |warden - eager| = " + std::to_string(diff);
    }
  }
  return "";
}

// --- Warden paths ---------------------------------------------------------------------------------

// A compiled function, warmed, checked against eager once, with the stats after the warm-up.
struct Prepared {
  warden::CompiledFunction f;
  warden::Stats warm;
  std::string error;  // non-empty: the check failed, or setting up threw
};

warden::Options StaticOptions(const std::string& name, const std::string& backend, int limit = 8) {
  warden::Options o = warden::bench::StaticAten(name);
  o.backend = backend;
  o.cache_size_limit = limit;
  return o;
}

Prepared Prepare(const Workload& w, const std::string& backend) {
  const int entries = EntriesOf(w);
  Prepared p{warden::compile(w.fn, StaticOptions(w.name, backend, std::max(8, entries))), {}, ""};
  try {
    std::unique_ptr<c10::InferenceMode> inference;
    if (w.inference) inference = std::make_unique<c10::InferenceMode>();
    // guard/entries_E: E - 1 entries for other shapes of arg0 first, so the hit's entry is the
    // oldest of E.
    for (int e = entries - 1; e >= 1; --e) {
      Args other = w.args;
      other[0] = torch::randn({4 + e, 4});
      p.f(other);
    }
    Call compiled = [&p](const Args& a) { return p.f(a); };
    const Outputs want = w.Run(w.fn);
    if (std::string why = Compare(w.Run(compiled), want); !why.empty()) {
      p.error = "compiling call differs from eager: " + why;
    } else if (std::string why2 = Compare(w.Run(compiled), want); !why2.empty()) {
      p.error = "cache hit differs from eager: " + why2;
    } else if (p.f.stats().compiles != entries) {
      p.error = "expected " + std::to_string(entries) + " entries, got " + std::to_string(p.f.stats().compiles);
    }
  } catch (const std::exception& e) {
    p.error = std::string("threw: ") + e.what();
  }
  p.warm = p.f.stats();
  if (!p.error.empty()) std::fprintf(stderr, "bench: %s/%s: %s\n", w.name.c_str(), backend.c_str(), p.error.c_str());
  return p;
}

// One Prepared per (workload, backend), made on first use (thread-safe: threads/ shares them).
Prepared& PreparedFor(const Workload& w, const std::string& backend) {
  static std::mutex mu;
  static auto* all = new std::map<std::string, std::unique_ptr<Prepared>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Prepared>& p = (*all)[w.name + "/" + backend];
  if (!p) p = std::make_unique<Prepared>(Prepare(w, backend));
  return *p;
}

// The timed loop of one path; `call` is eager's function or the compiled one.
void Loop(benchmark::State& state, const Workload& w, const Call& call) {
  std::unique_ptr<c10::InferenceMode> inference;
  if (w.inference) inference = std::make_unique<c10::InferenceMode>();
  for (auto _ : state) {
    Outputs out = w.Run(call);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  if (w.bytes > 0) state.SetBytesProcessed(state.iterations() * w.bytes);
  if (w.name.rfind("threads/", 0) == 0) {
    state.counters["calls_per_s_per_thread"] =
        benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kAvgThreadsRate);
  }
}

void BM_Eager(benchmark::State& state, const Workload* w) { Loop(state, *w, w->fn); }

void BM_Warden(benchmark::State& state, const Workload* w, const char* backend) {
  Prepared& p = PreparedFor(*w, backend);
  if (!p.error.empty()) {
    state.SkipWithError(p.error.c_str());
    for (auto _ : state) {
    }
    return;
  }
  Loop(state, *w, [&p](const Args& a) { return p.f(a); });
  const warden::Stats now = p.f.stats();
  if (now.compiles != p.warm.compiles || now.eager_calls != p.warm.eager_calls) {
    state.SkipWithError("a timed call was not a cache hit");
  }
}

// A copy of the chain's input into a preallocated tensor: 2 * nbytes moved per iteration.
void BM_Copy(benchmark::State& state, const Workload* w) {
  const at::Tensor& x = w->args[0].toTensor();
  at::Tensor dst = torch::empty_like(x);
  for (auto _ : state) {
    dst.copy_(x);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<int64_t>(x.nbytes()));
}

// --- Dynamic shapes: the sequence-length sweep -----------------------------------------------------

int64_t g_sweep_max_len = 512;
constexpr int64_t kSweepDim = 32;

struct Mode {
  warden::Dynamic dynamic;
  const char* name;
};
constexpr Mode kModes[] = {
    {warden::Dynamic::kStatic, "static"}, {warden::Dynamic::kAuto, "auto"}, {warden::Dynamic::kDynamic, "dynamic"}};

const char* ModeName(warden::Dynamic d) {
  for (const Mode& m : kModes) {
    if (m.dynamic == d) return m.name;
  }
  return "?";
}

struct Sweep {
  AttentionBlock block{kSweepDim, 4};
  std::vector<Args> inputs;  // L = 1 .. max_len: x [1, L, 32]
  warden::Fn fn = Unary([this](const at::Tensor& x) { return block(x); });
};

Sweep& TheSweep() {
  static auto* s = [] {
    torch::manual_seed(1);
    auto* s = new Sweep();
    for (int64_t len = 1; len <= g_sweep_max_len; ++len) s->inputs.push_back({torch::randn({1, len, kSweepDim})});
    return s;
  }();
  return *s;
}

warden::Options SweepOptions(warden::Dynamic d, const std::string& backend) {
  warden::Options o;
  o.name = std::string("sweep_") + ModeName(d);
  o.backend = backend;
  o.dynamic = d;
  o.cache_size_limit = 512;  // so that kStatic really compiles every length
  return o;
}

// Checks a fresh compiled function against eager on a few lengths (repeats are hits); empty if ok.
std::string CheckSweep(warden::Dynamic d, const std::string& backend) {
  Sweep& s = TheSweep();
  warden::CompiledFunction f = warden::compile(s.fn, SweepOptions(d, backend));
  for (int64_t len : {1, 2, 3, 3, 17, 1, 64, 2, 17}) {
    if (len > g_sweep_max_len) continue;
    const Args& x = s.inputs[len - 1];
    if (std::string why = Compare(f(x), s.fn(x)); !why.empty()) return "L=" + std::to_string(len) + ": " + why;
  }
  return "";
}

// One iteration = the whole sweep through a new compiled function (or eagerly: backend null).
void BM_Sweep(benchmark::State& state, warden::Dynamic d, const char* backend) {
  c10::InferenceMode inference;
  Sweep& s = TheSweep();
  if (backend != nullptr) {
    static std::map<std::string, std::string>* checked = new std::map<std::string, std::string>();
    const std::string key = std::string(ModeName(d)) + "/" + backend;
    if (!checked->count(key)) (*checked)[key] = CheckSweep(d, backend);
    if (!(*checked)[key].empty()) {
      std::fprintf(stderr, "bench: sweep %s: %s\n", key.c_str(), (*checked)[key].c_str());
      state.SkipWithError(("output differs from eager: " + (*checked)[key]).c_str());
      for (auto _ : state) {
      }
      return;
    }
  }
  warden::Stats total;
  for (auto _ : state) {
    if (backend == nullptr) {
      for (const Args& x : s.inputs) benchmark::DoNotOptimize(s.fn(x).data());
      continue;
    }
    state.PauseTiming();
    warden::CompiledFunction f = warden::compile(s.fn, SweepOptions(d, backend));
    state.ResumeTiming();
    for (const Args& x : s.inputs) benchmark::DoNotOptimize(f(x).data());
    state.PauseTiming();
    const warden::Stats st = f.stats();
    total.compiles += st.compiles;
    total.cache_hits += st.cache_hits;
    total.eager_calls += st.eager_calls;
    state.ResumeTiming();
  }
  if (backend != nullptr) {
    const double n = static_cast<double>(state.iterations());
    state.counters["compiles"] = static_cast<double>(total.compiles) / n;
    state.counters["hits"] = static_cast<double>(total.cache_hits) / n;
    state.counters["eager_calls"] = static_cast<double>(total.eager_calls) / n;
  }
  state.counters["lengths"] = static_cast<double>(s.inputs.size());
}

// --- Registration and main -----------------------------------------------------------------------

void Register() {
  for (const Workload& w : Workloads()) {
    const bool threads = w.name.rfind("threads/", 0) == 0;
    auto configure = [threads](benchmark::internal::Benchmark* b) {
      if (threads) b->Threads(1)->Threads(2)->Threads(4)->UseRealTime();
    };
    configure(benchmark::RegisterBenchmark((w.name + "/eager").c_str(), BM_Eager, &w));
    for (const char* backend : kBackends) {
      configure(benchmark::RegisterBenchmark((w.name + "/" + backend).c_str(), BM_Warden, &w, backend));
    }
    if (w.bytes > 0) benchmark::RegisterBenchmark((w.name + "/copy").c_str(), BM_Copy, &w);
  }
  for (const Mode& mode : kModes) {
    const warden::Dynamic d = mode.dynamic;
    const std::string name = std::string("dynamic/sweep_") + mode.name;
    auto configure = [](benchmark::internal::Benchmark* b) {
      b->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
    };
    configure(benchmark::RegisterBenchmark((name + "/eager").c_str(), BM_Sweep, d, nullptr));
    for (const char* backend : kBackends) {
      configure(benchmark::RegisterBenchmark((name + "/" + backend).c_str(), BM_Sweep, d, backend));
    }
  }
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  const int intra_op = std::atoi(warden::bench::TakeFlag(&argc, argv, "intra_op_threads", "1").c_str());
  g_sweep_max_len = std::max<int64_t>(1, std::atoll(warden::bench::TakeFlag(&argc, argv, "sweep_max_len", "512").c_str()));
  at::set_num_threads(std::max(1, intra_op));
  warden::tools::SetBlasThreads(std::max(1, intra_op));  // OpenBLAS's own pool too

  // Default minimum time per benchmark unless the user chose one.
  std::vector<char*> args(argv, argv + argc);
  static char kMinTime[] = "--benchmark_min_time=0.1";
  bool has_min_time = false;
  for (int i = 1; i < argc; ++i) has_min_time |= std::strncmp(argv[i], "--benchmark_min_time", 20) == 0;
  if (!has_min_time) args.insert(args.begin() + 1, kMinTime);
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);

  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  const char* cache = std::getenv("WARDEN_CACHE_DIR");
  benchmark::AddCustomContext("intra_op_threads", std::to_string(at::get_num_threads()));
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  benchmark::AddCustomContext("cpu_model", CpuModel());
  benchmark::AddCustomContext("warden_cache_dir", cache != nullptr ? cache : "~/.cache/warden (default)");
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
