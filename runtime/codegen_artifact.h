// What a code-generating backend's artifact exposes beyond Artifact::Run: the generated source and
// the library it was loaded from, for WARDEN_LOGS=output_code and explain(). Obtain it with
// dynamic_cast from an Artifact; replay artifacts are not CodegenArtifacts.
#ifndef WARDEN_RUNTIME_CODEGEN_ARTIFACT_H_
#define WARDEN_RUNTIME_CODEGEN_ARTIFACT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace warden {

class CodegenArtifact : public Artifact {
 public:
  // The generated C++ ("" when nothing in the graph was fused and every node is replayed).
  virtual const std::string& source() const = 0;
  // The loaded shared library ("" when nothing was compiled).
  virtual const std::string& library_path() const = 0;
  // Where the library came from (codegen::KernelLibrary::origin: "compiled", "local hit", "remote
  // hit", "package hit", plus rejected shared entries); "" when nothing was compiled.
  virtual const std::string& kernel_origin() const = 0;
  // Per fused region, the node indices it runs as one kernel; the last programs() of them are
  // straight-line programs (Note [Straight-line programs] in runtime/codegen_pointwise.h).
  virtual std::vector<std::vector<int>> fused_regions() const = 0;
  virtual int programs() const { return 0; }
  // "aten::max_pool2d at %2" per replay step that has a kernel built into Warden (Note [Native
  // kernels] in runtime/native_kernels.cc), in graph order.
  virtual std::vector<std::string> native_kernels() const { return {}; }
};

// Process-wide count of fused-region (or program) runs whose run-time check failed (a
// non-contiguous input, an index out of range, ...) so that the region's nodes were replayed
// instead; for tests and explain. Counted off the hot path.
int64_t CodegenRegionFallbacks();

}  // namespace warden

#endif  // WARDEN_RUNTIME_CODEGEN_ARTIFACT_H_
