#include "optim/flat_params.h"

#include <torch/torch.h>

#include "core/check.h"

namespace gossamer::optim {

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.detach().to(at::kCPU, at::kFloat).reshape({-1}));
  return flat.empty() ? torch::empty({0}) : torch::cat(flat);
}

void write_flat(std::vector<at::Tensor>& tensors, const at::Tensor& flat) {
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (auto& t : tensors) {
    const std::int64_t n = t.numel();
    GOSSAMER_CHECK(offset + n <= flat.numel(), "write_flat: the flat vector is too short");
    t.copy_(flat.slice(0, offset, offset + n).view(t.sizes()));
    offset += n;
  }
  GOSSAMER_CHECK(offset == flat.numel(), "write_flat: the flat vector is too long");
}

}  // namespace gossamer::optim
