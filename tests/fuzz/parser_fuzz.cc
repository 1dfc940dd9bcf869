// libFuzzer-compatible target for the text Warden parses: WARDEN_LOGS specs
// (runtime::LogTopics::Parse), Google Benchmark JSON (tools/bench_report_lib.h), WARDEN_TRACE_DIR
// JSON-lines files and saved explain_json() documents (tools/report_lib.h). The kernel
// cache's files (compiler memo, cached libraries) are covered by the fault tests in
// tests/hostile_test.cc and tests/runtime/cpp_backend_test.cc instead: reading them spawns the
// compiler. With clang: clang++ -fsanitize=fuzzer,address parser_fuzz.cc ... runs it under
// libFuzzer; here parser_fuzz_test.cc drives it with seeded random mutations under g++.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/logging.h"
#include "tools/bench_report_lib.h"
#include "tools/report_lib.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  warden::runtime::LogTopics::Parse(text);  // never throws: unknown topics are ignored
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_discarded()) {
    try {
      warden::tools::MarkdownReport(json, {});
    } catch (const std::exception&) {
      // Documented: malformed input is a std::runtime_error (or a json type_error), not a crash.
    }
  }
  // A trace file may be cut anywhere (the process died) or hold anything; the report renders
  // what it can.
  try {
    const warden::report::Trace trace = warden::report::ParseTrace({{"fuzz.jsonl", text}});
    warden::report::TextReport(trace);
    warden::report::HtmlReport(trace, "");
  } catch (const std::exception&) {
  }
  try {
    warden::report::ExplainText(text).status().IgnoreError();
  } catch (const std::exception&) {
  }
  return 0;
}
