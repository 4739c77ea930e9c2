// Gpt: a GPT-style decoder language model (pre-LayerNorm, learned positions, tied input/output
// embeddings, GPT-2 initialization), byte vocabulary by default.
//
// Ownership: Gpt is a handle; copies share the same parameters (like torch::nn module holders).
// Threading: not thread-safe; one training thread drives a model. Errors: shape misuse throws
// ContractError; nothing here touches the network or files.
//
// Parameters are enumerated by block (blocks()): "embed" (token and position embeddings), then
// "block.0" .. "block.{L-1}", then "final" (last LayerNorm). The output head is tied to the token
// embedding, so it has no parameters of its own. Fragments and pipeline stages are cut along blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace gossamer::model {

struct GptConfig {
  std::int64_t vocab_size = 256;  // bytes
  std::int64_t context = 128;     // maximum sequence length T
  std::int64_t layers = 4;
  std::int64_t width = 128;       // d_model
  std::int64_t heads = 4;         // width % heads == 0
  double dropout = 0.0;
  std::uint64_t init_seed = 1234;
  std::uint64_t dropout_seed = 1;  // the model's own dropout generator (no global RNG state)
};

struct NamedParameter {
  std::string name;    // "block.3.attn.qkv.weight"
  at::Tensor tensor;   // shares storage with the model
};

struct ParameterBlock {
  std::string name;    // "embed", "block.0", ..., "final"
  std::vector<NamedParameter> parameters;
};

class Gpt {
 public:
  explicit Gpt(const GptConfig& config);
  ~Gpt();
  Gpt(const Gpt&) = default;
  Gpt& operator=(const Gpt&) = default;

  const GptConfig& config() const;

  // tokens: int64 (B, T) with T <= context. Returns logits (B, T, vocab).
  at::Tensor forward(const at::Tensor& tokens) const;
  // Mean cross-entropy (nats per token) of predicting targets (B, T) from tokens (B, T).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) const;

  std::vector<ParameterBlock> blocks() const;
  std::vector<NamedParameter> named_parameters() const;  // all, in block order
  std::vector<at::Tensor> parameters() const;
  std::int64_t num_parameters() const;

  // State of the model's dropout generator (a uint8 tensor), for checkpoints.
  at::Tensor dropout_rng_state() const;
  void set_dropout_rng_state(const at::Tensor& state);

  void train(bool on = true);
  bool is_training() const;

  // The underlying module, for serialization and device moves.
  torch::nn::Module& module();
  const torch::nn::Module& module() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace gossamer::model
