// Note [Native convolution]
// The convolutions of small image models (a few to a few dozen channels, 3x3 or 1x1 kernels,
// images of a few dozen pixels a side) are far below what ATen's CPU convolution is tuned for:
// oneDNN (LibTorch 1.13 and 2.x alike) spends more on setting up each call and on reordering than
// on the multiply-adds. A 1x1 convolution with stride 2 from 8 to 16 channels over 8 images of
// 16x16 (131 thousand multiply-adds) took ~40 us eagerly on this project's machines, and the
// single-channel stem of the ResNet in tests/models/models.h ~48 us at batch 8: 3-6 GFLOP/s, where
// one core's AVX2 peak is ~80. On backend "cpp" a replay step of aten::conv2d runs the kernel below
// when its checks pass, and the ATen call otherwise:
//   - built only when stride, padding, dilation and groups are constants: stride and dilation
//     positive, padding non-negative, groups 1;
//   - at run time: a float32 input [N, C, H, W] and weight [O, C, KH, KW], both contiguous and
//     NCHW to suggest_memory_format() (then eager's output is contiguous NCHW too), every size
//     positive, an output of at least one pixel; the bias absent or a contiguous float32 [O]; every
//     tensor a plain CPU tensor; every weight finite (a padded position multiplies its weight by
//     zero here, where ATen's direct kernels skip it: with an infinite weight that is NaN against
//     a finite sum); more than one output channel (1.13's oneDNN may return a single channel
//     channels-last); a padded copy of the input at most kMaxPaddedFactor times the input and output;
//     no gradient wanted and none forward-mode; the thread's dispatch state as for the other
//     native kernels (no autocast); C * KH * KW <= kMaxReduction, O <= kMaxOutChannels and at most
//     kMaxWork multiply-adds in all, kMaxWideWork when C and O are both 16 or more (beyond them,
//     oneDNN's blocked kernels are as fast or faster);
//   - results: eager's sizes and strides; values within float rounding of eager's, not its bits (the
//     products are summed in another order), like the fused kernels of backend "cpp".
// How: each image is copied once into a zero-padded buffer whose columns are split by their
// position modulo the stride ("phases"), so that for every kernel tap the input pixels of eight
// consecutive output pixels of a row are eight consecutive floats, whatever the stride and
// dilation. The output plane is cut into 8-pixel vectors (a row's last one partial); two vectors
// times four output channels are eight AVX accumulators, and every tap adds a broadcast weight
// times an input vector to them. Tasks are (image, 4 output channels), split across ATen's
// intra-op threads. The loops are compiled for AVX2 with FMA and for the baseline, picked by the
// CPU once.
// aten::conv_transpose2d.input (nn::ConvTranspose2d) takes the same run-time checks with its own
// limits (C <= kMaxReduction, O * KH * KW <= kMaxTransposedColumns, kMaxWork, an output at most
// kMaxPaddedFactor times the products), output_padding as ATen accepts it, and every weight
// finite (LibTorch 2.x's oneDNN deconvolution multiplies some weights by zeros it pads in). Every
// input pixel's products with every weight are computed as vectors along the output columns
// (Products: a DCGAN layer's input may be one pixel), then added at their output pixels
// (Scatter: o-vectors into an [oh][ow][o] buffer, transposed out with the bias; fewer than 8
// output channels plane by plane).
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "runtime/codegen_replay.h"
#include "runtime/native_kernels.h"

// at::parallel_for is a header template: with LibTorch's OpenMP backend it only splits work when
// this translation unit is compiled with -fopenmp (runtime/BUILD).
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "runtime/native_conv.cc must be compiled with -fopenmp for at::parallel_for to split kernels"
#endif

// The vector helpers below are always inlined, so their AVX-sized arguments never cross a call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace warden::codegen::native {
namespace {

// Beyond these, ATen's convolution (oneDNN's blocked kernels) is as fast or faster: measured with
// bench/native_conv_bench.cc, this kernel ran convolutions of up to ~20 million multiply-adds per
// call at 1.0-5x eager's speed, and 3x3 ones of 32 to 128 channels with 58 million at 0.6-0.7x.
constexpr int64_t kMaxReduction = 576;       // C * KH * KW (64 channels of 3x3)
constexpr int64_t kMaxOutChannels = 128;     // O
constexpr int64_t kMaxWork = int64_t{1} << 25;  // multiply-adds per call: N * O * OH * OW * C * KH * KW
// With 16 or more channels in and out, oneDNN's blocked kernels are efficient and only its per-call
// cost is left to win: 16->16 and 32->32 3x3 convolutions of 4.7 million multiply-adds measured
// 1.0x and 0.96x, so those stay with ATen above kMaxWideWork.
constexpr int64_t kWideChannels = 16;
constexpr int64_t kMaxWideWork = int64_t{1} << 22;
// A transposed convolution's columns, O * KH * KW (a DCGAN layer of 64 channels and 4x4 kernels
// has 1024).
constexpr int64_t kMaxTransposedColumns = 4096;
// The padded copy of a convolution's input may hold at most this many times the floats of its
// input and output together, plus kPaddedSlack: a padding or stride far larger than the image
// would make it gigabytes where ATen allocates nothing of the kind.
constexpr double kMaxPaddedFactor = 8;
constexpr double kPaddedSlack = 1 << 16;
// Multiply-adds (or, in the scatter, additions) per parallel task, at least: a fork and join of
// the intra-op threads costs a few microseconds on an idle machine and far more on a busy one,
// so a call is split only into parts of ~10 us of multiply-adds or more.
constexpr int64_t kGrain = int64_t{1} << 19;

constexpr int kBlock = 4;    // output channels per task
constexpr int kVectors = 2;  // output vectors per tile

// One convolution's shapes and buffers.
struct Conv {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
  int64_t hp, wq;        // padded rows; floats per (row, phase) of the padded buffer
  int64_t taps;          // c * kh * kw
  const float* padded;   // [n][c][hp][sw][wq]
  const float* weights;  // [blocks][taps][kBlock], zero beyond o
  const float* bias;     // [blocks * kBlock], zero beyond o
  const int64_t* tap;    // [taps]: offset of the tap's first input float from an output row's base
  const int64_t* vsrc;   // [vectors]: offset of the vector's input base in an image's buffer
  const int64_t* vdst;   // [vectors]: offset of the vector's first output in a channel's plane
  const int* vlanes;     // [vectors]: its valid lanes (8 but at a row's end)
  int64_t vectors;       // oh * ceil(ow / 8)
  float* out;            // [n][o][oh][ow]
};

template <int kTile>
C10_ALWAYS_INLINE void Tile(const Conv& cv, const float* image, const float* wb, const float* bias, int valid,
                            int64_t v0, float* out_plane0) {
  F8 acc[kBlock][kTile];
  for (int j = 0; j < kBlock; ++j) {
    for (int v = 0; v < kTile; ++v) acc[j][v] = Splat(bias[j]);
  }
  const float* src[kTile];
  for (int v = 0; v < kTile; ++v) src[v] = image + cv.vsrc[v0 + v];
  for (int64_t t = 0; t < cv.taps; ++t) {
    const int64_t off = cv.tap[t];
    F8 x[kTile];
    for (int v = 0; v < kTile; ++v) x[v] = Load(src[v] + off);
    const float* wt = wb + t * kBlock;
    for (int j = 0; j < kBlock; ++j) {
      const F8 wv = Splat(wt[j]);
      for (int v = 0; v < kTile; ++v) acc[j][v] += wv * x[v];
    }
  }
  const int64_t plane = cv.oh * cv.ow;
  for (int j = 0; j < valid; ++j) {
    float* dst = out_plane0 + j * plane;
    for (int v = 0; v < kTile; ++v) {
      float lanes[kLanes];
      Store(lanes, acc[j][v]);
      std::memcpy(dst + cv.vdst[v0 + v], lanes, cv.vlanes[v0 + v] * sizeof(float));
    }
  }
}

#if defined(__x86_64__)
// The first `lanes` lanes (0..8) set.
__attribute__((target("avx2"), always_inline)) inline __m256i LaneMask(int lanes) {
  alignas(32) static const int32_t kMasks[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMasks + kLanes - lanes));
}

// Tile with AVX2 intrinsics: the accumulators stay in registers (eight of the sixteen), each tap
// is kTile loads, kBlock broadcasts and kBlock * kTile FMAs.
template <int kTile>
__attribute__((target("avx2,fma"), always_inline)) inline void TileAvx2(const Conv& cv, const float* image,
                                                                        const float* wb, const float* bias,
                                                                        int valid, int64_t v0, float* out_plane0) {
  __m256 acc[kBlock][kTile];
#pragma GCC unroll 4
  for (int j = 0; j < kBlock; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < kTile; ++v) acc[j][v] = _mm256_broadcast_ss(bias + j);
  }
  const float* src[kTile];
#pragma GCC unroll 2
  for (int v = 0; v < kTile; ++v) src[v] = image + cv.vsrc[v0 + v];
  const int64_t* tap = cv.tap;
  const int64_t taps = cv.taps;
  for (int64_t t = 0; t < taps; ++t) {
    const int64_t off = tap[t];
    __m256 x[kTile];
#pragma GCC unroll 2
    for (int v = 0; v < kTile; ++v) x[v] = _mm256_loadu_ps(src[v] + off);
    const float* wt = wb + t * kBlock;
#pragma GCC unroll 4
    for (int j = 0; j < kBlock; ++j) {
      const __m256 wv = _mm256_broadcast_ss(wt + j);
#pragma GCC unroll 2
      for (int v = 0; v < kTile; ++v) acc[j][v] = _mm256_fmadd_ps(wv, x[v], acc[j][v]);
    }
  }
  const int64_t plane = cv.oh * cv.ow;
  // Constant indices only, so that acc never needs an address.
#pragma GCC unroll 4
  for (int j = 0; j < kBlock; ++j) {
    if (j >= valid) break;
    float* dst = out_plane0 + j * plane;
#pragma GCC unroll 2
    for (int v = 0; v < kTile; ++v) {
      if (cv.vlanes[v0 + v] == kLanes) {
        _mm256_storeu_ps(dst + cv.vdst[v0 + v], acc[j][v]);
      } else {
        _mm256_maskstore_ps(dst + cv.vdst[v0 + v], LaneMask(cv.vlanes[v0 + v]), acc[j][v]);
      }
    }
  }
}

__attribute__((target("avx2,fma"))) void TaskAvx2(const Conv& cv, int64_t img, int64_t block) {
  const float* image = cv.padded + img * cv.c * cv.hp * cv.sw * cv.wq;
  const float* wb = cv.weights + block * cv.taps * kBlock;
  const float* bias = cv.bias + block * kBlock;
  const int valid = static_cast<int>(std::min<int64_t>(kBlock, cv.o - block * kBlock));
  float* out_plane0 = cv.out + (img * cv.o + block * kBlock) * cv.oh * cv.ow;
  int64_t v = 0;
  for (; v + kVectors <= cv.vectors; v += kVectors) TileAvx2<kVectors>(cv, image, wb, bias, valid, v, out_plane0);
  for (; v < cv.vectors; ++v) TileAvx2<1>(cv, image, wb, bias, valid, v, out_plane0);
}
#endif

// The same with generic vectors, for CPUs without AVX2.
void TaskBaseline(const Conv& cv, int64_t img, int64_t block) {
  const float* image = cv.padded + img * cv.c * cv.hp * cv.sw * cv.wq;
  const float* wb = cv.weights + block * cv.taps * kBlock;
  const float* bias = cv.bias + block * kBlock;
  const int valid = static_cast<int>(std::min<int64_t>(kBlock, cv.o - block * kBlock));
  float* out_plane0 = cv.out + (img * cv.o + block * kBlock) * cv.oh * cv.ow;
  for (int64_t v = 0; v < cv.vectors; ++v) Tile<1>(cv, image, wb, bias, valid, v, out_plane0);
}

void RunConv(const Conv& cv) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  const int64_t blocks = (cv.o + kBlock - 1) / kBlock;
  const int64_t per_task = std::max<int64_t>(1, cv.oh * cv.ow * cv.taps * kBlock);
  at::parallel_for(0, cv.n * blocks, std::max<int64_t>(1, kGrain / per_task), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
#if defined(__x86_64__)
      if (avx2) {
        TaskAvx2(cv, i / blocks, i % blocks);
        continue;
      }
#endif
      TaskBaseline(cv, i / blocks, i % blocks);
    }
  });
}

// A contiguous NCHW float32 plain CPU tensor with no forward gradient.
bool Dense(const at::Tensor& t, int64_t dim) {
  return PlainCpu(t) && t.scalar_type() == at::kFloat && t.dim() == dim && t.is_contiguous() &&
         (dim != 4 || t.suggest_memory_format() == at::MemoryFormat::Contiguous) && !HasForwardGrad(t);
}

// A step argument's tensor: from its slot, or its constant; undefined for None.
at::Tensor ArgTensor(const OpStepArg& a, const std::vector<c10::IValue>& slots) {
  const c10::IValue& v = a.kind == OpStepArg::Kind::kSlot ? slots[a.slot] : a.constant;
  return v.isTensor() ? v.toTensor() : at::Tensor();
}

bool TensorArg(const OpStepArg& a, bool optional) {
  if (a.kind == OpStepArg::Kind::kSlot) return true;
  return a.kind == OpStepArg::Kind::kConstant && (a.constant.isTensor() || (optional && a.constant.isNone()));
}

// One or two ints into a pair.
bool Pair(const OpStepArg& a, int64_t* pair) {
  if (a.kind != OpStepArg::Kind::kConstant || !a.constant.isIntList()) return false;
  const std::vector<int64_t> v = a.constant.toIntVector();
  if (v.size() != 1 && v.size() != 2) return false;
  pair[0] = v[0];
  pair[1] = v.back();
  return true;
}

// Output sizes from the input, kernel, stride, padding and dilation; false where ATen raises.
bool OutputSizes(Conv* cv) {
  const int64_t span_h = cv->h + 2 * cv->ph - cv->dh * (cv->kh - 1) - 1;
  const int64_t span_w = cv->w + 2 * cv->pw - cv->dw * (cv->kw - 1) - 1;
  if (span_h < 0 || span_w < 0) return false;
  cv->oh = span_h / cv->sh + 1;
  cv->ow = span_w / cv->sw + 1;
  return true;
}

// The floats of RunDirect's padded, phase-split copy of the input, in double.
double PaddedFloats(const Conv& cv) {
  const int64_t row_vectors = (cv.ow + kLanes - 1) / kLanes;
  const int64_t wq = row_vectors * kLanes + (cv.kw - 1) * cv.dw / cv.sw;
  return static_cast<double>(cv.n) * cv.c * (cv.h + 2 * cv.ph) * cv.sw * wq;
}

// Multiply-adds of the convolution, in double: the product may not fit in 64 bits.
double Work(const Conv& cv) {
  return static_cast<double>(cv.n) * cv.o * cv.oh * cv.ow * cv.c * cv.kh * cv.kw;
}

// No gradient wanted of the step (grad mode off, or none of the tensors requires grad) and a
// dispatch state the native kernels allow.
bool NoGradWanted(std::initializer_list<const at::Tensor*> tensors) {
  bool below_autograd = false;
  if (!DispatchStateAllowsNative(&below_autograd)) return false;
  if (!c10::GradMode::is_enabled() || below_autograd) return true;
  for (const at::Tensor* t : tensors) {
    if (t->defined() && t->requires_grad()) return false;
  }
  return true;
}

// The convolution cv describes (sizes, stride, padding, dilation and output sizes set) of x
// [n][c][h][w] into out [n][o][oh][ow]: weight (oc, tap) at wsrc[oc * w_oc + tap * w_tap], taps in
// (c, kh, kw) order; bsrc null or [o].
void RunDirect(Conv* cv, const float* xsrc, const float* wsrc, int64_t w_oc, int64_t w_tap, const float* bsrc,
               float* out) {
  cv->taps = cv->c * cv->kh * cv->kw;
  const int64_t blocks = (cv->o + kBlock - 1) / kBlock;
  const int64_t row_vectors = (cv->ow + kLanes - 1) / kLanes;
  cv->vectors = cv->oh * row_vectors;
  cv->hp = cv->h + 2 * cv->ph;
  // A vector of a row's last (partial) one reads up to lane 7 from the largest tap offset.
  cv->wq = row_vectors * kLanes + (cv->kw - 1) * cv->dw / cv->sw;
  const int64_t image_floats = cv->c * cv->hp * cv->sw * cv->wq;

  thread_local std::vector<float> floats;
  thread_local std::vector<int64_t> offsets;
  thread_local std::vector<int> lanes;
  const size_t need = static_cast<size_t>(blocks * kBlock * (cv->taps + 1) + cv->n * image_floats);
  if (floats.size() < need) floats.resize(need);
  float* weights = floats.data();
  float* bias = weights + blocks * kBlock * cv->taps;
  float* padded = bias + blocks * kBlock;

  // Weights to [block][tap][kBlock].
  for (int64_t oc = 0; oc < blocks * kBlock; ++oc) {
    float* dst = weights + (oc / kBlock) * cv->taps * kBlock + oc % kBlock;
    if (oc >= cv->o) {
      for (int64_t t = 0; t < cv->taps; ++t) dst[t * kBlock] = 0.0f;
      continue;
    }
    const float* row = wsrc + oc * w_oc;
    for (int64_t t = 0; t < cv->taps; ++t) dst[t * kBlock] = row[t * w_tap];
  }
  std::fill(bias, bias + blocks * kBlock, 0.0f);
  if (bsrc != nullptr) std::memcpy(bias, bsrc, cv->o * sizeof(float));

  // Padded, phase-split images: only the rows and phases some tap reads (a 1x1 convolution with
  // stride 2 reads one row in two and one phase in two).
  std::fill(padded, padded + cv->n * image_floats, 0.0f);
  thread_local std::vector<char> read;
  read.assign(static_cast<size_t>(cv->hp + cv->sw), 0);
  char* row_read = read.data();
  char* phase_read = row_read + cv->hp;
  for (int64_t r = 0; r < cv->oh; ++r) {
    for (int64_t i = 0; i < cv->kh; ++i) row_read[r * cv->sh + i * cv->dh] = 1;
  }
  for (int64_t k = 0; k < cv->kw; ++k) phase_read[k * cv->dw % cv->sw] = 1;
  for (int64_t r = 0; r < cv->h; ++r) {
    if (!row_read[r + cv->ph]) continue;
    for (int64_t q = 0; q < cv->sw; ++q) {
      if (!phase_read[q]) continue;
      // Phase q holds padded columns q, q + sw, q + 2 sw, ...: input columns q - pw + idx * sw,
      // for the idx with 0 <= column < w.
      const int64_t first = q >= cv->pw ? 0 : (cv->pw - q + cv->sw - 1) / cv->sw;
      const int64_t end = std::min(cv->wq, (cv->w - q + cv->pw + cv->sw - 1) / cv->sw);
      const int64_t count = end - first, col0 = q - cv->pw + first * cv->sw;
      if (count <= 0) continue;
      for (int64_t plane = 0; plane < cv->n * cv->c; ++plane) {
        const float* src = xsrc + (plane * cv->h + r) * cv->w + col0;
        float* phase = padded + ((plane * cv->hp + r + cv->ph) * cv->sw + q) * cv->wq + first;
        if (cv->sw == 1) {
          std::memcpy(phase, src, count * sizeof(float));
        } else if (cv->sw == 2) {
          for (int64_t i = 0; i < count; ++i) phase[i] = src[2 * i];
        } else {
          for (int64_t i = 0; i < count; ++i) phase[i] = src[i * cv->sw];
        }
      }
    }
  }

  offsets.resize(static_cast<size_t>(cv->taps + 2 * cv->vectors));
  lanes.resize(static_cast<size_t>(cv->vectors));
  int64_t* tap = offsets.data();
  for (int64_t ci = 0; ci < cv->c; ++ci) {
    for (int64_t i = 0; i < cv->kh; ++i) {
      for (int64_t k = 0; k < cv->kw; ++k) {
        const int64_t col = k * cv->dw;
        tap[(ci * cv->kh + i) * cv->kw + k] = ((ci * cv->hp + i * cv->dh) * cv->sw + col % cv->sw) * cv->wq + col / cv->sw;
      }
    }
  }
  int64_t* vsrc = tap + cv->taps;
  int64_t* vdst = vsrc + cv->vectors;
  for (int64_t r = 0; r < cv->oh; ++r) {
    for (int64_t q = 0; q < row_vectors; ++q) {
      const int64_t v = r * row_vectors + q;
      vsrc[v] = r * cv->sh * cv->sw * cv->wq + q * kLanes;
      vdst[v] = r * cv->ow + q * kLanes;
      lanes[v] = static_cast<int>(std::min<int64_t>(kLanes, cv->ow - q * kLanes));
    }
  }

  cv->padded = padded;
  cv->weights = weights;
  cv->bias = bias;
  cv->tap = tap;
  cv->vsrc = vsrc;
  cv->vdst = vdst;
  cv->vlanes = lanes.data();
  cv->out = out;
  RunConv(*cv);
  // A large call's buffer is not kept for the next one.
  if (floats.size() > (size_t{1} << 20)) std::vector<float>().swap(floats);
}

// A transposed convolution's products: out[n][p][m] = sum over c of x[n][c][p] * w[c][m], for
// every input pixel p (of `pixels`) and column m = (output channel, kh, kw) (of `m`); w and out
// rows are mp floats (m rounded up to whole vectors; w's padding is zero). Vectors run along the
// columns (a DCGAN layer's input may be one pixel), four pixels by two vectors of accumulators.
struct Products {
  int64_t n, c, pixels, m, mp;
  const float* x;  // [n][c][pixels]
  const float* w;  // [c][mp]
  float* out;      // [n][pixels][mp]
};

constexpr int kPixels = 4;

// The same with generic vectors, for CPUs without AVX2: rows [q0, q0 + kPixels) of the flat index.
void ProductsRowsBaseline(const Products& g, int64_t q0) {
  const int64_t end = std::min(q0 + kPixels, g.n * g.pixels);
  for (int64_t q = q0; q < end; ++q) {
    const float* x = g.x + (q / g.pixels) * g.c * g.pixels + q % g.pixels;
    float* out = g.out + q * g.mp;
    std::fill(out, out + g.mp, 0.0f);
    for (int64_t ic = 0; ic < g.c; ++ic) {
      const F8 xv = Splat(x[ic * g.pixels]);
      const float* w = g.w + ic * g.mp;
      for (int64_t m = 0; m < g.mp; m += kLanes) {
        Store(out + m, Load(out + m) + xv * Load(w + m));
      }
    }
  }
}

#if defined(__x86_64__)
// Rows [q0, q0 + rows) of the flat (image, pixel) index q = img * pixels + p.
template <int kTile>
__attribute__((target("avx2,fma"), always_inline)) inline void ProductsTileAvx2(const Products& g, int64_t q0,
                                                                                int rows, int64_t m0) {
  __m256 acc[kPixels][kTile];
#pragma GCC unroll 4
  for (int j = 0; j < kPixels; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < kTile; ++v) acc[j][v] = _mm256_setzero_ps();
  }
  // Rows past the last one repeat it (their sums are not stored): constant indices only.
  const float* xrow[kPixels];
#pragma GCC unroll 4
  for (int j = 0; j < kPixels; ++j) {
    const int64_t q = q0 + std::min(j, rows - 1);
    xrow[j] = g.x + (q / g.pixels) * g.c * g.pixels + q % g.pixels;
  }
  const float* w = g.w + m0;
  const int64_t c = g.c, mp = g.mp, pixels = g.pixels;
  for (int64_t ic = 0; ic < c; ++ic) {
    __m256 wv[kTile];
#pragma GCC unroll 2
    for (int v = 0; v < kTile; ++v) wv[v] = _mm256_loadu_ps(w + ic * mp + v * kLanes);
#pragma GCC unroll 4
    for (int j = 0; j < kPixels; ++j) {
      const __m256 xv = _mm256_broadcast_ss(xrow[j] + ic * pixels);
#pragma GCC unroll 2
      for (int v = 0; v < kTile; ++v) acc[j][v] = _mm256_fmadd_ps(xv, wv[v], acc[j][v]);
    }
  }
  float* out = g.out + q0 * mp + m0;
#pragma GCC unroll 4
  for (int j = 0; j < kPixels; ++j) {
    if (j >= rows) break;
#pragma GCC unroll 2
    for (int v = 0; v < kTile; ++v) _mm256_storeu_ps(out + j * mp + v * kLanes, acc[j][v]);
  }
}

__attribute__((target("avx2,fma"))) void ProductsRowsAvx2(const Products& g, int64_t q0) {
  const int rows = static_cast<int>(std::min<int64_t>(kPixels, g.n * g.pixels - q0));
  int64_t m0 = 0;
  for (; m0 + 2 * kLanes <= g.mp; m0 += 2 * kLanes) ProductsTileAvx2<2>(g, q0, rows, m0);
  if (m0 < g.mp) ProductsTileAvx2<1>(g, q0, rows, m0);
}
#endif
void RunProducts(const Products& g) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  const int64_t blocks = (g.n * g.pixels + kPixels - 1) / kPixels;
  at::parallel_for(0, blocks, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, kPixels * g.c * g.m)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t block = begin; block < end; ++block) {
#if defined(__x86_64__)
                       if (avx2) {
                         ProductsRowsAvx2(g, block * kPixels);
                         continue;
                       }
#endif
                       ProductsRowsBaseline(g, block * kPixels);
                     }
                   });
}

// A transposed convolution's products added at their output pixels (col2im): each input pixel's
// (kh, kw) products, o consecutive floats, go to one output pixel of an [oh][ow][o] buffer, in
// vectors along o; then that buffer, plus the bias, is written out as [o][oh][ow]. One image per
// task.
struct Scatter {
  int64_t n, o, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, mp;
  const float* cols;  // [n][h * w][mp], columns (kh, kw, o)
  const float* bias;  // [o] or null
  float* out;         // [n][o][oh][ow]
  float* nhwc;        // [n][oh][ow][o] scratch
};

C10_ALWAYS_INLINE void AddRow(float* dst, const float* src, int64_t count) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    Store(dst + i, Load(dst + i) + Load(src + i));
  }
  for (; i < count; ++i) dst[i] += src[i];
}

// Fewer channels than a vector: plane by plane, each (kh, kw) column added along output rows.
void ScatterPlanes(const Scatter& sc, int64_t img) {
  const int64_t o = sc.o, plane = sc.oh * sc.ow;
  const float* cols = sc.cols + img * sc.h * sc.w * sc.mp;
  for (int64_t oc = 0; oc < o; ++oc) {
    float* out = sc.out + (img * o + oc) * plane;
    std::fill(out, out + plane, sc.bias != nullptr ? sc.bias[oc] : 0.0f);
    for (int64_t i = 0; i < sc.kh; ++i) {
      for (int64_t k = 0; k < sc.kw; ++k) {
        // Output column ix * sw - pw + k * dw is inside [0, ow) for ix in [lo, hi).
        const int64_t x0 = k * sc.dw - sc.pw;
        const int64_t lo = x0 >= 0 ? 0 : (-x0 + sc.sw - 1) / sc.sw;
        const int64_t hi = std::min(sc.w, x0 >= sc.ow ? 0 : (sc.ow - x0 + sc.sw - 1) / sc.sw);
        const float* col = cols + (i * sc.kw + k) * o + oc;
        for (int64_t iy = 0; iy < sc.h; ++iy) {
          const int64_t y = iy * sc.sh - sc.ph + i * sc.dh;
          if (y < 0 || y >= sc.oh) continue;
          float* row = out + y * sc.ow;
          const float* src = col + iy * sc.w * sc.mp;
          for (int64_t ix = lo; ix < hi; ++ix) row[x0 + ix * sc.sw] += src[ix * sc.mp];
        }
      }
    }
  }
}

C10_ALWAYS_INLINE void ScatterImageBody(const Scatter& sc, int64_t img) {
  const int64_t o = sc.o, plane = sc.oh * sc.ow;
  if (o < kLanes) {
    ScatterPlanes(sc, img);
    return;
  }
  float* nhwc = sc.nhwc + img * plane * o;
  std::fill(nhwc, nhwc + plane * o, 0.0f);
  const float* cols = sc.cols + img * sc.h * sc.w * sc.mp;
  for (int64_t iy = 0; iy < sc.h; ++iy) {
    for (int64_t i = 0; i < sc.kh; ++i) {
      const int64_t y = iy * sc.sh - sc.ph + i * sc.dh;
      if (y < 0 || y >= sc.oh) continue;
      for (int64_t ix = 0; ix < sc.w; ++ix) {
        const float* src = cols + (iy * sc.w + ix) * sc.mp + i * sc.kw * o;
        for (int64_t k = 0; k < sc.kw; ++k) {
          const int64_t x = ix * sc.sw - sc.pw + k * sc.dw;
          if (x < 0 || x >= sc.ow) continue;
          AddRow(nhwc + (y * sc.ow + x) * o, src + k * o, o);
        }
      }
    }
  }
  float* out = sc.out + img * o * plane;
  for (int64_t oc = 0; oc < o; ++oc) {
    const float b = sc.bias != nullptr ? sc.bias[oc] : 0.0f;
    float* dst = out + oc * plane;
    for (int64_t q = 0; q < plane; ++q) dst[q] = nhwc[q * o + oc] + b;
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void ScatterImageAvx2(const Scatter& sc, int64_t img) { ScatterImageBody(sc, img); }
#endif
void ScatterImageBaseline(const Scatter& sc, int64_t img) { ScatterImageBody(sc, img); }

void RunScatter(const Scatter& sc) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  at::parallel_for(0, sc.n, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, sc.h * sc.w * sc.kh * sc.kw * sc.o)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t img = begin; img < end; ++img) {
#if defined(__x86_64__)
                       if (avx2) {
                         ScatterImageAvx2(sc, img);
                         continue;
                       }
#endif
                       ScatterImageBaseline(sc, img);
                     }
                   });
}

// The step's input, weight and optional bias, each a dense float32 tensor of its rank.
bool Operands(const OpStep& s, const std::vector<c10::IValue>& slots, at::Tensor* x, at::Tensor* w, at::Tensor* b) {
  const c10::IValue& xv = slots[s.args[0].slot];
  if (!xv.isTensor()) return false;
  *x = xv.toTensor();
  *w = ArgTensor(s.args[1], slots);
  *b = ArgTensor(s.args[2], slots);
  return Dense(*x, 4) && Dense(*w, 4) && (!b->defined() || Dense(*b, 1));
}

// Positive stride and dilation, non-negative padding, none absurdly large.
bool Geometry(const int64_t* stride, const int64_t* padding, const int64_t* dilation) {
  for (int i = 0; i < 2; ++i) {
    if (stride[i] <= 0 || dilation[i] <= 0 || padding[i] < 0) return false;
    if (stride[i] > 64 || dilation[i] > 64 || padding[i] > 1024) return false;
  }
  return true;
}

// Every element of a contiguous float32 tensor finite. Runs on every call over every weight (a
// DCGAN generator's are ~16 thousand floats), so it tests the exponent bits eight at a time: the
// scalar isfinite loop took ~10 us of a 16 us call at batch 1.
C10_ALWAYS_INLINE bool AllFiniteBody(const float* p, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;  // all ones: infinity or NaN
  typedef uint32_t U8 __attribute__((vector_size(32)));
  U8 bad = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    U8 bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    bad |= (bits & kExponent) == kExponent;
  }
  uint32_t any = 0;
  for (int l = 0; l < kLanes; ++l) any |= bad[l];
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    any |= (bits & kExponent) == kExponent;
  }
  return any == 0;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) bool AllFiniteAvx2(const float* p, int64_t n) { return AllFiniteBody(p, n); }
#endif
bool AllFiniteBaseline(const float* p, int64_t n) { return AllFiniteBody(p, n); }

bool AllFinite(const at::Tensor& t) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return AllFiniteAvx2(t.data_ptr<float>(), t.numel());
#endif
  return AllFiniteBaseline(t.data_ptr<float>(), t.numel());
}

bool OneGroup(const OpStepArg& groups) {
  return groups.kind == OpStepArg::Kind::kConstant && groups.constant.isInt() && groups.constant.toInt() == 1;
}

}  // namespace

// conv2d(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, int[2] dilation,
// int groups) into native_params: sh, sw, ph, pw, dh, dw.
bool Conv2dParams(const OpStep& s, std::vector<int64_t>* params) {
  if (s.args.size() != 7 || s.args[0].kind != OpStepArg::Kind::kSlot || !TensorArg(s.args[1], false) ||
      !TensorArg(s.args[2], true)) {
    return false;
  }
  int64_t stride[2], padding[2], dilation[2];
  if (!Pair(s.args[3], stride) || !Pair(s.args[4], padding) || !Pair(s.args[5], dilation)) return false;
  if (!OneGroup(s.args[6])) return false;
  if (!Geometry(stride, padding, dilation)) return false;
  *params = {stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1]};
  return true;
}

bool NativeConv2d(const OpStep& s, std::vector<c10::IValue>& slots) {
  at::Tensor x, w, b;
  if (!Operands(s, slots, &x, &w, &b)) return false;
  Conv cv;
  cv.n = x.size(0);
  cv.c = x.size(1);
  cv.h = x.size(2);
  cv.w = x.size(3);
  cv.o = w.size(0);
  cv.kh = w.size(2);
  cv.kw = w.size(3);
  const std::vector<int64_t>& p = s.native_params;
  cv.sh = p[0];
  cv.sw = p[1];
  cv.ph = p[2];
  cv.pw = p[3];
  cv.dh = p[4];
  cv.dw = p[5];
  if (cv.n <= 0 || cv.c <= 0 || cv.h <= 0 || cv.w <= 0 || cv.o <= 0 || cv.kh <= 0 || cv.kw <= 0) return false;
  if (w.size(1) != cv.c || (b.defined() && b.size(0) != cv.o)) return false;
  if (cv.o > kMaxOutChannels || cv.c * cv.kh * cv.kw > kMaxReduction) return false;
  // One output channel: LibTorch 1.13's oneDNN path sometimes returns it with channel stride 1
  // (channels-last to suggest_memory_format, which the next convolution then follows), in a way
  // this kernel cannot predict.
  if (cv.o == 1) return false;
  if (!OutputSizes(&cv)) return false;  // ATen raises
  if (PaddedFloats(cv) > kMaxPaddedFactor * static_cast<double>(x.numel() + cv.n * cv.o * cv.oh * cv.ow) + kPaddedSlack) {
    return false;  // mostly padding (a large padding or stride): the buffer would dwarf the work
  }
  const bool wide = cv.c >= kWideChannels && cv.o >= kWideChannels;
  if (Work(cv) > static_cast<double>(wide ? kMaxWideWork : kMaxWork)) return false;
  if (!NoGradWanted({&x, &w, &b})) return false;
  // A padded position multiplies its weight by zero: refuse non-finite weights.
  if (!AllFinite(w)) return false;
  const float* wsrc = w.data_ptr<float>();
  CountCall();
  at::Tensor out = at::empty({cv.n, cv.o, cv.oh, cv.ow}, x.options());
  RunDirect(&cv, x.data_ptr<float>(), wsrc, cv.c * cv.kh * cv.kw, 1, b.defined() ? b.data_ptr<float>() : nullptr,
            out.data_ptr<float>());
  slots[s.returns[0].slots[0]] = std::move(out);
  return true;
}

// conv_transpose2d.input(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding,
// int[2] output_padding, int groups, int[2] dilation) into native_params: sh, sw, ph, pw, oph, opw,
// dh, dw.
bool ConvTranspose2dParams(const OpStep& s, std::vector<int64_t>* params) {
  if (s.args.size() != 8 || s.args[0].kind != OpStepArg::Kind::kSlot || !TensorArg(s.args[1], false) ||
      !TensorArg(s.args[2], true)) {
    return false;
  }
  int64_t stride[2], padding[2], output_padding[2], dilation[2];
  if (!Pair(s.args[3], stride) || !Pair(s.args[4], padding) || !Pair(s.args[5], output_padding) ||
      !Pair(s.args[7], dilation)) {
    return false;
  }
  if (!OneGroup(s.args[6])) return false;
  if (!Geometry(stride, padding, dilation)) return false;
  for (int i = 0; i < 2; ++i) {
    if (output_padding[i] < 0) return false;
    // ATen: "output padding must be smaller than either stride or dilation".
    if (output_padding[i] >= stride[i] && output_padding[i] >= dilation[i]) return false;
  }
  *params = {stride[0],         stride[1],         padding[0],  padding[1],
             output_padding[0], output_padding[1], dilation[0], dilation[1]};
  return true;
}

bool NativeConvTranspose2d(const OpStep& s, std::vector<c10::IValue>& slots) {
  at::Tensor x, w, b;
  if (!Operands(s, slots, &x, &w, &b)) return false;
  Products g;
  g.n = x.size(0);
  g.c = x.size(1);
  const int64_t h = x.size(2), wd = x.size(3);
  const int64_t o = w.size(1), kh = w.size(2), kw = w.size(3);
  if (g.n <= 0 || g.c <= 0 || h <= 0 || wd <= 0 || o <= 0 || kh <= 0 || kw <= 0 || w.size(0) != g.c) return false;
  if (b.defined() && b.size(0) != o) return false;
  const std::vector<int64_t>& p = s.native_params;
  const int64_t sh = p[0], sw = p[1], ph = p[2], pw = p[3], dh = p[6], dw = p[7];
  const int64_t oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + p[4] + 1;
  const int64_t ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + p[5] + 1;
  if (oh <= 0 || ow <= 0) return false;  // ATen raises
  g.m = o * kh * kw;
  g.pixels = h * wd;
  if (g.c > kMaxReduction || g.m > kMaxTransposedColumns) return false;
  if (static_cast<double>(g.n) * g.pixels * g.c * g.m > static_cast<double>(kMaxWork)) return false;
  // An output far larger than the products (a large stride or dilation spreads them thin) is
  // mostly zero-filling, which ATen does as well as this kernel.
  if (static_cast<double>(g.n) * o * oh * ow > kMaxPaddedFactor * static_cast<double>(g.n * g.pixels * g.m) + kPaddedSlack) {
    return false;
  }
  if (!NoGradWanted({&x, &w, &b})) return false;
  // LibTorch 2.x's oneDNN deconvolution multiplies some weights by zeros it pads in (a stride of
  // 3 or more, an output padding), so an infinite or NaN weight makes NaN there: refuse them.
  if (!AllFinite(w)) return false;
  const float* wsrc = w.data_ptr<float>();
  CountCall();
  g.mp = (g.m + kLanes - 1) / kLanes * kLanes;
  thread_local std::vector<float> buffer;
  const size_t need = static_cast<size_t>(g.c * g.mp + g.n * g.pixels * g.mp);
  if (buffer.size() < need) buffer.resize(need);
  // The weight as [c][mp] with columns in (kh, kw, o) order (an output pixel's channels are then
  // consecutive), each row zero-padded to whole vectors.
  float* wp = buffer.data();
  const int64_t taps = kh * kw;
  for (int64_t ic = 0; ic < g.c; ++ic) {
    float* row = wp + ic * g.mp;
    const float* src = wsrc + ic * g.m;  // [o][taps]
    for (int64_t oc = 0; oc < o; ++oc) {
      for (int64_t t = 0; t < taps; ++t) row[t * o + oc] = src[oc * taps + t];
    }
    std::fill(row + g.m, row + g.mp, 0.0f);
  }
  g.x = x.data_ptr<float>();
  g.w = wp;
  g.out = wp + g.c * g.mp;
  RunProducts(g);
  at::Tensor out = at::empty({g.n, o, oh, ow}, x.options());
  Scatter sc{g.n, o, h, wd, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, g.mp, g.out,
             b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr<float>()};
  thread_local std::vector<float> pixels_major;  // the [n][oh][ow][o] buffer, for o >= kLanes only
  if (o >= kLanes && pixels_major.size() < static_cast<size_t>(g.n * oh * ow * o)) {
    pixels_major.resize(g.n * oh * ow * o);
  }
  sc.nhwc = pixels_major.data();
  RunScatter(sc);
  if (pixels_major.size() > (size_t{1} << 20)) std::vector<float>().swap(pixels_major);
  if (buffer.size() > (size_t{1} << 20)) std::vector<float>().swap(buffer);
  slots[s.returns[0].slots[0]] = std::move(out);
  return true;
}

}  // namespace warden::codegen::native
