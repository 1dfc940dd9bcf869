// explain() and explain_json(): one report of a function's cache: entries (most recently used
// first) with graph, guards and provenance, stats, and the recompile events in call order.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/codegen_artifact.h"
#include "runtime/function_impl.h"

namespace warden {
namespace {

const char* DynamicName(Dynamic d) {
  switch (d) {
    case Dynamic::kStatic: return "static";
    case Dynamic::kAuto: return "auto";
    case Dynamic::kDynamic: return "dynamic";
  }
  return "?";
}

}  // namespace

std::string GraphText(const CacheEntry& e) {
  if (e.shapes == nullptr || e.shapes->symbols.empty()) return e.graph->ToString();
  const ops::ShapePassResult& shapes = *e.shapes;
  return e.graph->ToString([&shapes](tracer::ValueId id) {
    return tracer::SymShapeString(shapes.shapes.at(id));
  });
}

namespace {

// "sizes read by C++, verified per value (Note [Verified size reads]): arg0.size(0) in {2, 3, 5}".
std::string VerifiedText(const runtime::VerifiedSizes& v) {
  const std::string dims = v.names().size() == 1 ? v.names()[0] : absl::StrCat("(", absl::StrJoin(v.names(), ", "), ")");
  const bool strides = std::any_of(v.dims().begin(), v.dims().end(), [](const auto& d) { return d.second < 0; });
  return absl::StrCat(strides ? "sizes and strides" : "sizes", " read by C++, verified per value by re-tracing: ", dims,
                      " in {", v.ValuesText(), "}");
}


// What a code-generating artifact compiled, for explain; empty for replay artifacts.
struct CodegenInfo {
  std::string library;
  std::string origin;
  std::string source;
  int regions = 0;
  std::vector<std::string> programs;  // "%a..%b" per straight-line program
  std::vector<std::string> native;    // Note [Native kernels]
};

CodegenInfo CodegenInfoOf(const CacheEntry& e) {
  CodegenInfo info;
  if (const auto* c = dynamic_cast<const CodegenArtifact*>(e.artifact.get())) {
    info.library = c->library_path();
    info.origin = c->kernel_origin();
    info.source = c->source();
    const auto regions = c->fused_regions();
    info.regions = static_cast<int>(regions.size());
    info.native = c->native_kernels();
    for (size_t r = regions.size() - std::min<size_t>(regions.size(), c->programs()); r < regions.size(); ++r) {
      info.programs.push_back(absl::StrCat("%", regions[r].front(), "..%", regions[r].back()));
    }
  }
  return info;
}

}  // namespace

std::string CompiledFunction::explain() const {
  const Impl& f = *impl_;
  std::lock_guard<std::mutex> lock(f.mu_);
  const Stats s = stats();
  std::string out = absl::StrCat("function '", f.options_.name, "' (id ", f.id_, ", backend ",
                                 f.options_.backend, ", dynamic ", DynamicName(f.options_.dynamic),
                                 ", cache_size_limit ", f.options_.cache_size_limit, ")\n");
  absl::StrAppend(&out, "  calls ", s.calls, ", cache hits ", s.cache_hits, ", compiles ", s.compiles,
                  ", eager calls ", s.eager_calls,
                  s.size_verifications > 0 ? absl::StrCat(", size verifications ", s.size_verifications) : "", "\n");
  if (!f.eager_reason_.empty()) absl::StrAppend(&out, "  runs eagerly: ", f.eager_reason_, "\n");
  if (!f.profile_note_.empty()) absl::StrAppend(&out, "  dynamism profile: ", f.profile_note_, "\n");
  const auto entries = f.EntriesMru();
  absl::StrAppend(&out, "  ", entries.size(), " cache entr", entries.size() == 1 ? "y" : "ies",
                  " (most recently used first)\n");
  for (const auto& e : entries) {
    const auto names = f.ArgNames(e->graph->arg_kinds.size());
    absl::StrAppend(&out, "\nentry ", f.id_, "/", e->index, ": backend ", e->artifact.backend(),
                    ", created at call ", e->created_at_call, ", hits ", e->hits.load(), "\n");
    const std::string note = e->artifact.note();
    if (!note.empty()) absl::StrAppend(&out, "  note: ", note, "\n");
    const CodegenInfo code = CodegenInfoOf(*e);
    if (!code.library.empty()) {
      const std::string programs =
          code.programs.empty() ? ""
                                : absl::StrCat(" (", code.programs.size(), " straight-line program",
                                               code.programs.size() == 1 ? "" : "s", ": ",
                                               absl::StrJoin(code.programs, ", "), ")");
      absl::StrAppend(&out, "  kernels: ", code.regions, " fused region", code.regions == 1 ? "" : "s", programs,
                      " in ", code.library, " (", code.origin,
                      "; source beside it; WARDEN_LOGS=output_code prints it)\n");
    }
    if (!code.native.empty()) {
      absl::StrAppend(&out, "  native kernels: ", absl::StrJoin(code.native, ", "),
                      " (Warden's own kernel where its run-time checks pass, else the ATen call: Note [Native "
                      "kernels])\n");
    }
    for (const std::string& m : e->rule_mismatches) absl::StrAppend(&out, "  rule mismatch: ", m, "\n");
    for (const std::string& m : e->scalar_notes) absl::StrAppend(&out, "  scalar: ", m, "\n");
    if (e->verified != nullptr) absl::StrAppend(&out, "  ", VerifiedText(*e->verified), "\n");
    if (e->modules.empty() && !e->graph->mode_dependent.empty()) {
      absl::StrAppend(&out, "  unwatched mode flag: ", UnwatchedModeHint(*e->graph), "\n");
    } else if (!e->modules.empty()) {
      absl::StrAppend(&out, "  watched modules: ", e->modules.num_modules(), " (training flags and bindings guarded)\n");
    }
    if (e->shapes != nullptr && !e->shapes->symbols.empty()) {
      absl::StrAppend(&out, "  symbols:");
      for (size_t k = 0; k < e->shapes->symbols.size(); ++k) {
        absl::StrAppend(&out, " s", k, " = ", ops::SymbolName(e->shapes->symbols[k], names),
                        e->shapes->specialized.count(static_cast<int>(k)) ? " (specialized)" : "",
                        k + 1 < e->shapes->symbols.size() ? "," : "");
      }
      absl::StrAppend(&out, "\n");
    }
    if (e->backward != nullptr) {
      absl::StrAppend(&out, "  backward: ", e->backward->Describe(), "\n");
      // The backward graph (and what it reads: the saved arguments) is the backward function's.
      for (absl::string_view line : absl::StrSplit(e->backward->ExplainBackward(), '\n', absl::SkipEmpty())) {
        absl::StrAppend(&out, "    | ", line, "\n");
      }
    } else if (!e->backward_note.empty()) {
      absl::StrAppend(&out, "  backward: LibTorch's autograd over the replayed forward (", e->backward_note, ")\n");
    }
    for (const std::string& grad : e->graph->gradients) {
      absl::StrAppend(&out, "  gradient captured: ", grad, "\n");
    }
    absl::StrAppend(&out, "  graph:\n");
    for (absl::string_view line : absl::StrSplit(GraphText(*e), '\n', absl::SkipEmpty())) {
      absl::StrAppend(&out, "    ", line, "\n");
    }
    absl::StrAppend(&out, "  guards (", e->program.size(), "):\n");
    for (const std::string& line : GuardLines(*e, names)) absl::StrAppend(&out, "    ", line, "\n");
  }
  absl::StrAppend(&out, "\nrecompiles (", f.events_.size(), f.dropped_events_ ? absl::StrCat(", ", f.dropped_events_, " older dropped") : "", "):\n");
  for (const RecompileEvent& ev : f.events_) {
    absl::StrAppend(&out, "  call ", ev.call_index, ": ", ev.action, "\n");
    for (const std::string& r : ev.reasons) absl::StrAppend(&out, "    - ", r, "\n");
  }
  return out;
}

std::string CompiledFunction::explain_json() const {
  const Impl& f = *impl_;
  std::lock_guard<std::mutex> lock(f.mu_);
  const Stats s = stats();
  nlohmann::json doc;
  doc["function"] = f.options_.name;
  doc["id"] = f.id_;
  doc["options"] = {{"backend", f.options_.backend},
                    {"dynamic", DynamicName(f.options_.dynamic)},
                    {"cache_size_limit", f.options_.cache_size_limit},
                    {"fail_on_cache_limit", f.options_.fail_on_cache_limit},
                    {"async_compile", f.options_.async_compile}};
  doc["stats"] = {{"calls", s.calls},
                  {"cache_hits", s.cache_hits},
                  {"compiles", s.compiles},
                  {"eager_calls", s.eager_calls},
                  {"size_verifications", s.size_verifications}};
  doc["eager_reason"] = f.eager_reason_;
  doc["dynamism_profile"] = f.profile_note_;
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& e : f.EntriesMru()) {
    const auto names = f.ArgNames(e->graph->arg_kinds.size());
    nlohmann::json guards = nlohmann::json::array();
    for (const guards::Guard& g : e->program.guards()) {
      guards.push_back({{"kind", guards::GuardKindName(g.kind)},
                        {"text", guards::Describe(g, names)},
                        {"provenance", g.provenance}});
    }
    const CodegenInfo code = CodegenInfoOf(*e);
    entries.push_back({{"index", e->index},
                       {"id", absl::StrCat(f.id_, "/", e->index)},
                       {"backend", e->artifact.backend()},
                       {"backend_note", e->artifact.note()},
                       {"kernel_library", code.library},
                       {"kernel_origin", code.origin},
                       {"fused_regions", code.regions},
                       {"programs", code.programs},
                       {"native_kernels", code.native},
                       {"generated_source", code.source},
                       {"created_at_call", e->created_at_call},
                       {"hits", e->hits.load()},
                       {"graph", GraphText(*e)},
                       {"num_nodes", e->graph->nodes.size()},
                       {"guards", guards},
                       {"rule_mismatches", e->rule_mismatches},
                       {"scalar_notes", e->scalar_notes},
                       {"verified_sizes", e->verified != nullptr ? VerifiedText(*e->verified) : ""},
                       {"mode_dependent_ops", e->graph->mode_dependent},
                       {"gradients", e->graph->gradients},
                       {"backward", e->backward != nullptr ? e->backward->Describe()
                                                           : e->backward_note.empty() ? ""
                                                                                      : "autograd: " + e->backward_note},
                       {"watched_modules", e->modules.num_modules()},
                       {"unwatched_mode_hint", e->modules.empty() ? UnwatchedModeHint(*e->graph) : ""}});
  }
  doc["entries"] = entries;
  nlohmann::json events = nlohmann::json::array();
  for (const RecompileEvent& ev : f.events_) {
    events.push_back({{"call_index", ev.call_index}, {"reasons", ev.reasons}, {"action", ev.action}});
  }
  doc["recompiles"] = events;
  doc["dropped_recompiles"] = f.dropped_events_;
  return doc.dump(2);
}

}  // namespace warden
