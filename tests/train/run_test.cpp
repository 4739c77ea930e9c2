#include <doctest/doctest.h>

#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "optim/outer_optimizer.h"
#include "train/outer.h"
#include "train/run.h"
#include "train/worker.h"

using namespace gossamer;
using namespace gossamer::train;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("gossamer_" + name + "_" + std::to_string(std::random_device{}()));
  fs::remove_all(p);
  return p;
}

RunConfig tiny() {
  RunConfig c;
  c.model.layers = 1;
  c.model.width = 32;
  c.model.heads = 2;
  c.model.context = 16;
  c.model.dropout = 0.1;  // exercises the RNG state in checkpoints
  c.data.synthetic.bytes = 40000;
  c.train.batch_size = 4;
  c.train.steps = 20;
  c.train.warmup_steps = 3;
  c.train.eval_every = 5;
  c.train.eval_batches = 2;
  c.train.checkpoint_every = 0;
  return c;
}

TrainRequest request(const RunConfig& config, const fs::path& dir) {
  TrainRequest r;
  r.config = config;
  r.out_dir = dir;
  return r;
}

std::vector<torch::Tensor> params_of(const fs::path& dir, const RunConfig& config) {
  auto state = read_checkpoint(dir / kCheckpointFile);
  REQUIRE(state.ok());
  auto corpus = load_corpus(config);
  REQUIRE(corpus.ok());
  Worker w(config, corpus->dataset, 0, 1, real_clock());
  REQUIRE(w.restore(*state).ok());
  return w.model().parameters();
}

std::vector<nlohmann::json> metrics_of(const fs::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A TorchScript module with dropout (drawn from LibTorch's global generator, which the model seeds).
fs::path dropout_module() {
  const fs::path path = fresh_dir("dropout") += ".pt";
  torch::manual_seed(5);
  torch::jit::Module m("Drop");
  if (!m.hasattr("training")) m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("emb", (torch::randn({256, 16}) * 0.1).requires_grad_(), false);
  m.register_parameter("layer_0_w", (torch::randn({16, 16}) * 0.1).requires_grad_(), false);
  m.register_parameter("head", (torch::randn({16, 256}) * 0.1).requires_grad_(), false);
  m.define(R"(
def forward(self, tokens):
    x = torch.embedding(self.emb, tokens)
    x = x + torch.dropout(torch.tanh(torch.matmul(x, self.layer_0_w)), 0.2, self.training)
    return torch.matmul(x, self.head)
)");
  m.save(path.string());
  return path;
}

void check_resume(const RunConfig& config) {
  const fs::path straight = fresh_dir("straight"), split = fresh_dir("split");

  TrainRequest a = request(config, straight);
  auto ra = run_training(a, real_clock());
  REQUIRE(ra.ok());
  CHECK(ra->finished);
  CHECK(ra->steps == 20);

  TrainRequest b1 = request(config, split);
  b1.stop_at = 10;
  auto rb1 = run_training(b1, real_clock());
  REQUIRE(rb1.ok());
  CHECK_FALSE(rb1->finished);
  CHECK(rb1->steps == 10);
  // Metrics written after the checkpoint must not be duplicated on resume: fake a crash that left
  // lines beyond step 10.
  {
    std::ofstream extra(split / "metrics.jsonl", std::ios::app);
    extra << R"({"step": 11, "train_loss": 0.0})" << "\n" << R"({"step": 12, "tr)";
  }
  auto stored = config_from_checkpoint(split);
  REQUIRE(stored.ok());
  TrainRequest b2 = request(*stored, split);
  b2.resume = true;
  auto rb2 = run_training(b2, real_clock());
  REQUIRE(rb2.ok());
  CHECK(rb2->finished);
  CHECK(rb2->tokens == ra->tokens);

  const auto pa = params_of(straight, config), pb = params_of(split, config);
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pb[i]));
  CHECK(rb2->final_val_loss == ra->final_val_loss);

  const auto ma = metrics_of(straight), mb = metrics_of(split);
  REQUIRE(ma.size() == 20);
  REQUIRE(mb.size() == 20);
  for (std::size_t i = 0; i < ma.size(); ++i) {
    CHECK(ma[i]["step"] == mb[i]["step"]);
    CHECK(ma[i]["train_loss"].get<double>() == mb[i]["train_loss"].get<double>());
    CHECK(ma[i]["lr"].get<double>() == mb[i]["lr"].get<double>());
    CHECK(ma[i].contains("val_loss") == mb[i].contains("val_loss"));
  }
  CHECK(ma[4].contains("val_loss"));
  for (const char* key : {"step", "tokens", "train_loss", "lr", "tok_per_s"}) CHECK(ma[0].contains(key));
  CHECK(fs::exists(straight / "summary.json"));
  CHECK(fs::exists(straight / "config.toml"));
  fs::remove_all(straight);
  fs::remove_all(split);
}

}  // namespace

TEST_CASE("20 steps straight and 10 + resume + 10 give bit-identical parameters and losses") {
  SUBCASE("the built-in GPT") { check_resume(tiny()); }
  SUBCASE("the built-in GPT with Muon for its weight matrices") {
    RunConfig c = tiny();
    c.train.optimizer = InnerOptimizer::kMuon;
    check_resume(c);
  }
  SUBCASE("a TorchScript module with dropout") {
    RunConfig c = tiny();
    c.model.kind = ModelKind::kTorchScript;
    c.model.path = dropout_module().string();
    check_resume(c);
    fs::remove(c.model.path);
  }
}

TEST_CASE("a run folder is never overwritten silently, and a resume must match the model") {
  RunConfig config = tiny();
  config.train.steps = 2;
  config.train.warmup_steps = 0;
  const fs::path dir = fresh_dir("guard");
  TrainRequest req = request(config, dir);
  REQUIRE(run_training(req, real_clock()).ok());
  auto again = run_training(req, real_clock());
  CHECK(again.status().code() == ErrorCode::kInvalidArgument);
  CHECK(again.status().message().find("--resume") != std::string::npos);

  RunConfig wider = config;
  wider.model.width = 64;
  TrainRequest resume = request(wider, dir);
  resume.resume = true;
  auto mismatch = run_training(resume, real_clock());
  REQUIRE_FALSE(mismatch.ok());
  CHECK(mismatch.status().message().find("model config") != std::string::npos);

  TrainRequest nothing = request(config, fresh_dir("nothing"));
  CHECK(config_from_checkpoint(nothing.out_dir).status().code() == ErrorCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST_CASE("training on the synthetic language falls toward its entropy floor") {
  RunConfig c;
  c.model.layers = 2;
  c.model.width = 64;
  c.model.heads = 4;
  c.model.context = 32;
  c.data.synthetic.words = 16;
  c.data.synthetic.classes = 2;
  c.data.synthetic.bytes = 300000;
  c.train.batch_size = 16;
  c.train.steps = 150;
  c.train.warmup_steps = 10;
  c.train.lr = 3e-3;
  c.train.eval_every = 150;
  c.train.checkpoint_every = 0;
  const fs::path dir = fresh_dir("floor");
  TrainRequest req = request(c, dir);
  auto r = run_training(req, real_clock());
  REQUIRE(r.ok());
  REQUIRE(r->entropy_floor.has_value());
  REQUIRE(r->final_val_loss.has_value());
  const double floor = *r->entropy_floor, val = *r->final_val_loss;
  MESSAGE("entropy floor " << floor << ", val loss after 150 steps " << val);
  // From ln(256) = 5.55 nats at initialization to within 0.35 nats of the floor; never below it by
  // more than sampling noise.
  CHECK(val < floor + 0.35);
  CHECK(val > floor - 0.05);
  fs::remove_all(dir);
}

TEST_CASE("the inner optimizer's state in plain bytes: the same state gives the same bytes, it round-trips, and bad bytes change nothing") {
  RunConfig config = tiny();
  SUBCASE("AdamW") {}
  SUBCASE("Muon and AdamW") { config.train.optimizer = InnerOptimizer::kMuon; }
  auto corpus = load_corpus(config);
  REQUIRE(corpus.ok());
  Worker a(config, corpus->dataset, 0, 1, real_clock()), b(config, corpus->dataset, 0, 1, real_clock());
  for (int i = 0; i < 3; ++i) {
    a.step();
    b.step();
  }
  const Bytes state = a.optimizer_state();
  CHECK((state == b.optimizer_state()));  // two workers, one state: one set of bytes (an archive names tensors by address)
  Worker c(config, corpus->dataset, 0, 1, real_clock());
  REQUIRE(c.load_optimizer_state(state).ok());
  CHECK((c.optimizer_state() == state));
  Bytes bad = state;
  bad.resize(bad.size() - 1);
  CHECK(c.load_optimizer_state(bad).code() == ErrorCode::kMalformed);  // a moment cut short
  bad = state;
  bad[0] = std::byte{'X'};
  CHECK(c.load_optimizer_state(bad).code() == ErrorCode::kMalformed);
  CHECK((c.optimizer_state() == state));  // a refused state changed nothing
}

TEST_CASE("Muon as the inner optimizer: it trains, and another optimizer's state or checkpoint is refused") {
  RunConfig config = tiny();
  config.model.dropout = 0;
  config.train.steps = 60;
  config.train.warmup_steps = 5;
  RunConfig with_muon = config;
  with_muon.train.optimizer = InnerOptimizer::kMuon;
  auto corpus = load_corpus(config);
  REQUIRE(corpus.ok());
  RunConfig with_rule = with_muon;  // the default, train.muon_lr = 0: AdamW's lr with Moonlight's scale
  with_muon.train.muon_lr = 0.02;   // the reference's form and lr
  CHECK(with_rule.train.muon_lr == 0);
  Worker adam(config, corpus->dataset, 0, 1, real_clock()), muon(with_muon, corpus->dataset, 0, 1, real_clock()),
      rule(with_rule, corpus->dataset, 0, 1, real_clock());
  const double start = muon.evaluate();
  auto flat = [](Worker& w) { return torch::nn::utils::parameters_to_vector(w.model().parameters()).detach().clone(); };
  const at::Tensor rule_start = flat(rule);
  for (int i = 0; i < 60; ++i) {
    adam.step();
    muon.step();
    rule.step();
  }
  // From ln(256) = 5.55 nats, well down in 60 steps, as AdamW goes (within a nat of it either way).
  CHECK(muon.evaluate() < start - 1.0);
  CHECK(std::abs(muon.evaluate() - adam.evaluate()) < 1.0);
  CHECK(rule.evaluate() < start - 1.0);
  CHECK(std::abs(rule.evaluate() - adam.evaluate()) < 1.0);
  CHECK_FALSE(torch::equal(flat(rule), flat(muon)));  // another scale, other weights
  CHECK_FALSE(torch::equal(flat(rule), rule_start));
  // Each state is of its optimizer: the other one's is refused, and changes nothing.
  const Bytes adam_state = adam.optimizer_state(), muon_state = muon.optimizer_state();
  CHECK(muon_state.size() < adam_state.size());  // one buffer per matrix instead of two moments
  CHECK(adam.load_optimizer_state(muon_state).code() == ErrorCode::kMalformed);
  CHECK(muon.load_optimizer_state(adam_state).code() == ErrorCode::kMalformed);
  CHECK((muon.optimizer_state() == muon_state));
  // A run resumed with another train.optimizer is refused, naming the key.
  const fs::path dir = fresh_dir("muon_resume");
  config.train.steps = 4;
  config.train.warmup_steps = 1;
  REQUIRE(run_training(request(config, dir), real_clock()).ok());
  with_muon = config;
  with_muon.train.optimizer = InnerOptimizer::kMuon;
  with_muon.train.steps = 8;
  TrainRequest resume = request(with_muon, dir);
  resume.resume = true;
  auto refused = run_training(resume, real_clock());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("train.optimizer") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("the loop asks for the group of every step it runs, also after a regroup moved the worker on (a catch-up)") {
  RunConfig c = tiny();
  c.model.dropout = 0.0;
  c.train.steps = 12;
  c.outer.method = optim::Method::kDiLoCo;
  c.diloco.inner_steps = 2;
  auto corpus = load_corpus(c);
  REQUIRE(corpus.ok());
  Worker w(c, corpus->dataset, 0, 1, real_clock());
  auto oc = outer_config(c);
  REQUIRE(oc.ok());
  optim::Group solo;
  solo.peers.resize(1);
  auto setup = optim::make_outer_optimizer(*oc, param_blocks(w.model()), solo);
  REQUIRE(setup.ok());
  LoopOptions lo;
  lo.steps = c.train.steps;
  std::vector<std::int64_t> asked;
  LoopHooks hooks;
  hooks.regroup = [&](std::int64_t step) -> std::optional<optim::Group> {
    asked.push_back(step);
    if (step == 5) w.move_to(6);  // left out of a round there, it replayed the members' steps 5 and 6
    return std::nullopt;
  };
  auto account = run_worker_loop(w, *setup, real_clock(), lo, hooks);
  REQUIRE(account.ok());
  // Step 7 ran after the catch-up: it was asked for (the round due before it needs its group).
  CHECK(asked == std::vector<std::int64_t>{1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12});
  CHECK(w.steps_done() == 12);
  CHECK(account->computed_steps == 10);

  // Caught up through the run's end: no step past it.
  Worker w2(c, corpus->dataset, 0, 1, real_clock());
  auto setup2 = optim::make_outer_optimizer(*oc, param_blocks(w2.model()), solo);
  REQUIRE(setup2.ok());
  asked.clear();
  hooks.regroup = [&](std::int64_t step) -> std::optional<optim::Group> {
    asked.push_back(step);
    if (step == 9) w2.move_to(12);
    return std::nullopt;
  };
  auto account2 = run_worker_loop(w2, *setup2, real_clock(), lo, hooks);
  REQUIRE(account2.ok());
  CHECK(asked.back() == 9);
  CHECK(w2.steps_done() == 12);
  CHECK(account2->computed_steps == 8);
}
