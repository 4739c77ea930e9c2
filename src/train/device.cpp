#include "train/device.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>
#include <torch/cuda.h>

#include <fmt/format.h>

namespace gossamer::train {

Result<c10::Device> resolve_device(std::string_view name) {
  const std::string n(name);
  if (n == "cpu") return c10::Device(c10::kCPU);
  const bool cuda = torch::cuda::is_available();
  if (n == "auto") return cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (n == "cuda" || n.rfind("cuda:", 0) == 0) {
    if (!cuda) {
      return error(ErrorCode::kInvalidArgument,
                   "train.device = " + n +
                       " but this build's LibTorch has no CUDA or no GPU is visible: build against a CUDA-enabled LibTorch (README: GPU "
                       "builds, e.g. PyTorch's: cmake -DCMAKE_PREFIX_PATH=\"$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')\"), "
                       "check nvidia-smi, or use train.device = cpu (or auto)");
    }
    if (n == "cuda") return c10::Device(c10::kCUDA, 0);
    int index = -1;
    try {
      std::size_t used = 0;
      index = std::stoi(n.substr(5), &used);
      if (used != n.size() - 5) index = -1;
    } catch (const std::exception&) {
      index = -1;
    }
    const auto count = static_cast<int>(torch::cuda::device_count());
    if (index < 0 || index >= count) {
      return error(ErrorCode::kInvalidArgument, fmt::format("train.device = {}: this machine has {} GPU(s), cuda:0 .. cuda:{}", n, count, count - 1));
    }
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return error(ErrorCode::kInvalidArgument, "train.device = " + n + ": use auto, cpu, cuda or cuda:N");
}

// LibTorch 2.4 replaced the per-device autocast functions by ones that take the device type.
namespace {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(bool cuda) { return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU); }
void set_autocast_enabled(bool cuda, bool on) { at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, on); }
c10::ScalarType autocast_dtype(bool cuda) { return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU); }
void set_autocast_dtype(bool cuda, c10::ScalarType t) { at::autocast::set_autocast_dtype(cuda ? at::kCUDA : at::kCPU, t); }
#else
bool autocast_enabled(bool cuda) { return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled(); }
void set_autocast_enabled(bool cuda, bool on) { cuda ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on); }
c10::ScalarType autocast_dtype(bool cuda) { return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype(); }
void set_autocast_dtype(bool cuda, c10::ScalarType t) { cuda ? at::autocast::set_autocast_gpu_dtype(t) : at::autocast::set_autocast_cpu_dtype(t); }
#endif
}  // namespace

AutocastScope::AutocastScope(const c10::Device& device, bool bf16) {
  if (!bf16) return;
  active_ = true;
  cuda_ = device.is_cuda();
  was_enabled_ = autocast_enabled(cuda_);
  was_dtype_ = autocast_dtype(cuda_);
  set_autocast_dtype(cuda_, at::kBFloat16);
  set_autocast_enabled(cuda_, true);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // The cast weights cached for this scope are dropped when the outermost scope ends.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(cuda_, was_enabled_);
  set_autocast_dtype(cuda_, was_dtype_);
}

}  // namespace gossamer::train
