#include "optim/updates.h"

#include <torch/torch.h>

#include <string>

namespace gossamer::optim {

Status check_update(const at::Tensor& update, std::int64_t numel, std::string_view method, std::int64_t step) {
  const std::string where = std::string(method) + " update of step " + std::to_string(step);
  if (!update.defined() || update.dim() != 1 || update.scalar_type() != at::kFloat) return error(ErrorCode::kMalformed, where + ": not a flat fp32 vector");
  if (update.numel() != numel) {
    return error(ErrorCode::kMalformed, where + " holds " + std::to_string(update.numel()) + " values, this state needs " + std::to_string(numel));
  }
  if (!torch::isfinite(update).all().item<bool>()) return error(ErrorCode::kMalformed, where + " holds non-finite values");
  return Status();
}

}  // namespace gossamer::optim
