// ExternalModel: a model its caller computes (the Python package's user's own torch.nn.Module). The
// caller hands over its trainable parameters, which keep sharing storage with its module; training
// reads and writes them in place (outer steps, catch-up, checkpoints), and the caller runs forward
// and backward itself, so forward() is never called.
//
// Blocks: cut by cut_into_blocks (language_model.h) with `block_pattern`; a model whose names cannot
// be cut (no layer number in them) is one block, "block.0", and methods that cut fragments along
// blocks then have one to cut.
//
// Ownership: the caller's module owns the parameters; it must outlive the ExternalModel. Threading:
// as LanguageModel (the caller does not touch the parameters while training does). Errors: forward()
// throws ContractError; load() throws ContractError on an archive of another model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/language_model.h"

namespace gossamer::model {

class ExternalModel final : public LanguageModel {
 public:
  // kInvalidArgument for no parameters, or a parameter twice.
  [[nodiscard]] static Result<std::unique_ptr<ExternalModel>> make(std::vector<NamedParameter> params, const std::string& block_pattern);

  at::Tensor forward(const at::Tensor& tokens) override;
  std::vector<ParameterBlock> blocks() const override { return blocks_; }
  std::int64_t vocab_size() const override { return 0; }
  std::int64_t context() const override { return 0; }
  void train(bool on) override { training_ = on; }
  bool is_training() const override { return training_; }
  void to(const c10::Device& device) override;
  // The parameters by their names ("param." + name).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  std::vector<std::uint8_t> rng_state() const override { return {}; }
  void set_rng_state(const std::vector<std::uint8_t>&) override {}

 private:
  explicit ExternalModel(std::vector<ParameterBlock> blocks) : blocks_(std::move(blocks)) {}
  std::vector<ParameterBlock> blocks_;
  bool training_ = true;
};

}  // namespace gossamer::model
