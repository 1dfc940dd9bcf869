// Backend "cpp" (the default): a hybrid artifact.
// Regions of fusible pointwise nodes (Note [Pointwise regions]) run as one generated C++ kernel
// each; every other node is replayed through its operator handle exactly like backend "aten".
// A region whose inputs at run time are not what the kernel was built for replays its own nodes
// instead (Note [Region run-time check]), so the artifact is sound without any guard beyond those
// of the entry.
//
// Note [Region run-time check]
// Before a kernel runs, every input must have the traced dtype, be a CPU strided tensor without
// autograd or the negative bit, and have the traced rank. A static region (sizes and strides are
// literals in the kernel) then needs exactly the traced sizes and strides. A symbolic one needs
// the traced broadcast pattern (a dim that was broadcast is still 1, a full dim equals the other
// full dims), and the collapsed layout of the run-time tensors (codegen::Collapse, or for a
// reduction region codegen::ReductionLayout, with the traced number of outer dims and a reduced
// size >= 1, the traced one for layer_norm) must have the traced number of dims and innermost
// strides; its sizes and outer strides become the kernel's params. The pattern check makes every
// node result of the region the region shape again (a reduction's: the reduced shape), which is
// what the loops assume. An operand of a reduction's epilogue of the reduced shape is unsqueezed
// first, as at compile time. An inlined constant must be unchanged (Note [Inlined constants]).
#include <algorithm>
#include <atomic>
#include <optional>

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "runtime/backend.h"
#include "runtime/codegen_artifact.h"
#include "runtime/codegen_buffers.h"
#include "runtime/codegen_compiler.h"
#include "runtime/codegen_pointwise.h"
#include "runtime/codegen_replay.h"
#include "runtime/conv_epilogues.h"
#include "tracer/status.h"

namespace warden {
namespace {

using codegen::OpStep;
using codegen::PointwiseKernelFn;
using tracer::Graph;
using tracer::ValueId;

constexpr char kBackendName[] = "cpp";

std::atomic<int64_t> region_fallbacks{0};

// Elements per task when a kernel is split across ATen's intra-op threads (ATen's GRAIN_SIZE).
constexpr int64_t kGrainSize = 32768;

// at::parallel_for is a header template: with LibTorch's OpenMP backend it only splits work when
// the calling translation unit is compiled with -fopenmp (runtime/BUILD); without it every kernel
// would run on one thread while eager's ATen kernels use all intra-op threads.
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "runtime/cpp_backend.cc must be compiled with -fopenmp for at::parallel_for to split kernels"
#endif

// Whether a kernel may read `t`'s memory as a dense CPU array: its dispatch keys are a plain CPU
// tensor's, nothing more. A ZeroTensor (null data), a conjugate- or negative-bit view, a
// functionalization or Python wrapper, a nested, sparse, quantized or meta tensor all carry a
// key of their own; one mask refuses them all.
bool PlainCpuKeys(const at::Tensor& t) {
  // Raw bits: DispatchKeySet's operator- keeps backend bits, and a Meta or other backend bit
  // must refuse too.
  static const uint64_t kPlain = [] {
    c10::DispatchKeySet plain({c10::DispatchKey::CPU, c10::DispatchKey::ADInplaceOrView,
                               c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutocastCPU});
    return plain.raw_repr();
  }();
  return (t.key_set().raw_repr() & ~kPlain) == 0;
}

// An operand of a kernel or a program: a slot or a captured constant, and its traced metadata.
struct TracedInput {
  int slot = -1;  // -1: a captured constant
  at::Tensor constant;
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;  // traced

  static TracedInput Of(const Graph& g, ValueId id, codegen::SlotMap& slots) {
    const tracer::TensorMeta& m = g.value(id).meta;
    TracedInput in;
    in.slot = slots.Slot(id);
    if (in.slot < 0) in.constant = g.value(id).constant;
    in.dtype = m.dtype;
    in.sizes = m.sizes;
    in.strides = m.strides;
    return in;
  }

  // The operand of this call if a kernel built for the trace can read it: defined, a plain dense
  // CPU tensor of the traced dtype and rank (with `exact_layout`, the traced sizes and strides),
  // and not one whose use autograd would record (Note [History-free nodes]: an input that requires
  // grad is fine where nothing is recorded). Null otherwise.
  const at::Tensor* Check(const std::vector<c10::IValue>& slots, bool history_free, bool exact_layout) const {
    const at::Tensor& t = slot >= 0 ? slots[slot].toTensor() : constant;
    if (!t.defined() || !PlainCpuKeys(t) || t.scalar_type() != dtype || t.dim() != static_cast<int64_t>(sizes.size())) {
      return nullptr;
    }
    if (t.requires_grad() && !history_free && c10::GradMode::is_enabled()) return nullptr;
    if (exact_layout && (!t.sizes().equals(sizes) || !t.strides().equals(strides))) return nullptr;
    return &t;
  }
};

struct KernelInput : TracedInput {
  int unsqueeze = -1;                   // codegen::UnsqueezeReduced at this dim, or -1
  codegen::InlinedConstant inlined;     // Note [Inlined constants]
  std::vector<bool> full;               // per region dim (after unsqueeze): traced size is the region's (> 1)
};

struct KernelStep {
  PointwiseKernelFn fn = nullptr;
  bool static_layout = true;
  std::vector<int64_t> sizes;  // traced region shape
  int64_t numel = 0;           // traced
  codegen::Layout layout;      // traced
  std::vector<KernelInput> inputs;
  int reduced_dim = -1;        // >= 0: a reduction region over dims [reduced_dim, + reduced_count)
  int reduced_count = 1;       //   (Note [Row reductions])
  bool keepdim = false;
  int outer_dims = 0;          // layout dims before the reduced one
  bool fixed_reduced = false;  // the reduced size must be the traced one (layer_norm's shape)
  std::vector<int> output_slots;
  std::vector<bool> output_reduced;  // of the reduced shape (else the region shape)
  std::vector<at::ScalarType> output_dtypes;
  std::vector<std::vector<int64_t>> output_sizes;  // traced
  int first_op = 0, end_op = 0;  // ops_[first_op, end_op): the region's nodes, for the fallback
  bool history_free = false;     // Note [History-free nodes]: inputs may require grad
};

// Note [Straight-line programs] in codegen_pointwise.h.
struct ProgramStep {
  codegen::ProgramFn fn = nullptr;
  std::vector<TracedInput> inputs;  // their traced sizes and strides are required exactly
  std::vector<std::vector<int64_t>> output_sizes;
  std::vector<at::ScalarType> output_dtypes;
  std::vector<std::pair<int, int>> results;  // (slot, output index)
  std::vector<int> output_writes;            // per output: in-place writes (version bumps)
  int64_t scratch_bytes = 0;
  int first_op = 0, end_op = 0;
  bool history_free = false;
};

class CppArtifact final : public CodegenArtifact {
 public:
  CppArtifact(std::shared_ptr<const Graph> graph, codegen::PointwisePlan plan,
              std::vector<codegen::native::ConvGroup> conv_groups, std::shared_ptr<const codegen::KernelLibrary> library)
      : graph_(std::move(graph)), plan_(std::move(plan)), library_(std::move(library)) {
    const Graph& g = *graph_;
    codegen::SlotMap slots(g);
    for (size_t i = 0; i < g.arg_values.size(); ++i) {
      if (g.arg_values[i] != tracer::kNoValue) inputs_.push_back({static_cast<int>(i), slots.Slot(g.arg_values[i])});
    }
    const std::vector<bool> history_free = codegen::HistoryFreeNodes(g);
    const std::vector<bool> below = codegen::BelowAutogradNodes(g);
    // Note [Transposed twice], Note [Gradient results]: for the nodes outside fused regions.
    std::vector<bool> fused(g.nodes.size(), false);
    for (const codegen::PointwiseRegion& r : plan_.regions) {
      for (int node : r.nodes) fused[node] = true;
    }
    for (const codegen::ProgramRegion& p : plan_.programs) {
      for (int node : p.nodes) fused[node] = true;
    }
    const codegen::ReplaySimplification simple = codegen::SimplifyReplay(g, fused);
    for (const tracer::Node& n : g.nodes) {
      ops_.push_back(codegen::MakeOpStep(g, n, slots, fused[n.index] ? nullptr : &simple.forward));
      ops_.back().no_grad = history_free[n.index];
      ops_.back().below_autograd = below[n.index];
      if (simple.pass[n.index]) ops_.back().pass_through = ops_.back().args.at(0).slot;
      if (!fused[n.index]) codegen::SetNative(&ops_.back());  // Note [Native kernels]
    }

    // Note [Conv epilogues] in runtime/native_conv.cc: a group runs where its last node was.
    std::vector<int> group_of(g.nodes.size(), -1);
    for (const codegen::native::ConvGroup& cg : conv_groups) {
      ConvGroupStep step;
      step.group = cg;
      if (cg.batch_norm >= 0) step.epilogue.batch_norm = &ops_[cg.batch_norm];
      if (cg.add >= 0) step.epilogue.residual = &ops_[cg.add].args.at(cg.residual_arg);
      step.epilogue.relu = cg.relu >= 0;
      step.out_slot = ops_[cg.nodes.back()].returns.at(0).slots.at(0);
      step.no_grad = true;
      for (int node : cg.nodes) {
        step.no_grad = step.no_grad && ops_[node].no_grad;
        group_of[node] = static_cast<int>(conv_groups_.size());
      }
      conv_groups_.push_back(std::move(step));
    }
    std::vector<int> region_at(g.nodes.size(), -1), program_at(g.nodes.size(), -1);
    for (size_t r = 0; r < plan_.regions.size(); ++r) region_at[plan_.regions[r].nodes.front()] = r;
    for (size_t p = 0; p < plan_.programs.size(); ++p) program_at[plan_.programs[p].nodes.front()] = p;
    for (size_t i = 0; i < g.nodes.size();) {
      if (group_of[i] >= 0) {
        if (static_cast<int>(i) == conv_groups_[group_of[i]].group.nodes.back()) {
          steps_.push_back({Step::kConvGroup, group_of[i]});
        }
        ++i;
        continue;
      }
      if (program_at[i] >= 0) {
        const codegen::ProgramRegion& p = plan_.programs[program_at[i]];
        ProgramStep ps;
        ps.fn = reinterpret_cast<codegen::ProgramFn>(library_->Find(p.function));
        for (ValueId id : p.inputs) ps.inputs.push_back(TracedInput::Of(g, id, slots));
        for (ValueId id : p.outputs) {
          ps.output_sizes.push_back(g.value(id).meta.sizes);
          ps.output_dtypes.push_back(g.value(id).meta.dtype);
        }
        for (const auto& [id, out] : p.results) ps.results.push_back({slots.Slot(id), out});
        ps.output_writes = p.output_writes;
        ps.scratch_bytes = p.scratch_bytes;
        ps.first_op = p.nodes.front();
        ps.end_op = p.nodes.back() + 1;
        ps.history_free = true;
        for (int node : p.nodes) ps.history_free = ps.history_free && history_free[node];
        steps_.push_back({Step::kProgram, static_cast<int>(programs_.size())});
        programs_.push_back(std::move(ps));
        i = p.nodes.back() + 1;
        continue;
      }
      if (region_at[i] < 0) {
        if (!simple.skip[i]) steps_.push_back({Step::kOp, static_cast<int>(i)});
        ++i;
        continue;
      }
      const codegen::PointwiseRegion& r = plan_.regions[region_at[i]];
      KernelStep k;
      k.fn = reinterpret_cast<PointwiseKernelFn>(library_->Find(r.function));
      k.static_layout = r.static_layout;
      k.sizes = r.sizes;
      k.numel = 1;
      for (int64_t s : r.sizes) k.numel *= s;
      k.layout = r.layout;
      for (size_t j = 0; j < r.inputs.size(); ++j) {
        KernelInput in;
        static_cast<TracedInput&>(in) = TracedInput::Of(g, r.inputs[j], slots);
        in.unsqueeze = r.input_unsqueeze[j];
        in.inlined = r.input_constant[j];
        std::vector<int64_t> sizes = in.sizes, strides = in.strides;
        if (in.unsqueeze >= 0) {
          codegen::UnsqueezeReduced(r.sizes.size(), in.unsqueeze, r.reduced_count, &sizes, &strides);
        }
        const size_t lead = r.sizes.size() - sizes.size();
        for (size_t d = 0; d < r.sizes.size(); ++d) {
          in.full.push_back(d >= lead && r.sizes[d] != 1 && sizes[d - lead] == r.sizes[d]);
        }
        k.inputs.push_back(std::move(in));
      }
      for (ValueId id : r.outputs) {
        k.output_slots.push_back(slots.Slot(id));
        k.output_dtypes.push_back(g.value(id).meta.dtype);
        k.output_sizes.push_back(g.value(id).meta.sizes);
      }
      k.output_reduced = r.output_reduced;
      k.reduced_dim = r.reduced_dim;
      k.reduced_count = r.reduced_count;
      k.keepdim = r.keepdim;
      k.outer_dims = r.outer_dims;
      k.fixed_reduced = r.reduction == codegen::ReductionKind::kLayerNorm;
      k.first_op = r.nodes.front();
      k.end_op = r.nodes.back() + 1;
      k.history_free = true;
      for (int node : r.nodes) k.history_free = k.history_free && history_free[node];
      steps_.push_back({Step::kKernel, static_cast<int>(kernels_.size())});
      kernels_.push_back(std::move(k));
      i = r.nodes.back() + 1;
    }
    num_slots_ = slots.num_slots();
    outputs_ = codegen::OutputList(g, slots);
    // Note [Release after last use] in runtime/codegen_replay.h. A kernel step uses its inputs and
    // outputs, and everything the ops of its region use (its fallback runs them).
    std::vector<std::vector<int>> uses(steps_.size());
    for (size_t i = 0; i < steps_.size(); ++i) {
      if (steps_[i].kind == Step::kOp) {
        codegen::AddSlotsOf(ops_[steps_[i].index], &uses[i]);
        continue;
      }
      if (steps_[i].kind == Step::kConvGroup) {
        for (int op : conv_groups_[steps_[i].index].group.nodes) codegen::AddSlotsOf(ops_[op], &uses[i]);
        continue;
      }
      if (steps_[i].kind == Step::kProgram) {
        const ProgramStep& p = programs_[steps_[i].index];
        for (const TracedInput& in : p.inputs) uses[i].push_back(in.slot);
        for (const auto& [slot, out] : p.results) uses[i].push_back(slot);
        for (int op = p.first_op; op < p.end_op; ++op) codegen::AddSlotsOf(ops_[op], &uses[i]);
        continue;
      }
      const KernelStep& k = kernels_[steps_[i].index];
      for (const KernelInput& in : k.inputs) uses[i].push_back(in.slot);
      for (int slot : k.output_slots) uses[i].push_back(slot);
      for (int op = k.first_op; op < k.end_op; ++op) codegen::AddSlotsOf(ops_[op], &uses[i]);
    }
    std::vector<int> keep;
    for (const auto& [arg, slot] : inputs_) keep.push_back(slot);
    for (int slot : outputs_.slots()) keep.push_back(slot);
    releases_ = codegen::PlanReleases(num_slots_, uses, keep);
  }

  const std::string& source() const override { return plan_.source; }
  const std::string& library_path() const override {
    static const std::string* none = new std::string();
    return library_ != nullptr ? library_->path() : *none;
  }
  const std::string& kernel_origin() const override {
    static const std::string* none = new std::string();
    return library_ != nullptr ? library_->origin() : *none;
  }
  std::vector<std::vector<int>> fused_regions() const override {
    std::vector<std::vector<int>> regions;
    for (const auto& r : plan_.regions) regions.push_back(r.nodes);
    for (const auto& p : plan_.programs) regions.push_back(p.nodes);
    return regions;
  }
  int programs() const override { return static_cast<int>(plan_.programs.size()); }
  std::vector<std::string> native_kernels() const override {
    std::vector<std::string> out;
    std::vector<bool> grouped(ops_.size(), false);
    for (const ConvGroupStep& cg : conv_groups_) {
      // "aten::conv2d at %13 + batch_norm + add_ + relu": Note [Conv epilogues].
      const std::vector<int>& nodes = cg.group.nodes;
      std::string text = absl::StrCat(ops_[nodes.front()].name, " at %", nodes.front());
      for (size_t k = 1; k < nodes.size(); ++k) {
        std::string op = ops_[nodes[k]].name;
        op = op.substr(op.find("::") + 2);
        absl::StrAppend(&text, " + ", op.substr(0, op.find('.')));
      }
      out.push_back(std::move(text));
      for (int node : nodes) grouped[node] = true;
    }
    for (const codegen::OpStep& s : ops_) {
      if (s.native != nullptr && !grouped[s.index]) out.push_back(absl::StrCat(s.name, " at %", s.index));
    }
    return out;
  }

  // Hot path: a boxed call per unfused node and one kernel call per region (plus the allocation
  // of the region's outputs); takes no lock (but see EmptyOutput for outputs of >= 4 MB).
  // Scratch buffers are per thread as in backend "aten".
  bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
           std::string* value_guard_failure) const override {
    codegen::RunScratch scratch(num_slots_);
    std::vector<c10::IValue>& slots = scratch.slots();
    for (const auto& [arg, slot] : inputs_) slots[slot] = args[arg];
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      if (s.kind == Step::kOp) {
        if (!codegen::RunOpStep(ops_[s.index], slots, scratch.stack(), value_guard_failure)) return false;
      } else if (s.kind == Step::kConvGroup) {
        if (!RunConvGroup(conv_groups_[s.index], slots, scratch, value_guard_failure)) return false;
      } else if (s.kind == Step::kProgram) {
        const ProgramStep& p = programs_[s.index];
        if (!RunProgram(p, slots) && !Replay(p.first_op, p.end_op, slots, scratch, value_guard_failure)) return false;
      } else {
        const KernelStep& k = kernels_[s.index];
        if (!RunKernel(k, slots) && !Replay(k.first_op, k.end_op, slots, scratch, value_guard_failure)) return false;
      }
      for (int slot : releases_[i]) slots[slot] = c10::IValue();
    }
    outputs_.FromSlots(slots, outputs);  // Note [Building outputs]
    return true;
  }

 private:
  struct Step {
    enum Kind : uint8_t { kOp, kKernel, kProgram, kConvGroup } kind;
    int index;  // into ops_, kernels_, programs_ or conv_groups_
  };
  // Note [Conv epilogues] in runtime/native_conv.cc.
  struct ConvGroupStep {
    codegen::native::ConvGroup group;  // its nodes' steps run one by one when the fused kernel declines
    codegen::native::ConvEpilogue epilogue;  // points into ops_
    int out_slot = -1;
    bool no_grad = false;  // every node history-free: runs with grad mode off, as their steps would
  };
  std::vector<ConvGroupStep> conv_groups_;

  bool RunConvGroup(const ConvGroupStep& cg, std::vector<c10::IValue>& slots, codegen::RunScratch& scratch,
                    std::string* value_guard_failure) const {
    bool fused;
    {
      std::optional<c10::AutoGradMode> off;
      if (cg.no_grad && c10::GradMode::is_enabled()) off.emplace(false);
      fused = codegen::native::NativeConvFused(ops_[cg.group.nodes.front()], cg.epilogue, cg.out_slot, slots);
    }
    if (fused) {
      at::TensorImpl* out = slots[cg.out_slot].toTensor().unsafeGetTensorImpl();
      for (int w = 0; w < cg.group.in_place_writes; ++w) out->bump_version();
      return true;
    }
    for (int op : cg.group.nodes) {
      if (!codegen::RunOpStep(ops_[op], slots, scratch.stack(), value_guard_failure)) return false;
    }
    return true;
  }
  std::vector<std::vector<int>> releases_;  // per step: slots cleared after it

  // The region shape and kernel params of a symbolic region's run-time inputs, or false (Note
  // [Region run-time check]).
  static bool SymbolicLayout(const KernelStep& k, const absl::InlinedVector<const at::Tensor*, 8>& ins,
                             std::vector<int64_t>* shape, std::vector<int64_t>* params) {
    const size_t rank = k.sizes.size();
    shape->assign(rank, 1);
    std::vector<bool> seen(rank, false);
    std::vector<std::vector<int64_t>> sizes(ins.size()), strides(ins.size());
    for (size_t j = 0; j < ins.size(); ++j) {
      const at::Tensor& t = *ins[j];
      const KernelInput& in = k.inputs[j];
      sizes[j] = t.sizes().vec();
      // An inlined constant's literals are row-major (and its strides unchanged, RunKernel).
      strides[j] = in.inlined.inlined ? codegen::ContiguousStrides(sizes[j]) : t.strides().vec();
      if (in.unsqueeze >= 0) codegen::UnsqueezeReduced(rank, in.unsqueeze, k.reduced_count, &sizes[j], &strides[j]);
      const size_t lead = rank - sizes[j].size();
      for (size_t d = lead; d < rank; ++d) {
        const int64_t size = sizes[j][d - lead];
        if (!in.full[d]) {
          if (size != 1) return false;
        } else if (!seen[d]) {
          (*shape)[d] = size;
          seen[d] = true;
        } else if ((*shape)[d] != size) {
          return false;
        }
      }
    }
    codegen::Layout layout;
    int outer_dims = 0;
    if (k.reduced_dim >= 0) {
      if (ReducedSize(k, *shape) < 1 || (k.fixed_reduced && ReducedSize(k, *shape) != ReducedSize(k, k.sizes))) {
        return false;
      }
      if (!codegen::ReductionLayout(*shape, k.reduced_dim, k.reduced_count, sizes, strides, &layout, &outer_dims) ||
          outer_dims != k.outer_dims) {
        return false;
      }
    } else if (!codegen::Collapse(*shape, sizes, strides, &layout)) {
      return false;
    }
    const size_t dims = k.layout.sizes.size();
    if (layout.sizes.size() != dims) return false;
    params->assign(layout.sizes.begin(), layout.sizes.end());
    for (size_t j = 0; j < ins.size(); ++j) {
      if (layout.strides[j][dims - 1] != k.layout.strides[j][dims - 1]) return false;
      params->insert(params->end(), layout.strides[j].begin(), layout.strides[j].end() - 1);
    }
    return true;
  }

  // The run-time sizes of output j of a symbolic region of `shape`.
  static std::vector<int64_t> OutputSizes(const KernelStep& k, size_t j, c10::IntArrayRef shape) {
    std::vector<int64_t> sizes = shape.vec();
    if (k.output_reduced[j]) {
      const auto first = sizes.begin() + k.reduced_dim, last = first + k.reduced_count;
      if (k.keepdim) {
        std::fill(first, last, 1);
      } else {
        sizes.erase(first, last);
      }
    }
    return sizes;
  }

  // The number of elements a reduction over `shape` reduces into one.
  static int64_t ReducedSize(const KernelStep& k, c10::IntArrayRef shape) {
    int64_t n = 1;
    for (int d = k.reduced_dim; d < k.reduced_dim + k.reduced_count; ++d) {
      if (__builtin_mul_overflow(n, shape[d], &n)) return -1;  // refused by the callers
    }
    return n;
  }

  // This thread's scratch arrays for programs, at least `bytes` long and 64-byte aligned.
  static char* ProgramScratch(int64_t bytes) {
    struct Buffer {
      std::unique_ptr<char[]> data;
      int64_t size = 0;
    };
    thread_local Buffer buffer;
    if (buffer.size < bytes + 64) {
      buffer.data.reset(new char[bytes + 64]);
      buffer.size = bytes + 64;
    }
    const uintptr_t p = reinterpret_cast<uintptr_t>(buffer.data.get());
    return reinterpret_cast<char*>((p + 63) & ~uintptr_t{63});
  }

  // A kernel or program that declined this call (its inputs are not what it was built for): its
  // nodes ops_[first_op, end_op) run as ATen calls instead, counted for CodegenRegionFallbacks().
  bool Replay(int first_op, int end_op, std::vector<c10::IValue>& slots, codegen::RunScratch& scratch,
              std::string* value_guard_failure) const {
    region_fallbacks.fetch_add(1, std::memory_order_relaxed);
    for (int op = first_op; op < end_op; ++op) {
      if (!codegen::RunOpStep(ops_[op], slots, scratch.stack(), value_guard_failure)) return false;
    }
    return true;
  }

  // Runs a program; false (nothing published) if an input is not what it was built for or an
  // index is out of range (Note [Straight-line programs]).
  static bool RunProgram(const ProgramStep& p, std::vector<c10::IValue>& slots) {
    absl::InlinedVector<const void*, 8> in_ptrs;
    for (const TracedInput& in : p.inputs) {
      const at::Tensor* t = in.Check(slots, p.history_free, /*exact_layout=*/true);
      if (t == nullptr) return false;
      in_ptrs.push_back(t->numel() > 0 ? t->data_ptr() : nullptr);
    }
    absl::InlinedVector<at::Tensor, 4> outs;
    absl::InlinedVector<void*, 4> out_ptrs;
    for (size_t j = 0; j < p.output_sizes.size(); ++j) {
      outs.push_back(codegen::EmptyOutput(p.output_sizes[j], p.output_dtypes[j]));
      out_ptrs.push_back(outs.back().data_ptr());
    }
    // A program runs on one thread (its arrays are small); scratch is this thread's.
    char* scratch = p.scratch_bytes > 0 ? ProgramScratch(p.scratch_bytes) : nullptr;
    if (p.fn(in_ptrs.data(), out_ptrs.data(), scratch) != 0) return false;
    // Eager's in-place writes bumped these tensors' version counters.
    for (size_t j = 0; j < outs.size(); ++j) {
      for (int w = 0; w < p.output_writes[j]; ++w) outs[j].unsafeGetTensorImpl()->bump_version();
    }
    for (const auto& [slot, out] : p.results) slots[slot] = outs[out];
    return true;
  }

  // Runs one region's kernel; false (before any effect) if the inputs break its assumptions.
  static bool RunKernel(const KernelStep& k, std::vector<c10::IValue>& slots) {
    absl::InlinedVector<const at::Tensor*, 8> ins;
    for (const KernelInput& in : k.inputs) {
      const at::Tensor* t = in.Check(slots, k.history_free, /*exact_layout=*/k.static_layout);
      if (t == nullptr || (in.inlined.inlined && !codegen::StillInlinable(in.inlined, *t))) return false;
      ins.push_back(t);
    }
    std::vector<int64_t> shape, params;
    if (!k.static_layout && !SymbolicLayout(k, ins, &shape, &params)) return false;
    const c10::IntArrayRef sizes = k.static_layout ? c10::IntArrayRef(k.sizes) : c10::IntArrayRef(shape);
    int64_t n = 1;
    for (int64_t s : sizes) {
      if (__builtin_mul_overflow(n, s, &n)) return false;  // replayed: ATen raises as eager does
    }
    absl::InlinedVector<at::Tensor, 4> outs;
    for (size_t j = 0; j < k.output_dtypes.size(); ++j) {
      // Static: each output's traced sizes (a reduction's differ from the region shape).
      if (k.static_layout) {
        outs.push_back(codegen::EmptyOutput(k.output_sizes[j], k.output_dtypes[j]));
      } else {
        outs.push_back(codegen::EmptyOutput(OutputSizes(k, j, sizes), k.output_dtypes[j]));
      }
    }
    if (n > 0) {
      absl::InlinedVector<const void*, 8> in_ptrs;
      absl::InlinedVector<void*, 4> out_ptrs;
      for (const at::Tensor* t : ins) in_ptrs.push_back(t->data_ptr());
      for (at::Tensor& o : outs) out_ptrs.push_back(o.data_ptr());
      const int64_t* p = params.empty() ? nullptr : params.data();
      if (k.reduced_dim >= 0) {  // lines (Note [Row reductions]); the reduced size is >= 1
        const int64_t reduced = ReducedSize(k, sizes), lines = n / reduced;
        if (n <= kGrainSize) {
          k.fn(in_ptrs.data(), out_ptrs.data(), p, 0, lines);
        } else {
          at::parallel_for(0, lines, std::max<int64_t>(1, kGrainSize / reduced), [&](int64_t begin, int64_t end) {
            k.fn(in_ptrs.data(), out_ptrs.data(), p, begin, end);
          });
        }
      } else if (n <= kGrainSize) {
        k.fn(in_ptrs.data(), out_ptrs.data(), p, 0, n);
      } else {
        at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
          k.fn(in_ptrs.data(), out_ptrs.data(), p, begin, end);
        });
      }
    }
    for (size_t j = 0; j < outs.size(); ++j) slots[k.output_slots[j]] = std::move(outs[j]);
    return true;
  }

  std::shared_ptr<const Graph> graph_;
  codegen::PointwisePlan plan_;
  std::shared_ptr<const codegen::KernelLibrary> library_;
  int num_slots_ = 0;
  std::vector<std::pair<int, int>> inputs_;  // (argument, slot)
  std::vector<OpStep> ops_;                  // one per node, by node index
  std::vector<KernelStep> kernels_;
  std::vector<ProgramStep> programs_;
  std::vector<Step> steps_;
  codegen::OutputList outputs_;
};

class CppBackend final : public Backend {
 public:
  std::string name() const override { return kBackendName; }
  absl::StatusOr<std::unique_ptr<Artifact>> Compile(std::shared_ptr<const Graph> graph) override {
    return Compile(std::move(graph), CompileContext());
  }
  absl::StatusOr<std::unique_ptr<Artifact>> Compile(std::shared_ptr<const Graph> graph,
                                                    const CompileContext& context) override {
    for (const tracer::Node& n : graph->nodes) {
      if (!n.handle) return absl::InternalError(absl::StrCat("node %", n.index, " has no operator"));
    }
    const std::vector<bool> history_free = codegen::HistoryFreeNodes(*graph);
    // Note [Conv epilogues] in runtime/native_conv.cc: the nodes of a group join no program or region.
    std::vector<codegen::native::ConvGroup> conv_groups = codegen::native::PlanConvEpilogues(*graph, history_free);
    std::vector<bool> reserved(graph->nodes.size(), false);
    for (const codegen::native::ConvGroup& cg : conv_groups) {
      for (int node : cg.nodes) reserved[node] = true;
    }
    codegen::PointwisePlan plan = codegen::PlanPointwise(*graph, context.symbolic_shape, history_free, reserved);
    const bool native = std::any_of(graph->nodes.begin(), graph->nodes.end(),
                                    [](const tracer::Node& n) { return codegen::MayRunNative(n); });
    if (plan.regions.empty() && plan.programs.empty() && !native) {
      // Nothing to fuse and no native kernel (Note [Native kernels]): the replay artifact is the
      // same computation with less bookkeeping (and a fast path for graphs that only return their
      // arguments).
      std::unique_ptr<Backend> replay = MakeBackend("aten");
      if (replay != nullptr) return replay->Compile(std::move(graph), context);
    }
    std::shared_ptr<const codegen::KernelLibrary> library;
    if (!plan.regions.empty() || !plan.programs.empty()) {
      std::vector<std::string> kernels;
      for (const codegen::PointwiseRegion& r : plan.regions) kernels.push_back(r.function);
      for (const codegen::ProgramRegion& p : plan.programs) kernels.push_back(p.function);
      ASSIGN_OR_RETURN(library, codegen::LoadKernels(plan.source, kernels));
    }
    return std::unique_ptr<Artifact>(
        new CppArtifact(std::move(graph), std::move(plan), std::move(conv_groups), std::move(library)));
  }
};

const bool registered = [] {
  RegisterBackend(kBackendName, [] { return std::unique_ptr<Backend>(new CppBackend()); });
  return true;
}();

}  // namespace

int64_t CodegenRegionFallbacks() { return region_fallbacks.load(); }

}  // namespace warden
