// Note [Native kernels]
// Some ATen CPU kernels are far slower than the work they do. max_pool2d on a contiguous NCHW
// float tensor runs ATen's generic loop (a branch per element, `val > max || isnan(val)`, that
// random post-relu data mispredicts about half the time, and indices computed for every output
// even when nobody reads them): 400 us for a [16, 8, 28, 28] input on this project's machines,
// with LibTorch 1.13 and 2.x alike, where the kernel below takes ~20 us.
// Two max pools were ~30% of a small CNN's training step in eager. On backend "cpp" a replay step
// of such an op calls a kernel compiled into Warden instead, when its run-time checks pass, and the
// ATen call otherwise (same results, same errors).
//
// avg_pool2d has the same kind of loop (~2 ns per input element). Kernels here: max_pool2d,
// max_pool2d_with_indices (NativeMaxPool2d) and avg_pool2d (NativeAvgPool2d).
//
// max_pool2d / max_pool2d_with_indices (NativeMaxPool2d):
//   - built only when every argument but the input is a constant with ATen's accepted forms
//     (kernel_size 1 or 2 ints, stride 0/1/2, padding 1/2, dilation 1/2), positive kernel, stride
//     and dilation, and padding at most half the kernel (else ATen raises, so ATen runs);
//   - at run time: a defined tensor with exactly a plain CPU tensor's dispatch keys (with or
//     without the autograd keys), f32 or f64, 3-D or 4-D, contiguous in the layout ATen would
//     give its outputs (suggest_memory_format), every size positive, output sizes >= 1, no
//     forward-mode gradient; no thread mode recorded around the step, and the thread's dispatch
//     state the default one or the default minus the autograd keys (then no history, as in eager);
//   - results are ATen's exactly: each output is the first maximum of its window in row-major
//     order, and a NaN wins over everything and over earlier NaNs (`val > max || isnan(val)`,
//     ATen's rule), so the indices, and the gradients routed through them, are eager's bit for bit;
//   - history: when grad mode is on and the input requires grad, the kernel runs inside a
//     torch::autograd::Function (MaxPool2dNode) whose backward is ATen's
//     max_pool2d_with_indices_backward with the saved input and indices, the formula eager's
//     MaxPool2DWithIndicesBackward0 applies; saved tensors are version-checked as eager's are. The
//     difference a user can see is the node's name (grad_fn()->name()).
// avg_pool2d (NativeAvgPool2d): the same checks; count_include_pad and divisor_override as ATen
// takes them (a zero divisor is ATen's error). Each window is clipped to the padded input for its
// pool size, then to the input; its sum starts from 0 in the dtype and adds row-major, and the
// output is 0 + sum / divisor, as in ATen's loop: the same IEEE operations, so the same bits (signs
// of zero included). Its node's backward is ATen's avg_pool2d_backward on the saved input.
#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <climits>
#include <cmath>
#include <optional>
#include <type_traits>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "runtime/codegen_replay.h"
#include "runtime/native_kernels.h"

namespace warden::codegen {
namespace {

thread_local int64_t native_calls = 0;

// The parameters of one pool step, from its constant arguments.
// native_params: kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode, then for avg_pool2d count_include_pad
// and divisor_override (0: none).
struct PoolParams {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  bool ceil;
  bool include_pad = true;
  int64_t divisor = 0;
};

PoolParams ParamsOf(const OpStep& s) {
  const std::vector<int64_t>& p = s.native_params;
  PoolParams r{p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8] != 0};
  if (p.size() > 10) {
    r.include_pad = p[9] != 0;
    r.divisor = p[10];
  }
  return r;
}

// ATen's pooling_output_shape, or -1 where ATen would reject the result.
int64_t OutputSize(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dilation, bool ceil) {
  const int64_t span = in + 2 * pad - dilation * (k - 1) - 1 + (ceil ? stride - 1 : 0);
  if (span < 0) return -1;  // ATen divides rounding toward -inf here; such outputs are rejected
  int64_t out = span / stride + 1;
  if (ceil && (out - 1) * stride >= in + pad) --out;
  return out;
}

// The common 2x2 window with stride 2, no padding or dilation, every window inside the input
// (ceil_mode may add partial ones at the edges: they take the general loops).
bool Window2x2(const PoolParams& p, int64_t h, int64_t w, int64_t oh, int64_t ow) {
  return p.kh == 2 && p.kw == 2 && p.sh == 2 && p.sw == 2 && p.ph == 0 && p.pw == 0 && p.dh == 1 && p.dw == 1 &&
         2 * oh <= h && 2 * ow <= w;
}

#if defined(__SSE2__)
// Four 2x2/2 windows of f32 rows r0, r1 at a time, branch-free: returns how many outputs of the
// row it wrote (a multiple of 4). Lane by lane the same choices as the scalar loop below: a value
// replaces the running max when it is greater or NaN.
template <bool kIndices>
int64_t Pool2x2Sse(const float* r0, const float* r1, int64_t base, int64_t w, float* o, int64_t* x, int64_t ow) {
  int64_t c = 0;
  const __m128i step = _mm_set_epi32(6, 4, 2, 0);  // input column of each lane's window, minus 2c
  for (; c + 4 <= ow; c += 4) {
    const __m128 lo0 = _mm_loadu_ps(r0 + 2 * c), hi0 = _mm_loadu_ps(r0 + 2 * c + 4);
    const __m128 lo1 = _mm_loadu_ps(r1 + 2 * c), hi1 = _mm_loadu_ps(r1 + 2 * c + 4);
    const __m128 a = _mm_shuffle_ps(lo0, hi0, _MM_SHUFFLE(2, 0, 2, 0));  // r0[2c], r0[2c+2], ...
    const __m128 b = _mm_shuffle_ps(lo0, hi0, _MM_SHUFFLE(3, 1, 3, 1));  // r0[2c+1], ...
    const __m128 d0 = _mm_shuffle_ps(lo1, hi1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m128 d1 = _mm_shuffle_ps(lo1, hi1, _MM_SHUFFLE(3, 1, 3, 1));
    __m128 m = a;
    // Which of the four elements won, 0..3 (row-major in the window), per lane.
    __m128i which = _mm_setzero_si128();
    auto take = [&](__m128 v, int k) {
      const __m128 t = _mm_or_ps(_mm_cmpgt_ps(v, m), _mm_cmpunord_ps(v, v));
      m = _mm_or_ps(_mm_and_ps(t, v), _mm_andnot_ps(t, m));
      const __m128i ti = _mm_castps_si128(t);
      which = _mm_or_si128(_mm_and_si128(ti, _mm_set1_epi32(k)), _mm_andnot_si128(ti, which));
    };
    take(b, 1);
    take(d0, 2);
    take(d1, 3);
    _mm_storeu_ps(o + c, m);
    if (kIndices) {
      // index = base + 2c + column + (which & 1) + (which >> 1) * w
      alignas(16) int32_t k[4], col[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(k), which);
      _mm_store_si128(reinterpret_cast<__m128i*>(col), step);
      for (int l = 0; l < 4; ++l) x[c + l] = base + 2 * c + col[l] + (k[l] & 1) + (k[l] >> 1) * w;
    }
  }
  return c;
}
#endif

// One plane: in [h, w] -> out, ind [oh, ow]. `ind` may be null (no indices needed).
template <typename T, bool kIndices>
void PoolPlane(const T* in, T* out, int64_t* ind, int64_t h, int64_t w, int64_t oh, int64_t ow, const PoolParams& p) {
  if (Window2x2(p, h, w, oh, ow)) {
    // Starting from the window's first element equals ATen's start from -inf: it wins unless it
    // is -inf, and then the max is -inf at that index either way.
    for (int64_t y = 0; y < oh; ++y) {
      const T* r0 = in + 2 * y * w;
      const T* r1 = r0 + w;
      const int64_t base = 2 * y * w;
      T* o = out + y * ow;
      int64_t* x = kIndices ? ind + y * ow : nullptr;
      int64_t c = 0;
#if defined(__SSE2__)
      if constexpr (std::is_same_v<T, float>) c = Pool2x2Sse<kIndices>(r0, r1, base, w, o, x, ow);
#endif
      for (; c < ow; ++c) {
        const int64_t j = 2 * c;
        T m = r0[j];
        int64_t mi = base + j;
        T v = r0[j + 1];
        if (v > m || std::isnan(v)) m = v, mi = base + j + 1;
        v = r1[j];
        if (v > m || std::isnan(v)) m = v, mi = base + w + j;
        v = r1[j + 1];
        if (v > m || std::isnan(v)) m = v, mi = base + w + j + 1;
        o[c] = m;
        if (kIndices) x[c] = mi;
      }
    }
    return;
  }
  for (int64_t y = 0; y < oh; ++y) {
    int64_t h0 = y * p.sh - p.ph;
    const int64_t h1 = std::min(h0 + (p.kh - 1) * p.dh + 1, h);
    while (h0 < 0) h0 += p.dh;
    for (int64_t c = 0; c < ow; ++c) {
      int64_t w0 = c * p.sw - p.pw;
      const int64_t w1 = std::min(w0 + (p.kw - 1) * p.dw + 1, w);
      while (w0 < 0) w0 += p.dw;
      int64_t mi = h0 * w + w0;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t yy = h0; yy < h1; yy += p.dh) {
        for (int64_t xx = w0; xx < w1; xx += p.dw) {
          const T v = in[yy * w + xx];
          if ((v > m) || std::isnan(v)) {
            m = v;
            mi = yy * w + xx;
          }
        }
      }
      out[y * ow + c] = m;
      if (kIndices) ind[y * ow + c] = mi;
    }
  }
}

#if defined(__SSE2__)
// avg_pool2d over four 2x2/2 windows of f32 at a time, summed in ATen's order from 0 and divided
// by `divisor` (ATen's `0 + sum / divide_factor`, the same IEEE operations lane by lane).
int64_t AvgPool2x2Sse(const float* r0, const float* r1, float* o, int64_t ow, float divisor) {
  int64_t c = 0;
  const __m128 zero = _mm_setzero_ps(), div = _mm_set1_ps(divisor);
  for (; c + 4 <= ow; c += 4) {
    const __m128 lo0 = _mm_loadu_ps(r0 + 2 * c), hi0 = _mm_loadu_ps(r0 + 2 * c + 4);
    const __m128 lo1 = _mm_loadu_ps(r1 + 2 * c), hi1 = _mm_loadu_ps(r1 + 2 * c + 4);
    __m128 sum = _mm_add_ps(zero, _mm_shuffle_ps(lo0, hi0, _MM_SHUFFLE(2, 0, 2, 0)));
    sum = _mm_add_ps(sum, _mm_shuffle_ps(lo0, hi0, _MM_SHUFFLE(3, 1, 3, 1)));
    sum = _mm_add_ps(sum, _mm_shuffle_ps(lo1, hi1, _MM_SHUFFLE(2, 0, 2, 0)));
    sum = _mm_add_ps(sum, _mm_shuffle_ps(lo1, hi1, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm_storeu_ps(o + c, _mm_add_ps(zero, _mm_div_ps(sum, div)));
  }
  return c;
}
#endif

// avg_pool2d of one plane, ATen's loop: the window clipped to the padded input gives the pool
// size, then to the input; the sum starts at 0 in the dtype, row-major; the output is
// 0 + sum / divisor (an empty window stays 0).
template <typename T>
void AvgPoolPlane(const T* in, T* out, int64_t h, int64_t w, int64_t oh, int64_t ow, const PoolParams& p) {
  if (Window2x2(p, h, w, oh, ow)) {
    const int64_t divisor = p.divisor != 0 ? p.divisor : 4;
    for (int64_t y = 0; y < oh; ++y) {
      const T* r0 = in + 2 * y * w;
      const T* r1 = r0 + w;
      T* o = out + y * ow;
      int64_t c = 0;
#if defined(__SSE2__)
      if constexpr (std::is_same_v<T, float>) c = AvgPool2x2Sse(r0, r1, o, ow, static_cast<float>(divisor));
#endif
      for (; c < ow; ++c) {
        T sum = 0;
        sum += r0[2 * c];
        sum += r0[2 * c + 1];
        sum += r1[2 * c];
        sum += r1[2 * c + 1];
        o[c] = T(0) + sum / divisor;
      }
    }
    return;
  }
  for (int64_t y = 0; y < oh; ++y) {
    for (int64_t c = 0; c < ow; ++c) {
      int64_t h0 = y * p.sh - p.ph, w0 = c * p.sw - p.pw;
      int64_t h1 = std::min(h0 + p.kh, h + p.ph), w1 = std::min(w0 + p.kw, w + p.pw);
      const int64_t pool = (h1 - h0) * (w1 - w0);
      h0 = std::max<int64_t>(h0, 0);
      w0 = std::max<int64_t>(w0, 0);
      h1 = std::min(h1, h);
      w1 = std::min(w1, w);
      if (h0 >= h1 || w0 >= w1) {
        out[y * ow + c] = T(0);
        continue;
      }
      T sum = 0;
      for (int64_t yy = h0; yy < h1; ++yy) {
        for (int64_t xx = w0; xx < w1; ++xx) sum += in[yy * w + xx];
      }
      const int64_t divisor = p.divisor != 0 ? p.divisor : p.include_pad ? pool : (h1 - h0) * (w1 - w0);
      out[y * ow + c] = T(0) + sum / divisor;
    }
  }
}

// A pool's output (sizes: the input's with the last two dims oh, ow) and the input's planes.
struct PoolShape {
  std::vector<int64_t> out_sizes;
  int64_t h, w, planes;
};

PoolShape ShapeOf(const at::Tensor& x, int64_t oh, int64_t ow) {
  PoolShape s{x.sizes().vec(), x.size(-2), x.size(-1), 0};
  s.out_sizes[s.out_sizes.size() - 2] = oh;
  s.out_sizes.back() = ow;
  s.planes = x.numel() / (s.h * s.w);
  return s;
}

template <typename T>
void PoolPlanes(const at::Tensor& x, at::Tensor& out, at::Tensor& ind, const PoolShape& s, int64_t oh, int64_t ow,
                const PoolParams& p) {
  const T* in = x.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int64_t h = s.h, w = s.w;
  if (ind.defined()) {
    int64_t* i = ind.data_ptr<int64_t>();
    for (int64_t k = 0; k < s.planes; ++k) PoolPlane<T, true>(in + k * h * w, o + k * oh * ow, i + k * oh * ow, h, w, oh, ow, p);
  } else {
    for (int64_t k = 0; k < s.planes; ++k) PoolPlane<T, false>(in + k * h * w, o + k * oh * ow, nullptr, h, w, oh, ow, p);
  }
}

// out (and indices if wanted) of a contiguous input whose checks passed.
std::pair<at::Tensor, at::Tensor> RunPool(const at::Tensor& x, const PoolParams& p, int64_t oh, int64_t ow,
                                          bool indices) {
  const PoolShape s = ShapeOf(x, oh, ow);
  at::Tensor out = at::empty(s.out_sizes, x.options());
  at::Tensor ind = indices ? at::empty(s.out_sizes, x.options().dtype(at::kLong)) : at::Tensor();
  if (x.scalar_type() == at::kFloat) {
    PoolPlanes<float>(x, out, ind, s, oh, ow, p);
  } else {
    PoolPlanes<double>(x, out, ind, s, oh, ow, p);
  }
  return {std::move(out), std::move(ind)};
}

struct MaxPool2dNode : public torch::autograd::Function<MaxPool2dNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const OpStep* step, int64_t oh, int64_t ow) {
    auto [out, ind] = RunPool(x, ParamsOf(*step), oh, ow, true);
    ctx->save_for_backward({x, ind});
    ctx->mark_non_differentiable({ind});
    ctx->saved_data["params"] = c10::IValue(step->native_params);
    return {out, ind};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const std::vector<int64_t> p = ctx->saved_data["params"].toIntVector();
    at::Tensor grad_input;
    if (grads[0].defined()) {
      grad_input = at::max_pool2d_with_indices_backward(grads[0], saved[0], {p[0], p[1]}, {p[2], p[3]},
                                                        {p[4], p[5]}, {p[6], p[7]}, p[8] != 0, saved[1]);
    }
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <typename T>
void AvgPoolPlanes(const at::Tensor& x, at::Tensor& out, const PoolShape& s, int64_t oh, int64_t ow,
                   const PoolParams& p) {
  const T* in = x.data_ptr<T>();
  T* o = out.data_ptr<T>();
  for (int64_t k = 0; k < s.planes; ++k) AvgPoolPlane<T>(in + k * s.h * s.w, o + k * oh * ow, s.h, s.w, oh, ow, p);
}

at::Tensor RunAvgPool(const at::Tensor& x, const PoolParams& p, int64_t oh, int64_t ow) {
  const PoolShape s = ShapeOf(x, oh, ow);
  at::Tensor out = at::empty(s.out_sizes, x.options());
  if (x.scalar_type() == at::kFloat) {
    AvgPoolPlanes<float>(x, out, s, oh, ow, p);
  } else {
    AvgPoolPlanes<double>(x, out, s, oh, ow, p);
  }
  return out;
}

struct AvgPool2dNode : public torch::autograd::Function<AvgPool2dNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const OpStep* step, int64_t oh, int64_t ow) {
    at::Tensor out = RunAvgPool(x, ParamsOf(*step), oh, ow);
    ctx->save_for_backward({x});
    ctx->saved_data["params"] = c10::IValue(step->native_params);
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const std::vector<int64_t> p = ctx->saved_data["params"].toIntVector();
    at::Tensor grad_input;
    if (grads[0].defined()) {
      grad_input = at::avg_pool2d_backward(grads[0], saved[0], {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}, p[8] != 0,
                                           p[9] != 0, p[10] != 0 ? c10::optional<int64_t>(p[10]) : c10::nullopt);
    }
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// The dispatch keys of a plain CPU tensor, with and without autograd's (an inference tensor).
// Both are made with inference mode set explicitly: the first call may come from inside it.
bool native::PlainCpu(const at::Tensor& x) {
  static const uint64_t with_autograd = [] {
    c10::InferenceMode mode(false);
    return at::empty({1}).key_set().raw_repr();
  }();
  static const uint64_t inference = [] {
    c10::InferenceMode mode(true);
    return at::empty({1}).key_set().raw_repr();
  }();
  if (!x.defined()) return false;
  const uint64_t keys = x.key_set().raw_repr();
  return keys == with_autograd || keys == inference;
}

// The thread's dispatch state: the kernel stands for the CPU kernel and, with history, for the
// autograd kernel above it. Any key a thread includes beyond the default, or excludes beyond the
// default and autograd's (which only drops the history: Note [Below autograd]), means eager would
// run something else first: ATen runs.
bool native::DispatchStateAllowsNative(bool* below_autograd) {
  const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
  if (!(local.included_ - c10::default_included_set).empty()) return false;
  // Enabling CPU autocast takes AutocastCPU out of the default-excluded keys (eager then casts
  // conv and matmul inputs to bfloat16); it is the only autocast key a CPU tensor carries.
  if (!local.excluded_.has(c10::DispatchKey::AutocastCPU)) return false;
  const c10::DispatchKeySet excluded = local.excluded_ - c10::default_excluded_set;
  if (!(excluded - c10::autograd_dispatch_keyset_with_ADInplaceOrView).empty()) return false;
  *below_autograd = excluded.has(c10::DispatchKey::AutogradCPU);
  return true;
}

bool native::HasForwardGrad(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->autograd_meta() != nullptr && t._fw_grad(0).defined();
}

void native::CountCall() { ++native_calls; }

namespace {
using native::PlainCpu;

// A pool step's input that passed the run-time checks: the output's sizes, and whether the result
// needs the kernel's autograd node.
struct PoolInput {
  const at::Tensor* x;
  int64_t oh, ow;
  bool history;
};

// The run-time checks of every pool kernel (Note [Native kernels]).
std::optional<PoolInput> CheckPoolInput(const OpStep& s, const std::vector<c10::IValue>& slots, const PoolParams& p) {
  const c10::IValue& v = slots[s.args[0].slot];
  if (!v.isTensor()) return std::nullopt;
  const at::Tensor& t = v.toTensor();
  if (!PlainCpu(t)) return std::nullopt;
  const at::ScalarType dtype = t.scalar_type();
  // ATen lays its outputs out as suggest_memory_format() says: a contiguous tensor can still be
  // channels-last to it (one channel, NHWC storage), and then eager's outputs are channels-last.
  if ((dtype != at::kFloat && dtype != at::kDouble) || (t.dim() != 3 && t.dim() != 4) || !t.is_contiguous() ||
      t.suggest_memory_format() != at::MemoryFormat::Contiguous) {
    return std::nullopt;
  }
  for (int64_t d : t.sizes()) {
    if (d <= 0) return std::nullopt;
  }
  const int64_t oh = OutputSize(t.size(-2), p.kh, p.ph, p.sh, p.dh, p.ceil);
  const int64_t ow = OutputSize(t.size(-1), p.kw, p.pw, p.sw, p.dw, p.ceil);
  if (oh < 1 || ow < 1) return std::nullopt;
  bool below_autograd = false;
  if (!native::DispatchStateAllowsNative(&below_autograd) || native::HasForwardGrad(t)) return std::nullopt;
  const bool history = c10::GradMode::is_enabled() && t.requires_grad() && !below_autograd;
  return PoolInput{&t, oh, ow, history};
}

bool NativeMaxPool2d(const OpStep& s, std::vector<c10::IValue>& slots) {
  const PoolParams p = ParamsOf(s);
  const std::optional<PoolInput> in = CheckPoolInput(s, slots, p);
  if (!in) return false;
  const bool with_indices = s.returns.size() == 2;
  ++native_calls;
  if (in->history) {
    torch::autograd::variable_list r = MaxPool2dNode::apply(*in->x, &s, in->oh, in->ow);
    slots[s.returns[0].slots[0]] = std::move(r[0]);
    if (with_indices) slots[s.returns[1].slots[0]] = std::move(r[1]);
    return true;
  }
  auto [out, ind] = RunPool(*in->x, p, in->oh, in->ow, with_indices);
  slots[s.returns[0].slots[0]] = std::move(out);
  if (with_indices) slots[s.returns[1].slots[0]] = std::move(ind);
  return true;
}

bool NativeAvgPool2d(const OpStep& s, std::vector<c10::IValue>& slots) {
  const PoolParams p = ParamsOf(s);
  const std::optional<PoolInput> in = CheckPoolInput(s, slots, p);
  if (!in) return false;
  ++native_calls;
  slots[s.returns[0].slots[0]] = in->history ? AvgPool2dNode::apply(*in->x, &s, in->oh, in->ow)[0]
                                             : RunAvgPool(*in->x, p, in->oh, in->ow);
  return true;
}

// A pool step's arguments as ATen accepts them: the input from a slot, every other argument a
// constant; `lists` int[] arguments after the input (kernel_size, stride, padding[, dilation]), each
// of one or two ints (stride empty: the kernel's), into pairs. False where ATen would raise or the
// arguments are not constants: ATen runs.
bool PoolArgs(const OpStep& s, size_t num_args, int lists, std::vector<int64_t> (&pair)[4]) {
  if (s.args.size() != num_args || s.args[0].kind != OpStepArg::Kind::kSlot) return false;
  for (size_t i = 1; i < num_args; ++i) {
    if (s.args[i].kind != OpStepArg::Kind::kConstant) return false;
  }
  for (int i = 0; i < lists; ++i) {
    if (!s.args[1 + i].constant.isIntList()) return false;
    pair[i] = s.args[1 + i].constant.toIntVector();
  }
  if (pair[1].empty()) pair[1] = pair[0];
  for (int i = 0; i < lists; ++i) {
    if (pair[i].size() == 1) pair[i].push_back(pair[i][0]);
    if (pair[i].size() != 2) return false;
  }
  if (lists < 4) pair[3] = {1, 1};  // no dilation
  for (int i = 0; i < 2; ++i) {
    if (pair[0][i] <= 0 || pair[1][i] <= 0 || pair[3][i] <= 0 || pair[2][i] < 0 || pair[2][i] > pair[0][i] / 2) {
      return false;
    }
    // ATen converts each to a 32-bit int and raises (or, 1.13's avg_pool2d, wraps and then raises)
    // when it does not fit.
    for (int k = 0; k < 4; ++k) {
      if (pair[k][i] > INT32_MAX) return false;
    }
  }
  return true;
}

// max_pool2d(self, kernel_size, stride, padding, dilation, ceil_mode) into `params`.
bool MaxPoolParams(const OpStep& s, std::vector<int64_t>* params) {
  std::vector<int64_t> pair[4];
  if (!PoolArgs(s, 6, 4, pair) || !s.args[5].constant.isBool()) return false;
  *params = {pair[0][0], pair[0][1], pair[1][0], pair[1][1], pair[2][0],
             pair[2][1], pair[3][0], pair[3][1], s.args[5].constant.toBool() ? 1 : 0};
  return true;
}

// avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
// into `params`.
bool AvgPoolParams(const OpStep& s, std::vector<int64_t>* params) {
  std::vector<int64_t> pair[4];
  if (!PoolArgs(s, 7, 3, pair)) return false;
  const c10::IValue& divisor = s.args[6].constant;
  if (!s.args[4].constant.isBool() || !s.args[5].constant.isBool() || !(divisor.isNone() || divisor.isInt())) {
    return false;
  }
  if (divisor.isInt() && divisor.toInt() == 0) return false;  // ATen: "divisor must be not zero"
  *params = {pair[0][0], pair[0][1], pair[1][0], pair[1][1], pair[2][0], pair[2][1], 1, 1,
             s.args[4].constant.toBool() ? 1 : 0, s.args[5].constant.toBool() ? 1 : 0,
             divisor.isInt() ? divisor.toInt() : 0};
  return true;
}

// The ops with a native kernel: schema name, tensor results, the parser of the constant arguments
// into native_params, the kernel.
struct NativeOp {
  const char* op;
  size_t returns;
  bool (*params)(const OpStep&, std::vector<int64_t>*);
  NativeFn kernel;
};
constexpr NativeOp kNativeOps[] = {
    {"aten::max_pool2d", 1, &MaxPoolParams, &NativeMaxPool2d},
    {"aten::max_pool2d_with_indices", 2, &MaxPoolParams, &NativeMaxPool2d},
    {"aten::avg_pool2d", 1, &AvgPoolParams, &NativeAvgPool2d},
    {"aten::lstm.input", 3, &native::LstmParams, &native::NativeLstm},
    {"aten::conv2d", 1, &native::Conv2dParams, &native::NativeConv2d},
    {"aten::conv_transpose2d.input", 1, &native::ConvTranspose2dParams, &native::NativeConvTranspose2d},
};

const NativeOp* NativeOpOf(const std::string& op) {
  for (const NativeOp& n : kNativeOps) {
    if (op == n.op) return &n;
  }
  return nullptr;
}

}  // namespace

void SetNative(OpStep* s) {
  s->native = nullptr;
  const NativeOp* op = NativeOpOf(s->name);
  if (op == nullptr || s->mode || s->check_shapes || s->returns.size() != op->returns) return;
  for (const OpStepReturn& r : s->returns) {
    if (r.kind != tracer::NodeReturn::Kind::kTensor || r.slots.size() != 1 || r.slots[0] < 0) return;
  }
  if (op->params(*s, &s->native_params)) s->native = op->kernel;
}

bool MayRunNative(const tracer::Node& n) { return NativeOpOf(n.op) != nullptr; }

int64_t NativeCallsOnThisThread() { return native_calls; }

}  // namespace warden::codegen
