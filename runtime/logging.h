// WARDEN_LOGS: a comma-separated list of topics ("recompiles", "graph", "guards", "output_code",
// "all"), read when a function is compiled. Output goes to stderr in the formats of ../shared/API.md.
#ifndef WARDEN_RUNTIME_LOGGING_H_
#define WARDEN_RUNTIME_LOGGING_H_

#include <string>

namespace warden::runtime {

struct LogTopics {
  bool recompiles = false;
  bool graph = false;
  bool guards = false;
  bool output_code = false;  // generated C++ of backend "cpp" and its library path

  static LogTopics FromEnv();                         // reads WARDEN_LOGS now
  static LogTopics Parse(const std::string& spec);    // "recompiles,graph"
};

// Writes one message to stderr atomically with respect to other Warden messages.
void LogToStderr(const std::string& text);

// `text` with every control character (newline, escape, DEL, ...) as \xNN: names and paths that
// reach stderr or explain() cannot forge log lines or terminal escapes.
std::string EscapeControl(const std::string& text);

// Prints `text` once per process for a given key (one-time warnings).
void WarnOnce(const std::string& key, const std::string& text);

}  // namespace warden::runtime

#endif  // WARDEN_RUNTIME_LOGGING_H_
