#include "tools/libtorch_info.h"

#include <dlfcn.h>

#include <ATen/Context.h>

#include "tracer/torch_compat.h"

namespace warden::tools {

std::string LibTorchDescription() {
  std::string s = WARDEN_TORCH_VERSION_STRING;
  Dl_info info{};
  // at::globalContext lives in libtorch_cpu: the file it came from is the LibTorch in use.
  if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) != 0 && info.dli_fname != nullptr) {
    s += " (";
    s += info.dli_fname;
    s += ")";
  }
  return s;
}

}  // namespace warden::tools
