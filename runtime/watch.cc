// Note [Watched modules]
// A LibTorch module keeps C++ state that reaches ATen only as plain values: its training flag
// becomes batch_norm's `training` and dropout's `train` bool. A trace sees the bool, not where it
// came from, so `m->eval()` after compiling would hit the train-mode graph.
// CompiledFunction::watch(module) makes that state part of every later entry's guards: the training
// flag of the module and of each submodule, and, for every container module, which submodules its
// child registry holds (replace_module rebinds one in place; register_module adds one). The checks
// read the flags and registries directly (private members, reached through the
// explicit-instantiation rule below: LibTorch offers only the virtual is_training() and allocating
// accessors), without a branch per flag, so a watched model of 50 submodules costs about one load
// per submodule on a hit (bench/watch_bench).
//
// Bound tensors. Parameters and buffers are tensors the trace captures: their metadata is guarded
// as every captured tensor's (Note [Captured tensors] in guards/builder.cc), and in-place changes
// (optimizer steps, torch::load, set_data, to()) are what replay reads. But LibTorch's modules read
// their tensor *members* in forward (LinearImpl::weight), and `lin->weight = t` rebinds the member:
// the graph would go on reading the tensor it captured. For the module types LibTorch ships
// (TensorMembers below: linear, bilinear, conv and transposed conv, batch/instance/layer/group
// norm, embedding, PReLU) the guards hold the TensorImpl each member was bound to, one load and
// compare per member (~1.2 ns each, bench/watch_bench); a rebinding misses with "module 'model'
// parameter 'fc.weight' rebound". Only members the entry's graph captured are kept, and undefined
// ones (an absent bias a rebinding would bring in): the graph depends on no other member, and a
// watched model the function does not run costs nothing here.
//
// What is not guarded, and why. Members of the user's own module classes are C++ fields Warden
// cannot enumerate (guard them by reading them through an op, or `reset()` after rebinding), and
// recurrent modules keep their weights in a flat list only their own code rebinds. Which tensor a
// registry slot holds cannot change through LibTorch's API (register_parameter refuses a name
// twice). Leaf modules that gain a child after compiling are not seen either.
//
// Flags the function itself changes (`model->eval()` inside it) are guarded as the call found them
// and replayed as it left them: every hit sets them again after its artifact ran. A function that
// registers or replaces submodules runs eagerly (reported).
#include "runtime/watch.h"

#include <algorithm>
#include <type_traits>

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/functional/instancenorm.h>  // instancenorm.h uses it without including it
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace warden {
namespace {

using ChildDict = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;

// Access to torch::nn::Module's child registry and training flag. Access checking does not apply to
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
struct ChildrenTag {
  using type = ChildDict torch::nn::Module::*;
  friend type MemberOf(ChildrenTag);
};
template struct Expose<TrainingTag, &torch::nn::Module::is_training_>;
template struct Expose<ChildrenTag, &torch::nn::Module::children_>;

const char* BoolText(bool b) { return b ? "true" : "false"; }

struct Member {
  const char* name;
  const at::Tensor* tensor;
  bool buffer;
};

// The tensor members the forward of a LibTorch module reads (Note [Watched modules]: bound
// tensors); none for other module types.
std::vector<Member> TensorMembers(const torch::nn::Module& m) {
  namespace nn = torch::nn;
  auto weight_bias = [](const auto* p) {
    return std::vector<Member>{{"weight", &p->weight, false}, {"bias", &p->bias, false}};
  };
  auto norm = [](const auto* p) {
    return std::vector<Member>{{"weight", &p->weight, false},
                               {"bias", &p->bias, false},
                               {"running_mean", &p->running_mean, true},
                               {"running_var", &p->running_var, true},
                               {"num_batches_tracked", &p->num_batches_tracked, true}};
  };
#define WARDEN_MEMBERS(Type, how) \
  if (const auto* p = dynamic_cast<const nn::Type*>(&m)) return how(p);
  WARDEN_MEMBERS(LinearImpl, weight_bias)
  WARDEN_MEMBERS(BilinearImpl, weight_bias)
  WARDEN_MEMBERS(Conv1dImpl, weight_bias)
  WARDEN_MEMBERS(Conv2dImpl, weight_bias)
  WARDEN_MEMBERS(Conv3dImpl, weight_bias)
  WARDEN_MEMBERS(ConvTranspose1dImpl, weight_bias)
  WARDEN_MEMBERS(ConvTranspose2dImpl, weight_bias)
  WARDEN_MEMBERS(ConvTranspose3dImpl, weight_bias)
  WARDEN_MEMBERS(LayerNormImpl, weight_bias)
  WARDEN_MEMBERS(GroupNormImpl, weight_bias)
  WARDEN_MEMBERS(BatchNorm1dImpl, norm)
  WARDEN_MEMBERS(BatchNorm2dImpl, norm)
  WARDEN_MEMBERS(BatchNorm3dImpl, norm)
  WARDEN_MEMBERS(InstanceNorm1dImpl, norm)
  WARDEN_MEMBERS(InstanceNorm2dImpl, norm)
  WARDEN_MEMBERS(InstanceNorm3dImpl, norm)
#undef WARDEN_MEMBERS
  if (const auto* p = dynamic_cast<const nn::EmbeddingImpl*>(&m)) return {{"weight", &p->weight, false}};
  if (const auto* p = dynamic_cast<const nn::EmbeddingBagImpl*>(&m)) return {{"weight", &p->weight, false}};
  if (const auto* p = dynamic_cast<const nn::PReLUImpl*>(&m)) return {{"weight", &p->weight, false}};
  return {};
}

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
      int path = root;
      if (!item.key().empty()) {
        path = static_cast<int>(g.paths_.size());
        g.paths_.push_back(absl::StrCat(w.name, ".", item.key()));
      }
      const bool* flag = &(m.*MemberOf(TrainingTag{}));
      g.flags_.push_back(flag);
      g.flag_expected_.push_back(*flag);
      g.flag_paths_.push_back(path);
      for (const Member& member : TensorMembers(m)) {
        g.bound_.push_back({member.tensor, member.tensor->unsafeGetTensorImpl()});
        g.bound_names_.push_back({root, member.buffer,
                                  item.key().empty() ? member.name : absl::StrCat(item.key(), ".", member.name)});
      }
      const auto& items = (m.*MemberOf(ChildrenTag{})).items();
      if (items.empty()) continue;  // a leaf (Note [Watched modules]: what is not guarded)
      g.children_.push_back({&items, items.data(), items.size(), g.expected_.size(), root,
                             item.key().empty() ? "" : absl::StrCat(item.key(), ".")});
      for (const auto& child : items) {
        g.expected_.push_back(child.value().get());
        g.child_names_.push_back(child.key());
      }
    }
  }
  g.empty_ = g.flags_.empty();
  return g;
}

void ModuleGuards::KeepBoundTensorsIn(const std::vector<const c10::TensorImpl*>& captured) {
  size_t kept = 0;
  for (size_t k = 0; k < bound_.size(); ++k) {
    const c10::TensorImpl* impl = bound_[k].expected;
    if (impl != c10::UndefinedTensorImpl::singleton() && !std::binary_search(captured.begin(), captured.end(), impl)) {
      continue;
    }
    if (kept != k) {
      bound_[kept] = bound_[k];
      bound_names_[kept] = std::move(bound_names_[k]);
    }
    ++kept;
  }
  bound_.resize(kept);
  bound_names_.resize(kept);
}

bool ModuleGuards::CheckAll() const noexcept {
  // Flags first (a train()/eval() switch is by far the most common change), without a branch per
  // flag: one load, xor and or each.
  const bool* const* flag = flags_.data();
  const uint8_t* want = flag_expected_.data();
  const size_t n = flags_.size();
  unsigned changed = 0, changed2 = 0, changed3 = 0, changed4 = 0;  // independent chains
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    changed |= static_cast<unsigned>(*flag[i]) ^ want[i];
    changed2 |= static_cast<unsigned>(*flag[i + 1]) ^ want[i + 1];
    changed3 |= static_cast<unsigned>(*flag[i + 2]) ^ want[i + 2];
    changed4 |= static_cast<unsigned>(*flag[i + 3]) ^ want[i + 3];
  }
  for (; i < n; ++i) changed |= static_cast<unsigned>(*flag[i]) ^ want[i];
  if ((changed | changed2 | changed3 | changed4) != 0) return false;
  // Bound tensors: one load of the member's TensorImpl pointer each, no branch per member.
  const Bound* bound = bound_.data();
  const size_t m = bound_.size();
  uintptr_t rebound = 0, rebound2 = 0;
  size_t k = 0;
  for (; k + 2 <= m; k += 2) {
    rebound |= reinterpret_cast<uintptr_t>(bound[k].member->unsafeGetTensorImpl()) ^
               reinterpret_cast<uintptr_t>(bound[k].expected);
    rebound2 |= reinterpret_cast<uintptr_t>(bound[k + 1].member->unsafeGetTensorImpl()) ^
                reinterpret_cast<uintptr_t>(bound[k + 1].expected);
  }
  if (k < m) {
    rebound |= reinterpret_cast<uintptr_t>(bound[k].member->unsafeGetTensorImpl()) ^ reinterpret_cast<uintptr_t>(bound[k].expected);
  }
  if ((rebound | rebound2) != 0) return false;
  return StructureHolds();
}

// Flags are written through the same member pointer LibTorch's Module::train() writes, not by
// calling train() (virtual and recursive: it would also set the children, whose flags the call may
// have left differently).
void ModuleGuards::RecordFlagsAfterCall() {
  flag_writes_.clear();
  for (size_t i = 0; i < flags_.size(); ++i) {
    if (*flags_[i] != flag_expected_[i]) flag_writes_.push_back({const_cast<bool*>(flags_[i]), *flags_[i]});
  }
}

void ModuleGuards::ApplyFlagWrites() const noexcept {
  for (const auto& [flag, value] : flag_writes_) *flag = value;
}

void ModuleGuards::RestoreFlags() const noexcept {
  for (size_t i = 0; i < flags_.size(); ++i) *const_cast<bool*>(flags_[i]) = flag_expected_[i];
}

bool ModuleGuards::StructureHolds() const noexcept {
  using Items = std::vector<ChildDict::Item>;
  const void* const* expected = expected_.data();
  for (const Children& c : children_) {
    const Items& items = *static_cast<const Items*>(c.items);
    if (static_cast<const void*>(items.data()) != c.begin || items.size() != c.size) return false;
    const ChildDict::Item* item = items.data();
    const void* const* want_child = expected + c.first;
    uintptr_t diff = 0, diff2 = 0;  // independent chains, no branch per child
    size_t k = 0;
    for (; k + 2 <= c.size; k += 2) {
      diff |= reinterpret_cast<uintptr_t>(item[k].value().get()) ^ reinterpret_cast<uintptr_t>(want_child[k]);
      diff2 |= reinterpret_cast<uintptr_t>(item[k + 1].value().get()) ^ reinterpret_cast<uintptr_t>(want_child[k + 1]);
    }
    if (k < c.size) diff |= reinterpret_cast<uintptr_t>(item[k].value().get()) ^ reinterpret_cast<uintptr_t>(want_child[k]);
    if ((diff | diff2) != 0) return false;
  }
  return true;
}

std::string ModuleGuards::FirstFailure() const {
  for (size_t i = 0; i < flags_.size(); ++i) {
    if (*flags_[i] != flag_expected_[i]) {
      return absl::StrCat("module '", paths_[flag_paths_[i]], "' training mismatch. expected ",
                          BoolText(flag_expected_[i]), ", actual ", BoolText(*flags_[i]));
    }
  }
  for (size_t k = 0; k < bound_.size(); ++k) {
    if (bound_[k].member->unsafeGetTensorImpl() == bound_[k].expected) continue;
    const BoundName& b = bound_names_[k];
    return absl::StrCat("module '", paths_[b.root], "' ", b.buffer ? "buffer '" : "parameter '", b.name, "' rebound");
  }
  using Items = std::vector<ChildDict::Item>;
  for (const Children& c : children_) {
    const Items& items = *static_cast<const Items*>(c.items);
    for (size_t i = 0; i < std::min(items.size(), c.size); ++i) {
      if (items[i].value().get() == expected_[c.first + i] && items[i].key() == child_names_[c.first + i]) continue;
      return absl::StrCat("module '", paths_[c.root], "' submodule '", c.prefix, child_names_[c.first + i],
                          "' replaced");
    }
    if (items.size() != c.size) {
      const std::string owner =
          c.prefix.empty() ? paths_[c.root] : absl::StrCat(paths_[c.root], ".", c.prefix.substr(0, c.prefix.size() - 1));
      return absl::StrCat("module '", owner, "' submodule count mismatch. expected ", c.size, ", actual ",
                          items.size());
    }
  }
  return "";
}

std::vector<std::string> ModuleGuards::Describe() const {
  std::vector<std::string> lines;
  for (size_t i = 0; i < flags_.size(); ++i) {
    lines.push_back(absl::StrCat("module '", paths_[flag_paths_[i]], "' training == ", BoolText(flag_expected_[i]),
                                 "  # watched module: train()/eval() reach ops only as bools"));
  }
  if (!bound_.empty()) {
    std::vector<std::string> names;
    for (const BoundName& b : bound_names_) names.push_back(absl::StrCat(paths_[b.root], ".", b.name));
    lines.push_back(absl::StrCat("module tensors ", absl::StrJoin(names, ", "),
                                 " bound as at compile time  # watched module: forward reads the members"));
  }
  for (const Children& c : children_) {
    std::vector<std::string> names;
    for (size_t i = 0; i < c.size; ++i) names.push_back(absl::StrCat(c.prefix, child_names_[c.first + i]));
    lines.push_back(absl::StrCat("module '", paths_[c.root], "' submodule", c.size == 1 ? " " : "s ",
                                 absl::StrJoin(names, ", "), " registered as at compile time  # watched module"));
  }
  return lines;
}

}  // namespace warden
