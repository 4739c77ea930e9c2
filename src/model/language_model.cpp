#include "model/language_model.h"

#include <torch/torch.h>

#include "core/check.h"

namespace gossamer::model {

at::Tensor LanguageModel::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  GOSSAMER_CHECK(tokens.sizes() == targets.sizes(), "LanguageModel::loss: tokens and targets must have the same shape");
  auto logits = forward(tokens).to(torch::kFloat);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::vector<NamedParameter> LanguageModel::named_parameters() const {
  std::vector<NamedParameter> out;
  for (auto& b : blocks()) {
    for (auto& p : b.parameters) out.push_back(std::move(p));
  }
  return out;
}

std::vector<at::Tensor> LanguageModel::parameters() const {
  std::vector<at::Tensor> out;
  for (auto& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

std::int64_t LanguageModel::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace gossamer::model
