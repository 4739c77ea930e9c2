#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <torch/torch.h>

#include "core/check.h"

namespace gossamer::optim {

at::Tensor orthogonalize(const at::Tensor& g, int steps, at::ScalarType dtype) {
  GOSSAMER_CHECK(g.dim() == 2, "orthogonalize: a matrix is needed");
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = g.size(0) > g.size(1);
  at::Tensor x = (tall ? g.t() : g).to(dtype);
  // Scaled so that every singular value is at most 1, where the iteration converges.
  x = x / (x.norm() + 1e-7);
  for (int i = 0; i < steps; ++i) {
    const at::Tensor s = torch::mm(x, x.t());
    const at::Tensor poly = b * s + c * torch::mm(s, s);
    x = a * x + torch::mm(poly, x);
  }
  if (tall) x = x.t();
  return x.to(g.scalar_type()).contiguous();
}

Muon::Muon(std::vector<at::Tensor> params, MuonOptions options) : params_(std::move(params)), options_(options) {
  momenta_.reserve(params_.size());
  for (const auto& p : params_) momenta_.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
}

Result<Muon> Muon::make(std::vector<at::Tensor> matrices, MuonOptions o) {
  for (std::size_t i = 0; i < matrices.size(); ++i) {
    if (matrices[i].dim() != 2) {
      return error(ErrorCode::kInvalidArgument, "Muon: parameter " + std::to_string(i) + " is not a matrix (" + std::to_string(matrices[i].dim()) + "-D)");
    }
  }
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) return error(ErrorCode::kInvalidArgument, "Muon: the learning rate must be a finite number >= 0");
  if (!(o.momentum >= 0 && o.momentum < 1)) return error(ErrorCode::kInvalidArgument, "Muon: momentum must lie in [0, 1)");
  if (o.ns_steps < 1 || o.ns_steps > 20) return error(ErrorCode::kInvalidArgument, "Muon: Newton-Schulz steps must lie in [1, 20]");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) return error(ErrorCode::kInvalidArgument, "Muon: weight decay must be a finite number >= 0");
  return Muon(std::move(matrices), o);
}

void Muon::step() {
  torch::NoGradGuard no_grad;
  const auto dtype = options_.bf16 ? at::kBFloat16 : at::kFloat;
  const double beta = options_.momentum;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    const at::Tensor g = p.grad();
    at::Tensor& m = momenta_[i];
    m.mul_(beta).add_(g, 1 - beta);
    const at::Tensor direction = options_.nesterov ? g + beta * (m - g) : m;
    const auto rows = static_cast<double>(p.size(0));
    const auto cols = static_cast<double>(p.size(1));
    const double scale = options_.match_adamw ? 0.2 * std::sqrt(std::max(rows, cols)) : std::sqrt(std::max(1.0, rows / cols));
    const at::Tensor update = orthogonalize(direction, options_.ns_steps, dtype);
    if (options_.weight_decay > 0) p.mul_(1 - options_.lr * options_.weight_decay);
    p.add_(update, -options_.lr * scale);
  }
}

Status Muon::set_momenta(const std::vector<at::Tensor>& momenta) {
  if (momenta.size() != params_.size()) {
    return error(ErrorCode::kInvalidArgument, "Muon: " + std::to_string(momenta.size()) + " momentum buffers for " + std::to_string(params_.size()) + " parameters");
  }
  for (std::size_t i = 0; i < momenta.size(); ++i) {
    if (!momenta[i].sizes().equals(params_[i].sizes())) {
      return error(ErrorCode::kInvalidArgument, "Muon: momentum buffer " + std::to_string(i) + " has another shape than its parameter");
    }
    if (!torch::isfinite(momenta[i]).all().item<bool>()) return error(ErrorCode::kInvalidArgument, "Muon: momentum buffer " + std::to_string(i) + " is not finite");
  }
  for (std::size_t i = 0; i < momenta.size(); ++i) momenta_[i] = momenta[i].to(params_[i].device(), params_[i].scalar_type()).contiguous().clone();
  return Status();
}

}  // namespace gossamer::optim
