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
//
// Note [Conv epilogues]
// A convolution of a small image model is rarely the last op of its layer: an eval-mode batch_norm,
// a residual add and a relu follow it (ResNet blocks: relu(bn(conv(x)) + shortcut); the CNN and
// DCGAN: relu(bn(conv(x)))). Run separately, each rereads and rewrites the whole output. On backend
// "cpp" PlanConvEpilogues takes, after a conv2d or conv_transpose2d.input step whose traced shapes
// the kernel above accepts, a chain of at most: aten::batch_norm with training=false, running
// statistics and float32 [O] parameters; aten::add.Tensor / add_.Tensor with alpha 1 and a float32
// operand of the output's sizes (the residual; either operand of add); aten::relu / relu_. Each
// link reads the previous link's value, which nothing else reads and the function does not return;
// an add of two convolutions' chains joins the first (a node is in at most one group). The group
// becomes one step at its last node's position (its inputs all exist by then), so no node between
// its first and last may write anything: none that writes in place, none Warden has no shape rule
// for, no norm op other than an eval batch_norm (a training batch_norm updates its running
// statistics although its schema does not say so). Its nodes join no program or region.
// On each call NativeConvFused:
//   - folds the batch_norm from the call's parameters and running statistics, never from values
//     seen at compile time (an optimizer step, load_state_dict or a train-mode call changes them
//     in place, and the captured-tensor guards check metadata, not values): alpha = weight /
//     sqrt(var + eps) and beta = bias - mean * alpha, in float as ATen's eval kernel and the
//     programs compute them; the packed weights are weight * alpha and the bias conv_bias * alpha
//     + beta;
//   - adds the residual and applies relu as the accumulators are stored (max(0, NaN) is NaN, as
//     in ATen's relu);
//   - makes the kernel's own checks, and on top: the batch_norm's tensors and the residual plain
//     dense float32 CPU tensors of the right sizes, no gradient wanted of any of them, alpha, beta
//     and the folded bias finite, and largest |weight| * largest |alpha| below FLT_MAX (so no
//     folded weight overflows where eager's unscaled products might not).
// When any check fails, the group's steps run one by one (the convolution's own native kernel
// included), as without the group. Results: eager's sizes and strides, and eager's version counter
// (bumped once per add_ or relu_ link); values within float rounding of eager's (the fold rounds
// weight * alpha once where eager rounds the convolution's sum, then scales it), as for the kernel
// alone, which also means that sums near float overflow may overflow differently (as any two
// summation orders may). explain() lists a group as "aten::conv2d at %13 + batch_norm + add_ + relu".
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "runtime/codegen_replay.h"
#include "runtime/conv_epilogues.h"
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
  const float* residual = nullptr;  // Note [Conv epilogues]: added at the store, [n][o][oh][ow]
  bool relu = false;                // then max(0, .), NaN kept
};

// Note [Conv epilogues]: one output value plus its residual (res null: none), then relu.
C10_ALWAYS_INLINE float Epilogue(float v, const float* res, bool relu) {
  if (res != nullptr) v += *res;
  return relu && v < 0.0f ? 0.0f : v;  // NaN stays NaN, as in ATen's relu
}

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
    const float* res = cv.residual != nullptr ? cv.residual + (out_plane0 - cv.out) + j * plane : nullptr;
    for (int v = 0; v < kTile; ++v) {
      float lanes[kLanes];
      Store(lanes, acc[j][v]);
      const int64_t at = cv.vdst[v0 + v];
      const int count = cv.vlanes[v0 + v];
      for (int l = 0; l < count; ++l) lanes[l] = Epilogue(lanes[l], res != nullptr ? res + at + l : nullptr, cv.relu);
      std::memcpy(dst + at, lanes, count * sizeof(float));
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
  // Note [Conv epilogues]: the residual, then relu. max_ps returns its second operand when either
  // is NaN, so max(0, NaN) is NaN as in ATen's relu.
  if (cv.residual != nullptr || cv.relu) {
    const float* res0 = cv.residual != nullptr ? cv.residual + (out_plane0 - cv.out) : nullptr;
#pragma GCC unroll 4
    for (int j = 0; j < kBlock; ++j) {
      if (j >= valid) break;  // no such channel: nothing to read or store
#pragma GCC unroll 2
      for (int v = 0; v < kTile; ++v) {
        if (res0 != nullptr) {
          const float* res = res0 + j * plane + cv.vdst[v0 + v];
          const __m256 r = cv.vlanes[v0 + v] == kLanes ? _mm256_loadu_ps(res)
                                                       : _mm256_maskload_ps(res, LaneMask(cv.vlanes[v0 + v]));
          acc[j][v] = _mm256_add_ps(acc[j][v], r);
        }
        if (cv.relu) acc[j][v] = _mm256_max_ps(_mm256_setzero_ps(), acc[j][v]);
      }
    }
  }
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

// The largest magnitude among a contiguous float32 tensor's elements, as the bits of its absolute
// value: kNonFinite or more when some element is infinite or NaN. Runs on every call over every
// weight (a DCGAN generator's are ~16 thousand floats), so it works on the bits eight at a time (a
// scalar isfinite loop took ~10 us of a 16 us call at batch 1): for finite floats the order of
// the absolute values' bits as integers is the order of the magnitudes, and infinities and NaNs
// come after every finite one.
constexpr uint32_t kNonFinite = 0x7f800000u;
C10_ALWAYS_INLINE uint32_t MaxAbsBitsBody(const float* p, int64_t n) {
  typedef uint32_t U8 __attribute__((vector_size(32)));
  U8 most = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    U8 bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    bits &= 0x7fffffffu;
    most = most > bits ? most : bits;
  }
  uint32_t out = 0;
  for (int l = 0; l < kLanes; ++l) out = std::max(out, most[l]);
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    out = std::max(out, bits & 0x7fffffffu);
  }
  return out;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint32_t MaxAbsBitsAvx2(const float* p, int64_t n) { return MaxAbsBitsBody(p, n); }
#endif
uint32_t MaxAbsBitsBaseline(const float* p, int64_t n) { return MaxAbsBitsBody(p, n); }

// Every weight finite: their largest magnitude, or a negative number.
float FiniteMaxAbs(const at::Tensor& t) {
  const float* p = t.data_ptr<float>();
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  const uint32_t bits = avx2 ? MaxAbsBitsAvx2(p, t.numel()) : MaxAbsBitsBaseline(p, t.numel());
#else
  const uint32_t bits = MaxAbsBitsBaseline(p, t.numel());
#endif
  if (bits >= kNonFinite) return -1.0f;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
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
// (c, kh, kw) order; bsrc null or [o]; scale null or [o], the weights' factor per output channel
// (a batch_norm folded in, Note [Conv epilogues]).
void RunDirect(Conv* cv, const float* xsrc, const float* wsrc, int64_t w_oc, int64_t w_tap, const float* bsrc,
               const float* scale, float* out) {
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
    if (scale == nullptr) {
      for (int64_t t = 0; t < cv->taps; ++t) dst[t * kBlock] = row[t * w_tap];
    } else {
      const float s = scale[oc];
      for (int64_t t = 0; t < cv->taps; ++t) dst[t * kBlock] = row[t * w_tap] * s;
    }
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
  const float* residual = nullptr;  // Note [Conv epilogues]: added at the end, [n][o][oh][ow]
  bool relu = false;                // then max(0, .), NaN kept
};

// Note [Conv epilogues]: a finished output plane plus its residual plane, then relu.
C10_ALWAYS_INLINE void PlaneEpilogue(const Scatter& sc, int64_t offset, int64_t count) {
  if (sc.residual == nullptr && !sc.relu) return;
  float* out = sc.out + offset;
  const float* res = sc.residual != nullptr ? sc.residual + offset : nullptr;
  int64_t q = 0;
  const F8 zero = Splat(0.0f);
  for (; q + kLanes <= count; q += kLanes) {
    F8 v = Load(out + q);
    if (res != nullptr) v += Load(res + q);
    if (sc.relu) v = v < zero ? zero : v;
    Store(out + q, v);
  }
  for (; q < count; ++q) out[q] = Epilogue(out[q], res != nullptr ? res + q : nullptr, sc.relu);
}

C10_ALWAYS_INLINE void AddRow(float* dst, const float* src, int64_t count) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    Store(dst + i, Load(dst + i) + Load(src + i));
  }
  for (; i < count; ++i) dst[i] += src[i];
}

// Fewer channels than a vector: plane by plane, each (kh, kw) column added along output rows.
// Always inlined, so that ScatterImageAvx2 compiles it for AVX2 (out of line, DCGAN's last layer
// ran its baseline build: 3-4 us more per call at batch 1).
C10_ALWAYS_INLINE void ScatterPlanes(const Scatter& sc, int64_t img) {
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
    PlaneEpilogue(sc, (img * o + oc) * plane, plane);
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
  // In vectors over the image's output, still in cache (an element-wise epilogue in the strided
  // transpose above cost ~4 us more on DCGAN's second layer at batch 8).
  PlaneEpilogue(sc, img * o * plane, o * plane);
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

namespace {

// A conv2d's shapes from its input and weight sizes and native_params (sh, sw, ph, pw, dh, dw);
// false where ATen raises or beyond the kernel's limits (Note [Native convolution]).
bool Conv2dShape(c10::IntArrayRef xs, c10::IntArrayRef ws, const std::vector<int64_t>& p, Conv* cv) {
  if (xs.size() != 4 || ws.size() != 4 || p.size() != 6) return false;
  cv->n = xs[0];
  cv->c = xs[1];
  cv->h = xs[2];
  cv->w = xs[3];
  cv->o = ws[0];
  cv->kh = ws[2];
  cv->kw = ws[3];
  cv->sh = p[0];
  cv->sw = p[1];
  cv->ph = p[2];
  cv->pw = p[3];
  cv->dh = p[4];
  cv->dw = p[5];
  if (cv->n <= 0 || cv->c <= 0 || cv->h <= 0 || cv->w <= 0 || cv->o <= 0 || cv->kh <= 0 || cv->kw <= 0) return false;
  if (ws[1] != cv->c) return false;
  if (cv->o > kMaxOutChannels || cv->c * cv->kh * cv->kw > kMaxReduction) return false;
  // One output channel: LibTorch 1.13's oneDNN path sometimes returns it with channel stride 1
  // (channels-last to suggest_memory_format, which the next convolution then follows), in a way
  // this kernel cannot predict.
  if (cv->o == 1) return false;
  if (!OutputSizes(cv)) return false;  // ATen raises
  const double x_numel = static_cast<double>(cv->n) * cv->c * cv->h * cv->w;
  if (PaddedFloats(*cv) > kMaxPaddedFactor * (x_numel + static_cast<double>(cv->n) * cv->o * cv->oh * cv->ow) + kPaddedSlack) {
    return false;  // mostly padding (a large padding or stride): the buffer would dwarf the work
  }
  const bool wide = cv->c >= kWideChannels && cv->o >= kWideChannels;
  return Work(*cv) <= static_cast<double>(wide ? kMaxWideWork : kMaxWork);
}

// A transposed convolution's shapes (native_params sh, sw, ph, pw, oph, opw, dh, dw); false where
// ATen raises or beyond the kernel's limits.
struct Transposed {
  Products g;
  int64_t h, wd, o, kh, kw, oh, ow;
};
bool TransposedShape(c10::IntArrayRef xs, c10::IntArrayRef ws, const std::vector<int64_t>& p, Transposed* t) {
  if (xs.size() != 4 || ws.size() != 4 || p.size() != 8) return false;
  Products& g = t->g;
  g.n = xs[0];
  g.c = xs[1];
  t->h = xs[2];
  t->wd = xs[3];
  t->o = ws[1];
  t->kh = ws[2];
  t->kw = ws[3];
  if (g.n <= 0 || g.c <= 0 || t->h <= 0 || t->wd <= 0 || t->o <= 0 || t->kh <= 0 || t->kw <= 0 || ws[0] != g.c) {
    return false;
  }
  t->oh = (t->h - 1) * p[0] - 2 * p[2] + p[6] * (t->kh - 1) + p[4] + 1;
  t->ow = (t->wd - 1) * p[1] - 2 * p[3] + p[7] * (t->kw - 1) + p[5] + 1;
  if (t->oh <= 0 || t->ow <= 0) return false;  // ATen raises
  g.m = t->o * t->kh * t->kw;
  g.pixels = t->h * t->wd;
  if (g.c > kMaxReduction || g.m > kMaxTransposedColumns) return false;
  if (static_cast<double>(g.n) * g.pixels * g.c * g.m > static_cast<double>(kMaxWork)) return false;
  // An output far larger than the products (a large stride or dilation spreads them thin) is
  // mostly zero-filling, which ATen does as well as this kernel.
  return static_cast<double>(g.n) * t->o * t->oh * t->ow <=
         kMaxPaddedFactor * static_cast<double>(g.n * g.pixels * g.m) + kPaddedSlack;
}

// One call's epilogue operands (Note [Conv epilogues]).
struct EpilogueOperands {
  const float* scale = nullptr;  // [o]: the batch_norm's alpha, the weights' factor
  const float* bias = nullptr;   // [o]: the bias with the batch_norm folded in (bias * alpha + beta)
  const float* residual = nullptr;
  bool relu = false;
};

// A dense float32 [o] tensor (or an absent optional one).
bool ChannelVector(const at::Tensor& t, int64_t o, bool optional) {
  if (!t.defined()) return optional;
  return Dense(t, 1) && t.size(0) == o;
}

// Resolves e for an output [n, o, oh, ow] of a convolution with bias `conv_bias` (null or [o]) and
// weights of largest magnitude `weight_max`: the batch_norm's alpha and beta from this call's
// parameters and running statistics (ATen's eval form: alpha = weight / sqrt(var + eps), beta = bias
// - mean * alpha), folded into a factor of the weights and a new bias; the residual's data. False,
// with nothing run, when a tensor is not of the kernel's form or wants a gradient, or a folded
// weight or bias might not be finite (then the steps run one by one, as eager would).
bool ResolveEpilogue(const ConvEpilogue& e, const std::vector<c10::IValue>& slots, int64_t n, int64_t o, int64_t oh,
                     int64_t ow, const float* conv_bias, float weight_max, EpilogueOperands* out) {
  out->relu = e.relu;
  if (e.batch_norm != nullptr) {
    const OpStep& bn = *e.batch_norm;
    const at::Tensor weight = ArgTensor(bn.args[1], slots), bias = ArgTensor(bn.args[2], slots);
    const at::Tensor mean = ArgTensor(bn.args[3], slots), var = ArgTensor(bn.args[4], slots);
    if (!ChannelVector(weight, o, true) || !ChannelVector(bias, o, true) || !ChannelVector(mean, o, false) ||
        !ChannelVector(var, o, false)) {
      return false;
    }
    if (!NoGradWanted({&weight, &bias, &mean, &var})) return false;
    const double eps = bn.args[7].constant.toDouble();
    thread_local std::vector<float> fold;
    fold.resize(static_cast<size_t>(2 * o));
    float* scale = fold.data();
    float* folded = scale + o;
    const float* w = weight.defined() ? weight.data_ptr<float>() : nullptr;
    const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
    const float* m = mean.data_ptr<float>();
    const float* v = var.data_ptr<float>();
    double scale_max = 0;
    bool finite = true;
    for (int64_t c = 0; c < o; ++c) {
      const float invstd = 1.0f / std::sqrt(v[c] + static_cast<float>(eps));  // in float, as ATen
      scale[c] = w != nullptr ? invstd * w[c] : invstd;
      const float shift = (b != nullptr ? b[c] : 0.0f) - m[c] * scale[c];
      folded[c] = (conv_bias != nullptr ? conv_bias[c] : 0.0f) * scale[c] + shift;
      finite = finite && std::isfinite(scale[c]) && std::isfinite(shift) && std::isfinite(folded[c]);
      scale_max = std::max(scale_max, static_cast<double>(std::fabs(scale[c])));
    }
    // Every folded weight finite: the largest product is at most weight_max * scale_max.
    if (!finite || !(static_cast<double>(weight_max) * scale_max < std::numeric_limits<float>::max())) return false;
    out->scale = scale;
    out->bias = folded;
  }
  if (e.residual != nullptr) {
    const at::Tensor r = ArgTensor(*e.residual, slots);
    if (!r.defined() || !Dense(r, 4) || r.sizes() != c10::IntArrayRef({n, o, oh, ow})) return false;
    if (!NoGradWanted({&r})) return false;
    out->residual = r.data_ptr<float>();  // the tensor stays alive in its slot or constant
  }
  return true;
}

// What both kernels check once their shapes are known (output [n, o, oh, ow]), and the call's
// epilogue; *bias: the bias to add (e's folded one, the step's, or null). False to decline.
bool Admit(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const ConvEpilogue* e,
           const std::vector<c10::IValue>& slots, int64_t n, int64_t o, int64_t oh, int64_t ow, const float** bias,
           EpilogueOperands* ep) {
  if (b.defined() && b.size(0) != o) return false;
  if (!NoGradWanted({&x, &w, &b})) return false;
  // A padded position multiplies its weight by zero (and LibTorch 2.x's oneDNN deconvolution
  // multiplies some weights by zeros it pads in: a stride of 3 or more, an output padding), so an
  // infinite or NaN weight would make NaN where eager's does not: refuse them.
  const float weight_max = FiniteMaxAbs(w);
  if (weight_max < 0) return false;
  *bias = b.defined() ? b.data_ptr<float>() : nullptr;
  if (e != nullptr && !ResolveEpilogue(*e, slots, n, o, oh, ow, *bias, weight_max, ep)) return false;
  if (ep->bias != nullptr) *bias = ep->bias;
  return true;
}

bool Conv2dCall(const OpStep& s, const ConvEpilogue* e, int out_slot, std::vector<c10::IValue>& slots) {
  at::Tensor x, w, b;
  if (!Operands(s, slots, &x, &w, &b)) return false;
  Conv cv;
  if (!Conv2dShape(x.sizes(), w.sizes(), s.native_params, &cv)) return false;
  const float* bias = nullptr;
  EpilogueOperands ep;
  if (!Admit(x, w, b, e, slots, cv.n, cv.o, cv.oh, cv.ow, &bias, &ep)) return false;
  at::Tensor out = at::empty({cv.n, cv.o, cv.oh, cv.ow}, x.options());
  cv.residual = ep.residual;
  cv.relu = ep.relu;
  RunDirect(&cv, x.data_ptr<float>(), w.data_ptr<float>(), cv.c * cv.kh * cv.kw, 1, bias, ep.scale,
            out.data_ptr<float>());
  CountCall();
  slots[out_slot] = std::move(out);
  return true;
}

bool ConvTranspose2dCall(const OpStep& s, const ConvEpilogue* e, int out_slot, std::vector<c10::IValue>& slots) {
  at::Tensor x, w, b;
  if (!Operands(s, slots, &x, &w, &b)) return false;
  Transposed t;
  if (!TransposedShape(x.sizes(), w.sizes(), s.native_params, &t)) return false;
  Products& g = t.g;
  const int64_t o = t.o;
  const float* bias = nullptr;
  EpilogueOperands ep;
  if (!Admit(x, w, b, e, slots, g.n, o, t.oh, t.ow, &bias, &ep)) return false;
  const float* wsrc = w.data_ptr<float>();
  g.mp = (g.m + kLanes - 1) / kLanes * kLanes;
  thread_local std::vector<float> buffer;
  const size_t need = static_cast<size_t>(g.c * g.mp + g.n * g.pixels * g.mp);
  if (buffer.size() < need) buffer.resize(need);
  // The weight as [c][mp] with columns in (kh, kw, o) order (an output pixel's channels are then
  // consecutive), each row zero-padded to whole vectors; a batch_norm's alpha folded in.
  float* wp = buffer.data();
  const int64_t taps = t.kh * t.kw;
  for (int64_t ic = 0; ic < g.c; ++ic) {
    float* row = wp + ic * g.mp;
    const float* src = wsrc + ic * g.m;  // [o][taps]
    for (int64_t oc = 0; oc < o; ++oc) {
      const float scale = ep.scale != nullptr ? ep.scale[oc] : 1.0f;  // times 1 is exact
      for (int64_t tap = 0; tap < taps; ++tap) row[tap * o + oc] = src[oc * taps + tap] * scale;
    }
    std::fill(row + g.m, row + g.mp, 0.0f);
  }
  CountCall();
  g.x = x.data_ptr<float>();
  g.w = wp;
  g.out = wp + g.c * g.mp;
  RunProducts(g);
  at::Tensor out = at::empty({g.n, o, t.oh, t.ow}, x.options());
  Scatter sc{g.n, o, t.h, t.wd, t.kh, t.kw, s.native_params[0], s.native_params[1], s.native_params[2],
             s.native_params[3], s.native_params[6], s.native_params[7], t.oh, t.ow, g.mp, g.out, bias,
             out.data_ptr<float>(), nullptr};
  sc.residual = ep.residual;
  sc.relu = ep.relu;
  thread_local std::vector<float> pixels_major;  // the [n][oh][ow][o] buffer, for o >= kLanes only
  if (o >= kLanes && pixels_major.size() < static_cast<size_t>(g.n * t.oh * t.ow * o)) {
    pixels_major.resize(g.n * t.oh * t.ow * o);
  }
  sc.nhwc = pixels_major.data();
  RunScatter(sc);
  if (pixels_major.size() > (size_t{1} << 20)) std::vector<float>().swap(pixels_major);
  if (buffer.size() > (size_t{1} << 20)) std::vector<float>().swap(buffer);
  slots[out_slot] = std::move(out);
  return true;
}

}  // namespace

bool NativeConv2d(const OpStep& s, std::vector<c10::IValue>& slots) {
  return Conv2dCall(s, nullptr, s.returns[0].slots[0], slots);
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
  return ConvTranspose2dCall(s, nullptr, s.returns[0].slots[0], slots);
}

namespace {
thread_local int64_t fused_conv_calls = 0;
}  // namespace

bool NativeConvFused(const OpStep& conv, const ConvEpilogue& e, int out_slot, std::vector<c10::IValue>& slots) {
  bool ran = false;
  if (conv.native == NativeConv2d) ran = Conv2dCall(conv, &e, out_slot, slots);
  if (conv.native == NativeConvTranspose2d) ran = ConvTranspose2dCall(conv, &e, out_slot, slots);
  fused_conv_calls += ran;
  return ran;
}

int64_t FusedConvCallsOnThisThread() { return fused_conv_calls; }

namespace {

using tracer::Node;
using tracer::NodeArg;
using tracer::ValueId;

bool FloatOf(const tracer::Graph& g, ValueId v, const std::vector<int64_t>* sizes) {
  const tracer::TensorMeta& m = g.value(v).meta;
  return g.value(v).is_tensor && m.dtype == at::kFloat && (sizes == nullptr || m.sizes == *sizes);
}

// An absent optional tensor: None, or an undefined tensor constant.
bool Absent(const NodeArg& a) {
  return a.kind == NodeArg::Kind::kConstant && (a.constant.isNone() || (a.constant.isTensor() && !a.constant.toTensor().defined()));
}

// batch_norm(chain, weight?, bias?, running_mean, running_var, training=false, momentum, eps, cudnn)
// with float32 [o] parameters and statistics.
bool BatchNormEpilogue(const tracer::Graph& g, const Node& n, ValueId chain, int64_t o) {
  if (n.args.size() != 9 || n.args[0].kind != NodeArg::Kind::kValue || n.args[0].value != chain) return false;
  const std::vector<int64_t> channel = {o};
  for (int i = 1; i <= 4; ++i) {
    const NodeArg& a = n.args[i];
    if (i <= 2 && Absent(a)) continue;
    if (a.kind != NodeArg::Kind::kValue || !FloatOf(g, a.value, &channel)) return false;
  }
  const NodeArg& training = n.args[5];
  const NodeArg& eps = n.args[7];
  return training.kind == NodeArg::Kind::kConstant && training.constant.isBool() && !training.constant.toBool() &&
         eps.kind == NodeArg::Kind::kConstant && eps.constant.isDouble();
}

// add(chain, other, alpha=1), add(other, chain, 1) or add_(chain, other, 1) with a float32 `other` of
// the output's sizes: the argument index of `other`, or -1.
int ResidualArg(const Node& n, const tracer::Graph& g, ValueId chain, const std::vector<int64_t>& sizes) {
  if (n.args.size() != 3 || n.args[0].kind != NodeArg::Kind::kValue || n.args[1].kind != NodeArg::Kind::kValue) return -1;
  const c10::IValue& alpha = n.args[2].constant;
  if (n.args[2].kind != NodeArg::Kind::kConstant || !((alpha.isInt() && alpha.toInt() == 1) || (alpha.isDouble() && alpha.toDouble() == 1.0))) {
    return -1;
  }
  int other = -1;
  if (n.args[0].value == chain && n.args[1].value != chain) {
    other = 1;
  } else if (n.op == "aten::add.Tensor" && n.args[1].value == chain && n.args[0].value != chain) {
    other = 0;
  }
  if (other < 0 || !FloatOf(g, n.args[other].value, &sizes)) return -1;
  return other;
}

}  // namespace

std::vector<ConvGroup> PlanConvEpilogues(const tracer::Graph& g, const std::vector<bool>& history_free) {
  std::vector<ConvGroup> groups;
  const size_t values = g.values.size();
  std::vector<int> readers(values, 0), reader(values, -1);
  for (const Node& n : g.nodes) {
    for (ValueId v : tracer::InputValues(n)) {
      if (v == tracer::kNoValue) continue;
      ++readers[v];
      reader[v] = n.index;
    }
  }
  std::vector<bool> returned(values, false);
  for (ValueId v : g.outputs) {
    if (v != tracer::kNoValue) returned[v] = true;
  }
  auto requires_grad = [&](ValueId v) {
    const tracer::Value& val = g.value(v);
    if (val.kind == tracer::ValueKind::kConstant) return val.constant.defined() && val.constant.requires_grad();
    return val.meta.requires_grad;
  };
  // A node may write what a group reads without saying so in its schema (a batch_norm in training
  // mode updates its running statistics), or be an op Warden knows nothing of.
  auto may_write = [&](const Node& n) {
    if (n.mutates || !n.handle || n.kind == tracer::NodeKind::kOpaque) return true;
    if (n.op.find("batch_norm") == std::string::npos && n.op.find("instance_norm") == std::string::npos) return false;
    return !(n.op == "aten::batch_norm" && n.args.size() == 9 && n.args[5].kind == NodeArg::Kind::kConstant &&
             n.args[5].constant.isBool() && !n.args[5].constant.toBool());
  };
  std::vector<bool> taken(g.nodes.size(), false);  // each node in at most one group
  SlotMap scratch(g);
  for (const Node& c : g.nodes) {
    const bool transposed = c.op == "aten::conv_transpose2d.input";
    if ((c.op != "aten::conv2d" && !transposed) || c.mode || !c.handle) continue;
    if (c.args.size() < 2 || c.args[0].kind != NodeArg::Kind::kValue || c.args[1].kind != NodeArg::Kind::kValue) continue;
    const OpStep step = MakeOpStep(g, c, scratch);
    std::vector<int64_t> params;
    if (!(transposed ? ConvTranspose2dParams(step, &params) : Conv2dParams(step, &params))) continue;
    ValueId chain = tracer::SingleTensorResult(c);
    if (chain == tracer::kNoValue || !FloatOf(g, c.args[0].value, nullptr) || !FloatOf(g, c.args[1].value, nullptr) ||
        !FloatOf(g, chain, nullptr)) {
      continue;
    }
    // Only where the traced shapes are the kernel's: elsewhere the convolution is an ATen call and
    // its epilogue better left to the programs and regions.
    const std::vector<int64_t>& xs = g.value(c.args[0].value).meta.sizes;
    const std::vector<int64_t>& ws = g.value(c.args[1].value).meta.sizes;
    Conv cv;
    Transposed t;
    if (!(transposed ? TransposedShape(xs, ws, params, &t) : Conv2dShape(xs, ws, params, &cv))) continue;
    const std::vector<int64_t> sizes = g.value(chain).meta.sizes;
    if (sizes.size() != 4) continue;
    ConvGroup group;
    group.nodes.push_back(c.index);
    int stage = 0;  // 0: batch_norm, add or relu may follow; 1: add or relu; 2: relu
    while (stage < 3 && !returned[chain] && readers[chain] == 1) {
      const Node& m = g.nodes[reader[chain]];
      // An add of two convolutions' chains belongs to the first.
      if (m.mode || !m.handle || taken[m.index]) break;
      // The group runs where its last node was: nothing in between may write a tensor it reads.
      bool writes = false;
      for (int i = group.nodes.back() + 1; i < m.index; ++i) writes = writes || may_write(g.nodes[i]);
      if (writes) break;
      const ValueId result = tracer::SingleTensorResult(m);
      if (result == tracer::kNoValue || !FloatOf(g, result, &sizes)) break;
      int residual = -1;
      if (stage == 0 && m.op == "aten::batch_norm" && BatchNormEpilogue(g, m, chain, sizes[1])) {
        group.batch_norm = m.index;
        stage = 1;
      } else if (stage <= 1 && (m.op == "aten::add.Tensor" || m.op == "aten::add_.Tensor") &&
                 (residual = ResidualArg(m, g, chain, sizes)) >= 0) {
        group.add = m.index;
        group.residual_arg = residual;
        stage = 2;
      } else if ((m.op == "aten::relu" || m.op == "aten::relu_") && m.args.size() == 1 &&
                 m.args[0].kind == NodeArg::Kind::kValue && m.args[0].value == chain) {
        group.relu = m.index;
        stage = 3;
      } else {
        break;
      }
      group.nodes.push_back(m.index);
      chain = result;
    }
    if (group.nodes.size() < 2) continue;
    // The kernel runs only when no gradient is wanted: with grad mode on at entry and an input that
    // requires grad, it never would (unless the nodes are history-free, Note [History-free nodes]).
    bool free = true, grad = false;
    for (int node : group.nodes) {
      free = free && static_cast<size_t>(node) < history_free.size() && history_free[node];
      for (ValueId v : tracer::InputValues(g.nodes[node])) grad = grad || (v != tracer::kNoValue && requires_grad(v));
    }
    if (g.entry_mode.grad_mode && grad && !free) continue;
    for (int node : group.nodes) {
      taken[node] = true;
      // The result's version: eager's add_ / relu_ bump the tensor they write, an out-of-place link
      // makes a fresh one (version 0).
      const std::string& op = g.nodes[node].op;
      const bool in_place = op == "aten::add_.Tensor" || op == "aten::relu_";
      group.in_place_writes = in_place ? group.in_place_writes + 1 : 0;
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace warden::codegen::native
