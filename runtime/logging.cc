#include "runtime/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

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

void LogToStderr(const std::string& text) {
  std::lock_guard<std::mutex> lock(LogMutex());
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
