// Which LibTorch a test or benchmark binary runs against, for its log and report: the version it
// was compiled against and the library file the process actually loaded.
#pragma once

#include <string>

namespace warden::tools {

// "2.13.0 (/path/to/torch/lib/libtorch_cpu.so)".
std::string LibTorchDescription();

}  // namespace warden::tools
