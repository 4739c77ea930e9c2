// LanguageModel: what training needs from a model, whichever it is (the built-in Gpt, a user's
// TorchScript module): logits from tokens, its parameters grouped into blocks in model order, train
// and eval modes, and its state for checkpoints.
//
// Blocks: the model's parameters cut into "embed" (everything before the first layer), "block.0" ..
// "block.{L-1}" (one per layer) and "final" (everything after). Fragments of Streaming DiLoCo and
// pipeline stages are cut along blocks. Every trainable parameter is in exactly one block, once,
// even when the model ties it to two names.
//
// Ownership: a LanguageModel owns its parameters (tensors handed out share their storage).
// Threading: not thread-safe; one training thread drives a model. Errors: shape misuse throws
// ContractError; load() throws c10::Error on an archive of another model (callers turn it into a
// Status).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "core/status.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace gossamer::model {

struct NamedParameter {
  std::string name;    // "block.3.attn.qkv.weight"
  at::Tensor tensor;   // shares storage with the model
};

struct ParameterBlock {
  std::string name;    // "embed", "block.0", ..., "final"
  std::vector<NamedParameter> parameters;
};

// Parameters in model order cut into blocks by their names: `block_pattern` is a regular expression
// (ECMAScript) whose first group is the layer index ("h.3.attn.weight" -> layer 3); what comes before
// the first layer is "embed", what comes after the last "final", layers are renumbered "block.0" ...
// in index order. Names that give no layer, or nothing before or after the layers, are a
// kInvalidArgument naming `where`, some of the names and the fix.
[[nodiscard]] Result<std::vector<ParameterBlock>> cut_into_blocks(const std::vector<NamedParameter>& params, const std::string& block_pattern,
                                                                  const std::string& where);

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;

  // tokens: int64 (B, T) with T <= context(). Returns logits (B, T, vocab_size()).
  virtual at::Tensor forward(const at::Tensor& tokens) = 0;
  virtual std::vector<ParameterBlock> blocks() const = 0;
  virtual std::int64_t vocab_size() const = 0;
  virtual std::int64_t context() const = 0;

  virtual void train(bool on) = 0;
  virtual bool is_training() const = 0;
  // Moves parameters and buffers to `device` in place (tensors handed out before stay valid).
  virtual void to(const c10::Device& device) = 0;

  // Parameters and buffers, for checkpoints; load() expects an archive save() wrote for the same model.
  virtual void save(torch::serialize::OutputArchive& archive) const = 0;
  virtual void load(torch::serialize::InputArchive& archive) = 0;
  // The state of the model's dropout randomness (bytes), for checkpoints.
  virtual std::vector<std::uint8_t> rng_state() const = 0;
  virtual void set_rng_state(const std::vector<std::uint8_t>& state) = 0;

  // Mean cross-entropy (nats per token, computed in fp32 whatever the logits' dtype) of predicting
  // targets (B, T) from tokens (B, T).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);
  std::vector<NamedParameter> named_parameters() const;  // all, in block order
  std::vector<at::Tensor> parameters() const;
  std::int64_t num_parameters() const;
};

}  // namespace gossamer::model
