// Note [Spawning from a host] in subprocess.h.
#include "runtime/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
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
  int status_fd;  // close-on-exec; receives errno if exec fails
};

constexpr int kStatusFd = 3;

#define WARDEN_RAW_CHILD __attribute__((no_sanitize("address", "thread", "undefined"), noinline))

// Raw system calls only: this runs in the parent's memory on a borrowed stack (see the Note).
WARDEN_RAW_CHILD int ChildMain(void* arg) {
  const ChildSpec* spec = static_cast<const ChildSpec*>(arg);
  for (int sig = 1; sig <= 64; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    KernelSigaction old;
    if (syscall(SYS_rt_sigaction, sig, nullptr, &old, sizeof(unsigned long)) != 0) continue;
    if (old.handler == SIG_DFL) continue;
    if (old.handler == SIG_IGN && sig != SIGCHLD && sig != SIGPIPE && sig != SIGXFSZ) continue;
    KernelSigaction dfl;
    dfl.handler = SIG_DFL;
    dfl.flags = 0;
    dfl.restorer = nullptr;
    dfl.mask = 0;
    syscall(SYS_rt_sigaction, sig, &dfl, nullptr, sizeof(unsigned long));
  }
  syscall(SYS_setpgid, 0, 0);
  long null_fd = syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY);
  if (null_fd < 0) syscall(SYS_exit, 127);
  if (null_fd != 0 && syscall(SYS_dup3, null_fd, 0, 0) < 0) syscall(SYS_exit, 127);
  if (syscall(SYS_dup3, spec->out_fd, 1, 0) < 0 || syscall(SYS_dup3, spec->out_fd, 2, 0) < 0) {
    syscall(SYS_exit, 127);
  }
  if (spec->status_fd != kStatusFd && syscall(SYS_dup3, spec->status_fd, kStatusFd, O_CLOEXEC) < 0) {
    syscall(SYS_exit, 127);
  }
#ifdef SYS_close_range
  if (syscall(SYS_close_range, kStatusFd + 1, ~0U, 0) != 0)
#endif
  {
    for (int fd = kStatusFd + 1; fd < 65536; ++fd) syscall(SYS_close, fd);
  }
  unsigned long empty_mask = 0;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty_mask, nullptr, sizeof(unsigned long));
  syscall(SYS_execve, spec->path, spec->argv, spec->envp);
  int error = errno;
  syscall(SYS_write, kStatusFd, &error, sizeof(error));
  syscall(SYS_exit, 127);
  return 127;
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

int Reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, __WALL) < 0) {
    if (errno != EINTR) return 128;
  }
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

  constexpr size_t kStack = 256 * 1024;
  void* stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  pid_t pid = -1;
  int clone_error = 0;
  if (stack != MAP_FAILED) {
    // Every signal is blocked across the clone, so no host handler can run on the child's side
    // before it has reset them; the child unblocks them just before exec.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = clone(ChildMain, static_cast<char*>(stack) + kStack, CLONE_VM | CLONE_VFORK, &spec);
    clone_error = errno;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    munmap(stack, kStack);
  } else {
    clone_error = errno;
  }
  close(out[1]);
  close(status[1]);
  if (pid < 0) {
    close(out[0]);
    close(status[0]);
    return absl::FailedPreconditionError(absl::StrCat("cannot run ", args[0], ": ", std::strerror(clone_error)));
  }
  int exec_error = 0;
  ssize_t n;
  do {
    n = read(status[0], &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  close(status[0]);
  if (n == sizeof(exec_error)) {
    close(out[0]);
    Reap(pid);
    return absl::FailedPreconditionError(absl::StrCat("cannot run ", args[0], ": ", std::strerror(exec_error)));
  }

  Result result;
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
    n = read(out[0], buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // end of output
    const size_t keep = std::min(static_cast<size_t>(n), max_output - std::min(max_output, result.output.size()));
    result.output.append(buf, keep);
    truncated |= keep < static_cast<size_t>(n);
  }
  close(out[0]);
  // The output is closed; the exit follows at once, unless something hangs on after closing it.
  while (!timed_out) {
    int st = 0;
    const pid_t r = waitpid(pid, &st, WNOHANG | __WALL);
    if (r == pid) {
      result.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      kill(-pid, SIGKILL);  // anything the driver left behind in its group
      if (truncated) absl::StrAppend(&result.output, "\n[...]");
      return result;
    }
    if (r < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    if (Clock::now() >= deadline) {
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  Kill(pid);
  Reap(pid);
  return absl::DeadlineExceededError(absl::StrCat(args[0], " did not finish within ", timeout_seconds,
                                                  " s and was killed"));
}

}  // namespace warden::subprocess
