// Running the C++ compiler from inside a host process (Note [Spawning from a host]).
//
// Note [Spawning from a host]
// The host owns the process's signal dispositions, file descriptors and children; Warden must
// work whatever they are and leave them alone:
//   - Warden forks a helper with exit signal 0 instead of SIGCHLD. The kernel auto-reaps only
//     SIGCHLD children when the host ignores SIGCHLD (or sets SA_NOCLDWAIT), and a host's
//     `waitpid(-1, ...)` reaper only collects SIGCHLD children, so neither can take the helper's
//     exit; Warden waits for it with __WALL. (The compiler itself cannot be that child: exec resets
//     the exit signal to SIGCHLD.)
//   - The helper resets every signal the host catches, and SIGCHLD, SIGPIPE and SIGXFSZ even if
//     ignored, to the default (a compiler waits for its own children), unblocks all signals, makes
//     itself a process-group leader, keeps only stdin (/dev/null), the output pipe and a status
//     pipe, forks and execs the compiler, waits for it and writes how it ended to the status pipe.
//     Host descriptors never leak into the compiler.
//   - The wait is bounded: past the timeout the whole process group (helper, driver, cc1/as/ld) is
//     killed with SIGKILL and the call returns DeadlineExceeded.
// The helper is a copy of a possibly multi-threaded host, so it makes raw system calls only (no
// allocation, no locks, no sanitizer interceptors). A fork copies the host's page tables: a few ms
// for a host of some GB, small next to a compile.
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
