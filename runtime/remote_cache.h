// The shared kernel cache on Redis (WARDEN_REMOTE_CACHE=redis://HOST:PORT[/DB]): get and put of
// encoded entries (runtime/kernel_entry.h) under "warden:kernel:v1:<key>", through hiredis.
//
// Every operation has one deadline, WARDEN_REMOTE_CACHE_TIMEOUT_MS (default 500), for connecting,
// sending and receiving together: the socket is non-blocking and polled against the deadline, so a
// dead, slow or trickling server costs at most that much per miss, never a hang. The host name is
// resolved once per process (the system resolver, outside the deadline: use an address or a name
// in /etc/hosts where DNS may be slow). A reply is bounded in size (kMaxEntryBytes) while it is
// read, and must not be an array (whose elements hiredis would allocate up front). A connection
// inherited through fork() is replaced; an idle one the server dropped is retried once. After a
// failure the server is left alone for 10 s (one warning per URL and kind of failure), and misses
// compile locally meanwhile. Operations on one URL are serialized (one connection).
#ifndef WARDEN_RUNTIME_REMOTE_CACHE_H_
#define WARDEN_RUNTIME_REMOTE_CACHE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace warden::codegen {

struct RemoteCacheStats {
  int64_t gets = 0;      // lookups sent
  int64_t hits = 0;      // lookups that returned an entry (verified or not)
  int64_t puts = 0;      // entries published
  int64_t failures = 0;  // operations that failed (unreachable, timeout, protocol, size)
  int64_t skipped = 0;   // operations not attempted because the server failed recently
};
RemoteCacheStats GetRemoteCacheStats();

// The entry stored under `key` at `url`: nullopt if there is none. Errors: InvalidArgument (the
// URL), Unavailable (down, timeout, recently failed), DataLoss (protocol, too large).
absl::StatusOr<std::optional<std::string>> RemoteGet(const std::string& url, const std::string& key);

// Stores `entry` under `key`: unless an entry is there already, or, with `replace`, in any case.
absl::Status RemotePut(const std::string& url, const std::string& key, const std::string& entry, bool replace = false);

// Forgets connections and recent failures (tests).
void ResetRemoteCacheForTesting();

}  // namespace warden::codegen

#endif  // WARDEN_RUNTIME_REMOTE_CACHE_H_
