// The `warden` developer CLI.
//
//   warden report DIR [--out=FILE] [--text]   HTML report of a WARDEN_TRACE_DIR (default
//                                             DIR/report.html); --text prints it as plain text
//   warden explain FILE                       a saved explain_json() document, readably
//   warden package --out=FILE [--cache=DIR] [--trace=DIR]
//                                             the kernel cache (default: WARDEN_CACHE_DIR's, else
//                                             ~/.cache/warden/kernels) as one package for
//                                             WARDEN_PACKAGE, or only the kernels a run used (its
//                                             WARDEN_TRACE_DIR); entries tagged with the key of
//                                             WARDEN_CACHE_KEY_FILE (Note [Shared kernels])
//
// Under `bazel run`, relative paths are taken from the directory bazel was run in.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "runtime/codegen_compiler.h"
#include "runtime/kernel_entry.h"
#include "runtime/private_files.h"
#include "tools/report_lib.h"

ABSL_FLAG(std::string, out, "", "report: where to write the HTML (default DIR/report.html)");
ABSL_FLAG(bool, text, false, "report: print the plain-text report on stdout instead of writing HTML");
ABSL_FLAG(std::string, cache, "", "package: the kernel directory to package (default: the configured kernel cache)");
ABSL_FLAG(std::string, trace, "", "package: only the kernels the run traced into this WARDEN_TRACE_DIR used");

namespace {

constexpr const char* kUsage =
    "warden report DIR [--out=FILE] [--text] | warden explain FILE | warden package --out=FILE [--cache=DIR] [--trace=DIR]\n"
    "  report: the trace written with WARDEN_TRACE_DIR=DIR, as an HTML page or (--text) plain text\n"
    "  explain: a saved CompiledFunction::explain_json() document, printed readably\n"
    "  package: the kernel cache as one file for WARDEN_PACKAGE, tagged with WARDEN_CACHE_KEY_FILE's key";

std::string Resolve(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "warden: %s\n", message.c_str());
  return 1;
}

int Report(const std::string& dir) {
  auto trace = warden::report::LoadTrace(dir);
  if (!trace.ok()) return Fail(std::string(trace.status().message()));
  if (absl::GetFlag(FLAGS_text)) {
    std::fputs(warden::report::TextReport(*trace).c_str(), stdout);
    return 0;
  }
  const std::string out = absl::GetFlag(FLAGS_out).empty() ? absl::StrCat(dir, "/report.html")
                                                            : Resolve(absl::GetFlag(FLAGS_out));
  const std::string dot = warden::report::FindDot();
  std::ofstream file(out);
  file << warden::report::HtmlReport(*trace, dot);
  file.close();
  if (!file) return Fail(absl::StrCat("cannot write ", out));
  std::printf("wrote %s (%zu functions, %lld events; graphs %s)\n", out.c_str(), trace->functions.size(),
              static_cast<long long>(trace->num_events), dot.empty() ? "as text: Graphviz dot not found" : "as SVG");
  return 0;
}

int Explain(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Fail(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto out = warden::report::ExplainText(text.str());
  if (!out.ok()) return Fail(absl::StrCat(path, ": ", out.status().message()));
  std::fputs(out->c_str(), stdout);
  return 0;
}

int Package() {
  const std::string out = Resolve(absl::GetFlag(FLAGS_out));
  if (out.empty()) return Fail("package: --out=FILE is required");
  const std::string dir =
      absl::GetFlag(FLAGS_cache).empty() ? warden::codegen::KernelCacheDir() : Resolve(absl::GetFlag(FLAGS_cache));
  std::optional<std::string> key;
  const char* key_file = std::getenv("WARDEN_CACHE_KEY_FILE");
  if (key_file != nullptr && *key_file != '\0') {
    auto read = warden::codegen::ReadKeyFile(key_file);
    if (!read.ok()) return Fail(absl::StrCat("package: ", read.status().message()));
    key = *std::move(read);
  } else {
    std::fprintf(stderr, "warden: package: no WARDEN_CACHE_KEY_FILE: the entries are not authenticated; hosts "
                         "load them only with WARDEN_CACHE_UNAUTHENTICATED=1 and from a private file\n");
  }
  std::set<std::string> used;
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    auto keys = warden::report::KernelKeysUsed(Resolve(absl::GetFlag(FLAGS_trace)));
    if (!keys.ok()) return Fail(absl::StrCat("package: ", keys.status().message()));
    used = *std::move(keys);
    if (used.empty()) return Fail("package: the trace records no kernel library (was the backend \"cpp\"?)");
  }
  int count = 0;
  std::vector<std::string> skipped;
  auto bytes = warden::codegen::BuildPackage(dir, key, &count, &skipped, used.empty() ? nullptr : &used);
  if (!bytes.ok()) return Fail(absl::StrCat("package: ", bytes.status().message()));
  for (const std::string& s : skipped) std::fprintf(stderr, "warden: package: skipped %s\n", s.c_str());
  if (auto written = warden::files::WritePrivateFile(out, *bytes); !written.ok()) {
    return Fail(absl::StrCat("package: cannot write ", out, ": ", written.message()));
  }
  std::printf("wrote %s: %d kernel librar%s from %s (%zu bytes, %s)\n", out.c_str(), count, count == 1 ? "y" : "ies",
              dir.c_str(), bytes->size(), key.has_value() ? "HMAC-SHA256 tagged" : "untagged");
  return count > 0 ? 0 : Fail("package: no kernel libraries to package");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() == 3 && std::string(args[1]) == "report") return Report(Resolve(args[2]));
  if (args.size() == 3 && std::string(args[1]) == "explain") return Explain(Resolve(args[2]));
  if (args.size() == 2 && std::string(args[1]) == "package") return Package();
  std::fprintf(stderr, "usage: %s\n", kUsage);
  return 2;
}
