// Shape rules of ops whose output size depends on tensor values (nonzero, argwhere,
// masked_select). Their rules check what shapes alone decide and return kDataDependentSize for
// the rest; OpInfo::data_dependent_shape tells the tracer to take the real size from the eager
// run and to guard on the values it came from.

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

// nonzero/argwhere(self) -> [count, rank]: one row of indices per nonzero element.
absl::StatusOr<Shapes> Nonzero(const ShapeContext& ctx) {
  return Shapes{Shape{kDataDependentSize, static_cast<Dim>(ctx.shape(0).size())}};
}

// masked_select(self, mask) -> [count]: self and mask must broadcast.
absl::StatusOr<Shapes> MaskedSelect(const ShapeContext& ctx) {
  absl::StatusOr<Shape> b = Broadcast(ctx, ctx.shape(0), ctx.shape(1));
  if (!b.ok()) return b.status();
  return Shapes{Shape{kDataDependentSize}};
}

}  // namespace

WARDEN_REGISTER_OPS(data_dependent) {
  for (const char* name : {"aten::nonzero", "aten::argwhere"}) {
    r.Add({name, Nonzero, /*random=*/false, /*factory=*/false, /*data_dependent_shape=*/true});
  }
  r.Add({"aten::masked_select", MaskedSelect, /*random=*/false, /*factory=*/false,
         /*data_dependent_shape=*/true});
}

}  // namespace warden::ops
