// Every benchmark's context names the LibTorch it ran against ("libtorch" in the console header
// and in --benchmark_format=json), registered before main() runs.
#include <benchmark/benchmark.h>

#include "tools/libtorch_info.h"

namespace {

const bool registered = [] {
  benchmark::AddCustomContext("libtorch", warden::tools::LibTorchDescription());
  return true;
}();

}  // namespace
