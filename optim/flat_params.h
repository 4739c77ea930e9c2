// Parameters as one flat fp32 vector: what outer optimizers keep their state in and send.
// flatten() copies the tensors (in order) into a new fp32 vector on `device` (the CPU unless the
// outer state lives on the training device); write_flat() copies such a vector back into the
// tensors, wherever each lives, without recording gradients. The sizes must match (a caller bug
// otherwise).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace gossamer::optim {

at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::Device device = at::kCPU);
// flatten() into `out`, reusing its memory when it is already a flat fp32 CPU vector of the right
// length (a buffer kept from step to step).
void flatten_into(const std::vector<at::Tensor>& tensors, at::Tensor& out);
void write_flat(std::vector<at::Tensor>& tensors, const at::Tensor& flat);

}  // namespace gossamer::optim
