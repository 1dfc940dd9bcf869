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

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual absl::StatusOr<std::unique_ptr<Artifact>> Compile(
      std::shared_ptr<const tracer::Graph> graph) = 0;
};

using BackendFactory = std::function<std::unique_ptr<Backend>()>;

// Registers a backend under `name` (replacing one of the same name). Thread-safe.
void RegisterBackend(const std::string& name, BackendFactory factory);
// A new instance of the named backend, or nullptr.
std::unique_ptr<Backend> MakeBackend(const std::string& name);
std::vector<std::string> BackendNames();

}  // namespace warden

#endif  // WARDEN_RUNTIME_BACKEND_H_
