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

#include "model/language_model.h"

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

class Gpt final : public LanguageModel {
 public:
  explicit Gpt(const GptConfig& config);
  ~Gpt();
  Gpt(const Gpt&) = default;
  Gpt& operator=(const Gpt&) = default;

  const GptConfig& config() const;

  at::Tensor forward(const at::Tensor& tokens) override;
  // The forward in pieces, for pipeline stages (docs/skippipe.md): forward(tokens) is
  // head(block(L-1, ... block(0, embed(tokens)))), bit for bit.
  at::Tensor embed(const at::Tensor& tokens);                // token and position embeddings (and dropout): (B, T, C)
  at::Tensor block(std::int64_t index, const at::Tensor& x);  // transformer block `index` of 0 .. layers-1
  at::Tensor head(const at::Tensor& x);                       // final LayerNorm and the tied output head: logits (B, T, V)
  // Multiplies block `index`'s two residual branches by `factor`, in place: it then computes
  // x + f·attn(ln1(x)), then + f·mlp(ln2(·)), its output projections (weights and biases) scaled.
  // Stochastic depth's inference rule: a block that training skipped with probability 1 - f adds, at
  // inference, what it added on average. The result is an ordinary Gpt (saved, exported alike).
  void scale_residual_branches(std::int64_t index, double factor);
  std::vector<ParameterBlock> blocks() const override;
  std::int64_t vocab_size() const override { return config().vocab_size; }
  std::int64_t context() const override { return config().context; }
  void train(bool on = true) override;
  bool is_training() const override;
  void to(const c10::Device& device) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  // The state of the model's own dropout generator.
  std::vector<std::uint8_t> rng_state() const override;
  void set_rng_state(const std::vector<std::uint8_t>& state) override;

  // The underlying module, for serialization and device moves.
  torch::nn::Module& module();
  const torch::nn::Module& module() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace gossamer::model
