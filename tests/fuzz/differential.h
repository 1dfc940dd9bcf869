// Differential and guard-soundness checks of Warden against eager LibTorch, over programs from
// tests/fuzz/program.h, through the public API only (runtime/warden.h).
//
// For each program and each configuration (backend x Dynamic mode) a fresh CompiledFunction is
// called on a sequence of inputs (new values, a changed size, another layout, a changed scalar);
// every call must give what eager gives on an identical copy of the inputs: the same outputs
// (dtype, sizes, requires_grad, values: exact for integers and bools, allclose for floating
// types), the same argument mutations, and an exception whenever eager raises one (the same
// c10::Error text when eager raised a c10::Error). Then the guard probes: after a reset and one
// call, one guard of the new entry (a dtype, requires_grad, a rank, a static size, a scalar value)
// is broken by changing exactly that property; that call must miss and still equal eager.
// Backward: whenever a call's outputs require grad, the same loss (a weighted sum of them) is
// back-propagated on both sides: both must raise, or both must leave equal .grad on every
// argument. With `grad_inside` the function itself also takes the gradient of that loss with
// respect to its arguments that require grad (torch::autograd::grad) and returns it after its
// outputs (Note [Gradients inside] in differential.cc). Configurations with `mark_dynamic` first mark one dim of one tensor argument and
// every scalar argument (the programs use scalars only as op arguments, the promise
// mark_dynamic on a scalar makes: Note [Symbolic scalars]). Float outputs that differ beyond the
// tolerances are judged against a double-precision run of the program (Note [Float reference]).
// Programs with patterns (Note [Patterns] in program.cc) also get: calls that pass one tensor in
// two argument positions, a view of it or two halves of one storage; twin models, Warden's
// watched, switched between train() and eval() on both sides, compared after every call
// (parameters, running statistics, gradients). Every call also checks that thread-local modes
// (grad, inference, autocast, dispatch keys) are the caller's again afterwards, that returned
// tensors match in leafness and inference-ness, and that the global generator, seeded alike
// before each side's call, ends in the same state.
#ifndef WARDEN_TESTS_FUZZ_DIFFERENTIAL_H_
#define WARDEN_TESTS_FUZZ_DIFFERENTIAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/warden.h"
#include "tests/fuzz/program.h"

namespace warden::fuzz {

struct Config {
  std::string backend;
  Dynamic dynamic;
  bool mark_dynamic = false;  // mark_dynamic one tensor dim and every scalar before the first call
  bool grad_inside = false;   // the function also takes gradients (Note [Gradients inside])
};
std::string ConfigName(const Config& c);
// {aten, cpp} x {static, auto, dynamic, static with mark_dynamic}
std::vector<Config> AllConfigs();
std::vector<Config> ConfigsOf(const std::string& backend);  // AllConfigs() of one backend
// {static, auto} of one backend with grad_inside (Note [Gradients inside]).
std::vector<Config> GradInsideConfigsOf(const std::string& backend);

struct CheckCounts {
  int64_t calls = 0;         // Warden calls checked against eager
  int64_t eager_errors = 0;  // of which eager raised (and Warden had to raise too)
  int64_t probes = 0;        // guard probes (each a call that must miss)
  int64_t backward = 0;      // calls whose outputs were back-propagated on both sides
  int64_t grads_inside = 0;  // calls whose function took gradients inside (Note [Gradients inside])
  int64_t reference_accepts = 0;  // float differences accepted against a double run (Note [Float reference])
  int64_t limitations = 0;  // documented refusals: Warden raised "cannot be re-run eagerly" where
                            // eager returned (README "Run eagerly, and said so"); not failures
};

// Every difference found for `program`, each a self-contained text naming the configuration and
// call (empty: none). Adds to `counts`, and each documented refusal to `limitations` if given.
std::vector<std::string> CheckProgram(const Program& program, const std::vector<Config>& configs,
                                      CheckCounts* counts, std::vector<std::string>* limitations = nullptr);

struct FuzzBudget {
  uint64_t seed = 1;       // program i has seed `seed + i`
  int64_t programs = 100;  // stop after this many programs...
  double seconds = 0;      // ...or after this long (0: no time limit)
  std::vector<Config> configs = AllConfigs();
  bool verbose = false;    // print every program
  bool force_patterns = false;  // Generate(seed, /*force_patterns=*/true)
};

struct FuzzSummary {
  int64_t programs = 0;
  int64_t with_patterns = 0;  // of which had at least one pattern
  double seconds = 0;
  CheckCounts counts;
  std::vector<std::string> failures;  // each starts with the program's text (seed included)
  std::vector<std::string> limitations;  // the first few documented refusals, one per program
};

FuzzSummary RunFuzz(const FuzzBudget& budget);

// Whether `p` got any pattern (Note [Patterns] in program.cc).
bool HasPatterns(const Program& p);

}  // namespace warden::fuzz

#endif  // WARDEN_TESTS_FUZZ_DIFFERENTIAL_H_
