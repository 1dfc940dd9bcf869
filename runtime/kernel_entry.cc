// Note [Shared kernels] in kernel_entry.h.
#include "runtime/kernel_entry.h"

#include <dirent.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/logging.h"
#include "runtime/private_files.h"

namespace warden::codegen {
namespace {

constexpr absl::string_view kEntryMagic = "warden-kernel-entry 1";
constexpr absl::string_view kPackageMagic = "warden-package 1";
constexpr size_t kMaxHeaderBytes = 4096;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string HmacHex(const std::string& key, absl::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), mac, &length) == nullptr) {
    return "";
  }
  return files::Hex(absl::string_view(reinterpret_cast<const char*>(mac), length));
}

bool IsHex(absl::string_view s, size_t length) {
  if (s.size() != length) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// One line of header text: no control characters (they would split the header).
std::string OneLine(const std::string& s) {
  std::string out;
  for (char c : s) out.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c);
  if (out.size() > 1024) out = out.substr(0, 1021) + "...";  // the header must fit kMaxHeaderBytes
  return out;
}

// The header up to (not including) the tag line: what the tag covers.
std::string Covered(const KernelEntry& e) {
  return absl::StrCat(kEntryMagic, "\nkey ", e.key, "\nportable ", e.portable, "\ncompiler ", OneLine(e.compiler),
                      "\nsize ", e.library.size(), "\nsha256 ", files::Sha256Hex(e.library), "\n");
}

}  // namespace

std::string LibraryRecord(absl::string_view library_bytes) {
  return absl::StrCat("sha256 ", files::Sha256Hex(library_bytes), " ", library_bytes.size(), "\n");
}

std::string KeyFingerprint(const std::string& key) { return HmacHex(key, "warden-key-fingerprint-v1").substr(0, 16); }

absl::StatusOr<std::string> ReadKeyFile(const std::string& path) {
  auto file = files::ReadRegularFile(path, 4096, files::Trust::kSecret);
  if (!file.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("WARDEN_CACHE_KEY_FILE: ", file.status().message()));
  }
  std::string key = file->bytes;
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (key.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat("WARDEN_CACHE_KEY_FILE: ", path, " holds ", key.size(),
                                                   " bytes; a key must have at least 16 (e.g. `head -c 32 "
                                                   "/dev/urandom | base64 > FILE; chmod 600 FILE`)"));
  }
  return key;
}

SharingConfig ReadSharingConfig() {
  SharingConfig c;
  c.remote = Env("WARDEN_REMOTE_CACHE");
  c.package = Env("WARDEN_PACKAGE");
  if (c.remote.empty() && c.package.empty()) return c;
  const std::string key_file = Env("WARDEN_CACHE_KEY_FILE");
  const std::string opt_in = Env("WARDEN_CACHE_UNAUTHENTICATED");
  if (!key_file.empty()) {
    auto key = ReadKeyFile(key_file);
    if (!key.ok()) {
      c.problem = std::string(key.status().message());
    } else {
      c.key = *std::move(key);
    }
  } else if (opt_in == "1") {
    c.unauthenticated = true;
    runtime::WarnOnce("sharing-unauthenticated",
                      "warden: WARDEN_CACHE_UNAUTHENTICATED=1: shared kernels are loaded without authentication; "
                      "anyone who can write the Redis server or the package can run code in this process "
                      "(set WARDEN_CACHE_KEY_FILE to a secret the fleet shares instead)");
  } else {
    c.problem = "no WARDEN_CACHE_KEY_FILE (shared kernels must be authenticated; set it to a secret the fleet "
                "shares, or WARDEN_CACHE_UNAUTHENTICATED=1 to accept unauthenticated ones)";
  }
  if (!c.problem.empty()) {
    runtime::WarnOnce(absl::StrCat("sharing-off-", c.problem),
                      absl::StrCat("warden: the shared kernel cache and packages are off: ",
                                   runtime::EscapeControl(c.problem), "; kernels are compiled locally"));
  }
  return c;
}

std::string EncodeEntry(const KernelEntry& entry, const std::optional<std::string>& hmac_key) {
  const std::string covered = Covered(entry);
  const std::string tag = hmac_key.has_value() ? HmacHex(*hmac_key, covered) : "none";
  return absl::StrCat(covered, "hmac-sha256 ", tag, "\n\n", entry.library);
}

absl::StatusOr<KernelEntry> DecodeEntry(absl::string_view bytes, const SharingConfig& config,
                                        absl::string_view expect_key, absl::string_view expect_portable) {
  if (static_cast<int64_t>(bytes.size()) > kMaxEntryBytes) {
    return absl::DataLossError(absl::StrCat("size: ", bytes.size(), " bytes, more than the ", kMaxEntryBytes,
                                            " an entry can be"));
  }
  const size_t end = bytes.substr(0, kMaxHeaderBytes).find("\n\n");
  if (end == absl::string_view::npos) return absl::DataLossError("malformed: no header");
  const std::vector<absl::string_view> lines = absl::StrSplit(bytes.substr(0, end), '\n');
  if (lines.size() != 7 || lines[0] != kEntryMagic) return absl::DataLossError("malformed header");
  const char* names[] = {"key ", "portable ", "compiler ", "size ", "sha256 ", "hmac-sha256 "};
  std::string fields[6];
  for (int i = 0; i < 6; ++i) {
    absl::string_view line = lines[i + 1];
    if (!absl::ConsumePrefix(&line, names[i])) return absl::DataLossError(absl::StrCat("malformed header: ", names[i]));
    fields[i] = std::string(line);
  }
  KernelEntry e;
  e.key = fields[0];
  e.portable = fields[1];
  e.compiler = fields[2];
  e.library = std::string(bytes.substr(end + 2));
  int64_t size = -1;
  if (!IsHex(e.key, 32) || !IsHex(e.portable, 32) || !absl::SimpleAtoi(fields[3], &size) ||
      !IsHex(fields[4], 64)) {
    return absl::DataLossError("malformed header");
  }
  // The tag first: nothing of an entry that is not ours is looked at further.
  const std::string covered(bytes.substr(0, end + 1 - lines[6].size() - 1));
  if (config.key.has_value()) {
    if (fields[5] == "none") return absl::PermissionDeniedError("tag: the entry is not authenticated");
    const std::string expected = HmacHex(*config.key, covered);
    if (!IsHex(fields[5], 64) || expected.size() != 64 || CRYPTO_memcmp(expected.data(), fields[5].data(), 64) != 0) {
      return absl::PermissionDeniedError("tag: does not verify with this host's key (tampered, or another key)");
    }
  } else if (!config.unauthenticated) {
    return absl::PermissionDeniedError("tag: no key to verify it with");
  }
  if (!expect_key.empty() && e.key != expect_key) {
    return absl::DataLossError(absl::StrCat("key mismatch: the entry is for ", e.key));
  }
  if (!expect_portable.empty() && e.portable != expect_portable) {
    return absl::DataLossError(absl::StrCat("key mismatch: the entry's portable key is ", e.portable));
  }
  if (size != static_cast<int64_t>(e.library.size())) {
    return absl::DataLossError(absl::StrCat("size: the header says ", size, " bytes, the entry holds ", e.library.size()));
  }
  if (files::Sha256Hex(e.library) != fields[4]) return absl::DataLossError("digest: the library's SHA-256 differs");
  return e;
}

absl::StatusOr<std::shared_ptr<const Package>> Package::Open(const std::string& path, const SharingConfig& config) {
  auto file = files::ReadRegularFile(path, kMaxPackageBytes,
                                     config.key.has_value() ? files::Trust::kAnyOwner : files::Trust::kPrivate);
  if (!file.ok()) return absl::FailedPreconditionError(std::string(file.status().message()));
  absl::string_view rest = file->bytes;
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, " is not a Warden package: ", why));
  };
  if (!absl::ConsumePrefix(&rest, kPackageMagic) || !absl::ConsumePrefix(&rest, "\n")) return bad("no header");
  auto package = std::make_shared<Package>();
  while (!rest.empty()) {
    const size_t nl = rest.substr(0, 64).find('\n');
    if (nl == absl::string_view::npos) return bad("malformed entry header");
    absl::string_view head = rest.substr(0, nl);
    int64_t length = 0;
    std::vector<absl::string_view> parts = absl::StrSplit(head, ' ');
    if (parts.size() != 3 || parts[0] != "entry" || !IsHex(parts[1], 32) || !absl::SimpleAtoi(parts[2], &length) ||
        length < 0 || length > kMaxEntryBytes || static_cast<size_t>(length) > rest.size() - nl - 1) {
      return bad("malformed entry header");
    }
    package->entries_[std::string(parts[1])] = std::string(rest.substr(nl + 1, static_cast<size_t>(length)));
    rest.remove_prefix(nl + 1 + static_cast<size_t>(length));
  }
  return std::shared_ptr<const Package>(std::move(package));
}

const std::string* Package::Find(const std::string& portable) const {
  auto it = entries_.find(portable);
  return it == entries_.end() ? nullptr : &it->second;
}

std::shared_ptr<const Package> CurrentPackage(const SharingConfig& config) {
  if (config.package.empty() || !config.enabled()) return nullptr;
  static std::mutex mu;
  // Per path, the version last read (a new version replaces the old one's bytes).
  static auto* loaded = new std::map<std::string, std::pair<std::string, std::shared_ptr<const Package>>>();
  struct stat st;
  std::string version = config.package;
  if (stat(config.package.c_str(), &st) == 0) {
    absl::StrAppend(&version, "|", st.st_dev, "|", st.st_ino, "|", st.st_size, "|", st.st_mtim.tv_sec, ".",
                    st.st_mtim.tv_nsec, "|", config.key.has_value());
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded->find(config.package);
  if (it != loaded->end() && it->second.first == version) return it->second.second;
  auto package = Package::Open(config.package, config);
  if (!package.ok()) {
    runtime::WarnOnce(absl::StrCat("package-", version),
                      absl::StrCat("warden: WARDEN_PACKAGE unusable: ",
                                   runtime::EscapeControl(std::string(package.status().message())),
                                   "; kernels are compiled locally where a compiler is available"));
    (*loaded)[config.package] = {version, nullptr};
    return nullptr;
  }
  (*loaded)[config.package] = {version, *package};
  return *package;
}

absl::StatusOr<std::string> BuildPackage(const std::string& cache_dir, const std::optional<std::string>& hmac_key,
                                         int* count, std::vector<std::string>* skipped,
                                         const std::set<std::string>* only) {
  *count = 0;
  DIR* dir = opendir(cache_dir.c_str());
  if (dir == nullptr) return absl::NotFoundError(absl::StrCat("cannot open the kernel cache ", cache_dir));
  std::vector<std::string> keys;
  while (dirent* d = readdir(dir)) {
    absl::string_view name = d->d_name;
    if (absl::ConsumeSuffix(&name, ".so") && IsHex(name, 32) && (only == nullptr || only->count(std::string(name)))) {
      keys.emplace_back(name);
    }
  }
  closedir(dir);
  std::sort(keys.begin(), keys.end());
  if (only != nullptr) {
    for (const std::string& key : *only) {
      if (!std::binary_search(keys.begin(), keys.end(), key)) skipped->push_back(absl::StrCat(key, ": not in ", cache_dir));
    }
  }
  std::string out = absl::StrCat(kPackageMagic, "\n");
  for (const std::string& key : keys) {
    const std::string base = absl::StrCat(cache_dir, "/", key);
    auto library = files::ReadPrivateFile(base + ".so", kMaxEntryBytes - 4096);
    auto record = files::ReadPrivateFile(base + ".sha256", 4096);
    auto meta = files::ReadPrivateFile(base + ".meta", 4096);
    if (!library.ok() || !record.ok() ||
        record->bytes != LibraryRecord(library->bytes)) {
      skipped->push_back(absl::StrCat(key, ": no library recorded by Warden"));
      continue;
    }
    if (!meta.ok()) {
      skipped->push_back(absl::StrCat(key, ": no portable key recorded (built by an older Warden)"));
      continue;
    }
    KernelEntry e;
    e.key = key;
    e.library = std::move(library->bytes);
    for (absl::string_view line : absl::StrSplit(meta->bytes, '\n')) {
      if (absl::ConsumePrefix(&line, "portable ")) e.portable = std::string(line);
      if (absl::ConsumePrefix(&line, "compiler ")) e.compiler = std::string(line);
    }
    if (!IsHex(e.portable, 32)) {
      skipped->push_back(absl::StrCat(key, ": malformed .meta"));
      continue;
    }
    const std::string encoded = EncodeEntry(e, hmac_key);
    absl::StrAppend(&out, "entry ", e.portable, " ", encoded.size(), "\n", encoded);
    ++*count;
  }
  return out;
}

}  // namespace warden::codegen
