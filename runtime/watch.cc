// Note [Watched modules]
// A LibTorch module keeps C++ state that reaches ATen only as plain values: its training flag
// becomes batch_norm's `training` and dropout's `train` bool, its parameters are tensors the
// forward captures by reference. A trace sees the bools and the tensors, not where they came from,
// so `m->eval()` after compiling would hit the train-mode graph. CompiledFunction::watch(module)
// makes that state part of every later entry's guards: the training flag of the module and of each
// submodule, and which objects each one's parameter, buffer and child registries hold (a
// replace_module, or a registry that grew). The checks read the flags and registries directly
// (private members, reached through the explicit-instantiation rule below: LibTorch offers only
// the virtual is_training() and allocating accessors), so a watched module with 50 submodules
// costs one predictable load and compare per flag and per registry entry on a hit.
//
// What this cannot see: a tensor member assigned directly (`lin->weight = t`) bypasses the
// module's registry; LibTorch's own parameters(), optimizers and to() miss it too. Replace a
// parameter's contents in place (`weight.set_data(t)`, or copy_ under NoGradGuard): the cached
// graph reads the same tensor object, and its new metadata is guarded as a captured tensor's.
#include "runtime/watch.h"

#include <torch/nn/module.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace warden {
namespace {

using TensorDict = torch::OrderedDict<std::string, at::Tensor>;
using ChildDict = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;

// Access to torch::nn::Module's registries and training flag. Access checking does not apply to
// the names in an explicit instantiation ([temp.spec]), so `Expose` may name private members; the
// friend function it defines hands the member pointer to this file only.
template <typename Tag, typename Tag::type kMember>
struct Expose {
  friend typename Tag::type MemberOf(Tag) { return kMember; }
};
struct TrainingTag {
  using type = bool torch::nn::Module::*;
  friend type MemberOf(TrainingTag);
};
struct ParametersTag {
  using type = TensorDict torch::nn::Module::*;
  friend type MemberOf(ParametersTag);
};
struct BuffersTag {
  using type = TensorDict torch::nn::Module::*;
  friend type MemberOf(BuffersTag);
};
struct ChildrenTag {
  using type = ChildDict torch::nn::Module::*;
  friend type MemberOf(ChildrenTag);
};
template struct Expose<TrainingTag, &torch::nn::Module::is_training_>;
template struct Expose<ParametersTag, &torch::nn::Module::parameters_>;
template struct Expose<BuffersTag, &torch::nn::Module::buffers_>;
template struct Expose<ChildrenTag, &torch::nn::Module::children_>;

const char* KindName(int kind) {
  switch (kind) {
    case 0: return "parameter";
    case 1: return "buffer";
    default: return "submodule";
  }
}

const char* BoolText(bool b) { return b ? "true" : "false"; }

}  // namespace

WatchedModule MakeWatched(const torch::nn::Module& module, std::string name) {
  std::shared_ptr<const torch::nn::Module> owner = module.weak_from_this().lock();
  if (owner == nullptr) {
    throw Error(absl::StrCat("warden: watch(module, \"", name,
                             "\"): the module is not owned by a std::shared_ptr (construct it through its "
                             "ModuleHolder, e.g. torch::nn::Linear, or std::make_shared), so the function "
                             "could outlive it"));
  }
  if (name.empty()) throw Error("warden: watch(module, name): name must not be empty");
  return {std::move(owner), std::move(name)};
}

ModuleGuards ModuleGuards::Capture(const std::vector<WatchedModule>& watched) {
  ModuleGuards g;
  for (const WatchedModule& w : watched) {
    const int root = static_cast<int>(g.paths_.size());
    g.paths_.push_back(w.name);
    for (const auto& item : w.module->named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
      const torch::nn::Module& m = *item.value();
      g.alive_.push_back(item.value());
      const std::string prefix = item.key().empty() ? "" : absl::StrCat(item.key(), ".");
      int path = root;
      if (!item.key().empty()) {
        path = static_cast<int>(g.paths_.size());
        g.paths_.push_back(absl::StrCat(w.name, ".", item.key()));
      }
      const bool* flag = &(m.*MemberOf(TrainingTag{}));
      g.flags_.push_back({flag, *flag, path});
      auto add_tensors = [&](Registry::Kind kind, const TensorDict& dict) {
        g.registries_.push_back({kind, &dict, dict.size(), g.expected_.size(), root, prefix});
        for (const auto& entry : dict) {
          g.expected_.push_back(entry.value().unsafeGetTensorImpl());
          g.entry_names_.push_back(entry.key());
        }
      };
      add_tensors(Registry::kParameters, m.*MemberOf(ParametersTag{}));
      add_tensors(Registry::kBuffers, m.*MemberOf(BuffersTag{}));
      const ChildDict& children = m.*MemberOf(ChildrenTag{});
      g.registries_.push_back({Registry::kChildren, &children, children.size(), g.expected_.size(), root, prefix});
      for (const auto& entry : children) {
        g.expected_.push_back(entry.value().get());
        g.entry_names_.push_back(entry.key());
      }
    }
  }
  g.empty_ = g.flags_.empty();
  return g;
}

bool ModuleGuards::CheckAll() const noexcept {
  for (const Flag& f : flags_) {
    if (*f.flag != f.expected) return false;
  }
  const void* const* expected = expected_.data();
  for (const Registry& r : registries_) {
    if (r.kind == Registry::kChildren) {
      const auto& items = static_cast<const ChildDict*>(r.dict)->items();
      if (items.size() != r.size) return false;
      for (size_t i = 0; i < r.size; ++i) {
        if (items[i].value().get() != expected[r.first + i]) return false;
      }
    } else {
      const auto& items = static_cast<const TensorDict*>(r.dict)->items();
      if (items.size() != r.size) return false;
      for (size_t i = 0; i < r.size; ++i) {
        if (items[i].value().unsafeGetTensorImpl() != expected[r.first + i]) return false;
      }
    }
  }
  return true;
}

std::string ModuleGuards::FirstFailure() const {
  for (const Flag& f : flags_) {
    if (*f.flag != f.expected) {
      return absl::StrCat("module '", paths_[f.path], "' training mismatch. expected ", BoolText(f.expected),
                          ", actual ", BoolText(*f.flag));
    }
  }
  for (const Registry& r : registries_) {
    std::vector<const void*> now;
    std::vector<std::string> keys;
    if (r.kind == Registry::kChildren) {
      for (const auto& item : *static_cast<const ChildDict*>(r.dict)) {
        now.push_back(item.value().get());
        keys.push_back(item.key());
      }
    } else {
      for (const auto& item : *static_cast<const TensorDict*>(r.dict)) {
        now.push_back(item.value().unsafeGetTensorImpl());
        keys.push_back(item.key());
      }
    }
    const char* kind = KindName(r.kind);
    for (size_t i = 0; i < std::min(now.size(), r.size); ++i) {
      if (now[i] == expected_[r.first + i]) continue;
      const std::string name = absl::StrCat(r.prefix, keys[i]);
      return r.kind == Registry::kChildren
                 ? absl::StrCat("module '", paths_[r.root], "' submodule '", name, "' replaced")
                 : absl::StrCat("module '", paths_[r.root], "' ", kind, " '", name, "' rebound");
    }
    if (now.size() != r.size) {
      const std::string owner = r.prefix.empty() ? paths_[r.root]
                                                 : absl::StrCat(paths_[r.root], ".", r.prefix.substr(0, r.prefix.size() - 1));
      return absl::StrCat("module '", owner, "' ", kind, " count mismatch. expected ", r.size, ", actual ", now.size());
    }
  }
  return "";
}

std::vector<std::string> ModuleGuards::Describe() const {
  std::vector<std::string> lines;
  for (const Flag& f : flags_) {
    lines.push_back(absl::StrCat("module '", paths_[f.path], "' training == ", BoolText(f.expected),
                                 "  # watched module: train()/eval() reach ops only as bools"));
  }
  for (const Registry& r : registries_) {
    if (r.size == 0) continue;
    std::vector<std::string> names;
    for (size_t i = 0; i < r.size; ++i) names.push_back(absl::StrCat(r.prefix, entry_names_[r.first + i]));
    lines.push_back(absl::StrCat("module '", paths_[r.root], "' ", KindName(r.kind), r.size == 1 ? " " : "s ",
                                 absl::StrJoin(names, ", "), " bound as at compile time  # watched module"));
  }
  return lines;
}

}  // namespace warden
