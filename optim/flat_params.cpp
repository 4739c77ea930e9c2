#include "optim/flat_params.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace gossamer::optim {

namespace {

// Contiguous fp32 on the CPU: copied with memcpy, without a LibTorch operation per tensor (ddp
// flattens every parameter's gradient every step, and a small model has many small tensors).
bool plain(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(); }

// Copies plain tensors one after another into `dst`, which holds their total.
void gather(const std::vector<at::Tensor>& tensors, float* dst) {
  for (const auto& t : tensors) {
    if (t.numel() > 0) std::memcpy(dst, t.data_ptr<float>(), static_cast<std::size_t>(t.numel()) * sizeof(float));
    dst += t.numel();
  }
}

std::int64_t total(const std::vector<at::Tensor>& tensors) {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

}  // namespace

at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::Device device) {
  if (device.is_cpu() && !tensors.empty() && std::all_of(tensors.begin(), tensors.end(), plain)) {
    at::Tensor out = torch::empty({total(tensors)}, torch::kFloat);
    gather(tensors, out.data_ptr<float>());
    return out;
  }
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.detach().to(device, at::kFloat).reshape({-1}));
  return flat.empty() ? torch::empty({0}, torch::TensorOptions().device(device)) : torch::cat(flat);
}

void flatten_into(const std::vector<at::Tensor>& tensors, at::Tensor& out) {
  if (out.defined() && plain(out) && out.numel() == total(tensors) && std::all_of(tensors.begin(), tensors.end(), plain)) {
    gather(tensors, out.data_ptr<float>());
  } else {
    out = flatten(tensors);
  }
}

void write_flat(std::vector<at::Tensor>& tensors, const at::Tensor& flat) {
  torch::NoGradGuard no_grad;
  if (plain(flat) && std::all_of(tensors.begin(), tensors.end(), plain)) {
    GOSSAMER_CHECK(total(tensors) == flat.numel(), "write_flat: the flat vector's length differs from the tensors'");
    const float* src = flat.data_ptr<float>();
    for (auto& t : tensors) {
      if (t.numel() > 0) std::memcpy(t.data_ptr<float>(), src, static_cast<std::size_t>(t.numel()) * sizeof(float));
      t.unsafeGetTensorImpl()->bump_version();  // an in-place write, as copy_() would record it
      src += t.numel();
    }
    return;
  }
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
