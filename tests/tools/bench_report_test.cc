// tools/bench_report: a fixed Google Benchmark JSON (testdata/bench_report_input.json: plain runs,
// an error, repetitions with and without a median aggregate, a real-time sweep with counters and a
// label, multi-thread runs, a copy reference) against the golden Markdown
// (testdata/bench_report_expected.md). To update the golden after an intended change:
//   bazel run //tools:bench_report -- tests/tools/testdata/bench_report_input.json \
//     > tests/tools/testdata/bench_report_expected.md
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/bench_report_lib.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

constexpr const char* kDir = "tests/tools/testdata/";

TEST(BenchReportTest, MatchesGolden) {
  const nlohmann::json input = nlohmann::json::parse(ReadFile(std::string(kDir) + "bench_report_input.json"));
  EXPECT_EQ(warden::tools::MarkdownReport(input, {}), ReadFile(std::string(kDir) + "bench_report_expected.md"));
}

TEST(BenchReportTest, RealClockUsesRealTimeEverywhere) {
  const nlohmann::json input = nlohmann::json::parse(R"({"benchmarks": [
    {"name": "g/w/eager", "run_name": "g/w/eager", "run_type": "iteration", "threads": 1,
     "real_time": 200.0, "cpu_time": 100.0, "time_unit": "ns"},
    {"name": "g/w/aten", "run_name": "g/w/aten", "run_type": "iteration", "threads": 1,
     "real_time": 100.0, "cpu_time": 100.0, "time_unit": "ns"}]})");
  warden::tools::ReportOptions options;
  const std::string cpu = warden::tools::MarkdownReport(input, options);
  EXPECT_NE(cpu.find("| g/w | 100 ns | 100 ns |  | 1.00x |  |  |"), std::string::npos) << cpu;
  options.clock = "real";
  const std::string real = warden::tools::MarkdownReport(input, options);
  EXPECT_NE(real.find("| g/w | 200 ns | 100 ns |  | 2.00x |  |  |"), std::string::npos) << real;
  // No context: the header says what is missing, --blas fills in the BLAS.
  options.blas = "OpenBLAS";
  EXPECT_EQ(warden::tools::MarkdownReport(input, options).rfind("Measured (date not recorded) on an unnamed host; "
                                                                "BLAS: OpenBLAS.", 0),
            0u);
}

TEST(BenchReportTest, FormatsTimes) {
  EXPECT_EQ(warden::tools::FormatNs(21.14), "21.1 ns");
  EXPECT_EQ(warden::tools::FormatNs(431), "431 ns");
  EXPECT_EQ(warden::tools::FormatNs(5330), "5.33 µs");
  EXPECT_EQ(warden::tools::FormatNs(1.9641e6), "1.96 ms");
  EXPECT_EQ(warden::tools::FormatNs(33.266e9), "33.3 s");
}

TEST(BenchReportTest, RejectsInputWithoutBenchmarks) {
  EXPECT_THROW(warden::tools::MarkdownReport(nlohmann::json::parse(R"({"context": {}})"), {}), std::runtime_error);
}

}  // namespace
