// The system compiler, the on-disk kernel cache and dlopen (Note [Kernel cache]).
#include "runtime/codegen_compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/kernel_entry.h"
#include "runtime/logging.h"
#include "runtime/private_files.h"
#include "runtime/remote_cache.h"
#include "runtime/subprocess.h"
#include "tracer/status.h"

namespace warden::codegen {
namespace {

std::atomic<int64_t> num_compiles{0}, num_disk_hits{0}, num_discarded{0}, num_failures{0};
std::atomic<int64_t> num_remote_hits{0}, num_package_hits{0}, num_rejected{0};

// -fopenmp-simd honours `#pragma omp simd` without linking an OpenMP runtime. No -ffast-math or
// -ffinite-math-only: NaN and Inf must behave as in ATen. -fno-math-errno lets sqrt vectorize
// (errno is the only difference); -ffp-contract=off keeps each op rounded on its own as in eager.
// -fwrapv: integer kernels wrap on overflow as ATen's do (Note [Type promotion]). 512-bit vectors
// where the CPU has them (GCC prefers 256 by default): the fused loops are compute-bound on
// libmvec calls, which run ~1.4x faster 16-wide (ignored without AVX-512).
const std::vector<std::string>& CompileFlags() {
  static const auto* flags = new std::vector<std::string>{
      "-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp-simd", "-fno-math-errno",
      "-ffp-contract=off", "-fwrapv", "-shared", "-fPIC"};
  return *flags;
}

const std::vector<std::string>& LinkFlags() {
#if defined(__x86_64__) && defined(__GLIBC__)
  static const auto* libs = new std::vector<std::string>{"-lmvec"};  // vector math (glibc)
#else
  static const auto* libs = new std::vector<std::string>{};
#endif
  return *libs;
}

uint64_t Mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Two independent 64-bit hashes (FNV-1a and a multiply-rotate one), 32 hex digits. Stable across
// processes and builds, unlike std::hash or absl::Hash.
std::string HashHex(const std::string& data) {
  uint64_t h1 = 0xcbf29ce484222325ULL;
  uint64_t h2 = 0x9e3779b97f4a7c15ULL ^ data.size();
  for (unsigned char c : data) {
    h1 = (h1 ^ c) * 0x100000001b3ULL;
    h2 = ((h2 ^ c) * 0xff51afd7ed558ccdULL);
    h2 = (h2 << 23) | (h2 >> 41);
  }
  return absl::StrFormat("%016x%016x", Mix(h1), Mix(h2 ^ Mix(h1)));
}

constexpr int64_t kMaxLibraryBytes = int64_t{64} << 20;  // kernel libraries are tens of KB
constexpr int64_t kMaxRecordBytes = 4096;

// WARDEN_COMPILE_TIMEOUT (seconds, default 120): how long one compiler run may take.
double CompileTimeoutSeconds() {
  constexpr double kDefault = 120;
  const char* env = std::getenv("WARDEN_COMPILE_TIMEOUT");
  if (env == nullptr || *env == '\0') return kDefault;
  double v = 0;
  if (absl::SimpleAtod(env, &v) && v > 0 && v <= 86400) return v;
  runtime::WarnOnce(absl::StrCat("compile-timeout-", env),
                    absl::StrCat("warden: WARDEN_COMPILE_TIMEOUT='", runtime::EscapeControl(env),
                                 "' is not a number of seconds in (0, 86400]; using ", kDefault));
  return kDefault;
}

absl::StatusOr<subprocess::Result> RunProcess(const std::vector<std::string>& args) {
  const double timeout = CompileTimeoutSeconds();
  auto result = subprocess::Run(args, timeout);
  if (result.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(
        absl::StrCat(result.status().message(), " (WARDEN_COMPILE_TIMEOUT=", timeout, " s)"));
  }
  return result;
}

std::mutex dir_mu;
std::string* dir_in_use = nullptr;  // guarded by dir_mu

// The directory to keep kernels in: the configured one if it is private (Note [Private files]),
// else a directory private to this process, with a one-time warning saying why.
absl::StatusOr<std::string> UsableCacheDir() {
  const std::string configured = KernelCacheDir();
  absl::StatusOr<std::string> dir =
      configured.empty() ? files::ProcessPrivateDir() : files::EnsurePrivateDir(configured);
  if (!configured.empty() && !dir.ok()) {
    auto fallback = files::ProcessPrivateDir();
    runtime::WarnOnce(
        absl::StrCat("cache-dir-", configured, "-", dir.status().message()),
        absl::StrCat("warden: kernel cache refused: ", runtime::EscapeControl(std::string(dir.status().message())),
                     "; kernels of this process are compiled into ",
                     fallback.ok() ? *fallback : std::string("nowhere"),
                     " and not shared (fix the directory or set WARDEN_CACHE_DIR to a private one)"));
    dir = std::move(fallback);
  }
  if (dir.ok()) {
    std::lock_guard<std::mutex> lock(dir_mu);
    if (dir_in_use == nullptr) dir_in_use = new std::string();
    *dir_in_use = *dir;
  }
  return dir;
}

absl::StatusOr<std::string> FindCompiler() {
  const char* env = std::getenv("WARDEN_CXX");
  const std::string name = env != nullptr && *env != '\0' ? env : "g++";
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) == 0) return name;
    return absl::FailedPreconditionError(absl::StrCat("no C++ compiler: WARDEN_CXX=", name, " is not executable"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    // Only absolute entries: an empty or relative one would run whatever `g++` sits in the
    // current directory (a shared /tmp, say).
    if (dir.empty() || dir[0] != '/') continue;
    const std::string candidate = absl::StrCat(dir, "/", name);
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("no C++ compiler: '", name, "' is not in PATH=",
                                                    path != nullptr ? path : "",
                                                    " (install g++ or set WARDEN_CXX)"));
}

// What identifies the compiler binary without running it: its resolved path and the file's
// device, inode, size and modification time. An upgrade or a retargeted symlink changes it.
std::string CompilerFileStamp(const std::string& compiler) {
  char resolved[PATH_MAX];
  const std::string real = realpath(compiler.c_str(), resolved) != nullptr ? resolved : compiler;
  struct stat st;
  if (stat(real.c_str(), &st) != 0) return "";
  return absl::StrCat(real, "|", st.st_dev, "|", st.st_ino, "|", st.st_size, "|", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec);
}

// The compiler's identity without running it: the SHA-256 of its resolved binary, memoized per
// CompilerFileStamp for the process and on disk in <cache>/compilers/ (hashing a 1 MB driver costs
// ~2.5 ms; a process that finds its kernels on disk should not pay it). An upgrade, a retargeted
// symlink or another build of the compiler changes it; hosts of a fleet with the same compiler
// binary agree on it (Note [Shared kernels]). A wrapper script named by WARDEN_CXX is identified by
// its own bytes.
absl::StatusOr<std::string> CompilerIdentity(const std::string& compiler, const std::string& cache_dir) {
  static std::mutex mu;
  static auto* known = new std::map<std::string, std::string>();
  const std::string stamp = CompilerFileStamp(compiler);
  if (stamp.empty()) return absl::FailedPreconditionError(absl::StrCat("cannot examine the compiler ", compiler));
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = known->find(stamp);
    if (it != known->end()) return it->second;
  }
  const std::string memo = absl::StrCat(cache_dir, "/compilers/", HashHex(stamp), ".sha256");
  std::string identity;
  if (auto stored = files::ReadPrivateFile(memo, kMaxRecordBytes); stored.ok()) {
    std::vector<std::string> lines = absl::StrSplit(stored->bytes, '\n');
    if (lines.size() >= 2 && lines[0] == stamp && absl::StartsWith(lines[1], "sha256:") && lines[1].size() == 71) {
      identity = lines[1];
    }
  }
  if (identity.empty()) {
    char resolved[PATH_MAX];
    const std::string real = realpath(compiler.c_str(), resolved) != nullptr ? resolved : compiler;
    auto bytes = files::ReadRegularFile(real, int64_t{1} << 30, files::Trust::kAnyOwner);
    if (!bytes.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot read the compiler ", real, ": ", bytes.status().message()));
    }
    identity = absl::StrCat("sha256:", files::Sha256Hex(bytes->bytes));
    if (files::EnsurePrivateDir(absl::StrCat(cache_dir, "/compilers")).ok()) {
      files::WritePrivateFile(memo, absl::StrCat(stamp, "\n", identity, "\n")).IgnoreError();  // only a memo
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  known->emplace(stamp, identity);
  return identity;
}

// The CPU's feature flags: -march=native code is only valid where they are the same.
const std::string& CpuFlags() {
  static const std::string* flags = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("flags", 0) == 0) return new std::string(line);
    }
    return new std::string();
  }();
  return *flags;
}

// <key>.meta beside a library: what `warden package` needs that the key cannot give back.
std::string MetaOf(const std::string& portable, const std::string& compiler) {
  return absl::StrCat("portable ", portable, "\ncompiler ", compiler, "\n");
}

std::string KeyMarker(const std::string& key) { return absl::StrCat("warden-kernel-key:", key); }

// Removes a temporary file when the scope ends (renamed into place by then on success).
struct UnlinkOnExit {
  const std::string& path;
  ~UnlinkOnExit() { unlink(path.c_str()); }
};

// Deletes the unusable file at `path`, unless what is there now is not the file that failed (dev
// and ino of the file read; 0 if none was read: a symlink, FIFO or the like, always deleted), which
// happens when a concurrent build renamed a good library into place meanwhile.
void Discard(const std::string& path, const std::string& why, uint64_t dev, uint64_t ino) {
  struct stat st;
  if (ino != 0 && (lstat(path.c_str(), &st) != 0 || st.st_dev != dev || st.st_ino != ino)) return;
  unlink(path.c_str());
  num_discarded.fetch_add(1);
  runtime::WarnOnce(absl::StrCat("discarded-", path, "-", why),
                    absl::StrCat("warden: discarded cached kernel library ", runtime::EscapeControl(path), ": ",
                                 runtime::EscapeControl(why), "; rebuilding it"));
}

// dlopens `path`, whose bytes were read and verified as `library`, and resolves `kernels`. The
// library is reported under `name` (its place in the cache). Aborted if `path` no longer names
// the file that was read (a concurrent Warden process renamed a fresh build over it: retry).
absl::StatusOr<std::shared_ptr<const KernelLibrary>> OpenVerified(const std::string& path,
                                                                  const files::FileContents& library,
                                                                  const std::string& name, const std::string& key,
                                                                  const std::vector<std::string>& kernels) {
  const std::string marker = KeyMarker(key);
  if (library.bytes.find(marker) == std::string::npos) {
    return absl::DataLossError(absl::StrCat("it is not the kernel library for key ", key));
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::DataLossError(absl::StrCat("dlopen: ", error != nullptr ? error : "?"));
  }
  auto fail = [&](absl::Status status) {
    dlclose(handle);
    return status;
  };
  // dlopen opened the path again: it must still be the file that was verified (only this user can
  // replace it, Note [Private files]; a concurrent Warden process renames whole files into place).
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || st.st_dev != library.dev || st.st_ino != library.ino) {
    return fail(absl::AbortedError("it was replaced while being loaded"));
  }
  const auto* stored = static_cast<const char*>(dlsym(handle, "warden_kernel_key"));
  if (stored == nullptr || marker != stored) return fail(absl::DataLossError("warden_kernel_key does not match"));
  std::map<std::string, KernelFn> found;
  for (const std::string& kernel : kernels) {
    void* sym = dlsym(handle, kernel.c_str());
    if (sym == nullptr) return fail(absl::DataLossError(absl::StrCat("missing symbol ", kernel)));
    found[kernel] = reinterpret_cast<KernelFn>(sym);
  }
  return std::shared_ptr<const KernelLibrary>(new KernelLibrary(handle, name, std::move(found)));
}

// Loads the cached library at `path` only if it is, byte for byte, the one Warden recorded when
// it compiled it (Note [Kernel cache]): no code of an unverified file ever runs. NotFound: not
// cached; Aborted: replaced concurrently (retry); DataLoss: unusable (delete and rebuild).
absl::StatusOr<std::shared_ptr<const KernelLibrary>> Load(const std::string& path, const std::string& record_path,
                                                          const std::string& key,
                                                          const std::vector<std::string>& kernels,
                                                          uint64_t* dev, uint64_t* ino) {
  ASSIGN_OR_RETURN(const files::FileContents library, files::ReadPrivateFile(path, kMaxLibraryBytes));
  *dev = library.dev;
  *ino = library.ino;
  auto record = files::ReadPrivateFile(record_path, kMaxRecordBytes);
  if (!record.ok()) {
    return absl::DataLossError(absl::StrCat("no valid record of it was written by Warden (", record.status().message(), ")"));
  }
  const std::string expected = LibraryRecord(library.bytes);
  if (expected.size() < 70 || record->bytes != expected) {
    return absl::DataLossError("its contents differ from what Warden recorded when it compiled it "
                               "(truncated, corrupt or foreign file)");
  }
  return OpenVerified(path, library, path, key, kernels);
}

// Puts the library at `tmp`, whose bytes were read back as `contents`, into place as `so` for
// `key`: loaded from the temporary name (a concurrent writer of the same key renaming its own file
// into place cannot swap it), then recorded, then renamed.
absl::StatusOr<std::shared_ptr<const KernelLibrary>> Commit(const std::string& tmp, const files::FileContents& contents,
                                                            const std::string& so, const std::string& record,
                                                            const std::string& key,
                                                            const std::vector<std::string>& kernels) {
  ASSIGN_OR_RETURN(auto library, OpenVerified(tmp, contents, so, key, kernels));
  RETURN_IF_ERROR(files::WritePrivateFile(record, LibraryRecord(contents.bytes)));
  if (rename(tmp.c_str(), so.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot rename ", tmp, ": ", std::strerror(errno)));
  }
  return library;
}

// The library of `entry` (verified, Note [Shared kernels]) in the local cache `dir`: loaded from
// there if Warden already recorded it, else written through the private, recorded path and loaded.
absl::StatusOr<std::shared_ptr<const KernelLibrary>> InstallAndLoad(const std::string& dir, const KernelEntry& entry,
                                                                    const std::vector<std::string>& kernels,
                                                                    bool* was_local) {
  const std::string base = absl::StrCat(dir, "/", entry.key);
  const std::string so = base + ".so";
  *was_local = false;
  for (int attempt = 0; attempt < 3; ++attempt) {
    uint64_t dev = 0, ino = 0;
    auto local = Load(so, base + ".sha256", entry.key, kernels, &dev, &ino);
    if (local.ok()) {
      *was_local = true;
      return local;
    }
    if (local.status().code() != absl::StatusCode::kAborted) break;  // renamed over while loading: read again
  }
  // As a compile's output: written to a fresh name, read back, then committed.
  ASSIGN_OR_RETURN(const std::string tmp, files::MakeTempFile(so + ".in."));
  UnlinkOnExit remove_tmp{tmp};
  RETURN_IF_ERROR(files::WritePrivateFile(tmp, entry.library));
  ASSIGN_OR_RETURN(const files::FileContents written, files::ReadPrivateFile(tmp, kMaxLibraryBytes));
  if (written.bytes != entry.library) return absl::AbortedError("the installed library changed while being written");
  ASSIGN_OR_RETURN(auto library, Commit(tmp, written, so, base + ".sha256", entry.key, kernels));
  files::WritePrivateFile(base + ".meta", MetaOf(entry.portable, entry.compiler)).IgnoreError();  // for packaging
  return library;
}

// The name of `key` in the shared cache: a namespace per fleet key (a fingerprint of it), so that
// entries of another key, of an unauthenticated writer or from before a key rotation are never
// even fetched, let alone rejected on every miss.
std::string RemoteKey(const SharingConfig& sharing, const std::string& key) {
  return absl::StrCat(sharing.key.has_value() ? KeyFingerprint(*sharing.key) : std::string("unauthenticated"), ":",
                      key);
}

// The library of a shared entry (`where`: "package" or "remote") verified as DecodeEntry does and
// installed locally; `was_local` when the local cache already had it. A failure is counted as a
// rejection, reported on stderr every time (it is rare and may be an attack), appended to `note`
// for explain, and returned.
absl::StatusOr<std::shared_ptr<const KernelLibrary>> FromShared(
    const char* where, absl::string_view bytes, const SharingConfig& sharing, const std::string& dir,
    absl::string_view expect_key, absl::string_view expect_portable, const std::vector<std::string>& kernels,
    bool* was_local, std::string* note) {
  auto entry = DecodeEntry(bytes, sharing, expect_key, expect_portable);
  absl::StatusOr<std::shared_ptr<const KernelLibrary>> library =
      entry.ok() ? InstallAndLoad(dir, *entry, kernels, was_local) : entry.status();
  if (library.ok()) return library;
  num_rejected.fetch_add(1);
  const std::string text = absl::StrCat(where, " entry rejected (", library.status().message(), ")");
  runtime::LogToStderr(absl::StrCat("warden: ", runtime::EscapeControl(text), "; compiling it locally\n"));
  if (!note->empty()) absl::StrAppend(note, "; ");
  absl::StrAppend(note, text);
  return library;
}

absl::StatusOr<std::shared_ptr<const KernelLibrary>> CompileOrLoad(
    const std::string& source, const std::vector<std::string>& kernels) {
  const SharingConfig sharing = ReadSharingConfig();
  // SHA-256 (not HashHex): these name kernels across a fleet, where collisions must be infeasible.
  const std::string portable = files::Sha256Hex(absl::StrCat(
      "warden-portable-v1", std::string(1, '\0'), source, std::string(1, '\0'), absl::StrJoin(CompileFlags(), " "),
      " ", absl::StrJoin(LinkFlags(), " "), std::string(1, '\0'), CpuFlags())).substr(0, 32);
  ASSIGN_OR_RETURN(const std::string dir, UsableCacheDir());
  std::string note;  // rejected shared entries, for the origin

  // A package first: it serves hosts without a compiler (the portable key needs none).
  if (std::shared_ptr<const Package> package = CurrentPackage(sharing)) {
    if (const std::string* bytes = package->Find(portable)) {
      bool was_local = false;
      auto library = FromShared("package", *bytes, sharing, dir, "", portable, kernels, &was_local, &note);
      if (library.ok()) {
        (was_local ? num_disk_hits : num_package_hits).fetch_add(1);
        (*library)->set_origin(was_local ? "local hit" : "package hit");
        return library;
      }
    }
  }
  auto found = FindCompiler();
  if (!found.ok() && !sharing.package.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("the kernel is not in WARDEN_PACKAGE=", sharing.package,
                                                      note.empty() ? "" : absl::StrCat(" (", note, ")"),
                                                      ", and ", found.status().message()));
  }
  ASSIGN_OR_RETURN(const std::string compiler, std::move(found));
  ASSIGN_OR_RETURN(const std::string identity, CompilerIdentity(compiler, dir));
  // The name it is invoked by counts too: one binary may behave per argv[0] (clang / clang++).
  const std::string invoked = compiler.substr(compiler.rfind('/') + 1);
  const std::string key = files::Sha256Hex(absl::StrCat("warden-kernel-v3", std::string(1, '\0'), portable,
                                                        std::string(1, '\0'), identity, " as ", invoked))
                              .substr(0, 32);
  const std::string base = absl::StrCat(dir, "/", key);
  const std::string so = base + ".so";
  const std::string record = base + ".sha256";
  auto with_origin = [&](std::shared_ptr<const KernelLibrary> library, const std::string& origin) {
    library->set_origin(note.empty() ? origin : absl::StrCat(origin, "; ", note));
    return library;
  };

  for (int attempt = 0; attempt < 3; ++attempt) {
    uint64_t dev = 0, ino = 0;
    auto cached = Load(so, record, key, kernels, &dev, &ino);
    if (cached.ok()) {
      num_disk_hits.fetch_add(1);
      return with_origin(*std::move(cached), "local hit");
    }
    const absl::StatusCode code = cached.status().code();
    if (code == absl::StatusCode::kAborted) continue;  // renamed over while loading: read again
    if (code == absl::StatusCode::kDataLoss) Discard(so, std::string(cached.status().message()), dev, ino);
    break;  // NotFound, Unavailable (no descriptors): compile, and the rename replaces the file
  }

  const bool remote = sharing.enabled() && !sharing.remote.empty();
  bool remote_rejected = false;  // then the rebuild overwrites the entry
  if (remote) {
    auto got = RemoteGet(sharing.remote, RemoteKey(sharing, key));
    if (got.ok() && got->has_value()) {
      bool was_local = false;
      auto library = FromShared("remote", **got, sharing, dir, key, "", kernels, &was_local, &note);
      if (library.ok()) {
        num_remote_hits.fetch_add(1);
        return with_origin(*std::move(library), "remote hit");
      }
      remote_rejected = true;
    }
  }

  const std::string cc = base + ".cc";
  RETURN_IF_ERROR(files::WritePrivateFile(
      cc, absl::StrCat(source, "\nextern \"C\" const char warden_kernel_key[] = \"", KeyMarker(key), "\";\n")));
  ASSIGN_OR_RETURN(const std::string tmp, files::MakeTempFile(so + ".tmp."));
  UnlinkOnExit remove_tmp{tmp};
  std::vector<std::string> args = {compiler};
  for (const std::string& f : CompileFlags()) args.push_back(f);
  args.insert(args.end(), {"-o", tmp, cc});
  for (const std::string& f : LinkFlags()) args.push_back(f);
  ASSIGN_OR_RETURN(subprocess::Result run, RunProcess(args));
  if (run.exit_code != 0) {
    return absl::InternalError(absl::StrCat(compiler, " failed (exit ", run.exit_code, ") on ", cc, ":\n", run.output));
  }
  // What the compiler wrote (mode from its umask) is made private, read back through the same
  // checks, recorded, then renamed into place.
  chmod(tmp.c_str(), 0600);
  auto built = files::ReadPrivateFile(tmp, kMaxLibraryBytes);
  if (!built.ok()) {
    return absl::InternalError(absl::StrCat(compiler, " produced no usable library: ", built.status().message()));
  }
  files::SyncFile(tmp);  // on disk before its name and record say it is complete
  ASSIGN_OR_RETURN(auto library, Commit(tmp, *built, so, record, key, kernels));
  num_compiles.fetch_add(1);
  const std::string built_by = absl::StrCat(compiler, " ", identity);
  files::WritePrivateFile(base + ".meta", MetaOf(portable, built_by)).IgnoreError();
  if (remote) {
    KernelEntry entry{key, portable, built_by, built->bytes};
    // After a rejected entry, overwrite it: a stale or foreign entry must not block the key forever.
    RemotePut(sharing.remote, RemoteKey(sharing, key), EncodeEntry(entry, sharing.key), remote_rejected)
        .IgnoreError();  // warned in Run
  }
  return with_origin(std::move(library), "compiled");
}

}  // namespace

KernelLibrary::~KernelLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

KernelFn KernelLibrary::Find(const std::string& name) const {
  auto it = kernels_.find(name);
  return it == kernels_.end() ? nullptr : it->second;
}

std::string KernelCacheDir() {
  const char* root = std::getenv("WARDEN_CACHE_DIR");
  if (root != nullptr && *root != '\0') return absl::StrCat(root, "/kernels");
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home == '/') return absl::StrCat(home, "/.cache/warden/kernels");
  // No HOME: the user database's home directory, never a predictable shared path.
  struct passwd pw, *found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr &&
      found->pw_dir != nullptr && found->pw_dir[0] == '/' && std::string(found->pw_dir) != "/") {
    return absl::StrCat(found->pw_dir, "/.cache/warden/kernels");
  }
  return "";
}

std::string KernelCacheDirInUse() {
  std::lock_guard<std::mutex> lock(dir_mu);
  return dir_in_use != nullptr ? *dir_in_use : KernelCacheDir();
}

absl::StatusOr<std::shared_ptr<const KernelLibrary>> LoadKernels(
    const std::string& source, const std::vector<std::string>& kernels) {
  auto library = CompileOrLoad(source, kernels);
  if (!library.ok()) num_failures.fetch_add(1);
  return library;
}

KernelCacheStats GetKernelCacheStats() {
  KernelCacheStats s;
  s.compiles = num_compiles.load();
  s.disk_hits = num_disk_hits.load();
  s.discarded = num_discarded.load();
  s.failures = num_failures.load();
  s.remote_hits = num_remote_hits.load();
  s.package_hits = num_package_hits.load();
  s.rejected = num_rejected.load();
  return s;
}

}  // namespace warden::codegen
