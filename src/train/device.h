// The one place that knows about compute devices and precision: which device a run's
// `train.device` names, and the autocast scope a `train.precision` of bf16 runs its forward passes
// in. Everything else takes a device as a value (the model and its optimizer live there, batches
// are moved there; outer optimizers keep fp32 flat copies in host memory, or on the training
// device with outer.state_device = "device" (optim/flat_params.h); codecs encode from either).
//
// train.device: "cpu", "cuda" (the current GPU), "cuda:N", or "auto" (cuda when LibTorch has CUDA
// and a GPU is visible, else cpu). Asking for CUDA where there is none is a kInvalidArgument
// Status that says what to install or pass instead.
// train.precision: "fp32", or "bf16": forward passes (and so the activations autograd keeps) run
// in bfloat16 under LibTorch's autocast, on the CPU as on a GPU; the weights, gradients and
// optimizer state stay fp32 (master copies), and the loss is computed in fp32.
//
// Threading: AutocastScope sets thread-local autocast state; create it on the training thread.
#pragma once

#include <string>
#include <string_view>

#include <c10/core/Device.h>

#include "core/status.h"

namespace gossamer::train {

[[nodiscard]] Result<c10::Device> resolve_device(std::string_view name);

// While alive, ops on `device` run under autocast to bfloat16 when `bf16` is set; nothing otherwise.
class AutocastScope {
 public:
  AutocastScope(const c10::Device& device, bool bf16);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_{};
};

}  // namespace gossamer::train
