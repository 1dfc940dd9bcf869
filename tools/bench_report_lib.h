// tools/bench_report: Google Benchmark JSON (from //bench:all) to the Markdown table of ratios the
// README embeds. The library part, so that tests can run it on fixed input.
//
// Benchmark names are <group>/<workload>/<path>[/real_time][/threads:N]..., path = eager, aten,
// cpp, or an extra reference (copy). One row per workload (and thread count), in the order of the
// JSON: the three paths' times, each Warden path's speedup over eager (eager / Warden: above 1 is
// faster than eager) and notes (other paths, throughput, counters such as compiles, errors).
// Times are CPU time unless the benchmark measured real time (name part real_time) or
// `clock == "real"`; with repetitions the median is used (the "median" aggregate when present).
#ifndef WARDEN_TOOLS_BENCH_REPORT_LIB_H_
#define WARDEN_TOOLS_BENCH_REPORT_LIB_H_

#include <string>

#include <nlohmann/json.hpp>

namespace warden::tools {

struct ReportOptions {
  std::string clock = "cpu";  // "cpu" or "real": the time of benchmarks that did not use real time
  std::string blas;           // used when the JSON context has no "blas" entry
};

// The Markdown report: a header line (date, machine, BLAS, LibTorch, threads), the table, and a
// line saying how to read it. Throws std::runtime_error if `json` has no "benchmarks" array.
std::string MarkdownReport(const nlohmann::json& json, const ReportOptions& options);

// "5.33 µs", "431 ns", "33.3 s": three significant digits in the largest unit that keeps >= 1.
std::string FormatNs(double ns);

}  // namespace warden::tools

#endif  // WARDEN_TOOLS_BENCH_REPORT_LIB_H_
