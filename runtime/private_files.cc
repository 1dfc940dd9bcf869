// Note [Private files] in private_files.h.
#include "runtime/private_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace warden::files {
namespace {

std::string Errno() { return std::strerror(errno); }

absl::Status Unsafe(const std::string& path, const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat(path, " ", why));
}

// The modes and owners a directory above a private one may have.
absl::Status CheckAncestor(const std::string& path, const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) return Unsafe(path, "is not a directory");
  if (st.st_uid != 0 && st.st_uid != geteuid()) {
    return Unsafe(path, absl::StrCat("is owned by uid ", st.st_uid, ", not by root or uid ", geteuid()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return Unsafe(path, absl::StrFormat("is writable by group or others (mode %04o) and not sticky",
                                        st.st_mode & 07777));
  }
  return absl::OkStatus();
}

absl::Status CheckPrivate(const std::string& path, const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return Unsafe(path, "is a symlink");
  if (!S_ISDIR(st.st_mode)) return Unsafe(path, "is not a directory");
  if (st.st_uid != geteuid()) {
    return Unsafe(path, absl::StrCat("is owned by uid ", st.st_uid, ", not by uid ", geteuid()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return Unsafe(path, absl::StrFormat("is writable by group or others (mode %04o)", st.st_mode & 07777));
  }
  return absl::OkStatus();
}

// The resolved path of `path` once it and every directory above it pass the checks.
absl::StatusOr<std::string> ResolveAndCheck(const std::string& path);

// Checks `resolved` (a realpath) and every directory above it.
absl::Status CheckChain(const std::string& resolved) {
  struct stat st;
  if (lstat(resolved.c_str(), &st) != 0) return Unsafe(resolved, absl::StrCat("cannot be examined: ", Errno()));
  if (absl::Status s = CheckPrivate(resolved, st); !s.ok()) return s;
  std::string parent = resolved;
  while (parent.size() > 1) {
    const size_t slash = parent.rfind('/');
    parent = slash == 0 ? "/" : parent.substr(0, slash);
    if (lstat(parent.c_str(), &st) != 0) return Unsafe(parent, absl::StrCat("cannot be examined: ", Errno()));
    if (absl::Status s = CheckAncestor(parent, st); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::mutex private_dir_mu;
std::string* private_dir = nullptr;  // guarded by private_dir_mu; set once

void RemovePrivateDir() {
  std::lock_guard<std::mutex> lock(private_dir_mu);
  if (private_dir == nullptr) return;
  if (DIR* d = opendir(private_dir->c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") unlink(absl::StrCat(*private_dir, "/", name).c_str());
    }
    closedir(d);
  }
  rmdir(private_dir->c_str());
}

absl::StatusOr<std::string> ResolveAndCheck(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    return Unsafe(path, absl::StrCat("cannot be resolved: ", Errno()));
  }
  if (absl::Status s = CheckChain(resolved); !s.ok()) return s;
  return std::string(resolved);
}

}  // namespace

absl::Status MakeDirs(const std::string& dir) {
  std::string prefix = dir[0] == '/' ? "" : ".";
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    if (part.empty()) continue;
    absl::StrAppend(&prefix, "/", part);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat("cannot create directory ", prefix, ": ", Errno()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EnsurePrivateDir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("directory '", dir, "' is not an absolute path"));
  }
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  // The directory itself must not be a symlink (its ancestors may be: the resolved chain is checked).
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return Unsafe(dir, absl::StrCat("cannot be examined: ", Errno()));
  if (S_ISLNK(st.st_mode)) return Unsafe(dir, "is a symlink");
  return ResolveAndCheck(dir);
}

absl::StatusOr<std::string> ProcessPrivateDir() {
  std::lock_guard<std::mutex> lock(private_dir_mu);
  if (private_dir != nullptr) return *private_dir;
  std::string why;
  const char* tmpdir = std::getenv("TMPDIR");
  for (const std::string base : {std::string(tmpdir != nullptr && tmpdir[0] == '/' ? tmpdir : ""),
                                 std::string("/tmp")}) {
    if (base.empty()) continue;
    std::string pattern = absl::StrCat(base, "/warden-", geteuid(), "-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      absl::StrAppend(&why, " mkdtemp ", pattern, ": ", Errno(), ";");
      continue;
    }
    absl::StatusOr<std::string> resolved = ResolveAndCheck(pattern);
    if (!resolved.ok()) {
      rmdir(pattern.c_str());
      absl::StrAppend(&why, " ", resolved.status().message(), ";");
      continue;
    }
    private_dir = new std::string(*std::move(resolved));
    std::atexit(RemovePrivateDir);
    return *private_dir;
  }
  return absl::FailedPreconditionError(absl::StrCat("no private temporary directory:", why));
}

absl::StatusOr<FileContents> ReadPrivateFile(const std::string& path, int64_t max_bytes) {
  return ReadRegularFile(path, max_bytes, Trust::kPrivate);
}

absl::StatusOr<FileContents> ReadRegularFile(const std::string& path, int64_t max_bytes, Trust trust) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    if (errno == ELOOP) return absl::DataLossError(absl::StrCat(path, " is a symlink"));
    if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
      return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", Errno()));
    }
    return absl::DataLossError(absl::StrCat("cannot open ", path, ": ", Errno()));
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::DataLossError(absl::StrCat("cannot examine ", path, ": ", Errno()));
  if (!S_ISREG(st.st_mode)) return absl::DataLossError(absl::StrCat(path, " is not a regular file"));
  if (trust != Trust::kAnyOwner && st.st_uid != geteuid()) {
    return absl::DataLossError(absl::StrCat(path, " is owned by uid ", st.st_uid, ", not by uid ", geteuid()));
  }
  if (trust == Trust::kPrivate && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::DataLossError(absl::StrCat(path, " is writable by group or others"));
  }
  if (trust == Trust::kSecret && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::DataLossError(absl::StrFormat("%s is accessible to group or others (mode %04o; a secret must be 0600 or 0400)",
                                               path, st.st_mode & 07777));
  }
  if (st.st_size > max_bytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", st.st_size, " bytes, more than the ", max_bytes,
                                            " a Warden file can be"));
  }
  FileContents out;
  out.dev = st.st_dev;
  out.ino = st.st_ino;
  out.bytes.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.bytes.size()) {
    const ssize_t n = read(fd, out.bytes.data() + got, out.bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", Errno()));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != out.bytes.size()) {
    return absl::DataLossError(absl::StrCat(path, " changed size while being read"));
  }
  return out;
}

bool SyncFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  const bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && fsync(fd) == 0;
  close(fd);
  return ok;
}

bool WithinFileSizeLimit(int64_t end_offset) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return true;
  return end_offset >= 0 && static_cast<uint64_t>(end_offset) <= static_cast<uint64_t>(limit.rlim_cur);
}

absl::StatusOr<std::string> MakeTempFile(const std::string& prefix) {
  std::string name = prefix + "XXXXXX";
  const int fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("cannot create ", name, ": ", Errno()));
  close(fd);
  return name;
}

absl::Status WritePrivateFile(const std::string& path, absl::string_view bytes) {
  if (!WithinFileSizeLimit(static_cast<int64_t>(bytes.size()))) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot write ", path, ": ", bytes.size(),
                                                     " bytes exceed the file size limit (RLIMIT_FSIZE)"));
  }
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = mkostemp(tmp.data(), O_CLOEXEC);  // 0600, O_EXCL
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("cannot create ", tmp, ": ", Errno()));
  const bool ok = WriteAll(fd, bytes) && fsync(fd) == 0;
  const std::string error = Errno();
  close(fd);
  if (!ok) {
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp, ": ", error));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string rename_error = Errno();
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot rename ", tmp, ": ", rename_error));
  }
  return absl::OkStatus();
}

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1) return "";
  return Hex(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

std::string Hex(absl::string_view bytes) {
  std::string hex;
  hex.reserve(2 * bytes.size());
  for (unsigned char c : bytes) absl::StrAppendFormat(&hex, "%02x", c);
  return hex;
}

}  // namespace warden::files
