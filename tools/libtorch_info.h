// Which LibTorch a test or benchmark binary runs against, for its log and report: the version it
// was compiled against and the library file the process actually loaded, and the BLAS its matmuls
// run on.
#pragma once

#include <string>

namespace warden::tools {

// "2.13.0 (/path/to/torch/lib/libtorch_cpu.so)".
std::string LibTorchDescription();

// The BLAS LibTorch's matmuls call: "OpenBLAS (/usr/lib/.../openblas-pthread/libblas.so.3)" for a
// libblas.so.3 the process loaded (Debian's LibTorch; Debian's alternatives pick the file), "MKL
// (linked into LibTorch)" for a LibTorch built with MKL (the PyTorch wheels), else what is known.
std::string BlasDescription();

// Pins the BLAS's own thread pool to `threads` where LibTorch does not (OpenBLAS's pthread build
// starts one thread per core and at::set_num_threads does not reach it; MKL follows
// at::set_num_threads already). A benchmark measuring one intra-op thread's CPU time must call it,
// or eager's matmuls would run on threads the measurement does not see. Returns whether a BLAS
// thread setter was found and called.
bool SetBlasThreads(int threads);

}  // namespace warden::tools
