// Turning generated C++ into loaded kernels: the system compiler, the content-addressed on-disk
// kernel cache and dlopen. Knows nothing about graphs; codegen_pointwise.h writes the source.
//
// Note [Kernel cache]
// A kernel library lives in <dir>/<key>.so next to its source <key>.cc, its record <key>.sha256
// and <key>.meta (its portable key and compiler, for `warden package`), where <dir> is
// $WARDEN_CACHE_DIR/kernels, else ~/.cache/warden/kernels ($HOME, else the user database's home
// directory), and <key> is a 128-bit hash of the source, the flags, the CPU's feature flags
// (-march=native code must not be loaded on another CPU) and the compiler's identity: the SHA-256
// of its resolved binary (Note [Shared kernels] in kernel_entry.h shares <key> across a fleet).
//   - <dir> must be private (Note [Private files]); one that is not is refused with a warning and
//     the process compiles into a directory of its own instead. There is no shared fallback path.
//   - After compiling, Warden reads the library back (a regular file of bounded size), writes the
//     record "sha256 <digest> <size>" and renames the library into place; every file is written
//     under an mkstemp name and renamed, so concurrent processes never see a partial file.
//   - Before dlopen runs any code of a library, the whole file is read through one O_NOFOLLOW
//     descriptor and must match its record and contain `warden_kernel_key` = the key; after dlopen
//     the path must still name the file that was read, and every requested symbol must exist. A
//     file failing any of this is deleted, reported on stderr once, and rebuilt.
//   - The compiler is $WARDEN_CXX, else `g++` from PATH, run as Note [Spawning from a host] says,
//     for at most $WARDEN_COMPILE_TIMEOUT seconds (default 120). It runs only to compile: its
//     identity is read from its file, so a process that finds its kernels on disk, in the shared
//     cache or in a package never runs it.
//   - Lookup order: WARDEN_PACKAGE (by portable key; no compiler needed), the local cache, the
//     shared cache (WARDEN_REMOTE_CACHE), then the compiler (publishing what it built).
#ifndef WARDEN_RUNTIME_CODEGEN_COMPILER_H_
#define WARDEN_RUNTIME_CODEGEN_COMPILER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace warden::codegen {

// The signature of every generated kernel (see codegen_pointwise.h).
using KernelFn = void (*)(const void** in, void** out, int64_t n);

// A loaded kernel library; dlclose()d when the last artifact using it goes away.
class KernelLibrary {
 public:
  KernelLibrary(void* handle, std::string path, std::map<std::string, KernelFn> kernels)
      : handle_(handle), path_(std::move(path)), kernels_(std::move(kernels)) {}
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  KernelFn Find(const std::string& name) const;  // nullptr if not requested at load
  const std::string& path() const { return path_; }
  // Where it came from: "compiled", "local hit", "remote hit" or "package hit", followed by any
  // shared entry that was rejected on the way ("; remote entry rejected (tag: ...)").
  const std::string& origin() const { return origin_; }
  void set_origin(std::string origin) const { origin_ = std::move(origin); }  // once, before it is shared

 private:
  void* handle_;
  std::string path_;
  std::map<std::string, KernelFn> kernels_;
  mutable std::string origin_;
};

// Compiles `source` (or finds it in the kernel cache) and resolves `kernels` in it. Errors: no
// compiler, compiler failure (the message carries its output), an unusable cache directory, or a
// library that cannot be loaded even after a rebuild.
absl::StatusOr<std::shared_ptr<const KernelLibrary>> LoadKernels(
    const std::string& source, const std::vector<std::string>& kernels);

// The directory kernel libraries are configured to go to (Note [Kernel cache]), read from the
// environment per call; empty when there is no home directory (then a per-process private one).
std::string KernelCacheDir();

// The resolved directory the last compile or load used: KernelCacheDir() or, if that was refused,
// the process's private directory.
std::string KernelCacheDirInUse();

// Process-wide counters, for tests and explain.
struct KernelCacheStats {
  int64_t compiles = 0;    // compiler runs that produced a library
  int64_t disk_hits = 0;   // libraries loaded from the cache without compiling
  int64_t discarded = 0;   // cached files found corrupt or foreign, deleted and rebuilt
  int64_t failures = 0;    // LoadKernels calls that returned an error
  int64_t remote_hits = 0;   // libraries taken from the shared cache (Note [Shared kernels])
  int64_t package_hits = 0;  // libraries taken from WARDEN_PACKAGE
  int64_t rejected = 0;      // shared entries that failed verification (never loaded)
};
KernelCacheStats GetKernelCacheStats();

}  // namespace warden::codegen

#endif  // WARDEN_RUNTIME_CODEGEN_COMPILER_H_
