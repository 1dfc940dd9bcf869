// Note [Spawning from a host] in subprocess.h.
#include "runtime/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace warden::subprocess {
namespace {

// The kernel's struct sigaction (x86-64 and AArch64 lay it out alike); glibc's differs.
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  unsigned long mask;
};

struct ChildSpec {
  const char* path;
  char* const* argv;
  char* const* envp;
  int out_fd;     // becomes stdout and stderr
  int status_fd;  // close-on-exec; receives Reports
};

// What the helper process reports on the status pipe.
struct Report {
  int kind;   // kExecFailed (value: errno) or kExited (value: wait status)
  int value;
};
constexpr int kExecFailed = 1, kExited = 2;
constexpr int kStatusFd = 3;

#define WARDEN_RAW_CHILD __attribute__((no_sanitize("address", "thread", "undefined"), noinline))

WARDEN_RAW_CHILD void RawExit(int code) {
  for (;;) syscall(SYS_exit, code);
}

WARDEN_RAW_CHILD void SendReport(int kind, int value) {
  const Report r{kind, value};
  syscall(SYS_write, kStatusFd, &r, sizeof(r));
}

// The helper: a copy of the host (fork without an exit signal), single-threaded, making raw
// system calls only. It resets signals, sets up descriptors, forks the compiler, waits for it
// with SIGCHLD at its default and reports how it ended.
WARDEN_RAW_CHILD void HelperMain(const ChildSpec* spec) {
  for (int sig = 1; sig <= 64; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    KernelSigaction old;
    if (syscall(SYS_rt_sigaction, sig, nullptr, &old, sizeof(unsigned long)) != 0) continue;
    // SIGCHLD always: SA_NOCLDWAIT auto-reaps even with the default handler.
    if (old.handler == SIG_DFL && sig != SIGCHLD) continue;
    if (old.handler == SIG_IGN && sig != SIGCHLD && sig != SIGPIPE && sig != SIGXFSZ) continue;
    KernelSigaction dfl;
    dfl.handler = SIG_DFL;
    dfl.flags = 0;
    dfl.restorer = nullptr;
    dfl.mask = 0;
    syscall(SYS_rt_sigaction, sig, &dfl, nullptr, sizeof(unsigned long));
  }
  syscall(SYS_setpgid, 0, 0);
  const long null_fd = syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY);
  if (null_fd < 0) RawExit(127);
  if (null_fd != 0 && syscall(SYS_dup3, null_fd, 0, 0) < 0) RawExit(127);
  if (syscall(SYS_dup3, spec->out_fd, 1, 0) < 0 || syscall(SYS_dup3, spec->out_fd, 2, 0) < 0) RawExit(127);
  if (spec->status_fd != kStatusFd && syscall(SYS_dup3, spec->status_fd, kStatusFd, O_CLOEXEC) < 0) {
    RawExit(127);
  }
#ifdef SYS_close_range
  if (syscall(SYS_close_range, kStatusFd + 1, ~0U, 0) != 0)
#endif
  {
    struct KernelRlimit {
      unsigned long long cur, max;
    } nofile = {65536, 65536};
    syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, nullptr, &nofile);
    const unsigned long long last = nofile.cur > (1ull << 20) ? (1ull << 20) : nofile.cur;
    for (unsigned long long fd = kStatusFd + 1; fd < last; ++fd) syscall(SYS_close, fd);
  }
  unsigned long empty_mask = 0;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty_mask, nullptr, sizeof(unsigned long));
  const long pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);  // fork
  if (pid == 0) {
    syscall(SYS_execve, spec->path, spec->argv, spec->envp);
    SendReport(kExecFailed, errno);
    RawExit(127);
  }
  if (pid < 0) {
    SendReport(kExecFailed, errno);
    RawExit(127);
  }
  int status = 0;
  while (syscall(SYS_wait4, pid, &status, 0, nullptr) < 0) {
    if (errno != EINTR) RawExit(127);
  }
  SendReport(kExited, status);
  RawExit(0);
}

// Forks the helper. Its exit signal is 0, so the host's SIGCHLD setup never reaps it (it never
// execs, which would reset the exit signal to SIGCHLD).
WARDEN_RAW_CHILD long ForkHelper(const ChildSpec* spec) {
  const long pid = syscall(SYS_clone, 0, 0, 0, 0, 0);
  if (pid == 0) HelperMain(spec);
  return pid;
}

// A close-on-exec pipe whose ends are not 0, 1 or 2 (a host may have closed its stdio).
bool Pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  for (int i = 0; i < 2; ++i) {
    if (fds[i] > 2) continue;
    const int moved = fcntl(fds[i], F_DUPFD_CLOEXEC, kStatusFd);
    close(fds[i]);
    fds[i] = moved;
  }
  if (fds[0] < 0 || fds[1] < 0) {
    if (fds[0] >= 0) close(fds[0]);
    if (fds[1] >= 0) close(fds[1]);
    return false;
  }
  return true;
}

void Kill(pid_t pid) {
  kill(-pid, SIGKILL);  // the process group: the driver and whatever it started
  kill(pid, SIGKILL);
}

void Reap(pid_t pid) {
  while (waitpid(pid, nullptr, __WALL) < 0 && errno == EINTR) {
  }
}

// A wait status as an exit code: 128 + signal if killed by one.
int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

absl::StatusOr<Result> Run(const std::vector<std::string>& args, double timeout_seconds, size_t max_output) {
  if (args.empty()) return absl::InvalidArgumentError("subprocess::Run: empty argv");
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(std::max(timeout_seconds, 0.0)));
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  int out[2], status[2];
  if (!Pipe(out)) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  if (!Pipe(status)) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  ChildSpec spec{argv[0], argv.data(), environ, out[1], status[1]};

  Result result;
  result.output.reserve(max_output);  // no allocation while the helper runs
  pid_t pid = -1;
  int fork_error = 0;
  {
    // Every signal is blocked across the fork, so no host handler runs in the helper before it
    // has reset them; it unblocks them before forking the compiler.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = static_cast<pid_t>(ForkHelper(&spec));
    fork_error = errno;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  close(out[1]);
  close(status[1]);
  if (pid < 0) {
    close(out[0]);
    close(status[0]);
    return absl::FailedPreconditionError(absl::StrCat("cannot run ", args[0], ": ", std::strerror(fork_error)));
  }
  // The helper makes itself a group leader too; doing it here as well means a kill of the group
  // reaches whatever it starts, however early the timeout comes.
  setpgid(pid, pid);

  bool truncated = false, timed_out = false;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // end of output
    const size_t keep = std::min(static_cast<size_t>(n), max_output - std::min(max_output, result.output.size()));
    result.output.append(buf, keep);
    truncated |= keep < static_cast<size_t>(n);
  }
  close(out[0]);
  // The output is closed; the exit follows at once, unless something hangs on after closing it.
  // WNOWAIT: the helper stays a zombie, so its pid (the group's id) cannot be reused before the
  // group is killed below.
  while (!timed_out) {
    siginfo_t info{};
    const int r = waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT | __WALL);
    if (r == 0 && info.si_pid == pid) break;
    if (r < 0 && errno != EINTR) {
      const std::string error = std::strerror(errno);
      close(status[0]);
      Kill(pid);
      return absl::InternalError(absl::StrCat("waitid: ", error));
    }
    if (Clock::now() >= deadline) {
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  Kill(pid);  // the group: anything the compiler left behind (or everything, on a timeout)
  Reap(pid);
  if (timed_out) {
    close(status[0]);
    return absl::DeadlineExceededError(
        absl::StrCat(args[0], " did not finish within ", timeout_seconds, " s and was killed"));
  }
  // The helper has exited: its reports are all in the pipe. Non-blocking: a descriptor copy in
  // some other process (a host thread's fork) must not make this wait.
  fcntl(status[0], F_SETFL, fcntl(status[0], F_GETFL) | O_NONBLOCK);
  Report reports[2];
  size_t got = 0;
  for (;;) {
    const ssize_t n = read(status[0], reinterpret_cast<char*>(reports) + got, sizeof(reports) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(status[0]);
  bool exited = false;
  for (size_t i = 0; i < got / sizeof(Report); ++i) {
    if (reports[i].kind == kExecFailed) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot run ", args[0], ": ", std::strerror(reports[i].value)));
    }
    if (reports[i].kind == kExited) {
      result.exit_code = ExitCode(reports[i].value);
      exited = true;
    }
  }
  if (!exited) return absl::InternalError(absl::StrCat("cannot run ", args[0], ": the spawning helper failed"));
  if (truncated) absl::StrAppend(&result.output, "\n[...]");
  return result;
}

}  // namespace warden::subprocess
