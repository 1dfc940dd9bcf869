#include "runtime/trace_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/logging.h"
#include "runtime/private_files.h"

namespace warden::runtime {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A new file of ours in `dir` (which may be shared, like /tmp): *path (warden-<pid>.jsonl) created
// with O_EXCL | O_NOFOLLOW, mode 0600, or, if that name is taken (a planted file or symlink, or a
// previous process with the same pid), an mkstemp name, then stored in *path. Never opens an
// existing file.
std::FILE* CreateLog(const std::string& dir, std::string* path) {
  int fd = ::open(path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    std::string name = absl::StrCat(dir, "/warden-", ::getpid(), "-XXXXXX.jsonl");
    fd = ::mkostemps(name.data(), 6, O_CLOEXEC);
    if (fd >= 0) *path = name;
  }
  if (fd < 0) return nullptr;
  std::FILE* file = ::fdopen(fd, "w");
  if (file == nullptr) ::close(fd);
  return file;
}

nlohmann::json Argv() {
  nlohmann::json argv = nlohmann::json::array();
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) argv.push_back(arg);
  return argv;
}

bool IsTensorKind(guards::GuardKind k) {
  switch (k) {
    case guards::GuardKind::kDtype:
    case guards::GuardKind::kDispatchKeys:
    case guards::GuardKind::kDevice:
    case guards::GuardKind::kLayout:
    case guards::GuardKind::kRequiresGrad:
    case guards::GuardKind::kRank:
    case guards::GuardKind::kSize:
    case guards::GuardKind::kSizeAtLeast:
    case guards::GuardKind::kStride:
      return true;
    default:
      return false;
  }
}

nlohmann::json GuardJson(const guards::Guard& g, const std::vector<std::string>& names) {
  nlohmann::json j = {{"kind", guards::GuardKindName(g.kind)},
                      {"text", guards::Describe(g, names)},
                      {"provenance", g.provenance}};
  if (g.arg >= 0) j["arg"] = g.arg;
  if (g.dim >= 0) j["dim"] = g.dim;
  return j;
}

}  // namespace

TraceLog* TraceLog::FromEnv() {
  const char* dir = std::getenv("WARDEN_TRACE_DIR");
  if (dir == nullptr || *dir == '\0') return nullptr;
  int64_t max_bytes = kDefaultMaxBytes;
  if (const char* cap = std::getenv("WARDEN_TRACE_MAX_BYTES")) {
    int64_t v = 0;
    if (absl::SimpleAtoi(cap, &v) && v > 0) max_bytes = v;
  }
  // One log per directory, alive until exit (events may come from any function's destructor).
  static std::mutex* mu = new std::mutex();
  static auto* logs = new std::map<std::string, std::unique_ptr<TraceLog>>();
  std::lock_guard<std::mutex> lock(*mu);
  std::unique_ptr<TraceLog>& log = (*logs)[dir];
  if (log == nullptr) log = std::make_unique<TraceLog>(dir, max_bytes);
  return log.get();
}

std::string TraceLog::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return path_;
}

bool TraceLog::OpenLocked() {
  if (file_ != nullptr) return true;
  if (failed_) return false;
  path_ = absl::StrCat(dir_, "/warden-", ::getpid(), ".jsonl");
  struct stat st;
  if (files::MakeDirs(dir_).ok() && ::stat(dir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    file_ = CreateLog(dir_, &path_);
  }
  if (file_ == nullptr) {
    failed_ = true;
    WarnOnce(absl::StrCat("trace-dir-", dir_),
             absl::StrCat("warden: WARDEN_TRACE_DIR: cannot write ", path_, ": ", std::strerror(errno),
                          "; no trace is written"));
    return false;
  }
  start_us_ = NowMicros();
  return true;
}

void TraceLog::Emit(const std::string& event, nlohmann::json fields) {
  std::lock_guard<std::mutex> lock(mu_);
  if (truncated_ || !OpenLocked()) return;
  auto write = [this](const std::string& type, nlohmann::json j) {
    j["event"] = type;
    j["seq"] = seq_++;
    j["t_us"] = NowMicros() - start_us_;
    j["pid"] = static_cast<int64_t>(::getpid());
    std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line.push_back('\n');
    // A write past RLIMIT_FSIZE would raise SIGXFSZ, which kills the host by default.
    if (!files::WithinFileSizeLimit(bytes_ + static_cast<int64_t>(line.size()))) {
      failed_ = truncated_ = true;
      WarnOnce(absl::StrCat("trace-fsize-", path_),
               absl::StrCat("warden: WARDEN_TRACE_DIR: ", path_,
                            " reached the file size limit (RLIMIT_FSIZE); trace stops here"));
      return size_t{0};
    }
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
      failed_ = truncated_ = true;
      WarnOnce(absl::StrCat("trace-write-", path_),
               absl::StrCat("warden: WARDEN_TRACE_DIR: write to ", path_, " failed; trace stops here"));
    }
    bytes_ += static_cast<int64_t>(line.size());
    return line.size();
  };
  if (seq_ == 0) write("trace_start", {{"argv", Argv()}, {"max_bytes", max_bytes_}});
  fields["event"] = event;  // so the size estimate includes it
  const int64_t size = static_cast<int64_t>(fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size()) + 64;
  if (bytes_ + size > max_bytes_) {
    truncated_ = true;
    write("truncated", {{"bytes", bytes_}, {"max_bytes", max_bytes_},
                        {"dropped_event", event},
                        {"note", "WARDEN_TRACE_MAX_BYTES reached: later events are not recorded"}});
    return;
  }
  write(event, std::move(fields));
}

nlohmann::json ArgsJson(const std::vector<c10::IValue>& args, const std::vector<std::string>& names) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& a = args[i];
    nlohmann::json j = {{"name", i < names.size() ? names[i] : absl::StrCat("arg", i)}};
    if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();
      if (!t.defined()) {
        j["type"] = "UndefinedTensor";
      } else {
        j["type"] = "Tensor";
        j["dtype"] = std::string(c10::toString(t.scalar_type()));
        j["sizes"] = t.sizes().vec();
        j["strides"] = t.strides().vec();
        j["device"] = t.device().str();
        j["requires_grad"] = t.requires_grad();
      }
    } else if (a.isInt()) {
      j["type"] = "Int";
      j["value"] = a.toInt();
    } else if (a.isDouble()) {
      j["type"] = "Double";
      j["value"] = a.toDouble();
    } else if (a.isBool()) {
      j["type"] = "Bool";
      j["value"] = a.toBool();
    } else {
      j["type"] = a.tagKind();
    }
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json GuardsJson(const std::vector<guards::Guard>& guards, const std::vector<std::string>& names) {
  nlohmann::json out = nlohmann::json::array();
  for (const guards::Guard& g : guards) out.push_back(GuardJson(g, names));
  return out;
}

nlohmann::json FailingGuardsJson(const std::vector<guards::Guard>& guards, const std::vector<c10::IValue>& args,
                                 const std::vector<std::string>& names) {
  nlohmann::json out = nlohmann::json::array();
  std::set<int> bad_type;  // arguments whose type guard failed, or that are missing
  for (const guards::Guard& g : guards) {
    if (g.arg >= static_cast<int>(args.size()) || g.other_arg >= static_cast<int>(args.size())) {
      bad_type.insert(g.arg);
      continue;
    }
    if (IsTensorKind(g.kind) && (bad_type.count(g.arg) || !args[g.arg].isTensor())) continue;
    std::string reason;
    try {
      reason = guards::FailureReason(g, args, names);
    } catch (const std::exception& e) {
      reason = absl::StrCat("(could not evaluate: ", e.what(), ")");
    }
    if (reason.empty()) continue;
    if (g.kind == guards::GuardKind::kArgType) bad_type.insert(g.arg);
    nlohmann::json j = GuardJson(g, names);
    j["reason"] = reason;
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace warden::runtime
