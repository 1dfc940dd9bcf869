// Output tensors of generated kernels. Large outputs come from a small process-wide pool of
// huge-page-backed buffers that the tensors' deleters return to, so a kernel writing 64 MB does
// not page-fault (and have the kernel zero) 16K fresh pages on every call, which costs more than
// the kernel itself. Small outputs are plain at::empty. Nothing here knows about graphs.
#ifndef WARDEN_RUNTIME_CODEGEN_BUFFERS_H_
#define WARDEN_RUNTIME_CODEGEN_BUFFERS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace warden::codegen {

// A contiguous CPU tensor of `sizes` and `dtype`, uninitialized, resizable like at::empty's.
// Takes a lock only for outputs of at least kPooledBytes.
at::Tensor EmptyOutput(c10::IntArrayRef sizes, at::ScalarType dtype);

constexpr size_t kPooledBytes = size_t{4} << 20;

}  // namespace warden::codegen

#endif  // WARDEN_RUNTIME_CODEGEN_BUFFERS_H_
