// Files Warden writes and later trusts: the kernel cache's directories, libraries and records, and
// the trace log. Knows nothing about kernels; codegen_compiler.cc decides what goes where.
//
// Note [Private files]
// Warden dlopens libraries it finds on disk, so a file another local user could plant or swap is
// code execution in the host. The rules, each enforced here:
//   - A directory holding such files is private: created 0700; not a symlink; owned by the
//     effective user and not writable by group or others; and every directory above its resolved
//     path is owned by root or the effective user and, if writable by group or others, sticky
//     (like /tmp: nobody can rename another's entry). Callers use the resolved path afterwards,
//     so a symlink retargeted after the check changes nothing.
//   - Files are read through one descriptor opened with O_NOFOLLOW | O_NONBLOCK: a symlink is
//     refused, a FIFO or device never blocks (only regular files are read), and a size bound is
//     checked before reading, so a 2 GB sparse file is refused without being read.
//   - Files are written to an mkstemp name (0600, O_EXCL) in the same directory, fsynced, then
//     renamed into place: readers never see a partial file and no predictable name is opened.
//   - A write that would pass RLIMIT_FSIZE is refused before it is made: the kernel would raise
//     SIGXFSZ, whose default action kills the host.
// What this cannot do: the effective user can always write its own private directories, so a
// process running as that user can plant code there. Warden defends the host against other users
// and against corrupt or stale files, not against itself.
#ifndef WARDEN_RUNTIME_PRIVATE_FILES_H_
#define WARDEN_RUNTIME_PRIVATE_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace warden::files {

// mkdir -p: creates `dir` (absolute, or relative to the working directory; not empty) and its
// missing parents with mode 0700, leaving existing ones as they are. FailedPrecondition naming the
// component that could not be created.
absl::Status MakeDirs(const std::string& dir);

// Creates `dir` and missing parents (mode 0700) and checks it by the rules above. Returns the
// directory's resolved path, or FailedPrecondition naming the path and what is wrong with it.
absl::StatusOr<std::string> EnsurePrivateDir(const std::string& dir);

// A directory private to this process (mkdtemp under $TMPDIR, else /tmp), created on first use
// and removed with its files at exit. For when the configured directory is refused.
absl::StatusOr<std::string> ProcessPrivateDir();

// A regular file read through one descriptor (see the Note). `bytes` holds its contents; dev/ino
// identify the file that was read.
struct FileContents {
  std::string bytes;
  uint64_t dev = 0;
  uint64_t ino = 0;
};

// Reads `path` if it is a regular file owned by the effective user, not writable by group or
// others, of at most `max_bytes`. NotFound if nothing is there; Unavailable if it cannot be opened
// for want of descriptors or memory; DataLoss (saying why) if something is there that must not be
// trusted: a symlink, FIFO, device, directory, another user's file, or an oversized one.
absl::StatusOr<FileContents> ReadPrivateFile(const std::string& path, int64_t max_bytes);

// Like ReadPrivateFile, with the owner and mode rules chosen by `trust`:
//   kPrivate  - owned by the effective user, not writable by group or others (ReadPrivateFile);
//   kSecret   - owned by the effective user, no access at all for group or others (a key file);
//   kAnyOwner - any owner and mode (contents the caller authenticates itself, e.g. by HMAC).
enum class Trust { kPrivate, kSecret, kAnyOwner };
absl::StatusOr<FileContents> ReadRegularFile(const std::string& path, int64_t max_bytes, Trust trust);

// Writes `bytes` to `path` atomically (mkstemp + fsync + rename, mode 0600). Fails cleanly,
// without writing, where RLIMIT_FSIZE would be exceeded.
absl::Status WritePrivateFile(const std::string& path, absl::string_view bytes);

// A fresh file for a writer that is not this process (a compiler's -o): mkstemp `prefix`XXXXXX,
// mode 0600, closed again. The caller removes it.
absl::StatusOr<std::string> MakeTempFile(const std::string& prefix);

// fsync()s the regular file at `path` (opened with O_NOFOLLOW); false if that fails.
bool SyncFile(const std::string& path);

// Whether a file may grow to `end_offset` bytes without passing RLIMIT_FSIZE (no SIGXFSZ).
bool WithinFileSizeLimit(int64_t end_offset);

// `bytes` as lowercase hex digits, two per byte.
std::string Hex(absl::string_view bytes);

// SHA-256 of `bytes`, 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace warden::files

#endif  // WARDEN_RUNTIME_PRIVATE_FILES_H_
