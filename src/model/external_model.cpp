#include "model/external_model.h"

#include <torch/torch.h>

#include <set>

#include <spdlog/spdlog.h>

#include "core/check.h"

namespace gossamer::model {

Result<std::unique_ptr<ExternalModel>> ExternalModel::make(std::vector<NamedParameter> params, const std::string& block_pattern) {
  if (params.empty()) return error(ErrorCode::kInvalidArgument, "the model has no trainable parameter");
  std::set<std::string> names;
  std::set<const void*> tensors;
  for (const auto& p : params) {
    if (!p.tensor.defined()) return error(ErrorCode::kInvalidArgument, "parameter " + p.name + " is not a tensor");
    if (!names.insert(p.name).second || !tensors.insert(p.tensor.unsafeGetTensorImpl()).second) {
      return error(ErrorCode::kInvalidArgument, "parameter " + p.name + " is given twice (a tied parameter counts once)");
    }
  }
  auto blocks = cut_into_blocks(params, block_pattern, "the model");
  if (!blocks.ok()) {
    spdlog::info("{}; the model is one block", blocks.status().message());
    blocks = std::vector<ParameterBlock>{ParameterBlock{"block.0", std::move(params)}};
  }
  return std::unique_ptr<ExternalModel>(new ExternalModel(std::move(*blocks)));
}

at::Tensor ExternalModel::forward(const at::Tensor&) {
  GOSSAMER_CHECK(false, "ExternalModel::forward: the caller computes its own model");
  return {};
}

void ExternalModel::to(const c10::Device& device) {
  for (const auto& b : blocks_) {
    for (const auto& p : b.parameters) GOSSAMER_CHECK(p.tensor.device() == device, "ExternalModel::to: the caller's parameters stay where it put them");
  }
}

void ExternalModel::save(torch::serialize::OutputArchive& archive) const {
  for (const auto& b : blocks_) {
    for (const auto& p : b.parameters) archive.write("param." + p.name, p.tensor.detach());
  }
}

void ExternalModel::load(torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  for (const auto& b : blocks_) {
    for (const auto& p : b.parameters) {
      at::Tensor t;
      archive.read("param." + p.name, t);
      GOSSAMER_CHECK(t.sizes() == p.tensor.sizes(), "ExternalModel::load: parameter " + p.name + " has another shape in the archive");
      p.tensor.copy_(t);
    }
  }
}

}  // namespace gossamer::model
