// Sizes that C++ code reads, verified per value by re-tracing instead of recompiled per value.
//
// Note [Verified size reads]
// C++ code reads sizes to build shapes: `x.view({x.size(0), -1})`, `torch::zeros({x.size(0), h})`,
// `TORCH_CHECK(x.size(0) == y.size(0))`, and nn::LSTM builds its zero state from input.size(1).
// The tracer sees the int leave the tensor, never what C++ does with it, so the graph cannot be
// assumed valid for another value of that size: before this, the dim was specialized and every
// new batch size was a recompile. Now a new value costs one re-trace, not a compile:
//
// 1. Generalize. When a miss makes a dim dynamic and C++ read it (the shape pass, with
//    verify_reads, reports it in read_symbols instead of specializing it), the new trace is
//    compared with an earlier entry's trace of the same function. They must be the same program:
//    same ops, operands, aliasing, captured tensors, dtypes, reads and data-dependent values. Op
//    arguments may differ only where an int (or an int[] element) equals the read size in both
//    traces, or the same integer multiple k >= 2 of it in both (nn::MultiheadAttention views its
//    projections as [seq, batch*heads, head_dim]); those elements become run-time sizes of the
//    argument, times k (tracer::SizeRef), which both backends evaluate per call. The result is
//    one symbolic graph S.
// 2. Check. The shape pass runs on S (rules see those elements as symbols through
//    ShapeContext::Dims) and the new trace must be an instance of S at its sizes: every value's
//    traced sizes equal S's symbolic shape evaluated there. Then S is compiled once, and the entry
//    records the tuple of read sizes it has verified (VerifiedSizes) next to its ordinary guards,
//    which no longer pin those dims.
// 3. Verify. A call whose read sizes are not in the entry's set but that passes every other guard
//    re-traces the function (the user's C++ runs with those sizes, as on any miss, so every branch
//    it takes is seen). If that trace is an instance of S, the tuple joins the set (no new entry,
//    no backend compile) and the call returns the trace's results. Otherwise it is an ordinary
//    recompile, with the difference as the reason. Hits for verified tuples cost one lookup in a
//    small sorted set.
//
// Stride reads. C++ that reads strides or contiguity (`contiguous()` in nn::MultiheadAttention, an
// Embedding with max_norm) sees numbers that follow from every argument's sizes and strides in
// ways the graph does not track. Under verification such a read makes every symbol a read symbol
// and adds the strides of every tensor argument to the tuple (StrideDim), and the entry gets no
// stride guards (guards::BuildInput::strides_verified): each new combination of sizes and strides
// is traced once before it replays, so the branch C++ took on the layout is seen.
//
// Soundness rests on the set, not on step 1: a tuple is accepted only after a trace at exactly
// those sizes produced exactly S (the trace at the new value is the proof), so a wrong guess in
// step 1 (a coincidence of values, a `std::min(n, 4)` that agreed twice) costs a recompile, never a
// wrong result. Sizes 0 and 1 never enter a set: symbols stand for sizes >= 2 and keep that guard.
#ifndef WARDEN_RUNTIME_VERIFIED_SIZES_H_
#define WARDEN_RUNTIME_VERIFIED_SIZES_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>

#include "ops/shape_pass.h"
#include "tracer/graph.h"
#include "tracer/tracer.h"

namespace warden::runtime {

// The read sizes one entry has verified: tuples of (argument, dim) sizes, and of argument strides
// where C++ read strides (dims below 0: StrideDim). Check() is lock-free (the hot path); Add()
// publishes a new immutable set.
class VerifiedSizes {
 public:
  VerifiedSizes(std::vector<std::pair<int, int>> dims, std::vector<std::string> names);
  VerifiedSizes(const VerifiedSizes&) = delete;
  VerifiedSizes& operator=(const VerifiedSizes&) = delete;

  // The call's tuple is in the set. Arguments must be tensors of sufficient rank (the entry's
  // guards, checked first, ensure it).
  bool Check(const c10::IValue* args) const;
  void Add(const std::vector<int64_t>& tuple);
  std::vector<int64_t> TupleOf(const c10::IValue* args) const;
  // The tuple a trace saw: its arguments' sizes when the call began (the function may have
  // resized an argument in place since, Note [Metadata at entry] in guards/).
  std::vector<int64_t> TupleOf(const tracer::Graph& traced) const;
  std::vector<std::vector<int64_t>> Values() const;
  // The verified tuples as text: "2, 3" for one dim, "(2, 2), (3, 3)" for several.
  std::string ValuesText() const;

  const std::vector<std::pair<int, int>>& dims() const { return dims_; }
  // The element of dims() for a stride (stride reads: ops::ShapePassResult::stride_read).
  static int StrideDim(int dim) { return -1 - dim; }
  // "arg0.size(0)", one per dim.
  const std::vector<std::string>& names() const { return names_; }
  // "arg0.size(0)=7 not verified for this entry (verified: 2, 3)" or "".
  std::string Failure(const c10::IValue* args) const;
  // "arg0.size(0)=7".
  std::string TupleText(const std::vector<int64_t>& tuple) const;

 private:
  std::vector<std::pair<int, int>> dims_;
  std::vector<std::string> names_;
  mutable std::mutex mu_;                                // Add, and the owned sets
  std::vector<std::unique_ptr<std::vector<int64_t>>> owned_;  // flattened sorted tuples
  std::atomic<const std::vector<int64_t>*> current_{nullptr};
};

// Step 1 of Note [Verified size reads]: `now` (the new trace) with the op-argument elements that
// equal a read size (or one multiple of it) in both traces turned into SizeRefs; `read_dims` are the (argument, dim) pairs
// C++ read. Returns null and sets `why` when the traces are not the same program.
std::shared_ptr<tracer::Graph> Generalize(const tracer::TraceResult& now, const tracer::TraceResult& before,
                                          const std::vector<std::pair<int, int>>& read_dims, std::string* why);

// "" when `trace` is an instance of the symbolic graph `s` (shapes from its shape pass) at the
// trace's argument sizes; else the first difference.
std::string InstanceMismatch(const tracer::Graph& s, const std::vector<tracer::MetadataRead>& s_reads,
                             const ops::ShapePassResult& shapes, const tracer::TraceResult& trace);

}  // namespace warden::runtime

#endif  // WARDEN_RUNTIME_VERIFIED_SIZES_H_
