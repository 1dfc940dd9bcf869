// The LibTorch version Warden is built against, for the few places that differ between versions.
// The version comes from the build (@warden_libtorch defines WARDEN_TORCH_VERSION_*, read from
// torch/version.h by third_party/libtorch.bzl); version `#if`s live here and in the .cc files that
// need them, never in public headers.
//
// Note [Which LibTorch]
// Warden builds against Debian's libtorch-dev (1.13; 2.6 on Debian 13), a libtorch zip or a
// PyTorch wheel (2.13 is tested; README "Which LibTorch"). What differs, and where it is handled:
//   - TensorImpl: from 2.8 on, is_contiguous() and is_non_overlapping_and_dense() reach a custom
//     wrapper only through sym_is_contiguous_custom / sym_is_non_overlapping_and_dense_custom
//     (SymBool); the old names are no longer virtual. The tracer's wrapper overrides whichever the
//     version has (tracer.cc), with `override`, so a version where the guess is wrong fails to
//     compile instead of silently losing the metadata reads that become guards.
//   - From 2.8 on the wrapper answers sym_sizes() with symbolic SymInts (Note [Symbolic sizes] in
//     tracer.cc; written against 2.8+'s SymNodeImpl interface); before, with plain values.
//   - Autograd nodes are owned by std::shared_ptr up to 2.12 and by c10::intrusive_ptr from 2.13:
//     tracer.cc names the type through decltype(Edge::function).
//   - Autocast: 2.4 replaced the per-device CPU functions (autocast_compat.h).
//   - Ops come and go (aten::frobenius_norm left, scaled_dot_product_attention came): rules are
//     registered only for ops the running dispatcher has (ops/registry.cc, Registry::Absent).
//   - Kernel numerics: where eager's result on special values differs between versions, the fused
//     kernels probe eager once rather than assume (gelu at +inf, runtime/codegen_pointwise.cc).
#pragma once

#if !defined(WARDEN_TORCH_VERSION_MAJOR) || !defined(WARDEN_TORCH_VERSION_MINOR)
#error "WARDEN_TORCH_VERSION_* are not defined: depend on @warden_libtorch//:torch"
#endif

// True when the LibTorch being built against is major.minor or newer.
#define WARDEN_TORCH_AT_LEAST(major, minor)   \
  (WARDEN_TORCH_VERSION_MAJOR > (major) ||   \
   (WARDEN_TORCH_VERSION_MAJOR == (major) && WARDEN_TORCH_VERSION_MINOR >= (minor)))

#define WARDEN_TORCH_STRINGIFY_(x) #x
#define WARDEN_TORCH_STRINGIFY(x) WARDEN_TORCH_STRINGIFY_(x)
// "2.13.0": the version compiled against.
#define WARDEN_TORCH_VERSION_STRING                         \
  WARDEN_TORCH_STRINGIFY(WARDEN_TORCH_VERSION_MAJOR) "." \
  WARDEN_TORCH_STRINGIFY(WARDEN_TORCH_VERSION_MINOR) "." \
  WARDEN_TORCH_STRINGIFY(WARDEN_TORCH_VERSION_PATCH)
