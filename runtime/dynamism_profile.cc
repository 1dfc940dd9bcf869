// Note [Dynamism profiles] in dynamism_profile.h.
#include "runtime/dynamism_profile.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/codegen_compiler.h"
#include "runtime/logging.h"
#include "runtime/private_files.h"

namespace warden::runtime {
namespace {

constexpr int kVersion = 1;
constexpr int64_t kMaxProfileBytes = 1 << 20;

bool Enabled() {
  const char* env = std::getenv("WARDEN_DYNAMISM_PROFILES");
  return env == nullptr || std::string(env) != "0";
}

// What a profile is valid for: per argument, a tensor's rank and dtype or a scalar's type.
std::string Signature(const std::vector<c10::IValue>& args) {
  std::string sig;
  for (const c10::IValue& a : args) {
    if (a.isTensor() && a.toTensor().defined()) {
      absl::StrAppend(&sig, "T", a.toTensor().dim(), ":", c10::toString(a.toTensor().scalar_type()), ";");
    } else {
      absl::StrAppend(&sig, a.tagKind(), ";");
    }
  }
  return sig;
}

// Whether the arguments have dim `dim` of argument `arg` (a defined tensor of enough rank).
bool HasDim(const std::vector<c10::IValue>& args, int64_t arg, int64_t dim) {
  return arg >= 0 && arg < static_cast<int64_t>(args.size()) && args[arg].isTensor() &&
         args[arg].toTensor().defined() && dim >= 0 && dim < args[arg].toTensor().dim();
}

std::string ProfileDir() {
  const std::string kernels = codegen::KernelCacheDir();
  absl::string_view dir = kernels;
  if (dir.empty() || !absl::ConsumeSuffix(&dir, "/kernels")) return "";
  return absl::StrCat(dir, "/profiles");
}

std::string PathFor(const std::string& dir, const std::string& name, const std::string& function,
                    const std::string& signature) {
  const std::string nul(1, '\0');
  return absl::StrCat(dir, "/", files::Sha256Hex(absl::StrCat(name, nul, function, nul, signature)).substr(0, 32),
                      ".json");
}

}  // namespace

DynamismProfile LoadDynamismProfile(const std::string& name, const std::string& function,
                                    const std::vector<c10::IValue>& args) {
  DynamismProfile p;
  const std::string dir = ProfileDir();
  if (!Enabled() || dir.empty()) return p;
  const std::string signature = Signature(args);
  p.path = PathFor(dir, name, function, signature);
  auto file = files::ReadPrivateFile(p.path, kMaxProfileBytes);
  std::string version;  // what was read, so that each distinct bad profile is reported once
  if (!file.ok()) {
    if (file.status().code() != absl::StatusCode::kNotFound) p.note = std::string(file.status().message());
  } else {
    version = files::Sha256Hex(file->bytes);
    const nlohmann::json j = nlohmann::json::parse(file->bytes, nullptr, /*allow_exceptions=*/false);
    // Every field's type is checked before it is read (json::value throws on a wrong type).
    auto string_field = [&](const char* key) {
      return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
    };
    if (!j.is_object() || !j.contains("version") || !j["version"].is_number_integer() ||
        j["version"].get<int64_t>() != kVersion || !j.contains("dims") || !j["dims"].is_array()) {
      p.note = "malformed";
    } else if (string_field("name") != name || string_field("function") != function ||
               string_field("signature") != signature) {
      p.note = "written for another function (name, callable or argument signature differ)";
    } else {
      for (const auto& d : j["dims"]) {
        if (!d.is_array() || d.size() != 2 || !d[0].is_number_integer() || !d[1].is_number_integer()) {
          p.note = "malformed";
          break;
        }
        const int64_t arg = d[0].get<int64_t>(), dim = d[1].get<int64_t>();
        if (!HasDim(args, arg, dim)) {
          p.note = absl::StrCat("names arg", arg, ".size(", dim, "), which the arguments do not have");
          break;
        }
        p.dims.insert({static_cast<int>(arg), static_cast<int>(dim)});
      }
    }
  }
  if (!p.note.empty()) {
    p.dims.clear();
    p.note = absl::StrCat("dynamism profile ", p.path, " ignored: ", p.note);
    WarnOnce(p.note + version, absl::StrCat("warden: function '", EscapeControl(name), "': ", EscapeControl(p.note)));
  }
  return p;
}

void SaveDynamismProfile(const std::string& name, const std::string& function, const std::vector<c10::IValue>& args,
                         const std::set<std::pair<int, int>>& dims) {
  const std::string dir = ProfileDir();
  if (!Enabled() || dir.empty() || dims.empty()) return;
  auto resolved = files::EnsurePrivateDir(dir);
  if (!resolved.ok()) return;
  const std::string signature = Signature(args);
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [arg, dim] : dims) {
    // Only dims these arguments have (the signature is theirs; a dim of an earlier rank is not).
    if (HasDim(args, arg, dim)) list.push_back({arg, dim});
  }
  if (list.empty()) return;
  const nlohmann::json j = {
      {"version", kVersion}, {"name", name}, {"function", function}, {"signature", signature}, {"dims", list}};
  files::WritePrivateFile(PathFor(*resolved, name, function, signature), j.dump() + "\n").IgnoreError();
}

}  // namespace warden::runtime
