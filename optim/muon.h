// Muon: the inner optimizer of MuLoCo (arXiv 2505.23725), after Jordan et al. (2024). For a matrix
// parameter (a linear layer's weight), SGD momentum whose update is replaced by the nearest
// semi-orthogonal matrix: every singular value of the momentum set to about 1, its singular vectors
// kept, so that the step moves every direction of the layer alike instead of the few that dominate
// the gradient. The orthogonalization is approximated by a quintic Newton-Schulz iteration,
//   X <- a X + (b A + c A^2) X,  A = X X^T,  (a, b, c) = (3.4445, -4.7750, 2.0315),
// five times from X = G / ||G||_F (on the wider orientation, G^T for a tall G); its coefficients trade
// exactness for speed: the singular values land in about [0.7, 1.2] rather than on 1.
//
// Per step, for a matrix W with gradient G (rows r, columns c):
//   M <- beta M + (1 - beta) G
//   U <- orthogonalize(G + beta (M - G))  with Nesterov momentum (the default), orthogonalize(M) without
//   W <- W (1 - lr wd) - lr s U,  s = sqrt(max(1, r / c))
// The scale keeps a tall matrix's per-element step as large as a wide one's. With match_adamw,
// s = 0.2 sqrt(max(r, c)) instead (Liu et al. 2025, "Muon is Scalable for LLM Training"): U's elements
// have an RMS of about 1 / sqrt(max(r, c)), so every matrix's step has an RMS of 0.2 lr, about an
// AdamW step's, and Muon runs at AdamW's lr and weight decay, whatever the model's width. Everything else in a
// model (embeddings, norms, biases, a tied head) is left to AdamW, as the reference does; the split is
// the caller's (train/worker.cpp chooses which parameters are Muon's).
//
// A value type holding its parameters and one momentum buffer each; not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/status.h"

namespace gossamer::optim {

// The Newton-Schulz approximation of U V^T for G = U S V^T (2-D, any shape), computed in `dtype`
// (bf16 by default, as the reference does; fp32 where bf16 is slow) and returned in G's dtype. A zero
// matrix gives zeros.
at::Tensor orthogonalize(const at::Tensor& g, int steps = 5, at::ScalarType dtype = at::kBFloat16);

struct MuonOptions {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double weight_decay = 0.0;
  bool match_adamw = false;  // the step's scale 0.2 sqrt(max(r, c)) (above), for AdamW's lr
  bool bf16 = true;  // the Newton-Schulz iteration in bf16 (else fp32)
};

class Muon {
 public:
  // Every parameter must be a matrix (2-D). kInvalidArgument otherwise, or for options out of range.
  [[nodiscard]] static Result<Muon> make(std::vector<at::Tensor> matrices, MuonOptions options);

  // One step on the parameters' gradients; a parameter without a gradient is left alone.
  void step();
  void set_lr(double lr) { options_.lr = lr; }
  const MuonOptions& options() const { return options_; }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  // The momentum buffers, one per parameter in order (zeros before the first step).
  const std::vector<at::Tensor>& momenta() const { return momenta_; }
  // Replaces the buffers (a checkpoint or a donor's state): kInvalidArgument when the count or a
  // shape differs, or a value is not finite; nothing changes then.
  [[nodiscard]] Status set_momenta(const std::vector<at::Tensor>& momenta);

 private:
  Muon(std::vector<at::Tensor> params, MuonOptions options);
  std::vector<at::Tensor> params_, momenta_;
  MuonOptions options_;
};

}  // namespace gossamer::optim
