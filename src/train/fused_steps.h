// The inner step's optimizer work on a GPU in a few fused kernels, as PyTorch runs it there: AdamW
// over every tensor of a group at once (at::_fused_adamw_, torch.optim.AdamW(fused=True)) and the
// gradient norm and clipping over every gradient at once (at::_foreach_norm / _foreach_mul_, as
// torch.nn.utils.clip_grad_norm_ does). LibTorch's C++ AdamW and clip_grad_norm_ loop over the
// tensors one kernel at a time, which on a GPU costs more than the update itself.
//
// Both need LibTorch 2 and CUDA tensors (and the build option GOSSAMER_TORCH2_KERNELS); elsewhere they
// return false / nullopt and the caller takes LibTorch's loops, so CPU runs are unchanged. AdamW's
// state stays in the optimizer's own per-parameter state (step, exp_avg, exp_avg_sq), so the
// checkpoint and the CPU path read and write the same state. Threading: the training thread.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace gossamer::train {

// The key of a parameter in torch::optim::Optimizer::state(): a string of the tensor's address in
// LibTorch 1, the address itself in LibTorch 2.
using AdamStateMap = std::remove_reference_t<decltype(std::declval<torch::optim::AdamW&>().state())>;
using AdamStateKey = typename AdamStateMap::key_type;
[[nodiscard]] AdamStateKey adam_state_key(const at::Tensor& p);

// Whether this build has the fused forms (LibTorch 2 and GOSSAMER_TORCH2_KERNELS); they still apply
// only to CUDA tensors.
[[nodiscard]] bool fused_kernels_built();

// One AdamW step of every parameter with a gradient, fused per group. False (nothing done) where
// the fused kernel does not apply: another LibTorch, the build option off, or parameters off CUDA.
bool fused_adamw_step(torch::optim::AdamW& optimizer);

// Clips the gradients' global 2-norm to max_norm as clip_grad_norm_ does and returns the norm before
// clipping; nullopt (nothing done) where the fused kernels do not apply.
std::optional<double> fused_clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace gossamer::train
