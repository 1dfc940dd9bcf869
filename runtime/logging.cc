#include "runtime/logging.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "runtime/private_files.h"

namespace warden::runtime {
namespace {
std::mutex& LogMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
}  // namespace

LogTopics LogTopics::Parse(const std::string& spec) {
  LogTopics t;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::string topic = absl::AsciiStrToLower(absl::StripAsciiWhitespace(part));
    if (!topic.empty() && topic[0] == '+') topic.erase(0, 1);
    if (topic == "recompiles") t.recompiles = true;
    if (topic == "graph" || topic == "graph_code") t.graph = true;
    if (topic == "guards") t.guards = true;
    if (topic == "output_code") t.output_code = true;
    if (topic == "all") t.recompiles = t.graph = t.guards = t.output_code = true;
  }
  return t;
}

LogTopics LogTopics::FromEnv() {
  const char* spec = std::getenv("WARDEN_LOGS");
  return spec == nullptr ? LogTopics{} : Parse(spec);
}

std::string EscapeControl(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Whether `bytes` more fit in stderr under RLIMIT_FSIZE: past it the kernel raises SIGXFSZ, whose
// default action kills the host. Only a regular file has a size to exceed.
bool StderrHasRoomFor(size_t bytes) {
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0 || !S_ISREG(st.st_mode)) return true;
  const off_t offset = lseek(STDERR_FILENO, 0, SEEK_CUR);
  return files::WithinFileSizeLimit(std::max<int64_t>(offset, st.st_size) + static_cast<int64_t>(bytes) + 1);
}

void LogToStderr(const std::string& text) {
  std::lock_guard<std::mutex> lock(LogMutex());
  std::fflush(stderr);
  if (!StderrHasRoomFor(text.size())) return;
  std::fwrite(text.data(), 1, text.size(), stderr);
  if (text.empty() || text.back() != '\n') std::fputc('\n', stderr);
  std::fflush(stderr);
}

void WarnOnce(const std::string& key, const std::string& text) {
  static std::set<std::string>* seen = new std::set<std::string>();
  {
    std::lock_guard<std::mutex> lock(LogMutex());
    if (!seen->insert(key).second) return;
  }
  LogToStderr(text);
}

}  // namespace warden::runtime
