// The shared kernel cache on Redis (remote_cache.h). hiredis formats commands and parses replies;
// the socket is Warden's own (non-blocking, polled against one deadline per operation, written with
// MSG_NOSIGNAL so a server that went away never raises SIGPIPE in the host).
#include "runtime/remote_cache.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/kernel_entry.h"
#include "runtime/logging.h"
#include "tracer/status.h"

namespace warden::codegen {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int64_t> num_gets{0}, num_hits{0}, num_puts{0}, num_failures{0}, num_skipped{0};

constexpr auto kRetryAfter = std::chrono::seconds(10);

int TimeoutMs() {
  constexpr int kDefault = 500;
  const char* env = std::getenv("WARDEN_REMOTE_CACHE_TIMEOUT_MS");
  int v = 0;
  if (env == nullptr || *env == '\0') return kDefault;
  if (absl::SimpleAtoi(env, &v) && v > 0 && v <= 60000) return v;
  runtime::WarnOnce(absl::StrCat("remote-timeout-", env),
                    absl::StrCat("warden: WARDEN_REMOTE_CACHE_TIMEOUT_MS='", runtime::EscapeControl(env),
                                 "' is not a number of milliseconds in [1, 60000]; using ", kDefault));
  return kDefault;
}

struct Url {
  std::string host;
  std::string port;
  int db = 0;
};

absl::StatusOr<Url> ParseUrl(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("WARDEN_REMOTE_CACHE='", runtime::EscapeControl(url), "': ", why,
                                                   " (expected redis://HOST:PORT[/DB])"));
  };
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "redis://")) return bad("not a redis:// URL");
  Url u;
  const size_t slash = rest.find('/');
  if (slash != absl::string_view::npos) {
    if (!absl::SimpleAtoi(rest.substr(slash + 1), &u.db) || u.db < 0 || u.db > 1000000) return bad("bad database number");
    rest = rest.substr(0, slash);
  }
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return bad("no host and port");
  u.host = std::string(rest.substr(0, colon));
  int port = 0;
  if (!absl::SimpleAtoi(rest.substr(colon + 1), &port) || port <= 0 || port > 65535) return bad("bad port");
  u.port = std::to_string(port);
  for (char c : u.host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) return bad("bad host");
  }
  return u;
}

struct Deadline {
  Clock::time_point at;
  int RemainingMs() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
    return left > 0 ? static_cast<int>(left) : 0;
  }
};

absl::Status Timeout(const char* what) {
  return absl::UnavailableError(absl::StrCat("timed out ", what, " (WARDEN_REMOTE_CACHE_TIMEOUT_MS=", TimeoutMs(), ")"));
}

bool Poll(int fd, short events, const Deadline& d) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, d.RemainingMs());
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

// One connection to one server. Callers hold `mu`.
struct Server {
  struct Address {
    int family, socktype, protocol;
    sockaddr_storage addr;
    socklen_t len;
  };
  std::mutex mu;
  int fd = -1;
  pid_t pid = 0;                    // the process that opened fd (a forked child reconnects)
  std::vector<Address> addresses;   // resolved once: name resolution is outside any deadline
  Clock::time_point down_until{};
  void Close() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

absl::Status Resolve(Server& s, const Url& u) {
  if (!s.addresses.empty()) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", u.host, ": ", gai_strerror(rc)));
  }
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Server::Address addr{a->ai_family, a->ai_socktype, a->ai_protocol, {}, a->ai_addrlen};
    std::memcpy(&addr.addr, a->ai_addr, a->ai_addrlen);
    s.addresses.push_back(addr);
  }
  freeaddrinfo(found);
  return absl::OkStatus();
}

absl::Status Connect(Server& s, const Url& u, const Deadline& d) {
  RETURN_IF_ERROR(Resolve(s, u));
  std::string last = "no address";
  for (const Server::Address& a : s.addresses) {
    const int fd = socket(a.family, a.socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.protocol);
    if (fd < 0) continue;
    // EINTR: the connection still completes asynchronously, as with EINPROGRESS.
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0 && errno != EINPROGRESS &&
        errno != EINTR) {
      last = std::strerror(errno);
      close(fd);
      continue;
    }
    if (!Poll(fd, POLLOUT, d)) {
      close(fd);
      return Timeout("connecting");
    }
    int error = 0;
    socklen_t len = sizeof(error);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      last = std::strerror(error != 0 ? error : errno);
      close(fd);
      continue;
    }
    s.fd = fd;
    s.pid = getpid();
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat("cannot connect to ", u.host, ":", u.port, ": ", last));
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// Sends one command and reads its reply, all before `d`.
absl::StatusOr<Reply> Command(Server& s, const std::vector<std::string>& argv, const Deadline& d) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  char* formatted = nullptr;
  const auto length = redisFormatCommandArgv(&formatted, static_cast<int>(args.size()), args.data(), lens.data());
  if (length < 0 || formatted == nullptr) return absl::InternalError("cannot format a Redis command");
  std::unique_ptr<char, void (*)(char*)> cmd(formatted, redisFreeCommand);
  size_t sent = 0;
  while (sent < static_cast<size_t>(length)) {
    const ssize_t n = send(s.fd, formatted + sent, static_cast<size_t>(length) - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!Poll(s.fd, POLLOUT, d)) return Timeout("sending");
      continue;
    }
    return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
  }
  std::unique_ptr<redisReader, void (*)(redisReader*)> reader(redisReaderCreate(), redisReaderFree);
  if (reader == nullptr) return absl::ResourceExhaustedError("cannot allocate a Redis reader");
  int64_t received = 0;
  char buf[65536];
  for (;;) {
    void* reply = nullptr;
    if (redisReaderGetReply(reader.get(), &reply) != REDIS_OK) {
      return absl::DataLossError(absl::StrCat("protocol error: ", reader->errstr));
    }
    if (reply != nullptr) return Reply(static_cast<redisReply*>(reply));
    if (!Poll(s.fd, POLLIN, d)) return Timeout("waiting for the reply");
    const ssize_t n = recv(s.fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    if (n == 0) {
      return absl::UnavailableError(received == 0 ? "the server closed the connection"
                                                  : "the server closed the connection mid-reply");
    }
    // Warden's commands answer with one bulk string, nil, status or error: an array (whose
    // elements hiredis would allocate before a single byte of them arrived) is refused.
    if (received == 0 && buf[0] == '*') return absl::DataLossError("protocol error: unexpected array reply");
    received += n;
    if (received > kMaxEntryBytes + 64) {
      return absl::DataLossError(absl::StrCat("size: the reply passed ", kMaxEntryBytes, " bytes"));
    }
    if (redisReaderFeed(reader.get(), buf, static_cast<size_t>(n)) != REDIS_OK) {
      return absl::DataLossError("protocol error");
    }
  }
}

std::mutex servers_mu;
std::map<std::string, std::unique_ptr<Server>>* servers = new std::map<std::string, std::unique_ptr<Server>>();

Server& ServerFor(const std::string& url) {
  std::lock_guard<std::mutex> lock(servers_mu);
  auto& s = (*servers)[url];
  if (s == nullptr) s = std::make_unique<Server>();
  return *s;
}

// Runs `argv` on the server at `url` under one deadline, connecting (and selecting the database)
// first if needed. A failure closes the connection and marks the server down for kRetryAfter.
absl::StatusOr<Reply> Run(const std::string& url, const std::vector<std::string>& argv) {
  auto parsed = ParseUrl(url);
  if (!parsed.ok()) {
    runtime::WarnOnce(absl::StrCat("remote-url-", url),
                      absl::StrCat("warden: ", parsed.status().message(), "; the shared kernel cache is off"));
    return parsed.status();
  }
  const Url& u = *parsed;
  Server& s = ServerFor(url);
  std::lock_guard<std::mutex> lock(s.mu);
  if (Clock::now() < s.down_until) {
    num_skipped.fetch_add(1);
    return absl::UnavailableError("the server failed less than 10 s ago");
  }
  const Deadline d{Clock::now() + std::chrono::milliseconds(TimeoutMs())};
  if (s.fd >= 0 && s.pid != getpid()) {
    // Inherited through fork(): the connection is the parent's; this process opens its own.
    close(s.fd);
    s.fd = -1;
  }
  auto attempt = [&]() -> absl::StatusOr<Reply> {
    if (s.fd < 0) {
      RETURN_IF_ERROR(Connect(s, u, d));
      if (u.db != 0) {
        ASSIGN_OR_RETURN(Reply r, Command(s, {"SELECT", std::to_string(u.db)}, d));
        if (r->type == REDIS_REPLY_ERROR) return absl::UnavailableError(absl::StrCat("SELECT: ", r->str));
      }
    }
    return Command(s, argv, d);
  };
  const bool reused = s.fd >= 0;
  auto reply = attempt();
  if (!reply.ok() && reused &&
      (reply.status().message() == "the server closed the connection" ||
       absl::StartsWith(reply.status().message(), "send: "))) {
    // An idle connection the server (or a NAT) dropped: once more on a fresh one, same deadline.
    s.Close();
    reply = attempt();
  }
  if (!reply.ok()) {
    s.Close();
    s.down_until = Clock::now() + kRetryAfter;
    num_failures.fetch_add(1);
    runtime::WarnOnce(absl::StrCat("remote-", url, "-", reply.status().code()),
                      absl::StrCat("warden: remote kernel cache ", runtime::EscapeControl(url), ": ",
                                   runtime::EscapeControl(std::string(reply.status().message())),
                                   "; compiling locally (retrying the server after 10 s)"));
  }
  return reply;
}

std::string RedisKey(const std::string& key) { return absl::StrCat("warden:kernel:v1:", key); }

}  // namespace

absl::StatusOr<std::optional<std::string>> RemoteGet(const std::string& url, const std::string& key) {
  num_gets.fetch_add(1);
  // GETRANGE bounds what an honest server sends; the reader bounds what any server can.
  ASSIGN_OR_RETURN(Reply r, Run(url, {"GETRANGE", RedisKey(key), "0", std::to_string(kMaxEntryBytes)}));
  if (r->type == REDIS_REPLY_ERROR) return absl::UnavailableError(absl::StrCat("GETRANGE: ", r->str));
  if (r->type == REDIS_REPLY_NIL) return std::nullopt;
  if (r->type != REDIS_REPLY_STRING) return absl::DataLossError("unexpected reply type");
  if (r->len == 0) return std::nullopt;  // GETRANGE of a missing key is ""
  num_hits.fetch_add(1);
  return std::string(r->str, r->len);
}

absl::Status RemotePut(const std::string& url, const std::string& key, const std::string& entry, bool replace) {
  std::vector<std::string> argv = {"SET", RedisKey(key), entry};
  if (!replace) argv.push_back("NX");
  ASSIGN_OR_RETURN(Reply r, Run(url, argv));
  if (r->type == REDIS_REPLY_ERROR) return absl::UnavailableError(absl::StrCat("SET: ", r->str));
  num_puts.fetch_add(1);
  return absl::OkStatus();
}

RemoteCacheStats GetRemoteCacheStats() {
  RemoteCacheStats s;
  s.gets = num_gets.load();
  s.hits = num_hits.load();
  s.puts = num_puts.load();
  s.failures = num_failures.load();
  s.skipped = num_skipped.load();
  return s;
}

void ResetRemoteCacheForTesting() {
  std::lock_guard<std::mutex> lock(servers_mu);
  for (auto& [url, s] : *servers) {
    std::lock_guard<std::mutex> l(s->mu);
    s->Close();
    s->down_until = {};
  }
}

}  // namespace warden::codegen
