// Shape rules of recurrent layers (lstm/gru/rnn over a sequence, and their cells), loss
// functions and scaled_dot_product_attention (where the LibTorch has it). The batch and sequence
// dims pass through as they are, so they stay symbolic; hidden sizes come from the parameters.

#include <cstdint>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

// The sequence output of lstm/gru/rnn: input [T, B, I] ([B, T, I] with batch_first, [T, I]
// unbatched) becomes [.., D * hidden_out]; each hidden state is [L * D, B, H] ([L * D, H]).
absl::StatusOr<Shape> SequenceOutput(const ShapeContext& ctx, const Shape& input, const Shape& h,
                                     bool bidirectional, bool batch_first) {
  if (input.size() != 2 && input.size() != 3) {
    return ShapeError(ctx, "input must have 2 (unbatched) or 3 dims, got ", input.size());
  }
  const bool batched = input.size() == 3;
  if (h.size() != input.size()) {
    return ShapeError(ctx, "hidden state must have ", input.size(), " dims, got ", h.size());
  }
  if (batched) {
    const Dim& batch = batch_first ? input[0] : input[1];
    absl::Status st = ctx.RequireEqual(h[1], batch, "hidden state has the input's batch size");
    if (!st.ok()) return st;
  }
  Shape out = input;
  out.back() = h.back() * (bidirectional ? 2 : 1);
  return out;
}

// lstm.input(input, hx[h0, c0], params, has_biases, num_layers, dropout, train, bidirectional,
// batch_first) -> (output, hy, cy)
absl::StatusOr<Shapes> Lstm(const ShapeContext& ctx) {
  const std::vector<Shape>& hx = ctx.shapes(1);
  if (hx.size() != 2) return ShapeError(ctx, "lstm expects two hidden states (h0, c0), got ", hx.size());
  auto out = SequenceOutput(ctx, ctx.shape(0), hx[0], ctx.Bool(7), ctx.Bool(8));
  if (!out.ok()) return out.status();
  if (hx[1].size() != hx[0].size()) return ShapeError(ctx, "h0 and c0 must have the same rank");
  absl::Status st = ctx.RequireEqual(hx[1][0], hx[0][0], "h0 and c0 have the same number of layers");
  if (st.ok() && hx[0].size() == 3) st = ctx.RequireEqual(hx[1][1], hx[0][1], "h0 and c0 have the same batch size");
  if (!st.ok()) return st;
  return Shapes{*out, hx[0], hx[1]};
}

// gru.input / rnn_tanh.input / rnn_relu.input(input, hx, params, has_biases, num_layers, dropout,
// train, bidirectional, batch_first) -> (output, hy)
absl::StatusOr<Shapes> Gru(const ShapeContext& ctx) {
  auto out = SequenceOutput(ctx, ctx.shape(0), ctx.shape(1), ctx.Bool(7), ctx.Bool(8));
  if (!out.ok()) return out.status();
  return Shapes{*out, ctx.shape(1)};
}

// A cell's checks (ATen's check_rnn_cell_forward_input/hidden): input [B, I] or [I], hidden
// [B, H] or [H], w_ih [G * H, I].
absl::Status CheckCell(const ShapeContext& ctx, const Shape& input, const Shape& hidden) {
  if (input.size() != 1 && input.size() != 2) return ShapeError(ctx, "input must be 1-D or 2-D, got ", input.size(), "-D");
  if (hidden.size() != input.size()) return ShapeError(ctx, "hidden state must have the input's rank");
  const Shape& w_ih = ctx.shape(2);
  const Shape& w_hh = ctx.shape(3);
  if (w_ih.size() != 2 || w_hh.size() != 2) return ShapeError(ctx, "weights must be 2-D");
  absl::Status st = ctx.RequireEqual(input.back(), w_ih[1], "input size equals w_ih.size(1)");
  if (st.ok()) st = ctx.RequireEqual(hidden.back(), w_hh[1], "hidden size equals w_hh.size(1)");
  if (st.ok() && input.size() == 2) st = ctx.RequireEqual(hidden[0], input[0], "hidden state has the input's batch size");
  return st;
}

// lstm_cell(input, hx[h, c], w_ih, w_hh, b_ih?, b_hh?) -> (hy, cy)
absl::StatusOr<Shapes> LstmCell(const ShapeContext& ctx) {
  const std::vector<Shape>& hx = ctx.shapes(1);
  if (hx.size() != 2) return ShapeError(ctx, "lstm_cell expects two hidden states (h, c), got ", hx.size());
  absl::Status st = CheckCell(ctx, ctx.shape(0), hx[0]);
  if (st.ok()) st = RequireSameShape(ctx, hx[1], hx[0], "h and c have the same shape");
  if (!st.ok()) return st;
  return Shapes{hx[0], hx[1]};
}

// gru_cell / rnn_tanh_cell / rnn_relu_cell(input, hx, w_ih, w_hh, b_ih?, b_hh?) -> hy
absl::StatusOr<Shapes> Cell(const ShapeContext& ctx) {
  absl::Status st = CheckCell(ctx, ctx.shape(0), ctx.shape(1));
  if (!st.ok()) return st;
  return Shapes{ctx.shape(1)};
}

// Loss reductions: 0 = none (elementwise), 1 = mean, 2 = sum (at::Reduction).
bool Reduces(const ShapeContext& ctx, size_t i) { return ctx.Int(i) != 0; }

// mse_loss / l1_loss / smooth_l1_loss / huber_loss(self, target, reduction, ...): elementwise over
// the broadcast of both.
absl::StatusOr<Shapes> PairLoss(const ShapeContext& ctx) {
  auto b = Broadcast(ctx, ctx.shape(0), ctx.shape(1));
  if (!b.ok()) return b.status();
  return Shapes{Reduces(ctx, 2) ? Shape{} : *b};
}

// binary_cross_entropy(self, target, weight?, reduction): target has self's shape.
absl::StatusOr<Shapes> BinaryCrossEntropy(const ShapeContext& ctx) {
  absl::Status st = RequireSameShape(ctx, ctx.shape(1), ctx.shape(0), "target has the input's size");
  if (!st.ok()) return st;
  if (ctx.is_tensor(2)) {
    st = RequireExpandable(ctx, ctx.shape(2), ctx.shape(0), "weight broadcasts to the input");
    if (!st.ok()) return st;
  }
  return Shapes{Reduces(ctx, 3) ? Shape{} : ctx.shape(0)};
}

// binary_cross_entropy_with_logits(self, target, weight?, pos_weight?, reduction)
absl::StatusOr<Shapes> BinaryCrossEntropyWithLogits(const ShapeContext& ctx) {
  absl::Status st = RequireSameShape(ctx, ctx.shape(1), ctx.shape(0), "target has the input's size");
  if (!st.ok()) return st;
  return Shapes{Reduces(ctx, 4) ? Shape{} : ctx.shape(0)};
}

// Class-index targets: input [C] with target [], or [N, C, d...] with target [N, d...].
absl::StatusOr<Shape> ClassTarget(const ShapeContext& ctx, const Shape& input, const Shape& target) {
  if (input.empty()) return ShapeError(ctx, "input must have at least 1 dim");
  if (target.size() + 1 != input.size()) {
    return ShapeError(ctx, "expected a target of rank ", input.size() - 1, ", got ", target.size());
  }
  if (input.size() >= 2) {
    absl::Status st = ctx.RequireEqual(target[0], input[0], "target has the input's batch size");
    for (size_t d = 2; st.ok() && d < input.size(); ++d) {
      st = ctx.RequireEqual(target[d - 1], input[d], "target has the input's spatial sizes");
    }
    if (!st.ok()) return st;
  }
  return target;
}

absl::Status CheckClassWeight(const ShapeContext& ctx, size_t i, const Shape& input) {
  if (!ctx.is_tensor(i)) return absl::OkStatus();
  const Dim classes = input.size() == 1 ? input[0] : input[1];
  return ctx.RequireEqual(Numel(ctx.shape(i)), classes, "weight has one element per class");
}

// nll_loss / nll_loss_nd / nll_loss2d(self, target, weight?, reduction, ignore_index)
absl::StatusOr<Shapes> NllLoss(const ShapeContext& ctx) {
  auto target = ClassTarget(ctx, ctx.shape(0), ctx.shape(1));
  if (!target.ok()) return target.status();
  absl::Status st = CheckClassWeight(ctx, 2, ctx.shape(0));
  if (!st.ok()) return st;
  return Shapes{Reduces(ctx, 3) ? Shape{} : *target};
}

// nll_loss_forward / nll_loss2d_forward(...) -> (output, total_weight)
absl::StatusOr<Shapes> NllLossForward(const ShapeContext& ctx) {
  auto out = NllLoss(ctx);
  if (!out.ok()) return out.status();
  return Shapes{(*out)[0], Shape{}};
}

// cross_entropy_loss(self, target, weight?, reduction, ignore_index, label_smoothing): class
// indices (target one rank lower) or class probabilities (target of the input's shape).
absl::StatusOr<Shapes> CrossEntropy(const ShapeContext& ctx) {
  const Shape& input = ctx.shape(0);
  const Shape& target = ctx.shape(1);
  absl::Status st = CheckClassWeight(ctx, 2, input);
  if (!st.ok()) return st;
  if (!input.empty() && target.size() == input.size()) {
    st = RequireSameShape(ctx, target, input, "probability target has the input's size");
    if (!st.ok()) return st;
    Shape out = input;
    out.erase(out.begin() + (input.size() == 1 ? 0 : 1));
    return Shapes{Reduces(ctx, 3) ? Shape{} : out};
  }
  auto t = ClassTarget(ctx, input, target);
  if (!t.ok()) return t.status();
  return Shapes{Reduces(ctx, 3) ? Shape{} : *t};
}

// scaled_dot_product_attention(query [.., L, E], key [.., S, E], value [.., S, Ev], ...):
// [.., L, Ev]; the leading dims broadcast.
absl::StatusOr<Shapes> Attention(const ShapeContext& ctx) {
  const Shape& q = ctx.shape(0);
  const Shape& k = ctx.shape(1);
  const Shape& v = ctx.shape(2);
  if (q.size() < 2 || k.size() < 2 || v.size() < 2) return ShapeError(ctx, "query, key and value need 2+ dims");
  absl::Status st = ctx.RequireEqual(k.back(), q.back(), "key's embedding size equals query's");
  if (st.ok()) st = ctx.RequireEqual(v[v.size() - 2], k[k.size() - 2], "value and key have the same length");
  if (!st.ok()) return st;
  Shape out = q;
  out.back() = v.back();
  return Shapes{out};
}

}  // namespace

WARDEN_REGISTER_OPS(rnn) {
  // Multi-layer recurrent ops apply dropout between layers when training: random unless the
  // traced call had train=false or dropout=0 (the tracer clears the flag then).
  r.Add({"aten::lstm.input", Lstm, /*random=*/true});
  r.Add({"aten::gru.input", Gru, /*random=*/true});
  r.Add({"aten::rnn_tanh.input", Gru, /*random=*/true});
  r.Add({"aten::rnn_relu.input", Gru, /*random=*/true});
  r.Add({"aten::lstm_cell", LstmCell});
  r.Add({"aten::gru_cell", Cell});
  r.Add({"aten::rnn_tanh_cell", Cell});
  r.Add({"aten::rnn_relu_cell", Cell});

  for (const char* op : {"aten::mse_loss", "aten::l1_loss", "aten::smooth_l1_loss", "aten::huber_loss",
                         "aten::soft_margin_loss"}) {
    r.Add({op, PairLoss});
  }
  r.Add({"aten::binary_cross_entropy", BinaryCrossEntropy});
  r.Add({"aten::binary_cross_entropy_with_logits", BinaryCrossEntropyWithLogits});
  r.Add({"aten::nll_loss", NllLoss});
  r.Add({"aten::nll_loss_nd", NllLoss});
  r.Add({"aten::nll_loss2d", NllLoss});
  r.Add({"aten::nll_loss_forward", NllLossForward});
  r.Add({"aten::nll_loss2d_forward", NllLossForward});
  r.Add({"aten::cross_entropy_loss", CrossEntropy});
  // dropout_p > 0 draws a mask (the tracer clears the flag for dropout_p = 0).
  r.Add({"aten::scaled_dot_product_attention", Attention, /*random=*/true});
}

}  // namespace warden::ops
