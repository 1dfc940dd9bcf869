// A Google Benchmark reporter shared by the bench binaries that print a summary after the run:
// it prints the usual console table and keeps each benchmark's times for the summary.
#ifndef WARDEN_BENCH_REPORTING_H_
#define WARDEN_BENCH_REPORTING_H_

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/workloads.h"

namespace warden::bench {

struct Ns {
  double real = -1, cpu = -1;
};

// The console reporter, also keeping each benchmark's per-repetition times (ns).
class RecordingReporter : public benchmark::ConsoleReporter {
 public:
  RecordingReporter() : ConsoleReporter(OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& reports) override {
    ConsoleReporter::ReportRuns(reports);
    for (const Run& r : reports) {
      if (r.error_occurred) continue;
      const double to_ns = 1e9 / benchmark::GetTimeUnitMultiplier(r.time_unit);
      const Ns ns{r.GetAdjustedRealTime() * to_ns, r.GetAdjustedCPUTime() * to_ns};
      if (r.run_type == Run::RT_Iteration) {
        real_[r.run_name.str()].push_back(ns.real);
        cpu_[r.run_name.str()].push_back(ns.cpu);
      } else if (r.aggregate_name == "median") {
        // With --benchmark_report_aggregates_only the repetitions themselves are not reported.
        medians_[r.run_name.str()] = ns;
      }
    }
  }

  // Median over repetitions; negative when the benchmark did not run (filtered out or failed).
  Ns MedianNs(const std::string& name) const {
    if (auto it = medians_.find(name); it != medians_.end()) return it->second;
    if (real_.count(name) == 0) return {};
    return {Median(real_.at(name)), Median(cpu_.at(name))};
  }

 private:
  std::map<std::string, std::vector<double>> real_, cpu_;
  std::map<std::string, Ns> medians_;
};

struct PairTiming {
  Ns eager, warden;
};

inline double ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// Per-call ns of `eager` and `warden`, measured in alternating rounds (which one goes first
// alternates too); the median of the rounds' per-call means is robust to the other jobs sharing
// the machine, where Google Benchmark's back-to-back runs drift by 10-20%.
template <typename Eager, typename Warden>
PairTiming Interleaved(int rounds, int calls_per_round, Eager eager, Warden warden) {
  using Clock = std::chrono::steady_clock;
  auto time = [&](auto& body, std::vector<double>* real, std::vector<double>* cpu) {
    const double c0 = ThreadCpuNs();
    const auto t0 = Clock::now();
    for (int i = 0; i < calls_per_round; ++i) body();
    const auto t1 = Clock::now();
    const double c1 = ThreadCpuNs();
    real->push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls_per_round);
    cpu->push_back((c1 - c0) / calls_per_round);
  };
  std::vector<double> er, ec, wr, wc;
  time(eager, &er, &ec);  // warm up both
  time(warden, &wr, &wc);
  er.clear(), ec.clear(), wr.clear(), wc.clear();
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      time(eager, &er, &ec);
      time(warden, &wr, &wc);
    } else {
      time(warden, &wr, &wc);
      time(eager, &er, &ec);
    }
  }
  return {{Median(er), Median(ec)}, {Median(wr), Median(wc)}};
}

// Removes every `--<name>=V` from argv (Google Benchmark rejects flags it does not know) and
// returns the last V, or `fallback` if there was none.
inline std::string TakeFlag(int* argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  std::string value = fallback;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) != 0) continue;
    value = argv[i] + prefix.size();
    for (int j = i; j + 1 < *argc; ++j) argv[j] = argv[j + 1];
    --*argc;
    --i;
  }
  return value;
}

// Removes `--summary_rounds=N` (rounds of the interleaved summary; 0 skips it) from argv and
// returns N (or `default_rounds`).
inline int TakeSummaryRounds(int* argc, char** argv, int default_rounds) {
  return std::atoi(TakeFlag(argc, argv, "summary_rounds", std::to_string(default_rounds)).c_str());
}

}  // namespace warden::bench

#endif  // WARDEN_BENCH_REPORTING_H_
