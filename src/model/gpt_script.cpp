#include "model/gpt_script.h"

#include <torch/torch.h>

#include <cmath>

#include <fmt/format.h>

namespace gossamer::model {

namespace {

at::Tensor copy_of(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

std::string block_source(const GptConfig& c) {
  const std::int64_t hd = c.width / c.heads;
  // The same operations, in the same order, as model/gpt.cpp's Block (without dropout).
  return fmt::format(R"(
def forward(self, x):
    B = x.size(0)
    T = x.size(1)
    h = torch.layer_norm(x, [{C}], self.ln1_weight, self.ln1_bias, 1e-05)
    qkv = torch.linear(h, self.qkv_weight, self.qkv_bias)
    parts = qkv.split({C}, 2)
    q = parts[0].view(B, T, {H}, {D}).transpose(1, 2)
    k = parts[1].view(B, T, {H}, {D}).transpose(1, 2)
    v = parts[2].view(B, T, {H}, {D}).transpose(1, 2)
    att = torch.matmul(q, k.transpose(-2, -1)) * {scale}
    att = att.masked_fill(self.mask[0:T, 0:T], float("-inf"))
    att = torch.softmax(att, -1)
    y = torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, {C})
    x = x + torch.linear(y, self.proj_weight, self.proj_bias)
    h = torch.layer_norm(x, [{C}], self.ln2_weight, self.ln2_bias, 1e-05)
    h = torch.gelu(torch.linear(h, self.fc_weight, self.fc_bias), approximate="tanh")
    return x + torch.linear(h, self.mlp_proj_weight, self.mlp_proj_bias)
)",
                     fmt::arg("C", c.width), fmt::arg("H", c.heads), fmt::arg("D", hd),
                     fmt::arg("scale", fmt::format("{:.17g}", 1.0 / std::sqrt(static_cast<double>(hd)))));
}

}  // namespace

torch::jit::Module script_gpt(const Gpt& gpt) {
  const GptConfig& c = gpt.config();
  // Weights by the Gpt's own names ("block.3.attn.qkv.weight").
  std::map<std::string, at::Tensor> w;
  for (const auto& p : gpt.named_parameters()) w[p.name] = p.tensor;

  torch::jit::Module top("GossamerGpt");
  top.register_parameter("wte", copy_of(w.at("embed.wte.weight")), false);
  top.register_parameter("wpe", copy_of(w.at("embed.wpe.weight")), false);
  std::string calls;
  for (std::int64_t i = 0; i < c.layers; ++i) {
    const std::string in = "block." + std::to_string(i) + ".";
    torch::jit::Module b("GossamerGptBlock");
    auto put = [&](const char* name, const std::string& ours) { b.register_parameter(name, copy_of(w.at(in + ours)), false); };
    put("ln1_weight", "ln1.weight");
    put("ln1_bias", "ln1.bias");
    put("qkv_weight", "attn.qkv.weight");
    put("qkv_bias", "attn.qkv.bias");
    put("proj_weight", "attn.proj.weight");
    put("proj_bias", "attn.proj.bias");
    put("ln2_weight", "ln2.weight");
    put("ln2_bias", "ln2.bias");
    put("fc_weight", "mlp.fc.weight");
    put("fc_bias", "mlp.fc.bias");
    put("mlp_proj_weight", "mlp.proj.weight");
    put("mlp_proj_bias", "mlp.proj.bias");
    b.register_buffer("mask", torch::ones({c.context, c.context}, torch::kBool).triu(1));
    b.define(block_source(c));
    top.register_module("block_" + std::to_string(i), b);
    calls += fmt::format("    x = self.block_{}.forward(x)\n", i);
  }
  top.register_parameter("ln_f_weight", copy_of(w.at("final.ln_f.weight")), false);
  top.register_parameter("ln_f_bias", copy_of(w.at("final.ln_f.bias")), false);
  top.define(fmt::format(R"(
def forward(self, tokens):
    T = tokens.size(1)
    pos = torch.arange(T, device=tokens.device)
    x = torch.embedding(self.wte, tokens) + torch.embedding(self.wpe, pos)
{calls}    x = torch.layer_norm(x, [{C}], self.ln_f_weight, self.ln_f_bias, 1e-05)
    return torch.matmul(x, self.wte.t())
)",
                         fmt::arg("calls", calls), fmt::arg("C", c.width)));
  return top;
}

}  // namespace gossamer::model
