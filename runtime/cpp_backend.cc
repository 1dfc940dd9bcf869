// Backend "cpp" (the default): a hybrid artifact.
// Regions of fusible pointwise nodes (Note [Pointwise regions]) run as one generated C++ kernel
// each; every other node is replayed through its operator handle exactly like backend "aten".
// A region whose inputs at run time are not what the kernel assumes (contiguous, equal sizes, the
// traced dtype, no autograd) replays its own nodes instead, so the artifact is sound without any
// guard beyond those of the entry.
#include <atomic>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "runtime/backend.h"
#include "runtime/codegen_artifact.h"
#include "runtime/codegen_compiler.h"
#include "runtime/codegen_pointwise.h"
#include "runtime/codegen_replay.h"
#include "tracer/status.h"

namespace warden {
namespace {

using codegen::KernelFn;
using codegen::OpStep;
using tracer::Graph;
using tracer::ValueId;

constexpr char kBackendName[] = "cpp";

std::atomic<int64_t> region_fallbacks{0};

// Elements per task when a kernel is split across ATen's intra-op threads (ATen's GRAIN_SIZE).
constexpr int64_t kGrainSize = 32768;

struct KernelInput {
  int slot = -1;          // -1: a captured constant
  at::Tensor constant;
  bool scalar = false;    // 0-dim, broadcast over the region
};

struct KernelStep {
  KernelFn fn = nullptr;
  at::ScalarType dtype = at::ScalarType::Float;
  size_t element_size = 4;
  std::vector<KernelInput> inputs;
  std::vector<int> output_slots;
  int first_op = 0, end_op = 0;  // ops_[first_op, end_op): the region's nodes, for the fallback
};

class CppArtifact final : public CodegenArtifact {
 public:
  CppArtifact(std::shared_ptr<const Graph> graph, codegen::PointwisePlan plan,
              std::shared_ptr<const codegen::KernelLibrary> library)
      : graph_(std::move(graph)), plan_(std::move(plan)), library_(std::move(library)) {
    const Graph& g = *graph_;
    codegen::SlotMap slots(g);
    for (size_t i = 0; i < g.arg_values.size(); ++i) {
      if (g.arg_values[i] != tracer::kNoValue) inputs_.push_back({static_cast<int>(i), slots.Slot(g.arg_values[i])});
    }
    for (const tracer::Node& n : g.nodes) ops_.push_back(codegen::MakeOpStep(g, n, slots));

    std::vector<int> region_at(g.nodes.size(), -1);
    for (size_t r = 0; r < plan_.regions.size(); ++r) region_at[plan_.regions[r].nodes.front()] = r;
    for (size_t i = 0; i < g.nodes.size();) {
      if (region_at[i] < 0) {
        steps_.push_back({false, static_cast<int>(i)});
        ++i;
        continue;
      }
      const codegen::PointwiseRegion& r = plan_.regions[region_at[i]];
      KernelStep k;
      k.fn = library_->Find(r.function);
      k.dtype = r.dtype;
      k.element_size = c10::elementSize(r.dtype);
      for (size_t j = 0; j < r.inputs.size(); ++j) {
        KernelInput in;
        in.slot = slots.Slot(r.inputs[j]);
        if (in.slot < 0) in.constant = g.value(r.inputs[j]).constant;
        in.scalar = r.scalar_inputs[j];
        k.inputs.push_back(std::move(in));
      }
      for (ValueId id : r.outputs) k.output_slots.push_back(slots.Slot(id));
      k.first_op = r.nodes.front();
      k.end_op = r.nodes.back() + 1;
      steps_.push_back({true, static_cast<int>(kernels_.size())});
      kernels_.push_back(std::move(k));
      i = r.nodes.back() + 1;
    }
    num_slots_ = slots.num_slots();
    for (ValueId id : g.outputs) {
      if (id == tracer::kNoValue) {
        outputs_.push_back({-1, at::Tensor()});
      } else if (g.value(id).kind == tracer::ValueKind::kConstant) {
        outputs_.push_back({-1, g.value(id).constant});
      } else {
        outputs_.push_back({slots.Slot(id), at::Tensor()});
      }
    }
  }

  const std::string& source() const override { return plan_.source; }
  const std::string& library_path() const override {
    static const std::string* none = new std::string();
    return library_ != nullptr ? library_->path() : *none;
  }
  std::vector<std::vector<int>> fused_regions() const override {
    std::vector<std::vector<int>> regions;
    for (const auto& r : plan_.regions) regions.push_back(r.nodes);
    return regions;
  }

  // Hot path: a boxed call per unfused node and one kernel call per region (plus at::empty for
  // the region's outputs); takes no lock. Scratch buffers are per thread as in backend "aten".
  bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
           std::string* value_guard_failure) const override {
    codegen::RunScratch scratch(num_slots_);
    std::vector<c10::IValue>& slots = scratch.slots();
    for (const auto& [arg, slot] : inputs_) slots[slot] = args[arg];
    for (const Step& s : steps_) {
      if (!s.kernel) {
        if (!codegen::RunOpStep(ops_[s.index], slots, scratch.stack(), value_guard_failure)) return false;
        continue;
      }
      const KernelStep& k = kernels_[s.index];
      if (RunKernel(k, slots)) continue;
      region_fallbacks.fetch_add(1, std::memory_order_relaxed);
      for (int op = k.first_op; op < k.end_op; ++op) {
        if (!codegen::RunOpStep(ops_[op], slots, scratch.stack(), value_guard_failure)) return false;
      }
    }
    outputs->clear();
    outputs->reserve(outputs_.size());
    for (const auto& [slot, constant] : outputs_) {
      outputs->push_back(slot >= 0 ? slots[slot].toTensor() : constant);
    }
    return true;
  }

 private:
  struct Step {
    bool kernel;
    int index;  // into kernels_ or ops_
  };

  // Runs one region's kernel; false (before any effect) if the inputs break its assumptions.
  static bool RunKernel(const KernelStep& k, std::vector<c10::IValue>& slots) {
    absl::InlinedVector<const at::Tensor*, 8> ins;
    const at::Tensor* shape = nullptr;
    for (const KernelInput& in : k.inputs) {
      const at::Tensor& t = in.slot >= 0 ? slots[in.slot].toTensor() : in.constant;
      if (!t.defined() || t.scalar_type() != k.dtype || !t.device().is_cpu() ||
          t.layout() != at::kStrided || t.requires_grad() || t.is_neg()) {
        return false;
      }
      if (in.scalar) {
        if (t.dim() != 0) return false;
      } else {
        if (!t.is_contiguous()) return false;
        if (shape == nullptr) {
          shape = &t;
        } else if (!t.sizes().equals(shape->sizes())) {
          return false;
        }
      }
      ins.push_back(&t);
    }
    if (shape == nullptr) return false;
    const int64_t n = shape->numel();
    absl::InlinedVector<at::Tensor, 4> outs;
    for (size_t j = 0; j < k.output_slots.size(); ++j) {
      outs.push_back(at::empty(shape->sizes(), at::TensorOptions().dtype(k.dtype)));
    }
    if (n > 0) {
      auto run = [&](int64_t begin, int64_t end) {
        absl::InlinedVector<const void*, 8> in_ptrs;
        absl::InlinedVector<void*, 4> out_ptrs;
        for (size_t j = 0; j < ins.size(); ++j) {
          const char* p = static_cast<const char*>(ins[j]->data_ptr());
          in_ptrs.push_back(k.inputs[j].scalar ? p : p + begin * k.element_size);
        }
        for (at::Tensor& o : outs) out_ptrs.push_back(static_cast<char*>(o.data_ptr()) + begin * k.element_size);
        k.fn(in_ptrs.data(), out_ptrs.data(), end - begin);
      };
      if (n <= kGrainSize) {
        run(0, n);
      } else {
        at::parallel_for(0, n, kGrainSize, run);
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
  std::vector<Step> steps_;
  std::vector<std::pair<int, at::Tensor>> outputs_;  // slot, or -1 and a constant / undefined
};

class CppBackend final : public Backend {
 public:
  std::string name() const override { return kBackendName; }
  absl::StatusOr<std::unique_ptr<Artifact>> Compile(std::shared_ptr<const Graph> graph) override {
    for (const tracer::Node& n : graph->nodes) {
      if (!n.handle) return absl::InternalError(absl::StrCat("node %", n.index, " has no operator"));
    }
    codegen::PointwisePlan plan = codegen::PlanPointwise(*graph);
    std::shared_ptr<const codegen::KernelLibrary> library;
    if (!plan.regions.empty()) {
      std::vector<std::string> kernels;
      for (const codegen::PointwiseRegion& r : plan.regions) kernels.push_back(r.function);
      ASSIGN_OR_RETURN(library, codegen::LoadKernels(plan.source, kernels));
    }
    return std::unique_ptr<Artifact>(new CppArtifact(std::move(graph), std::move(plan), std::move(library)));
  }
};

const bool registered = [] {
  RegisterBackend(kBackendName, [] { return std::unique_ptr<Backend>(new CppBackend()); });
  return true;
}();

}  // namespace

int64_t CodegenRegionFallbacks() { return region_fallbacks.load(); }

}  // namespace warden
