// TorchScriptModel: a user's own model, saved by PyTorch with torch.jit.script(model).save(path) (or
// torch.jit.trace), trained by the same Worker, outer optimizers and codecs as the built-in GPT.
//
// Contract with the module: forward(tokens: int64 [B, T]) -> logits [B, T, V], for any T up to the
// run's context, V being the run's vocabulary; both are checked once at load with a forward pass.
// Its trainable parameters (requires_grad) are what training updates; tied parameters count once.
// Blocks (model/language_model.h) come from the parameters' names: `block_pattern` is a regular
// expression (ECMAScript) whose first capture group is the layer index ("transformer.h.3.attn..."
// -> layer 3 with the default, which takes the first all-digit part between dots or underscores,
// as in h.3.attn or block_3.qkv). Parameters before
// the first layer's are "embed", those after the last layer's "final". A model whose names give no
// layer, or nothing before or after the layers, cannot be cut and is refused with its names.
//
// Randomness: a scripted module's dropout draws from LibTorch's global generator, so every training
// forward first seeds it from (dropout_seed, the number of training forwards so far). The masks
// are then a function of the worker and the step, as the GPT's are, and simulated workers sharing
// one thread stay independent and reproducible; the counter is the checkpointed rng state.
//
// Ownership and threading: as LanguageModel. Errors: load() returns a Status naming the file and
// what is wrong (not TorchScript, no forward, wrong output shape, nothing to train, cannot be cut).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/language_model.h"

namespace gossamer::model {

inline constexpr const char* kDefaultBlockPattern = R"((?:^|[._])(\d+)(?:[._]|$))";

struct TorchScriptOptions {
  std::filesystem::path path;
  std::string block_pattern = kDefaultBlockPattern;
  std::int64_t context = 64;       // the longest T the run feeds
  std::int64_t vocab_size = 256;   // V the logits must have
  std::uint64_t dropout_seed = 1;
};

class TorchScriptModel final : public LanguageModel {
 public:
  [[nodiscard]] static Result<std::unique_ptr<TorchScriptModel>> load(const TorchScriptOptions& options);
  ~TorchScriptModel() override;

  at::Tensor forward(const at::Tensor& tokens) override;
  std::vector<ParameterBlock> blocks() const override;
  std::int64_t vocab_size() const override;
  std::int64_t context() const override;
  void train(bool on) override;
  bool is_training() const override;
  void to(const c10::Device& device) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  std::vector<std::uint8_t> rng_state() const override;
  void set_rng_state(const std::vector<std::uint8_t>& state) override;
  // Writes the module, with its current weights, as torch.jit.save does (throws c10::Error on I/O).
  void save_module(const std::filesystem::path& path) const;

 private:
  struct Impl;
  explicit TorchScriptModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gossamer::model
