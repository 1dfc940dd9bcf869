// The pool of large kernel outputs (codegen_buffers.h).
#include "runtime/codegen_buffers.h"

#include <sys/mman.h>

#include <cstdlib>
#include <limits>
#include <mutex>
#include <vector>

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

namespace warden::codegen {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMaxPooledBuffers = 4;           // at most 4 idle buffers ...
constexpr size_t kMaxPooledTotal = size_t{512} << 20;  // ... and 512 MB

struct Block {
  void* data;
  size_t bytes;  // a multiple of kHugePage
};

struct Pool {
  std::mutex mu;
  std::vector<Block> idle;
  size_t idle_bytes = 0;
};

Pool& GetPool() {
  static Pool* pool = new Pool();  // never destroyed: deleters may run during exit
  return *pool;
}

void Release(void* context) {
  Block* b = static_cast<Block*>(context);
  Pool& pool = GetPool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (pool.idle.size() < kMaxPooledBuffers && pool.idle_bytes + b->bytes <= kMaxPooledTotal) {
      pool.idle.push_back(*b);
      pool.idle_bytes += b->bytes;
      delete b;
      return;
    }
  }
  std::free(b->data);
  delete b;
}

Block* Acquire(size_t bytes) {
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  Pool& pool = GetPool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    for (size_t i = 0; i < pool.idle.size(); ++i) {
      if (pool.idle[i].bytes == rounded) {
        Block* b = new Block(pool.idle[i]);
        pool.idle_bytes -= b->bytes;
        pool.idle.erase(pool.idle.begin() + i);
        return b;
      }
    }
  }
  void* data = std::aligned_alloc(kHugePage, rounded);
  if (data == nullptr) return nullptr;
  madvise(data, rounded, MADV_HUGEPAGE);  // a hint; without THP the buffer still works
  return new Block{data, rounded};
}

}  // namespace

at::Tensor EmptyOutput(c10::IntArrayRef sizes, at::ScalarType dtype) {
  const caffe2::TypeMeta meta = c10::scalarTypeToTypeMeta(dtype);
  // Checked: sizes of expanded inputs can make numel * itemsize wrap, and a wrapped byte count
  // would be a small buffer the kernel writes past. at::empty raises eager's own error for them.
  size_t numel = 1, bytes = 0;
  for (int64_t s : sizes) {
    if (s < 0 || __builtin_mul_overflow(numel, static_cast<size_t>(s), &numel)) {
      return at::empty(sizes, at::TensorOptions().dtype(dtype));
    }
  }
  if (__builtin_mul_overflow(numel, meta.itemsize(), &bytes) ||
      bytes > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    return at::empty(sizes, at::TensorOptions().dtype(dtype));
  }
  Block* b = bytes >= kPooledBytes ? Acquire(bytes) : nullptr;
  if (b == nullptr) return at::empty(sizes, at::TensorOptions().dtype(dtype));
  // As at::empty builds it (empty_generic), with a data pointer whose deleter refills the pool.
  c10::DataPtr ptr(b->data, b, &Release, c10::Device(c10::DeviceType::CPU));
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), bytes,
                                                       std::move(ptr), c10::GetCPUAllocator(),
                                                       /*resizable=*/true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), meta);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

}  // namespace warden::codegen
