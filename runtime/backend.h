// The backend interface: a Backend turns a traced graph into an Artifact that runs it. "aten"
// (replay) is built in; "cpp" and host applications register more by name. Artifacts must be safe
// to run from many threads at once.
#ifndef WARDEN_RUNTIME_BACKEND_H_
#define WARDEN_RUNTIME_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"
#include "tracer/graph.h"

namespace warden {

class Artifact {
 public:
  virtual ~Artifact() = default;
  // Runs the graph on a call's arguments (which passed the entry's guards). Returns false, with
  // the reason in *value_guard_failure, when a value guard inside the graph fails; that happens
  // before any side effect, so the caller can retrace.
  virtual bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
                   std::string* value_guard_failure) const = 0;
};

// What a backend knows about the entry it compiles beyond the graph.
struct CompileContext {
  std::string function_name = "fn";  // Options.name, for logs and generated-code comments
  // Per value id of the graph: true where the value's shape has a symbolic dim, i.e. its sizes may
  // differ from the traced ones (tracer::Value::meta) in calls that hit the entry. Empty: every
  // size is static, equal to the traced sizes. Artifacts may bake static sizes in as literals.
  std::vector<bool> symbolic_shape;
  bool output_code = false;  // WARDEN_LOGS=output_code: print generated code on stderr

  bool IsStatic(tracer::ValueId id) const {
    return id < 0 || static_cast<size_t>(id) >= symbolic_shape.size() || !symbolic_shape[id];
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual absl::StatusOr<std::unique_ptr<Artifact>> Compile(
      std::shared_ptr<const tracer::Graph> graph) = 0;
  // Backends that use the context override this; the default ignores it.
  virtual absl::StatusOr<std::unique_ptr<Artifact>> Compile(
      std::shared_ptr<const tracer::Graph> graph, const CompileContext& context) {
    return Compile(std::move(graph));
  }
};

using BackendFactory = std::function<std::unique_ptr<Backend>()>;

// Registers a backend under `name` (replacing one of the same name). Thread-safe.
void RegisterBackend(const std::string& name, BackendFactory factory);
// A new instance of the named backend, or nullptr.
std::unique_ptr<Backend> MakeBackend(const std::string& name);
std::vector<std::string> BackendNames();

}  // namespace warden

#endif  // WARDEN_RUNTIME_BACKEND_H_
