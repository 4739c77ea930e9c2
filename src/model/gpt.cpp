#include "model/gpt.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <cstring>

#include "core/check.h"

namespace gossamer::model {

namespace {

// Dropout drawing from the model's own generator (not LibTorch's global one), so several models in one
// process (simulated workers) stay independent and reproducible. The generator is a CPU one on every
// device: masks of a model on a GPU are drawn on the host and copied, the same masks as on the CPU.
torch::Tensor drop(const torch::Tensor& x, double p, bool training, at::Generator& gen) {
  if (!training || p <= 0.0) return x;
  auto keep = torch::empty(x.sizes(), torch::TensorOptions().dtype(x.scalar_type())).bernoulli_(1.0 - p, gen);
  if (!x.device().is_cpu()) keep = keep.to(x.device());
  return x * keep * (1.0 / (1.0 - p));
}

// Causal multi-head self-attention.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const GptConfig& c, at::Generator g) : heads(c.heads), width(c.width), dropout_p(c.dropout), gen(std::move(g)) {
    qkv = register_module("qkv", torch::nn::Linear(c.width, 3 * c.width));
    proj = register_module("proj", torch::nn::Linear(c.width, c.width));
    // True above the diagonal: positions a query may not look at.
    mask = register_buffer("mask", torch::ones({c.context, c.context}, torch::kBool).triu(1));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), hd = width / heads;
    auto parts = qkv->forward(x).split(width, /*dim=*/2);
    auto q = parts[0].view({B, T, heads, hd}).transpose(1, 2);  // (B, H, T, hd)
    auto k = parts[1].view({B, T, heads, hd}).transpose(1, 2);
    auto v = parts[2].view({B, T, heads, hd}).transpose(1, 2);
#if GOSSAMER_TORCH2_KERNELS && TORCH_VERSION_MAJOR >= 2
    // On a GPU, LibTorch 2's fused causal attention (flash or memory-efficient kernels: no T x T
    // scores in memory). Not with dropout while training: its masks would come from LibTorch's
    // global generator, not the model's. CPU runs keep the explicit form below.
    if (!x.device().is_cpu() && (dropout_p <= 0.0 || !is_training())) {
      auto y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true).transpose(1, 2).contiguous().view({B, T, width});
      return proj->forward(y);
    }
#endif
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    att = att.masked_fill(mask.index({torch::indexing::Slice(0, T), torch::indexing::Slice(0, T)}),
                          -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    att = drop(att, dropout_p, is_training(), gen);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, width});
    y = proj->forward(y);
    y = drop(y, dropout_p, is_training(), gen);
    return y;
  }

  std::int64_t heads, width;
  double dropout_p;
  at::Generator gen;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor mask;
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  MlpImpl(const GptConfig& c, at::Generator g) : dropout_p(c.dropout), gen(std::move(g)) {
    fc = register_module("fc", torch::nn::Linear(c.width, 4 * c.width));
    proj = register_module("proj", torch::nn::Linear(4 * c.width, c.width));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = proj->forward(torch::gelu(fc->forward(x), "tanh"));
    y = drop(y, dropout_p, is_training(), gen);
    return y;
  }
  double dropout_p;
  at::Generator gen;
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const GptConfig& c, const at::Generator& gen) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
    attn = register_module("attn", Attention(c, gen));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
    mlp = register_module("mlp", Mlp(c, gen));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn->forward(ln1->forward(x));
    return x + mlp->forward(ln2->forward(x));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptModuleImpl : torch::nn::Module {
  explicit GptModuleImpl(const GptConfig& c) : config(c), gen(at::make_generator<at::CPUGeneratorImpl>(c.dropout_seed)) {
    wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.width));
    wpe = register_module("wpe", torch::nn::Embedding(c.context, c.width));
    for (std::int64_t i = 0; i < c.layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Block(c, gen)));
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
    init_weights();
  }

  // GPT-2 initialization: N(0, 0.02) for linear and embedding weights, zero biases, and residual
  // projections scaled by 1/sqrt(2L) so the residual stream's variance does not grow with depth.
  void init_weights() {
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(config.init_seed);
    const double std_dev = 0.02;
    const double resid_std = std_dev / std::sqrt(2.0 * static_cast<double>(config.layers));
    wte->weight.normal_(0.0, std_dev, gen);
    wpe->weight.normal_(0.0, std_dev, gen);
    for (auto& b : blocks) {
      b->attn->qkv->weight.normal_(0.0, std_dev, gen);
      b->attn->qkv->bias.zero_();
      b->attn->proj->weight.normal_(0.0, resid_std, gen);
      b->attn->proj->bias.zero_();
      b->mlp->fc->weight.normal_(0.0, std_dev, gen);
      b->mlp->fc->bias.zero_();
      b->mlp->proj->weight.normal_(0.0, resid_std, gen);
      b->mlp->proj->bias.zero_();
    }
  }

  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = embed(tokens);
    for (auto& b : blocks) x = b->forward(x);
    return head(x);
  }
  torch::Tensor embed(const torch::Tensor& tokens) {
    GOSSAMER_CHECK(tokens.dim() == 2, "Gpt::forward expects tokens of shape (B, T)");
    const auto T = tokens.size(1);
    GOSSAMER_CHECK(T <= config.context, "sequence length " + std::to_string(T) + " exceeds the model context " +
                                            std::to_string(config.context));
    auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
    auto x = wte->forward(tokens) + wpe->forward(pos);
    return drop(x, config.dropout, is_training(), gen);
  }
  torch::Tensor head(const torch::Tensor& x) {
    return torch::matmul(ln_f->forward(x), wte->weight.t());  // tied head
  }

  GptConfig config;
  at::Generator gen;  // dropout; shared by every submodule of this model
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GptModule);

void add_named(ParameterBlock& block, const std::string& prefix, torch::nn::Module& m) {
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    block.parameters.push_back({prefix + "." + item.key(), item.value()});
  }
}

}  // namespace

struct Gpt::Impl {
  explicit Impl(const GptConfig& c) : module(c) {}
  GptModule module;
};

Gpt::Gpt(const GptConfig& config) {
  GOSSAMER_CHECK(config.vocab_size > 0 && config.context > 0 && config.layers > 0 && config.width > 0,
                 "GptConfig sizes must be positive");
  GOSSAMER_CHECK(config.heads > 0 && config.width % config.heads == 0, "GptConfig: width must be divisible by heads");
  GOSSAMER_CHECK(config.dropout >= 0.0 && config.dropout < 1.0, "GptConfig: dropout must be in [0, 1)");
  impl_ = std::make_shared<Impl>(config);
}

Gpt::~Gpt() = default;

const GptConfig& Gpt::config() const { return impl_->module->config; }

at::Tensor Gpt::forward(const at::Tensor& tokens) { return impl_->module->forward(tokens); }
at::Tensor Gpt::embed(const at::Tensor& tokens) { return impl_->module->embed(tokens); }
at::Tensor Gpt::head(const at::Tensor& x) { return impl_->module->head(x); }
at::Tensor Gpt::block(std::int64_t index, const at::Tensor& x) {
  auto& m = *impl_->module;
  GOSSAMER_CHECK(index >= 0 && index < static_cast<std::int64_t>(m.blocks.size()), "Gpt::block: no block " + std::to_string(index));
  return m.blocks[static_cast<std::size_t>(index)]->forward(x);
}

void Gpt::scale_residual_branches(std::int64_t index, double factor) {
  auto& m = *impl_->module;
  GOSSAMER_CHECK(index >= 0 && index < static_cast<std::int64_t>(m.blocks.size()), "Gpt::scale_residual_branches: no block " + std::to_string(index));
  GOSSAMER_CHECK(std::isfinite(factor), "Gpt::scale_residual_branches: the factor must be finite");
  torch::NoGradGuard no_grad;
  auto& b = m.blocks[static_cast<std::size_t>(index)];
  for (auto* t : {&b->attn->proj->weight, &b->attn->proj->bias, &b->mlp->proj->weight, &b->mlp->proj->bias}) t->mul_(factor);
}

std::vector<ParameterBlock> Gpt::blocks() const {
  auto& m = *impl_->module;
  std::vector<ParameterBlock> out;
  ParameterBlock embed{"embed", {}};
  embed.parameters.push_back({"embed.wte.weight", m.wte->weight});
  embed.parameters.push_back({"embed.wpe.weight", m.wpe->weight});
  out.push_back(std::move(embed));
  for (std::size_t i = 0; i < m.blocks.size(); ++i) {
    ParameterBlock b{"block." + std::to_string(i), {}};
    add_named(b, b.name, *m.blocks[i]);
    out.push_back(std::move(b));
  }
  ParameterBlock final_block{"final", {}};
  add_named(final_block, "final.ln_f", *m.ln_f);
  out.push_back(std::move(final_block));
  return out;
}

std::vector<std::uint8_t> Gpt::rng_state() const {
  std::lock_guard<std::mutex> lock(impl_->module->gen.mutex());
  const at::Tensor state = impl_->module->gen.get_state();
  const auto* p = state.data_ptr<std::uint8_t>();
  return std::vector<std::uint8_t>(p, p + state.numel());
}

void Gpt::set_rng_state(const std::vector<std::uint8_t>& state) {
  auto t = torch::empty({static_cast<std::int64_t>(state.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), state.data(), state.size());
  std::lock_guard<std::mutex> lock(impl_->module->gen.mutex());
  impl_->module->gen.set_state(t);
}

void Gpt::save(torch::serialize::OutputArchive& archive) const { impl_->module->save(archive); }
void Gpt::load(torch::serialize::InputArchive& archive) { impl_->module->load(archive); }

void Gpt::train(bool on) { impl_->module->train(on); }
void Gpt::to(const c10::Device& device) { impl_->module->to(device); }
bool Gpt::is_training() const { return impl_->module->is_training(); }

torch::nn::Module& Gpt::module() { return *impl_->module; }
const torch::nn::Module& Gpt::module() const { return *impl_->module; }

}  // namespace gossamer::model
