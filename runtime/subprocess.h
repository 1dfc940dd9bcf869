// Running the C++ compiler from inside a host process (Note [Spawning from a host]).
//
// Note [Spawning from a host]
// The host owns the process's signal dispositions, file descriptors and children; Warden must
// work whatever they are and leave them alone:
//   - The child is created with clone(CLONE_VM | CLONE_VFORK) and exit signal 0, not SIGCHLD.
//     The kernel auto-reaps only SIGCHLD children when the host ignores SIGCHLD (or sets
//     SA_NOCLDWAIT), and a host's `waitpid(-1, ...)` reaper only collects SIGCHLD children, so
//     neither can take the exit status; Warden waits with __WALL.
//   - Before exec the child resets every signal the host catches, and SIGCHLD, SIGPIPE and
//     SIGXFSZ even if ignored, to the default (a compiler needs to wait for its own children),
//     unblocks all signals, makes itself a process-group leader and closes every descriptor but
//     stdin (/dev/null) and the output pipe: host descriptors never leak into the compiler.
//   - The wait is bounded: past the timeout the whole process group (the driver and cc1/as/ld)
//     is killed with SIGKILL and the call returns DeadlineExceeded.
// The child runs on its own small stack in the parent's memory until exec, and makes raw system
// calls only (no allocation, no locks, no sanitizer interceptors).
#ifndef WARDEN_RUNTIME_SUBPROCESS_H_
#define WARDEN_RUNTIME_SUBPROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace warden::subprocess {

struct Result {
  int exit_code = 0;   // 128 + signal if killed by a signal
  std::string output;  // stdout and stderr together, at most max_output bytes (then "[...]")
};

// Runs argv[0] (an absolute or relative path, no PATH search) with `argv`, the current
// environment and stdin from /dev/null. Errors: the program cannot be started
// (FailedPrecondition), or it did not finish within `timeout_seconds` (DeadlineExceeded; it and
// its process group were killed).
absl::StatusOr<Result> Run(const std::vector<std::string>& argv, double timeout_seconds,
                           size_t max_output = 64 * 1024);

}  // namespace warden::subprocess

#endif  // WARDEN_RUNTIME_SUBPROCESS_H_
