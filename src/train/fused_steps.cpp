#include "train/fused_steps.h"

#include <torch/version.h>

#include <map>
#include <sstream>

namespace gossamer::train {

namespace {

template <typename Key>
Key key_of(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;  // LibTorch 1's own key: the address as a stream writes it
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

#if GOSSAMER_TORCH2_KERNELS && TORCH_VERSION_MAJOR >= 2
#define GOSSAMER_FUSED_STEPS 1
#endif

[[maybe_unused]] bool all_cuda(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (!t.is_cuda() || t.scalar_type() != at::kFloat) return false;
  }
  return !tensors.empty();
}

}  // namespace

AdamStateKey adam_state_key(const at::Tensor& p) { return key_of<AdamStateKey>(p); }

bool fused_kernels_built() {
#ifdef GOSSAMER_FUSED_STEPS
  return true;
#else
  return false;
#endif
}

bool fused_adamw_step([[maybe_unused]] torch::optim::AdamW& optimizer) {
#ifndef GOSSAMER_FUSED_STEPS
  return false;
#else
  // Every group must take the fused form before any is stepped: a refusal half-way would leave the
  // caller's loop to step the first groups twice.
  for (const auto& group : optimizer.param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    if (!group.params().empty() && !all_cuda(group.params())) return false;
  }
  torch::NoGradGuard no_grad;
  auto& state = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    std::map<std::int64_t, at::Tensor> step_tensors;  // one device scalar per step count (usually one)
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const AdamStateKey key = adam_state_key(p);
      auto it = state.find(key);
      if (it == state.end()) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        it = state.emplace(key, std::move(fresh)).first;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      st.step(st.step() + 1);  // the kernel's bias correction reads the count after this step
      auto& count = step_tensors[st.step()];
      if (!count.defined()) count = torch::full({}, static_cast<double>(st.step()), p.options().dtype(at::kFloat));
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      steps.push_back(count);
    }
    if (params.empty()) continue;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(), std::get<0>(o.betas()),
                      std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
  }
  return true;
#endif
}

std::optional<double> fused_clip_grad_norm([[maybe_unused]] const std::vector<at::Tensor>& params, [[maybe_unused]] double max_norm) {
#ifndef GOSSAMER_FUSED_STEPS
  return std::nullopt;
#else
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (!all_cuda(grads)) return std::nullopt;
  const auto norms = at::_foreach_norm(grads, 2);
  const double total = at::stack(norms).norm().item<double>();
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) at::_foreach_mul_(grads, coef);
  return total;
#endif
}

}  // namespace gossamer::train
