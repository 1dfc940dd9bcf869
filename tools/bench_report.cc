// Turns the Google Benchmark JSON of //bench:all into the Markdown table the README embeds
// (see tools/bench_report_lib.h for what the table shows).
//
//   bazel run -c opt //bench:all -- --benchmark_format=json > /tmp/bench.json
//   bazel run //tools:bench_report -- /tmp/bench.json [--clock=cpu|real] [--blas=NAME] > table.md
//
// Reads stdin when the file is "-" or missing. A relative path is taken relative to the directory
// `bazel run` was started in. --blas is used only when the JSON context has no "blas" entry (the
// suite records the libblas it loaded); without either, this tool resolves Debian's alternative
// /etc/alternatives/libblas.so.3-x86_64-linux-gnu on the machine it runs on.
#include <limits.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "tools/bench_report_lib.h"

namespace {

int Usage() {
  std::fprintf(stderr, "usage: bench_report [--clock=cpu|real] [--blas=NAME] [FILE|-]\n");
  return 2;
}

std::string DebianBlasAlternative() {
  char resolved[PATH_MAX];
  if (realpath("/etc/alternatives/libblas.so.3-x86_64-linux-gnu", resolved) == nullptr) return "";
  return std::string(resolved) + " (Debian alternative on the machine that made this report)";
}

}  // namespace

int main(int argc, char** argv) {
  warden::tools::ReportOptions options;
  std::string file = "-";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--clock=", 8) == 0) {
      options.clock = argv[i] + 8;
      if (options.clock != "cpu" && options.clock != "real") return Usage();
    } else if (std::strncmp(argv[i], "--blas=", 7) == 0) {
      options.blas = argv[i] + 7;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      return Usage();
    } else {
      file = argv[i];
    }
  }
  if (options.blas.empty()) options.blas = DebianBlasAlternative();
  nlohmann::json input;
  try {
    if (file == "-") {
      input = nlohmann::json::parse(std::cin);
    } else {
      const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
      if (file[0] != '/' && cwd != nullptr) file = std::string(cwd) + "/" + file;
      std::ifstream in(file);
      if (!in) {
        std::fprintf(stderr, "bench_report: cannot read %s\n", file.c_str());
        return 1;
      }
      input = nlohmann::json::parse(in);
    }
    std::cout << warden::tools::MarkdownReport(input, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_report: %s\n", e.what());
    return 1;
  }
  return 0;
}
