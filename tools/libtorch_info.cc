#include "tools/libtorch_info.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>

#include <cstring>

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

std::string BlasDescription() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const char* name = info->dlpi_name;
        if (name != nullptr && std::strstr(name, "libblas.so") != nullptr) {
          *static_cast<std::string*>(out) = name;
          return 1;
        }
        return 0;
      },
      &found);
  if (found.empty()) return at::hasMKL() ? "MKL (linked into LibTorch)" : "no libblas loaded";
  char resolved[PATH_MAX];
  const std::string path = realpath(found.c_str(), resolved) != nullptr ? resolved : found;
  const char* kind = path.find("openblas") != std::string::npos ? "OpenBLAS"
                     : path.find("blis") != std::string::npos   ? "BLIS"
                     : path.find("atlas") != std::string::npos  ? "ATLAS"
                     : path.find("mkl") != std::string::npos    ? "MKL"
                     : path.find("/blas/") != std::string::npos ? "netlib reference BLAS"
                                                                : "unknown BLAS";
  return std::string(kind) + " (" + path + ")";
}

bool SetBlasThreads(int threads) {
  using Setter = void (*)(int);
  if (auto* set = reinterpret_cast<Setter>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
    return true;
  }
  return false;
}

}  // namespace warden::tools
