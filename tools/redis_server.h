// A redis-server of Debian's package on a free loopback port, persisting nothing, for the shared
// kernel cache's tests and benchmark (Note [Shared kernels]). Stopped (SIGTERM) when destroyed.
#ifndef WARDEN_TOOLS_REDIS_SERVER_H_
#define WARDEN_TOOLS_REDIS_SERVER_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace warden::tools {

// A TCP socket bound to a free loopback port (`*port`); the caller closes it.
inline int BindLoopback(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

inline int FreeLoopbackPort() {
  int port = 0;
  close(BindLoopback(&port));
  return port;
}

class LocalRedisServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/redis-server";

  // Starts the server with its working directory `dir` and its log in dir/redis.log; ok() says
  // whether it answers PING (within 5 s).
  explicit LocalRedisServer(const std::string& dir) : port_(FreeLoopbackPort()), log_(dir + "/redis.log") {
    if (access(kBinary, X_OK) != 0) return;
    const std::string port = std::to_string(port_);
    const char* argv[] = {kBinary, "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", dir.c_str(), nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    if (posix_spawn(&pid_, kBinary, &actions, nullptr, const_cast<char**>(argv), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    for (int i = 0; i < 200 && pid_ > 0 && !Command({"PING"}); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  ~LocalRedisServer() { Kill(SIGTERM); }
  LocalRedisServer(const LocalRedisServer&) = delete;
  LocalRedisServer& operator=(const LocalRedisServer&) = delete;

  bool ok() const { return pid_ > 0 && Command({"PING"}); }
  const std::string& log() const { return log_; }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // Runs one command (binary-safe arguments); the reply's string or elements, through `out` if
  // given. False if the server did not answer or answered with an error.
  bool Command(const std::vector<std::string>& args, std::vector<std::string>* out = nullptr) const {
    redisContext* c = redisConnect("127.0.0.1", port_);
    bool ok = false;
    if (c != nullptr && c->err == 0) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (const std::string& a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()))) {
        ok = r->type != REDIS_REPLY_ERROR;
        if (out != nullptr && r->type == REDIS_REPLY_STRING) out->emplace_back(r->str, r->len);
        if (out != nullptr && r->type == REDIS_REPLY_ARRAY) {
          for (size_t i = 0; i < r->elements; ++i) out->emplace_back(r->element[i]->str, r->element[i]->len);
        }
        freeReplyObject(r);
      }
    }
    if (c != nullptr) redisFree(c);
    return ok;
  }

 private:
  int port_;
  std::string log_;
  pid_t pid_ = -1;
};

}  // namespace warden::tools

#endif  // WARDEN_TOOLS_REDIS_SERVER_H_
