// A Google Benchmark reporter shared by the bench binaries that print a summary after the run:
// it prints the usual console table and keeps each benchmark's times for the summary.
#ifndef WARDEN_BENCH_REPORTING_H_
#define WARDEN_BENCH_REPORTING_H_

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

}  // namespace warden::bench

#endif  // WARDEN_BENCH_REPORTING_H_
