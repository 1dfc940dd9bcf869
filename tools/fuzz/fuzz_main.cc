// CLI of the differential fuzzer (tests/fuzz/differential.h). Exit status 1 if any program
// disagreed with eager; each failure prints its seed and program text, and
// `--seed=S --programs=1` reruns exactly that program (with --force_patterns when its text says
// "patterns forced").
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "tests/fuzz/differential.h"

int main(int argc, char** argv) {
  warden::fuzz::FuzzBudget budget;
  budget.programs = 1000;
  budget.seconds = 60;
  std::string backend = "all";
  bool grad_inside = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return arg.compare(0, n, name) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--seed=")) {
      budget.seed = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("--programs=")) {
      budget.programs = std::strtoll(v, nullptr, 10);
    } else if (const char* v = value("--seconds=")) {
      budget.seconds = std::strtod(v, nullptr);
    } else if (const char* v = value("--backend=")) {
      backend = v;
    } else if (arg == "--verbose") {
      budget.verbose = true;
    } else if (arg == "--force_patterns") {
      budget.force_patterns = true;
    } else if (arg == "--grad_inside") {
      grad_inside = true;
    } else {
      std::cerr << "usage: fuzz [--seed=S] [--programs=N] [--seconds=T (0: no limit)] "
                   "[--backend=aten|cpp|all] [--force_patterns] [--grad_inside] [--verbose]\n";
      return 2;
    }
  }
  if (grad_inside) {  // Note [Gradients inside] in tests/fuzz/differential.cc
    budget.configs = warden::fuzz::GradInsideConfigsOf("aten");
    for (const auto& c : warden::fuzz::GradInsideConfigsOf("cpp")) budget.configs.push_back(c);
  }
  if (backend != "all") {
    std::vector<warden::fuzz::Config> configs;
    for (const auto& c : budget.configs) {
      if (c.backend == backend) configs.push_back(c);
    }
    if (configs.empty()) {
      std::cerr << "unknown backend " << backend << "\n";
      return 2;
    }
    budget.configs = configs;
  }
  if (std::getenv("WARDEN_CACHE_DIR") == nullptr) setenv("WARDEN_CACHE_DIR", "/tmp/warden-fuzz-cache", 1);
  std::cerr << "fuzz: seed " << budget.seed << ", up to " << budget.programs << " programs, "
            << budget.seconds << " s, backend " << backend << (budget.force_patterns ? ", patterns forced" : "") << (grad_inside ? ", gradients inside" : "")
            << ", WARDEN_CACHE_DIR=" << std::getenv("WARDEN_CACHE_DIR")
            << "\n";
  const warden::fuzz::FuzzSummary s = warden::fuzz::RunFuzz(budget);
  for (const std::string& f : s.failures) std::cout << "FAILURE\n" << f << "\n";
  for (const std::string& l : s.limitations) std::cout << "DOCUMENTED LIMITATION (not a failure)\n" << l << "\n";
  std::cout << s.programs << " programs (seeds " << budget.seed << ".." << budget.seed + s.programs - 1 << ", "
            << s.with_patterns << " with patterns), "
            << s.counts.calls << " checked calls (" << s.counts.eager_errors << " raising in eager), "
            << s.counts.backward << " backward, " << s.counts.grads_inside << " with gradients inside, " << s.counts.reference_accepts << " float differences within the fp64 bound, "
            << s.counts.probes << " guard probes, " << s.counts.limitations << " documented refusals, "
            << s.failures.size() << " failures in " << s.seconds << " s\n";
  return s.failures.empty() ? 0 : 1;
}
