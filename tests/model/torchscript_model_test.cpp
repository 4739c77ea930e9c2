#include <doctest/doctest.h>

#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <random>

#include "core/check.h"
#include "model/gpt.h"
#include "model/gpt_script.h"
#include "model/torchscript_model.h"

using namespace gossamer;
using namespace gossamer::model;
namespace fs = std::filesystem;

namespace {

GptConfig small() {
  GptConfig c;
  c.context = 16;
  c.layers = 3;
  c.width = 32;
  c.heads = 4;
  return c;
}

struct TempFile {
  fs::path path = fs::temp_directory_path() / ("gossamer_ts_" + std::to_string(std::random_device{}()) + ".pt");
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

TorchScriptOptions options_for(const fs::path& path, const GptConfig& c) {
  TorchScriptOptions o;
  o.path = path;
  o.context = c.context;
  o.vocab_size = c.vocab_size;
  return o;
}

// A module defined in TorchScript source: an embedding, `layers` residual tanh layers named
// layer_<i>_w, and a head. Its names follow another scheme than the GPT's.
torch::jit::Module mini(int layers, std::int64_t vocab, std::int64_t width) {
  torch::manual_seed(3);
  torch::jit::Module m("Mini");
  m.register_parameter("emb", (torch::randn({vocab, width}) * 0.1).requires_grad_(), false);
  std::string body;
  for (int i = 0; i < layers; ++i) {
    m.register_parameter("layer_" + std::to_string(i) + "_w", (torch::randn({width, width}) * 0.1).requires_grad_(), false);
    body += "    x = x + torch.tanh(torch.matmul(x, self.layer_" + std::to_string(i) + "_w))\n";
  }
  m.register_parameter("head", (torch::randn({width, vocab}) * 0.1).requires_grad_(), false);
  m.define("def forward(self, tokens):\n    x = torch.embedding(self.emb, tokens)\n" + body + "    return torch.matmul(x, self.head)\n");
  return m;
}

}  // namespace

TEST_CASE("the GPT scripted to TorchScript computes what the GPT computes, and loads back as a TorchScript model") {
  const GptConfig c = small();
  Gpt gpt(c);
  gpt.train(false);
  TempFile f;
  script_gpt(gpt).save(f.path.string());

  auto loaded = TorchScriptModel::load(options_for(f.path, c));
  REQUIRE_MESSAGE(loaded.ok(), loaded.status().to_string());
  auto& ts = **loaded;
  ts.train(false);
  torch::NoGradGuard no_grad;
  for (std::int64_t T : {1, 9, 16}) {
    auto tokens = torch::randint(0, 256, {2, T}, torch::kLong);
    CHECK(torch::equal(ts.forward(tokens), gpt.forward(tokens)));
  }
  // Cut into the same blocks, every parameter once.
  const auto ours = gpt.blocks(), theirs = ts.blocks();
  REQUIRE(theirs.size() == ours.size());
  for (std::size_t b = 0; b < ours.size(); ++b) {
    CHECK(theirs[b].name == ours[b].name);
    REQUIRE(theirs[b].parameters.size() == ours[b].parameters.size());
    for (std::size_t i = 0; i < ours[b].parameters.size(); ++i) {
      CHECK(torch::equal(theirs[b].parameters[i].tensor, ours[b].parameters[i].tensor));
    }
  }
  CHECK(ts.num_parameters() == gpt.num_parameters());
}

TEST_CASE("a TorchScript model trains: gradients reach every parameter and the loss falls") {
  TempFile f;
  mini(3, 50, 16).save(f.path.string());
  TorchScriptOptions o;
  o.path = f.path;
  o.context = 8;
  o.vocab_size = 50;
  o.block_pattern = R"(layer_(\d+)_)";
  auto loaded = TorchScriptModel::load(o);
  REQUIRE_MESSAGE(loaded.ok(), loaded.status().to_string());
  auto& m = **loaded;
  const auto blocks = m.blocks();
  REQUIRE(blocks.size() == 5);
  CHECK(blocks[0].parameters.at(0).name == "emb");
  CHECK(blocks[2].name == "block.1");
  CHECK(blocks[2].parameters.at(0).name == "layer_1_w");
  CHECK(blocks[4].parameters.at(0).name == "head");

  // A sequence that repeats: next token = token + 1 (mod 50).
  auto tokens = (torch::arange(8).repeat({4, 1}) + torch::arange(4).unsqueeze(1) * 7) % 50;
  auto targets = (tokens + 1) % 50;
  torch::optim::AdamW opt(m.parameters(), torch::optim::AdamWOptions(1e-2));
  const double first = m.loss(tokens, targets).item<double>();
  double last = first;
  for (int i = 0; i < 60; ++i) {
    opt.zero_grad();
    auto loss = m.loss(tokens, targets);
    loss.backward();
    for (const auto& p : m.parameters()) CHECK(p.grad().defined());
    opt.step();
    last = loss.item<double>();
  }
  CHECK(last < 0.5 * first);
}

TEST_CASE("checkpoint state: save and load restore the parameters, the rng state replays the dropout stream") {
  TempFile f;
  mini(2, 20, 8).save(f.path.string());
  TorchScriptOptions o;
  o.path = f.path;
  o.context = 4;
  o.vocab_size = 20;
  auto a = TorchScriptModel::load(o), b = TorchScriptModel::load(o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : (*a)->parameters()) p.add_(1.0);
  }
  torch::serialize::OutputArchive out;
  (*a)->save(out);
  std::ostringstream os;
  out.save_to(os);
  std::istringstream is(os.str());
  torch::serialize::InputArchive in;
  in.load_from(is);
  (*b)->load(in);
  const auto pa = (*a)->parameters(), pb = (*b)->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pb[i]));
  (*a)->train(true);
  (*a)->forward(torch::zeros({1, 4}, torch::kLong));
  CHECK((*a)->rng_state() != (*b)->rng_state());
  (*b)->set_rng_state((*a)->rng_state());
  CHECK((*a)->rng_state() == (*b)->rng_state());
  CHECK_THROWS_AS((*b)->set_rng_state({1, 2, 3}), ContractError);
}

TEST_CASE("a module that breaks the contract is refused with what to change") {
  TempFile f;
  auto refused = [&](const TorchScriptOptions& o, const std::string& words) {
    auto m = TorchScriptModel::load(o);
    REQUIRE_FALSE(m.ok());
    INFO(m.status().message());
    CHECK(m.status().code() == ErrorCode::kInvalidArgument);
    CHECK(m.status().message().find(words) != std::string::npos);
  };
  TorchScriptOptions o;
  o.path = f.path;
  o.context = 8;
  o.vocab_size = 50;
  refused(o, "is not a file");
  {
    std::ofstream(f.path) << "not a zip archive";
  }
  refused(o, "is not a TorchScript module");
  mini(0, 50, 16).save(f.path.string());
  refused(o, "no parameter name holds a layer number");
  mini(2, 50, 16).save(f.path.string());
  CHECK(TorchScriptModel::load(o).ok());  // layer_1_w: the default pattern finds the layer
  o.block_pattern = "(";
  refused(o, "is not a regular expression");
  o.block_pattern = R"(emb|layer_(\d+))";  // the embedding matches without a layer number: it is not a layer
  CHECK(TorchScriptModel::load(o).ok());
  o.block_pattern = R"(^(\w))";  // every name "matches" a non-number
  refused(o, "which is not a layer number");
  o.block_pattern = kDefaultBlockPattern;
  o.vocab_size = 60;
  refused(o, "expected [1, 8, 60]");
  o.vocab_size = 50;
  torch::jit::Module two("Two");
  for (const char* name : {"a", "h_0_w", "z"}) two.register_parameter(name, torch::ones({1}).requires_grad_(), false);
  two.define("def forward(self, a, b):\n    return a * self.a\n");
  two.save(f.path.string());
  refused(o, "failed");
}
