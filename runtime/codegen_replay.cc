// Boxed replay of single nodes: the steps of backend "aten" (aten_backend.cc) and of the unfused
// nodes of the code-generating backend.
#include "runtime/codegen_replay.h"

#include <algorithm>
#include <limits>

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "guards/guard.h"

namespace warden::codegen {
namespace {

using tracer::NodeArg;
using tracer::NodeReturn;
using tracer::ValueId;

bool SameScalar(const c10::IValue& a, const c10::IValue& b) {
  auto as_double = [](const c10::IValue& v, double* d) {
    if (v.isDouble()) { *d = v.toDouble(); return true; }
    if (v.isScalar() && v.toScalar().isFloatingPoint()) { *d = v.toScalar().toDouble(); return true; }
    return false;
  };
  double da, db;
  if (as_double(a, &da) && as_double(b, &db)) return guards::SameDouble(da, db);
  if (a.isBool() && b.isBool()) return a.toBool() == b.toBool();
  if (a.isInt() && b.isInt()) return a.toInt() == b.toInt();
  if (a.isComplexDouble() && b.isComplexDouble()) return a.toComplexDouble() == b.toComplexDouble();
  return false;
}

}  // namespace

int SlotMap::Slot(ValueId id) {
  if (graph_.value(id).kind == tracer::ValueKind::kConstant) return -1;
  if (slot_of_[id] < 0) slot_of_[id] = num_slots_++;
  return slot_of_[id];
}

OpStep MakeOpStep(const tracer::Graph& g, const tracer::Node& n, SlotMap& slots,
                  const std::vector<tracer::ValueId>* forward) {
  OpStep s{*n.handle, n.op, n.index, {}, {}, false, {}, n.mode};
  auto read = [forward](ValueId id) { return forward != nullptr && id != tracer::kNoValue ? (*forward)[id] : id; };
  for (NodeArg na : n.args) {
    na.value = read(na.value);
    for (ValueId& id : na.values) id = read(id);
    OpStepArg a;
    switch (na.kind) {
      case NodeArg::Kind::kConstant:
        a.kind = na.sizes_of.empty() ? OpStepArg::Kind::kConstant : OpStepArg::Kind::kRunTimeSizes;
        a.constant = na.constant;
        if (a.constant.isIntList()) a.ints = a.constant.toIntVector();
        for (const tracer::SizeRef& r : na.sizes_of) a.sizes.push_back({r.elem, slots.Slot(g.arg_values.at(r.arg)), r.dim, r.scale});
        break;
      case NodeArg::Kind::kValue:
        a.slot = slots.Slot(na.value);
        if (a.slot >= 0) {
          a.kind = OpStepArg::Kind::kSlot;
        } else {
          a.kind = OpStepArg::Kind::kConstant;
          a.constant = g.value(na.value).constant;
        }
        break;
      case NodeArg::Kind::kValueList:
      case NodeArg::Kind::kOptValueList:
        a.kind = na.kind == NodeArg::Kind::kValueList ? OpStepArg::Kind::kSlotList
                                                      : OpStepArg::Kind::kOptSlotList;
        for (ValueId id : na.values) {
          if (id == tracer::kNoValue) {
            a.slots.push_back(-1);
            a.list_constants.emplace_back();
          } else if (g.value(id).kind == tracer::ValueKind::kConstant) {
            a.slots.push_back(-1);
            a.list_constants.emplace_back(g.value(id).constant);
          } else {
            a.slots.push_back(slots.Slot(id));
            a.list_constants.emplace_back();
          }
        }
        break;
    }
    s.args.push_back(std::move(a));
  }
  for (const NodeReturn& r : n.returns) {
    OpStepReturn sr{r.kind, {}, {}};
    for (ValueId id : r.values) {
      sr.slots.push_back(slots.Slot(id));
      if (r.kind == NodeReturn::Kind::kScalar) {
        sr.traced = g.value(id).traced_scalar;
        sr.captured = g.value(id).captured;
      }
      if (r.kind != NodeReturn::Kind::kScalar && n.kind == tracer::NodeKind::kDataDependent) {
        s.check_shapes = true;
        s.traced_shapes.push_back(g.value(id).meta.sizes);
      }
    }
    s.returns.push_back(std::move(sr));
  }
  SetUnboxed(&s);
  return s;
}

std::vector<bool> HistoryFreeNodes(const tracer::Graph& g) {
  std::vector<bool> free(g.nodes.size(), false);
  if (!g.entry_mode.grad_mode) return free;
  std::vector<char> needed(g.values.size(), 0);
  for (tracer::ValueId o : g.outputs) {
    if (o != tracer::kNoValue && g.value(o).meta.requires_grad) needed[o] = 1;
  }
  std::vector<tracer::ValueId> root(g.values.size());
  for (size_t v = 0; v < g.values.size(); ++v) root[v] = g.RootOf(static_cast<tracer::ValueId>(v));
  auto mark_inputs = [&](const tracer::Node& n) {
    for (tracer::ValueId v : tracer::InputValues(n)) {
      if (v != tracer::kNoValue) needed[v] = 1;
    }
  };
  // A write in place changes the history of every alias of what it writes (autograd rebases
  // views on it): it is needed when any value of the storage it writes is, until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (int k = static_cast<int>(g.nodes.size()) - 1; k >= 0; --k) {
      const tracer::Node& n = g.nodes[k];
      bool any = false;
      for (const tracer::NodeReturn& r : n.returns) {
        for (tracer::ValueId v : r.values) any |= needed[v] != 0;
      }
      free[k] = !any;
      if (any) mark_inputs(n);
    }
    std::vector<char> needed_root(g.values.size(), 0);
    for (size_t v = 0; v < g.values.size(); ++v) {
      if (needed[v]) needed_root[root[v]] = 1;
    }
    for (const tracer::Node& n : g.nodes) {
      if (!n.mutates || n.op == "aten::requires_grad_" || !free[n.index]) continue;
      bool touches = false;  // any input, not only the written ones (conservative)
      for (tracer::ValueId v : tracer::InputValues(n)) touches |= v != tracer::kNoValue && needed_root[root[v]] != 0;
      if (!touches) continue;
      for (const tracer::NodeReturn& r : n.returns) {
        for (tracer::ValueId v : r.values) needed[v] = 1;
      }
      changed = true;
    }
  }
  return free;
}

namespace {
bool RunOpStepInMode(const OpStep& s, std::vector<c10::IValue>& slots, torch::jit::Stack& stack, std::string* failure);
}  // namespace

namespace {
thread_local bool below_autograd_allowed = false;
thread_local int64_t below_autograd_calls = 0;
}  // namespace

int64_t BelowAutogradCallsOnThisThread() { return below_autograd_calls; }

ScopedBelowAutograd::ScopedBelowAutograd() : previous_(below_autograd_allowed) { below_autograd_allowed = true; }
ScopedBelowAutograd::~ScopedBelowAutograd() { below_autograd_allowed = previous_; }

std::vector<bool> BelowAutogradNodes(const tracer::Graph& g) {
  // observable[v]: a view v would show its base or version counter to someone: it is returned,
  // written, or the base of a view that is itself observable or made with every key (that view
  // would record v as its base). Views come after their bases, so one pass from the last node
  // settles each value before the values it views.
  std::vector<char> observable(g.values.size(), 0);
  for (tracer::ValueId o : g.outputs) {
    if (o != tracer::kNoValue) observable[o] = 1;
  }
  for (const tracer::Node& n : g.nodes) {
    // A composite op's kernel may branch on its inputs' requires_grad(), which a view of a
    // parameter made below the keys does not report (one made with them does, even with grad mode
    // off): its inputs keep their keys, so the kernel takes eager's path.
    const bool composite = n.handle && n.handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    if (!n.mutates && !composite) continue;
    for (tracer::ValueId v : tracer::InputValues(n)) {
      if (v != tracer::kNoValue) observable[v] = 1;
    }
  }
  std::vector<bool> below(g.nodes.size(), false);
  for (int k = static_cast<int>(g.nodes.size()) - 1; k >= 0; --k) {
    const tracer::Node& n = g.nodes[k];
    bool ok = !n.mutates && !n.mode;
    for (const tracer::NodeReturn& r : n.returns) {
      for (tracer::ValueId v : r.values) {
        ok = ok && (v == tracer::kNoValue || g.value(v).alias_of == tracer::kNoValue || !observable[v]);
      }
    }
    below[k] = ok;
    for (const tracer::NodeReturn& r : n.returns) {
      for (tracer::ValueId v : r.values) {
        if (v == tracer::kNoValue || g.value(v).alias_of == tracer::kNoValue || (ok && !observable[v])) continue;
        // alias_of names one input that shares the storage, not necessarily the one viewed (an op
        // with several tensor inputs, broadcast_tensors): every input of that storage counts.
        const tracer::ValueId root = g.RootOf(v);
        observable[g.value(v).alias_of] = 1;
        for (tracer::ValueId u : tracer::InputValues(n)) {
          if (u != tracer::kNoValue && g.RootOf(u) == root) observable[u] = 1;
        }
      }
    }
  }
  return below;
}

namespace {
thread_local int64_t pass_through_calls = 0;
thread_local int64_t replay_steps = 0;
}  // namespace

int64_t PassThroughCallsOnThisThread() { return pass_through_calls; }
int64_t ReplayStepsOnThisThread() { return replay_steps; }

ReplaySimplification SimplifyReplay(const tracer::Graph& g, const std::vector<bool>& fused) {
  ReplaySimplification r;
  const size_t num_values = g.values.size();
  r.forward.resize(num_values);
  for (size_t v = 0; v < num_values; ++v) r.forward[v] = static_cast<ValueId>(v);
  r.skip.assign(g.nodes.size(), false);
  r.pass.assign(g.nodes.size(), false);
  auto unary = [](const tracer::Node& n, const char* op) {
    return n.op == op && !n.mutates && !n.mode && n.args.size() == 1 && n.args[0].kind == NodeArg::Kind::kValue &&
           tracer::SingleTensorResult(n) != tracer::kNoValue;
  };
  auto is_t = [&](const tracer::Node& n) { return unary(n, "aten::t"); };
  auto is_alias = [&](const tracer::Node& n) { return unary(n, "aten::alias"); };
  std::vector<char> returned(num_values, 0), written_root(num_values, 0), unforwardable(num_values, 0);
  // The last requires_grad_ on each storage: a view made before it keeps a null grad_fn in eager
  // (its base's version did not change), so ops reading the view send no gradient to the base;
  // reading the base would. Only views made after the last one are forwarded.
  std::vector<int> last_grad_change(num_values, -1);
  for (ValueId o : g.outputs) {
    if (o != tracer::kNoValue) returned[o] = 1;
  }
  for (const tracer::Node& n : g.nodes) {
    const bool composite = n.handle && n.handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    if (n.op == "aten::requires_grad_") {
      for (ValueId v : tracer::InputValues(n)) {
        if (v != tracer::kNoValue) last_grad_change[g.RootOf(v)] = n.index;
      }
    } else if (n.mutates) {
      for (ValueId v : tracer::InputValues(n)) {
        if (v != tracer::kNoValue) written_root[g.RootOf(v)] = 1;  // any input (conservative)
      }
    }
    if (n.mutates || composite || n.mode) {
      for (ValueId v : tracer::InputValues(n)) {
        if (v != tracer::kNoValue) unforwardable[v] = 1;
      }
    }
  }
  // Note [Transposed twice]: v = t(u), u = t(x); or v = alias(x). view_since[v]: the first node
  // of the chain of views that v is forwarded through.
  std::vector<int> view_since(num_values, std::numeric_limits<int>::max());
  for (const tracer::Node& n : g.nodes) {
    if (fused[n.index] || (!is_t(n) && !is_alias(n))) continue;
    const ValueId v = tracer::SingleTensorResult(n), u = n.args[0].value;
    ValueId x = u;
    int first = n.index;
    if (is_t(n)) {
      const tracer::Value& uv = g.value(u);
      if (uv.kind != tracer::ValueKind::kNode || fused[uv.node] || !is_t(g.nodes[uv.node])) continue;
      x = g.nodes[uv.node].args[0].value;
      first = uv.node;
    }
    if (x == tracer::kNoValue) continue;
    first = std::min(first, view_since[x]);
    const ValueId root = g.RootOf(x);
    if (returned[v] || unforwardable[v] || written_root[root] || last_grad_change[root] >= first ||
        g.value(x).meta.sizes != g.value(v).meta.sizes || g.value(x).meta.strides != g.value(v).meta.strides) {
      continue;
    }
    r.forward[v] = r.forward[x];
    view_since[v] = first;
  }
  // Readers after forwarding: replay steps read forwarded values, fused nodes their own.
  std::vector<int> readers(num_values, 0);
  for (const tracer::Node& n : g.nodes) {
    for (ValueId v : tracer::InputValues(n)) {
      if (v != tracer::kNoValue) ++readers[fused[n.index] ? v : r.forward[v]];
    }
  }
  for (ValueId o : g.outputs) {
    if (o != tracer::kNoValue) readers[o] += 2;  // returned: kept, and never passed through
  }
  for (int k = static_cast<int>(g.nodes.size()) - 1; k >= 0; --k) {
    const tracer::Node& n = g.nodes[k];
    if (fused[k] || n.mutates || n.random || n.mode || (!is_t(n) && !is_alias(n) && !n.recomputed)) continue;
    bool read = false;
    for (const NodeReturn& ret : n.returns) {
      for (ValueId v : ret.values) read = read || (v != tracer::kNoValue && readers[v] != 0);
    }
    if (read) continue;
    r.skip[k] = true;
    for (ValueId v : tracer::InputValues(n)) {
      if (v != tracer::kNoValue) --readers[r.forward[v]];
    }
  }
  // Note [Gradient results].
  for (const tracer::Node& n : g.nodes) {
    if (fused[n.index] || !n.gradient_result || !unary(n, "aten::detach")) continue;
    const ValueId in = r.forward[n.args[0].value];
    const tracer::Value& v = g.value(in);
    r.pass[n.index] = v.kind == tracer::ValueKind::kNode && v.alias_of == tracer::kNoValue && readers[in] == 1;
  }
  return r;
}

bool RunOpStep(const OpStep& s, std::vector<c10::IValue>& slots, torch::jit::Stack& stack,
               std::string* failure) {
  ++replay_steps;
  if (s.pass_through >= 0) {  // Note [Gradient results]
    const c10::IValue& in = slots[s.pass_through];
    if (in.isTensor() && in.toTensor().defined() && in.toTensor().unsafeGetTensorImpl()->autograd_meta() == nullptr) {
      slots[s.returns[0].slots[0]] = in;
      ++pass_through_calls;
      return true;
    }
  }
  if (s.below_autograd && below_autograd_allowed && (s.no_grad || !c10::GradMode::is_enabled())) {
    c10::AutoGradMode off(false);
    at::AutoDispatchBelowADInplaceOrView below;
    ++below_autograd_calls;
    return RunOpStepInMode(s, slots, stack, failure);
  }
  if (s.no_grad && !s.mode && c10::GradMode::is_enabled()) {  // Note [History-free nodes]
    c10::AutoGradMode off(false);
    return RunOpStepInMode(s, slots, stack, failure);
  }
  return RunOpStepInMode(s, slots, stack, failure);
}

namespace {
bool RunOpStepInMode(const OpStep& s, std::vector<c10::IValue>& slots, torch::jit::Stack& stack, std::string* failure) {
  if (s.native != nullptr && s.native(s, slots)) return true;  // Note [Native kernels]
  if (s.unboxed != nullptr) {  // Note [Unboxed replay]
    at::Tensor out;
    if (s.mode) {
      tracer::ScopedThreadMode mode(*s.mode);
      out = s.unboxed(s, slots);
    } else {
      out = s.unboxed(s, slots);
    }
    CountUnboxedCall();
    slots[s.returns[0].slots[0]] = std::move(out);
    return true;
  }
  stack.clear();
  stack.reserve(s.args.size());
  for (const OpStepArg& a : s.args) {
    switch (a.kind) {
      case OpStepArg::Kind::kConstant:
        stack.push_back(a.constant);
        break;
      case OpStepArg::Kind::kRunTimeSizes: {
        if (!a.constant.isIntList()) {
          stack.emplace_back(slots[a.sizes[0].slot].toTensor().size(a.sizes[0].dim) * a.sizes[0].scale);
          break;
        }
        std::vector<int64_t> ints = a.ints;
        PatchRunTimeSizes(a, slots, ints.data());
        stack.emplace_back(std::move(ints));
        break;
      }
      case OpStepArg::Kind::kSlot:
        stack.push_back(slots[a.slot]);
        break;
      case OpStepArg::Kind::kSlotList: {
        c10::List<at::Tensor> list;
        list.reserve(a.slots.size());
        for (size_t k = 0; k < a.slots.size(); ++k) {
          list.push_back(a.slots[k] >= 0 ? slots[a.slots[k]].toTensor()
                                         : a.list_constants[k].toTensor());
        }
        stack.emplace_back(std::move(list));
        break;
      }
      case OpStepArg::Kind::kOptSlotList: {
        c10::List<c10::optional<at::Tensor>> list;
        for (size_t k = 0; k < a.slots.size(); ++k) {
          if (a.slots[k] >= 0) {
            list.push_back(slots[a.slots[k]].toTensor());
          } else if (a.list_constants[k].isTensor()) {
            list.push_back(a.list_constants[k].toTensor());
          } else {
            list.push_back(c10::nullopt);
          }
        }
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
  if (s.mode) {
    tracer::ScopedThreadMode mode(*s.mode);
    s.op.callBoxed(&stack);
  } else {
    s.op.callBoxed(&stack);
  }
  size_t shape_index = 0;
  for (size_t j = 0; j < s.returns.size(); ++j) {
    const OpStepReturn& r = s.returns[j];
    c10::IValue& out = stack[j];
    switch (r.kind) {
      case NodeReturn::Kind::kTensor:
        if (!r.slots.empty()) slots[r.slots[0]] = std::move(out);
        break;
      case NodeReturn::Kind::kTensorList: {
        auto list = out.toTensorVector();
        if (list.size() != r.slots.size()) {
          *failure = absl::StrCat("number of results of ", s.name, " at %", s.index,
                                  " changed: expected ", r.slots.size(), ", actual ", list.size());
          return false;
        }
        for (size_t k = 0; k < list.size(); ++k) slots[r.slots[k]] = std::move(list[k]);
        break;
      }
      case NodeReturn::Kind::kScalar:
        if (r.captured) {
          slots[r.slots[0]] = std::move(out);
          break;
        }
        if (!SameScalar(out, r.traced)) {
          *failure = absl::StrCat("value of ", s.name, " at %", s.index, " changed: expected ",
                                  tracer::IValueString(r.traced), ", actual ",
                                  tracer::IValueString(out));
          return false;
        }
        break;
    }
    if (s.check_shapes && r.kind != NodeReturn::Kind::kScalar) {
      for (int slot : r.slots) {
        const auto sizes = slots[slot].toTensor().sizes();
        const auto& traced = s.traced_shapes[shape_index++];
        if (!sizes.equals(traced)) {
          *failure = absl::StrCat("value of ", s.name, " at %", s.index,
                                  " changed: expected shape ", tracer::ShapeString(traced),
                                  ", actual ", tracer::ShapeString(sizes.vec()));
          return false;
        }
      }
    }
  }
  return true;
}
}  // namespace

OutputList::OutputList(const tracer::Graph& graph, SlotMap& slots) {
  for (tracer::ValueId id : graph.outputs) {
    if (id == tracer::kNoValue) {
      Add(-1, -1, at::Tensor());
    } else if (graph.value(id).kind == tracer::ValueKind::kConstant) {
      Add(-1, -1, graph.value(id).constant);
    } else {
      Add(slots.Slot(id), graph.value(id).kind == tracer::ValueKind::kInput ? graph.value(id).arg_index : -1,
          at::Tensor());
    }
  }
}

void OutputList::Add(int slot, int arg, at::Tensor constant) {
  for (Source& earlier : sources_) {
    if (slot >= 0 && earlier.slot == slot) earlier.last_reader = false;
  }
  // args_ grows only while every output so far is an argument (all_args() compares the counts).
  if (arg >= 0 && args_.size() == sources_.size()) args_.push_back(arg);
  sources_.push_back({slot, slot >= 0, slot >= 0 ? at::Tensor() : std::move(constant)});
}

std::vector<int> OutputList::slots() const {
  std::vector<int> slots;
  for (const Source& s : sources_) slots.push_back(s.slot);
  return slots;
}

RunScratch::Buffers& RunScratch::ThreadBuffers() {
  thread_local Buffers buffers;
  return buffers;
}

RunScratch::RunScratch(int num_slots) {
  Buffers& shared = ThreadBuffers();
  buffers_ = shared.busy ? &local_ : &shared;
  buffers_->busy = true;
  buffers_->slots.resize(num_slots);
}

RunScratch::~RunScratch() {
  buffers_->slots.clear();
  buffers_->stack.clear();
  buffers_->busy = false;
}

void PatchRunTimeSizes(const OpStepArg& a, const std::vector<c10::IValue>& slots, int64_t* ints) {
  for (const OpStepArg::RunTimeSize& r : a.sizes) ints[r.elem] = slots[r.slot].toTensor().size(r.dim) * r.scale;
}

void AddSlotsOf(const OpStep& s, std::vector<int>* slots) {
  for (const OpStepArg& a : s.args) {
    slots->push_back(a.slot);
    slots->insert(slots->end(), a.slots.begin(), a.slots.end());
    for (const OpStepArg::RunTimeSize& r : a.sizes) slots->push_back(r.slot);
  }
  for (const OpStepReturn& r : s.returns) slots->insert(slots->end(), r.slots.begin(), r.slots.end());
}

std::vector<std::vector<int>> PlanReleases(int num_slots, const std::vector<std::vector<int>>& uses,
                                           const std::vector<int>& keep) {
  std::vector<int> last(num_slots, -1);
  for (size_t i = 0; i < uses.size(); ++i) {
    for (int slot : uses[i]) {
      if (slot >= 0) last[slot] = static_cast<int>(i);
    }
  }
  for (int slot : keep) {
    if (slot >= 0) last[slot] = -1;
  }
  std::vector<std::vector<int>> releases(uses.size());
  for (int slot = 0; slot < num_slots; ++slot) {
    if (last[slot] >= 0) releases[last[slot]].push_back(slot);
  }
  return releases;
}

}  // namespace warden::codegen
