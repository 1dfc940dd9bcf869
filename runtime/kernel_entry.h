// Kernel libraries that travel between machines: the entry format shared by the remote cache
// (runtime/remote_cache.h) and packages, its authentication, and the settings that turn sharing on.
//
// Note [Shared kernels]
// A kernel library compiled on one host may be loaded on another, from a Redis server the fleet
// shares (WARDEN_REMOTE_CACHE) or from a package file (WARDEN_PACKAGE, built by `warden package`).
// Loading a library runs its code in the host, so the rules are those of Note [Kernel cache] plus:
//   - Threat model. Whoever can write the Redis server or the package file can offer any bytes. An
//     entry is loaded only if it carries an HMAC-SHA256 tag, made with the fleet's secret key
//     (WARDEN_CACHE_KEY_FILE: a file of 16..4096 bytes, owned by the user and inaccessible to
//     group and others), over its header: the cache key, the portable key, the compiler, the size
//     and the SHA-256 of the library bytes (which are checked too). A host that holds the key is
//     trusted to publish; one that does not can neither publish nor forge. Without a key file,
//     sharing stays off unless WARDEN_CACHE_UNAUTHENTICATED=1 opts in (with a warning: then anyone
//     who can write the server or the file can run code in every host that reads it), and an
//     unauthenticated package must still be a private file (Note [Private files]).
//   - An entry that fails any check (malformed, wrong key, size, digest, tag) is never written to
//     the local cache nor loaded; it is reported, and the kernel is compiled locally.
//   - A verified entry is installed in the local cache as a compile's output is (written to a
//     fresh name, read back, loaded from there, recorded, renamed into place), so concurrent
//     installs of one key never swap bytes under each other.
//   - In Redis, entries live in a namespace per fleet key (a 16-hex-digit HMAC fingerprint), so
//     another key's entries, or those from before a key rotation, are never fetched; an entry that
//     was rejected is overwritten by the local rebuild, so a bad entry does not block its key.
//   - Keys (SHA-256, truncated to 128 bits). The cache key (local, remote) hashes the source, the
//     flags, the CPU's feature flags and the compiler's identity (the SHA-256 of its resolved
//     binary and the name it is invoked by): a host with other CPU
//     features or another compiler binary never shares an entry. A package is looked up by the
//     portable key (the same without the compiler), since the host reading it may have no
//     compiler: a package fixes the compiler, recorded in each entry.
#ifndef WARDEN_RUNTIME_KERNEL_ENTRY_H_
#define WARDEN_RUNTIME_KERNEL_ENTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace warden::codegen {

// The sharing settings, read from the environment.
struct SharingConfig {
  std::string remote;               // WARDEN_REMOTE_CACHE ("" = off)
  std::string package;              // WARDEN_PACKAGE ("" = none)
  std::optional<std::string> key;   // the secret of WARDEN_CACHE_KEY_FILE, if it was usable
  bool unauthenticated = false;     // WARDEN_CACHE_UNAUTHENTICATED=1 (only meaningful without a key)
  std::string problem;              // non-empty: sharing is off although configured, and why
  bool enabled() const { return problem.empty() && (key.has_value() || unauthenticated); }
};

// Reads the environment now (each compile does; nothing here is on the hot path). Warns once per
// distinct problem (an unusable key file, no key without the opt-in, the opt-in itself).
SharingConfig ReadSharingConfig();

// A fingerprint of a fleet key (16 hex digits of an HMAC of a constant): names its namespace in the
// shared cache without revealing it.
std::string KeyFingerprint(const std::string& key);

// Reads a key file by the rules of the Note. InvalidArgument/FailedPrecondition naming the problem.
absl::StatusOr<std::string> ReadKeyFile(const std::string& path);

struct KernelEntry {
  std::string key;       // the cache key the library was built under (its warden_kernel_key)
  std::string portable;  // the same without the compiler
  std::string compiler;  // which compiler built it (resolved path and digest), for reports
  std::string library;   // the shared library's bytes
};

// The record Warden writes beside a kernel library it put in its cache (Note [Kernel cache]):
// "sha256 <digest> <size>\n".
std::string LibraryRecord(absl::string_view library_bytes);

constexpr int64_t kMaxEntryBytes = (int64_t{64} << 20) + 4096;

// The entry as bytes: a text header (tagged with `hmac_key`, or "none"), a blank line, the library.
std::string EncodeEntry(const KernelEntry& entry, const std::optional<std::string>& hmac_key);

// Parses and verifies `bytes`. With a key the tag must verify; without one the entry must be
// untagged-or-tagged and `unauthenticated` must be set. `expect_key`/`expect_portable`, when not
// empty, must match. PermissionDenied: the tag (missing, or not ours); DataLoss: anything else
// (malformed, size, digest, a key other than the one asked for).
absl::StatusOr<KernelEntry> DecodeEntry(absl::string_view bytes, const SharingConfig& config,
                                        absl::string_view expect_key, absl::string_view expect_portable);

// A package: entries by portable key. Read whole, verified entry by entry when used.
class Package {
 public:
  // Parses `path`. With a key it may have any owner (entries are authenticated); without one it
  // must be a private file. Bounded (kMaxPackageBytes).
  static absl::StatusOr<std::shared_ptr<const Package>> Open(const std::string& path, const SharingConfig& config);
  // The encoded entry for `portable`, or nullptr.
  const std::string* Find(const std::string& portable) const;
  size_t size() const { return entries_.size(); }

  static constexpr int64_t kMaxPackageBytes = int64_t{1} << 30;

 private:
  std::map<std::string, std::string> entries_;
};

// The package for `config.package`, parsed once per file version (path, inode, size, mtime) in the
// process; nullptr with a one-time warning when it cannot be used.
std::shared_ptr<const Package> CurrentPackage(const SharingConfig& config);

// Builds a package of every kernel library in `cache_dir` that Warden recorded (Note [Kernel
// cache]) and whose portable key it knows, or only of the cache keys in `only` when it is not
// null; entries tagged with `hmac_key`. `skipped` gets one line per library left out and why.
absl::StatusOr<std::string> BuildPackage(const std::string& cache_dir, const std::optional<std::string>& hmac_key,
                                         int* count, std::vector<std::string>* skipped,
                                         const std::set<std::string>* only = nullptr);

}  // namespace warden::codegen

#endif  // WARDEN_RUNTIME_KERNEL_ENTRY_H_
