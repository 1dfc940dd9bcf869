// Every benchmark's context names the LibTorch it ran against and its BLAS ("libtorch" and "blas"
// in the console header and in --benchmark_format=json), registered before main() runs.
#include <benchmark/benchmark.h>

#include "tools/libtorch_info.h"

namespace {

const bool registered = [] {
  benchmark::AddCustomContext("libtorch", warden::tools::LibTorchDescription());
  benchmark::AddCustomContext("blas", warden::tools::BlasDescription());
  return true;
}();

}  // namespace
