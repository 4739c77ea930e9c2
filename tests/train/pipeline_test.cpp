// SkipPipe's stage runtime (train/pipeline.h) over in-memory links, one thread per node: the
// gradients of a skipping path bit-identical to the same blocks run in one process, the full path
// equal to the whole model's, a 30-micro-batch iteration of the geo schedule within 1e-6 of one
// process with stage replicas bit-identical after their sync and step, the memory bound held, the
// bytes on the wire as the closed form says, and malformed messages refused.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <unistd.h>

#include <array>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "quant/codec.h"
#include "model/gpt.h"
#include "skippipe/planner.h"
#include "support/mutate.h"
#include "support/pipeline_config.h"
#include "train/pipeline.h"
#include "train/pipeline_trainer.h"
#include "train/run.h"
#include "train/pipeline_wire.h"
#include "train/trained_model.h"
#include "train/worker.h"
#include "transport/memory_link.h"
#include "transport/tags.h"

using namespace gossamer;
using namespace gossamer::train;
using namespace std::chrono_literals;

namespace {

model::GptConfig tiny_gpt() {
  model::GptConfig c;
  c.context = 8;
  c.layers = 6;
  c.width = 16;
  c.heads = 2;
  return c;
}

std::vector<std::vector<std::shared_ptr<transport::Link>>> mesh(int n) {
  std::vector<std::vector<std::shared_ptr<transport::Link>>> links(static_cast<std::size_t>(n), std::vector<std::shared_ptr<transport::Link>>(static_cast<std::size_t>(n)));
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      auto [ab, ba] = transport::make_memory_link_pair(transport::PeerId{static_cast<std::uint64_t>(a + 1)}, transport::PeerId{static_cast<std::uint64_t>(b + 1)});
      links[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] = ab;
      links[static_cast<std::size_t>(b)][static_cast<std::size_t>(a)] = ba;
    }
  }
  return links;
}

MicroBatchData batch(std::uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return MicroBatchData{torch::randint(0, 256, {2, 8}, g, torch::kLong), torch::randint(0, 256, {2, 8}, g, torch::kLong)};
}

// Every node's iteration on its own thread; the stats by node.
std::vector<IterationStats> run_all(std::vector<PipelineNode>& nodes, const std::map<int, std::vector<MicroBatchData>>& data, std::uint64_t iteration = 1) {
  std::vector<IterationStats> stats(nodes.size());
  std::vector<Status> st(nodes.size());
  std::vector<std::thread> threads;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    threads.emplace_back([&, n] {
      const auto it = data.find(static_cast<int>(n));
      auto r = nodes[n].run_iteration(iteration, it == data.end() ? std::vector<MicroBatchData>{} : it->second, Deadline::after(real_clock(), 60s));
      if (r.ok()) {
        stats[n] = std::move(*r);
      } else {
        st[n] = r.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t n = 0; n < nodes.size(); ++n) REQUIRE_MESSAGE(st[n].ok(), "node " << n << ": " << st[n].to_string());
  return stats;
}

// One node per stage, one agent on `hops` (node == stage).
skippipe::Schedule line(const std::vector<int>& hops, skippipe::Mode mode) {
  skippipe::Schedule s;
  s.mode = mode;
  s.options.path_length = static_cast<int>(hops.size()) + 1;
  s.options.mbs_per_origin = 1;
  s.options.mbs_per_agent = 1;
  s.options.max_swap_distance = 2;  // (3, 1, 5): a swap 2 below the highest
  s.stage_of = {0, 1, 2, 3, 4, 5};
  s.agents = {skippipe::Agent{0, hops, 0.0, 1}};
  return s;
}

// The micro-batch's loss in one process, through stage 0's blocks, then the stages of `stages`, and
// the head; its backward accumulates into `gpt`.
double one_process(model::Gpt& gpt, const MicroBatchData& d, const std::vector<int>& stages) {
  const auto per = gpt.config().layers / 6;
  auto x = gpt.embed(d.tokens);
  for (std::int64_t b = 0; b < per; ++b) x = gpt.block(b, x);
  for (int s : stages) {
    for (std::int64_t b = s * per; b < (s + 1) * per; ++b) x = gpt.block(b, x);
  }
  const auto logits = gpt.head(x);
  const auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 256}), d.targets.reshape({-1}));
  loss.backward();
  return loss.item<double>();
}

// A pipeline small enough to train a dozen iterations in a test: 6 blocks in 3 stages on 8 nodes,
// paths of 2 stages.
using testing::small_pipeline_run;

// Stage 0 on node 0, stage 1 on node 1; `mbs` agents of one micro-batch each, one forward apart.
skippipe::Schedule two_nodes(int mbs) {
  skippipe::Schedule s;
  s.mode = skippipe::Mode::kSkipPipe;
  s.options.stages = 2;
  s.options.path_length = 2;
  s.options.mbs_per_origin = mbs;
  s.options.mbs_per_agent = 1;
  s.stage_of = {0, 1};
  for (int k = 0; k < mbs; ++k) s.agents.push_back(skippipe::Agent{0, {1}, static_cast<double>(k), 1});
  return s;
}

model::GptConfig two_block_gpt() {
  model::GptConfig g = tiny_gpt();
  g.layers = 2;
  return g;
}

}  // namespace

TEST_CASE("a skipping path's gradients are bit-identical to the same blocks run in one process, and the full path's to the whole model's") {
  for (const auto& hops : std::vector<std::vector<int>>{{3, 1, 5}, {1, 2, 3, 4, 5}}) {
    CAPTURE(hops.size());
    const auto mode = hops.size() == 5 ? skippipe::Mode::kFull : skippipe::Mode::kSkipPipe;
    const auto s = line(hops, mode);
    REQUIRE(skippipe::validate(s).ok());
    auto links = mesh(6);
    std::vector<PipelineNode> nodes;
    for (int n = 0; n < 6; ++n) nodes.emplace_back(n, s, model::Gpt(tiny_gpt()), links[static_cast<std::size_t>(n)]);
    const auto d = batch(7);
    const auto stats = run_all(nodes, {{0, {d}}});
    model::Gpt ref(tiny_gpt());
    double ref_loss = 0;
    if (mode == skippipe::Mode::kFull) {
      const auto logits = ref.forward(d.tokens);
      const auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 256}), d.targets.reshape({-1}));
      loss.backward();
      ref_loss = loss.item<double>();
    } else {
      ref_loss = one_process(ref, d, hops);
    }
    REQUIRE(stats[0].losses.size() == 1);
    CHECK(stats[0].losses[0] == ref_loss);
    // Node n holds stage n's blocks (and node 0 the embeddings and the head's LayerNorm).
    std::vector<at::Tensor> ref_by_order;
    for (const auto& block : ref.blocks()) {
      for (const auto& p : block.parameters) ref_by_order.push_back(p.tensor.grad());
    }
    // Walk the blocks in model order for each node: a node's stage parameters come in the same order.
    model::Gpt shape(tiny_gpt());
    std::size_t at = 0;
    for (const auto& block : shape.blocks()) {
      int stage = 0;
      if (block.name != "embed" && block.name != "final") stage = static_cast<int>(std::stoll(block.name.substr(6)));
      const auto& mine = nodes[static_cast<std::size_t>(stage)].stage_parameters();
      // Index of this block's first parameter within node `stage`'s list.
      std::size_t offset = 0;
      if (stage == 0) {
        offset = block.name == "embed" ? 0 : block.name == "final" ? mine.size() - block.parameters.size() : 2;
      }
      for (std::size_t k = 0; k < block.parameters.size(); ++k, ++at) {
        const at::Tensor got = mine[offset + k].grad();
        const at::Tensor& want = ref_by_order[at];
        CAPTURE(block.name);
        CHECK(got.defined() == want.defined());
        if (got.defined() && want.defined()) CHECK(torch::equal(got, want));
      }
    }
    for (const auto& st : stats) CHECK(st.peak_inflight <= 1);
  }
}

TEST_CASE("a 30-micro-batch iteration of the geo schedule: within 1e-6 of one process, replicas bit-identical after sync and step, memory held, bytes as the closed form") {
  const skippipe::Network net = skippipe::geo_network(20);
  const skippipe::Costs costs;
  const skippipe::Options o;
  skippipe::GcmaOptions g;
  g.trials = 500;
  auto stage_of = skippipe::assign_gcma(net, costs, o, g);
  REQUIRE(stage_of.ok());
  auto planned = skippipe::plan(net, costs, *stage_of, o, skippipe::Mode::kSkipPipe);
  REQUIRE(planned.ok());
  const skippipe::Schedule& s = planned->schedule;
  auto links = mesh(20);
  std::vector<PipelineNode> nodes;
  for (int n = 0; n < 20; ++n) nodes.emplace_back(n, s, model::Gpt(tiny_gpt()), links[static_cast<std::size_t>(n)]);
  // Each origin's micro-batches, in the schedule's order; the same data in one process.
  std::map<int, std::vector<MicroBatchData>> data;
  model::Gpt ref(tiny_gpt());
  std::uint64_t seed = 100;
  std::vector<int> stage_visits(6, 0);
  for (const auto& a : s.agents) {
    std::vector<int> stages;
    for (int h : a.hops) stages.push_back(s.stage_of[static_cast<std::size_t>(h)]);
    for (int k = 0; k < a.microbatches; ++k) {
      const auto d = batch(seed++);
      data[a.origin].push_back(d);
      one_process(ref, d, stages);
      ++stage_visits[0];
      for (int st : stages) ++stage_visits[static_cast<std::size_t>(st)];
    }
  }
  const auto stats = run_all(nodes, data);
  std::uint64_t messages = 0, bytes = 0;
  for (std::size_t n = 0; n < 20; ++n) {
    messages += stats[n].messages_sent;
    bytes += stats[n].bytes_sent;
    CHECK(stats[n].peak_inflight <= o.memory);
  }
  CHECK(messages == 30u * 2 * 4);
  // Each message: the header, the payload's header (fp32, 1 dim) and B x T x C floats.
  quant::EncodeOptions fp32;
  const std::size_t payload = quant::encode(torch::zeros({2 * 8 * 16}), fp32).size();
  CHECK(bytes == messages * (kActivationHeaderBytes + payload));

  // Sync each stage over its replicas (their own mesh), then AdamW on every node.
  std::map<int, std::vector<int>> replicas;
  for (int n = 0; n < 20; ++n) replicas[s.stage_of[static_cast<std::size_t>(n)]].push_back(n);
  std::vector<std::thread> threads;
  std::vector<Status> st(20);
  for (const auto& [stage, members] : replicas) {
    auto m = mesh(static_cast<int>(members.size()));
    for (std::size_t r = 0; r < members.size(); ++r) {
      optim::Group grp;
      grp.rank = static_cast<int>(r);
      grp.size = static_cast<int>(members.size());
      grp.peers = m[r];
      threads.emplace_back([&, grp, n = members[r]] { st[static_cast<std::size_t>(n)] = nodes[static_cast<std::size_t>(n)].sync_stage(grp, 1, Deadline::after(real_clock(), 30s)); });
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& x : st) REQUIRE_MESSAGE(x.ok(), x.to_string());
  // Against one process: each stage's gradient is the sum over its micro-batches over their number.
  std::vector<at::Tensor> ref_grads;
  {
    std::vector<int> stage_of_param;
    for (const auto& block : ref.blocks()) {
      const int stage = block.name == "embed" || block.name == "final" ? 0 : static_cast<int>(std::stoll(block.name.substr(6)));
      for (const auto& p : block.parameters) {
        ref_grads.push_back(p.tensor.grad() / stage_visits[static_cast<std::size_t>(stage)]);
        stage_of_param.push_back(stage);
      }
    }
    for (int n = 0; n < 20; ++n) {
      const int stage = s.stage_of[static_cast<std::size_t>(n)];
      std::vector<at::Tensor> want;
      for (std::size_t i = 0; i < ref_grads.size(); ++i) {
        if (stage_of_param[i] == stage) want.push_back(ref_grads[i]);
      }
      const auto& mine = nodes[static_cast<std::size_t>(n)].stage_parameters();
      REQUIRE(mine.size() == want.size());
      // Stage 0's list is embed, its block, final; the reference's is the same order.
      for (std::size_t i = 0; i < mine.size(); ++i) {
        const double scale = want[i].abs().max().item<double>() + 1e-12;
        CHECK((mine[i].grad() - want[i]).abs().max().item<double>() <= 1e-6 * scale);
      }
    }
  }
  for (auto& node : nodes) {
    torch::optim::AdamW adam(node.stage_parameters(), torch::optim::AdamWOptions(1e-3));
    adam.step();
  }
  for (const auto& [stage, members] : replicas) {
    for (std::size_t r = 1; r < members.size(); ++r) {
      const auto& a = nodes[static_cast<std::size_t>(members[0])].stage_parameters();
      const auto& b = nodes[static_cast<std::size_t>(members[r])].stage_parameters();
      for (std::size_t i = 0; i < a.size(); ++i) {
        CHECK(torch::equal(a[i].grad(), b[i].grad()));
        CHECK(torch::equal(a[i], b[i]));
      }
    }
  }
}

TEST_CASE("pipeline messages: a round trip, and malformed or oversized ones refused before allocating") {
  const auto x = torch::randn({2, 8, 16});
  ActivationHeader h;
  h.iteration = 9;
  h.microbatch = 4;
  h.hop = 2;
  const Bytes b = encode_activation(h, x, quant::EncodeOptions{});
  const ActivationLimits limits{2, 8, 16};
  auto back = decode_activation(b, limits);
  REQUIRE(back.ok());
  CHECK(back->first.microbatch == 4);
  CHECK(back->first.hop == 2);
  CHECK(torch::equal(back->second, x));
  CHECK(decode_activation(b, ActivationLimits{1, 8, 16}).status().code() == ErrorCode::kOutOfRange);  // a larger batch than this node takes
  CHECK(decode_activation(b, ActivationLimits{2, 8, 32}).status().code() == ErrorCode::kOutOfRange);  // another width
  Bytes bad = b;
  bad[4] = std::byte{2};
  CHECK(decode_activation(bad, limits).status().code() == ErrorCode::kVersionMismatch);
  std::mt19937_64 rng(33);
  int refused = 0;
  for (int k = 0; k < 3000; ++k) {
    const Bytes m = testing::mutate(b, rng);
    auto r = decode_activation(m, limits);
    if (!r.ok()) {
      ++refused;
      continue;
    }
    CHECK(r->second.numel() <= 2 * 8 * 16);
    CHECK(torch::isfinite(r->second).all().item<bool>());
  }
  CHECK(refused > 0);
}

TEST_CASE("a skip-trained model is assembled by stochastic depth's rule: each stage's residual branches scaled by its visit share") {
  RunConfig c = small_pipeline_run();
  auto corpus = load_corpus(c);
  REQUIRE(corpus.ok());
  auto scaled = PipelineTrainer::make(c, corpus->dataset);
  REQUIRE_MESSAGE(scaled.ok(), scaled.status().to_string());
  c.pipeline.depth_scaling = false;
  auto plain = PipelineTrainer::make(c, corpus->dataset);
  REQUIRE(plain.ok());
  // Every micro-batch visits stage 0 and path_length - 1 others: the shares of the others add up to that.
  const std::vector<double> shares = (*scaled)->stage_shares();
  REQUIRE(shares.size() == 3);
  CHECK(shares[0] == 1.0);
  CHECK(shares[1] + shares[2] == doctest::Approx(c.pipeline.path_length - 1));
  CHECK(shares[1] < 1.0);
  for (int i = 0; i < 3; ++i) {
    REQUIRE((*scaled)->step().ok());
    REQUIRE((*plain)->step().ok());
  }
  CHECK((*scaled)->stage_shares() == shares);  // one schedule all along
  const double with_scaling = (*scaled)->evaluate();
  const double as_trained = (*plain)->evaluate();
  CHECK(with_scaling != as_trained);
  // The same weights (the timetable makes both runs bit-identical), scaled by hand: the output
  // projections of every block of a non-zero stage, by its share.
  std::map<int, std::vector<at::Tensor>> stages;
  const std::vector<int> holders = (*plain)->stage_holders();
  model::Gpt names(gpt_config(c, 0));
  const std::int64_t per = c.model.layers / c.pipeline.stages;
  for (int st = 0; st < 3; ++st) {
    auto params = (*plain)->node_parameters(holders[static_cast<std::size_t>(st)]);
    std::vector<std::string> stage_names;
    for (const auto& block : names.blocks()) {
      const bool in_stage = block.name.rfind("block.", 0) == 0 ? std::stoll(block.name.substr(6)) / per == st : st == 0;
      if (in_stage) {
        for (const auto& p : block.parameters) stage_names.push_back(p.name);
      }
    }
    REQUIRE(stage_names.size() == params.size());
    for (std::size_t k = 0; k < params.size(); ++k) {
      params[k] = params[k].clone();
      if (st > 0 && stage_names[k].find(".proj.") != std::string::npos) params[k].mul_(shares[static_cast<std::size_t>(st)]);
    }
    stages[st] = params;
  }
  CHECK((*plain)->evaluate_with(stages, {}) == with_scaling);
  // Saved as a trained run's model, it loads back as the model that was evaluated.
  const auto dir = std::filesystem::temp_directory_path() / ("gossamer-pipeline-model-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  model::Gpt assembled = (*scaled)->assemble((*scaled)->stage_weights(), (*scaled)->depth_scales());
  REQUIRE(save_trained_model(dir, c, assembled, 3).ok());
  auto loaded = load_trained_model(dir);
  REQUIRE_MESSAGE(loaded.ok(), loaded.status().to_string());
  CHECK(loaded->step == 3);
  const auto tokens = torch::randint(0, 256, {2, c.model.context}, torch::kLong);
  loaded->model->train(false);
  {
    torch::NoGradGuard no_grad;
    CHECK(torch::equal(loaded->model->forward(tokens), assembled.forward(tokens)));
  }
  std::filesystem::remove_all(dir);
  CHECK((*plain)->depth_scales().empty());
  CHECK((*scaled)->depth_scales() == shares);
  // With one of the two non-zero stages left out, the other stands for a whole path's: unscaled.
  CHECK((*scaled)->depth_scales({1}) == std::vector<double>{1.0, 1.0, 1.0});
  CHECK((*scaled)->evaluate({1}) == (*plain)->evaluate({1}));
  // The full pipeline trains every stage on every micro-batch: its model is assembled as trained.
  c.pipeline.mode = PipelineMode::kFull;
  c.pipeline.depth_scaling = true;
  auto full = PipelineTrainer::make(c, corpus->dataset);
  REQUIRE(full.ok());
  CHECK((*full)->stage_shares() == std::vector<double>{1.0, 1.0, 1.0});
}

TEST_CASE("depth scales with stages left out: the kept stages add as many updates as a trained path, none more than its own") {
  RunConfig c = small_pipeline_run();
  c.model.layers = 5;
  c.pipeline.stages = 5;
  c.pipeline.path_length = 3;  // stage 0 and 2 of the 4 others
  c.pipeline.nodes = 12;
  auto corpus = load_corpus(c);
  REQUIRE(corpus.ok());
  auto t = PipelineTrainer::make(c, corpus->dataset);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  const auto shares = (*t)->stage_shares();
  REQUIRE(shares.size() == 5);
  double expected = 0;
  for (std::size_t st = 1; st < 5; ++st) expected += shares[st];
  CHECK(expected == doctest::Approx(2.0));
  const auto all = (*t)->depth_scales();
  CHECK(all == shares);
  // Three of four kept: stretched so that they add two stages' updates in all.
  const auto three = (*t)->depth_scales({4});
  double added = 0;
  for (std::size_t st = 1; st < 4; ++st) {
    CHECK(three[st] > shares[st]);
    added += three[st];
  }
  CHECK(added == doctest::Approx(2.0));
  // Two kept, as many as a path has: each adds its whole update.
  CHECK((*t)->depth_scales({3, 4}) == std::vector<double>{1.0, 1.0, 1.0, 1.0, 1.0});
}

TEST_CASE("a pipeline trainer learns: its loss falls over iterations, and leaving stages out at inference changes the loss") {
 for (const std::string mode : {"skippipe", "full"}) {
  CAPTURE(mode);
  RunConfig c = small_pipeline_run();
  c.pipeline.mode = *train::parse_choice<train::PipelineMode>(mode);
  auto corpus = load_corpus(c);
  REQUIRE(corpus.ok());
  auto t = PipelineTrainer::make(c, corpus->dataset);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  std::vector<double> losses;
  for (int i = 0; i < 12; ++i) {
    auto r = (*t)->step();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    losses.push_back(r->train_loss);
    CHECK(r->samples == (i + 1) * (*t)->samples_per_iteration());
  }
  CHECK(losses.back() < losses.front() - 0.3);
  const double full = (*t)->evaluate();
  const double without = (*t)->evaluate({2});
  CHECK(std::isfinite(full));
  CHECK(std::isfinite(without));
  CHECK(full != without);
  // The same config again: the same losses, bit for bit (each node follows the timetable, so its
  // gradients add up in the same order whatever order the threads deliver its messages in).
  auto again = PipelineTrainer::make(c, corpus->dataset);
  REQUIRE(again.ok());
  for (int i = 0; i < 12; ++i) CHECK((*again)->step()->train_loss == losses[static_cast<std::size_t>(i)]);
  CHECK((*again)->evaluate() == full);
  // First come, first served: it learns as well, to the last bits only in the first iteration.
  c.pipeline.order = PipelineOrder::kArrival;
  auto arrival = PipelineTrainer::make(c, corpus->dataset);
  REQUIRE(arrival.ok());
  CHECK((*arrival)->step()->train_loss == losses[0]);
  for (int i = 1; i < 3; ++i) CHECK((*arrival)->step()->train_loss == doctest::Approx(losses[static_cast<std::size_t>(i)]).epsilon(1e-5));
 }
}

TEST_CASE("outer methods inside the stages: replicas step on their own, DiLoCo's agree after each round, every method syncs far fewer bytes than ddp, and the loss falls") {
  std::map<std::string, std::uint64_t> bytes;
  for (const std::string sync : {"ddp", "diloco", "streaming_diloco", "noloco", "co2"}) {
    CAPTURE(sync);
    RunConfig c = small_pipeline_run();
    c.pipeline.stage_sync = *optim::parse_method(sync);
    c.diloco.inner_steps = 4;
    c.streaming_diloco.inner_steps = 4;
    c.noloco.inner_steps = 4;
    c.co2.inner_steps = 4;
    auto corpus = load_corpus(c);
    REQUIRE(corpus.ok());
    auto t = PipelineTrainer::make(c, corpus->dataset);
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    std::vector<double> losses;
    std::int64_t rounds = 0;
    for (int i = 1; i <= 12; ++i) {
      auto r = (*t)->step();
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      losses.push_back(r->train_loss);
      bytes[sync] += r->sync_bytes;
      rounds += r->sync_rounds;
      if (sync == "diloco") CHECK((r->sync_bytes > 0) == (i % 4 == 0));  // a round every 4 iterations
      if (sync == "diloco" && i % 4 == 0) {
        for (int stage = 0; stage < 3; ++stage) {
          const auto reps = (*t)->stage_replicas(stage);
          for (std::size_t k = 1; k < reps.size(); ++k) {
            for (std::size_t j = 0; j < reps[0].size(); ++j) CHECK(torch::equal(reps[k][j], reps[0][j]));
          }
        }
      }
    }
    CHECK(losses.back() < losses.front() - 0.3);
    std::size_t taking_part = 0;
    for (int stage = 0; stage < 3; ++stage) taking_part += (*t)->stage_replicas(stage).size();
    if (sync == "diloco") CHECK(rounds == 3 * static_cast<std::int64_t>(taking_part));  // 3 rounds on every node that takes part
    if (sync != "ddp") CHECK(rounds > 0);
  }
  MESSAGE("stage sync bytes over 12 iterations: ddp " << bytes["ddp"] << ", diloco " << bytes["diloco"] << ", streaming_diloco " << bytes["streaming_diloco"]
                                                      << ", noloco " << bytes["noloco"] << ", co2 " << bytes["co2"]);
  for (const std::string sync : {"diloco", "streaming_diloco", "noloco", "co2"}) {
    CAPTURE(sync);
    CHECK(bytes[sync] > 0);
    CHECK(bytes[sync] * 3 < bytes["ddp"]);
  }
}

TEST_CASE("a pipeline split over two trainers (as over two processes), each hosting half the nodes, trains bit for bit as one trainer hosting all") {
  RunConfig c = small_pipeline_run();
  auto corpus = load_corpus(c);
  REQUIRE(corpus.ok());
  auto whole = PipelineTrainer::make(c, corpus->dataset);
  REQUIRE(whole.ok());
  const int n = static_cast<int>(c.pipeline.nodes);
  auto activations = mesh(n), sync = mesh(n);
  std::array<std::unique_ptr<PipelineTrainer>, 2> halves;
  for (int h = 0; h < 2; ++h) {
    PipelineEnvironment env;
    env.link = [&activations, &sync](int from, int to, int channel) {
      return (channel == 0 ? activations : sync)[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)];
    };
    for (int v = h; v < n; v += 2) env.local.push_back(v);
    auto t = PipelineTrainer::make(c, corpus->dataset, env);
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    halves[static_cast<std::size_t>(h)] = std::move(*t);
  }
  CHECK((*whole)->can_evaluate());
  for (int i = 0; i < 4; ++i) {
    auto one = (*whole)->step();
    REQUIRE(one.ok());
    std::array<Result<PipelineRecord>, 2> rec{error(ErrorCode::kInternal, ""), error(ErrorCode::kInternal, "")};
    std::thread other([&] { rec[1] = halves[1]->step(); });
    rec[0] = halves[0]->step();
    other.join();
    REQUIRE_MESSAGE(rec[0].ok(), rec[0].status().to_string());
    REQUIRE_MESSAGE(rec[1].ok(), rec[1].status().to_string());
    CHECK(rec[0]->losses + rec[1]->losses == one->losses);
    CHECK((rec[0]->train_loss * rec[0]->losses + rec[1]->train_loss * rec[1]->losses) / one->losses == doctest::Approx(one->train_loss).epsilon(1e-12));
    CHECK(rec[0]->activation_bytes + rec[1]->activation_bytes == one->activation_bytes);
    CHECK(rec[0]->samples == one->samples);
    // Every replica, wherever hosted, holds the weights the single trainer's replicas hold.
    for (int stage = 0; stage < 3; ++stage) {
      const auto ref = (*whole)->stage_replicas(stage);
      REQUIRE_FALSE(ref.empty());
      std::size_t seen = 0;
      for (const auto& half : halves) {
        for (const auto& replica : half->stage_replicas(stage)) {
          ++seen;
          for (std::size_t j = 0; j < replica.size(); ++j) CHECK(torch::equal(replica[j], ref[0][j]));
        }
      }
      CHECK(seen == ref.size());
    }
  }
}

TEST_CASE("a pipeline goes on without lost nodes: rescheduled over the survivors, their weights kept, replicas still equal, the loss still falling") {
  for (const std::string mode : {"skippipe", "full"}) {
    CAPTURE(mode);
    RunConfig c = small_pipeline_run();
    c.pipeline.mode = *train::parse_choice<train::PipelineMode>(mode);
    auto corpus = load_corpus(c);
    REQUIRE(corpus.ok());
    auto t = PipelineTrainer::make(c, corpus->dataset);
    REQUIRE(t.ok());
    std::vector<double> losses;
    for (int i = 0; i < 4; ++i) losses.push_back((*t)->step()->train_loss);
    const auto& s = (*t)->plan().schedule;
    // A node of stage 1 that micro-batches visit, and (skipping) an origin that starts some.
    int hop = -1, origin = -1;
    const auto visits = node_visits(s);
    for (int v = 0; v < s.nodes(); ++v) {
      if (hop < 0 && s.stage_of[static_cast<std::size_t>(v)] == 1 && visits[static_cast<std::size_t>(v)] > 0) hop = v;
      if (origin < 0 && s.stage_of[static_cast<std::size_t>(v)] == 0 && visits[static_cast<std::size_t>(v)] > 0) origin = v;
    }
    REQUIRE(hop >= 0);
    const auto before = (*t)->stage_replicas(2);
    std::vector<at::Tensor> kept;
    for (const auto& p : before[0]) kept.push_back(p.clone());
    const std::vector<int> dead = mode == "skippipe" ? std::vector<int>{hop, origin} : std::vector<int>{hop};
    const Status excluded = (*t)->exclude(dead);
    REQUIRE_MESSAGE(excluded.ok(), excluded.to_string());
    CHECK((*t)->lost_nodes() == static_cast<std::int64_t>(dead.size()));
    const auto& after = (*t)->plan().schedule;
    for (const auto& a : after.agents) {  // nobody routes through the lost nodes, nor through a node that was idle
      for (int d : dead) {
        CHECK(a.origin != d);
        CHECK(std::find(a.hops.begin(), a.hops.end(), d) == a.hops.end());
      }
      CHECK(visits[static_cast<std::size_t>(a.origin)] > 0);
      for (int h : a.hops) CHECK(visits[static_cast<std::size_t>(h)] > 0);
    }
    // The survivors' weights are as they were.
    const auto now = (*t)->stage_replicas(2);
    for (std::size_t j = 0; j < kept.size(); ++j) CHECK(torch::equal(now[0][j], kept[j]));
    for (int i = 0; i < 8; ++i) {
      auto r = (*t)->step();
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      CHECK(r->lost_nodes == static_cast<std::int64_t>(dead.size()));
      losses.push_back(r->train_loss);
    }
    // No jump back up: every stage went on from its trained weights.
    CHECK(losses[4] < losses[3] + 0.3);
    CHECK(losses.back() < losses.front() - 0.3);
    for (int stage = 0; stage < 3; ++stage) {
      const auto reps = (*t)->stage_replicas(stage);
      REQUIRE_FALSE(reps.empty());
      for (std::size_t k = 1; k < reps.size(); ++k) {
        for (std::size_t j = 0; j < reps[0].size(); ++j) CHECK(torch::equal(reps[k][j], reps[0][j]));
      }
    }
    CHECK(std::isfinite((*t)->evaluate()));
    // A stage left without any node cannot go on.
    std::vector<int> stage2;
    for (int v = 0; v < after.nodes(); ++v) {
      if (after.stage_of[static_cast<std::size_t>(v)] == 2) stage2.push_back(v);
    }
    const Status st = (*t)->exclude(stage2);
    CHECK(st.code() == ErrorCode::kUnavailable);
    CHECK((*t)->step().ok());  // and the refused exclusion changed nothing
  }
}

TEST_CASE("a gradient of the wrong shape from a peer fails the node's iteration with an error, not a crash") {
  // Two stages on two nodes: the test plays the origin (node 0) by hand over its link to node 1.
  const skippipe::Schedule s = two_nodes(1);
  REQUIRE(skippipe::validate(s).ok());
  auto links = mesh(2);
  PipelineNode node(1, s, model::Gpt(two_block_gpt()), links[1]);
  Result<IterationStats> result = error(ErrorCode::kInternal, "not run");
  std::thread t([&] { result = node.run_iteration(1, {}, Deadline::after(real_clock(), 20s)); });
  const transport::Tag tag = transport::tags::kPipeline | 1u;
  ActivationHeader fwd;
  fwd.iteration = 1;
  fwd.microbatch = 0;
  fwd.hop = 1;
  REQUIRE(links[0][1]->send(tag, encode_activation(fwd, torch::randn({2, 8, 16}), quant::EncodeOptions{}), Deadline::after(real_clock(), 5s)).ok());
  auto back = links[0][1]->recv(tag, Deadline::after(real_clock(), 10s));  // its output, on to the origin
  REQUIRE(back.ok());
  ActivationHeader bwd;
  bwd.backward = true;
  bwd.iteration = 1;
  bwd.microbatch = 0;
  bwd.hop = 1;
  REQUIRE(links[0][1]->send(tag, encode_activation(bwd, torch::randn({2, 4, 16}), quant::EncodeOptions{}), Deadline::after(real_clock(), 5s)).ok());
  t.join();
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == ErrorCode::kMalformed);
}

TEST_CASE("following a timetable, a message that comes twice fails the iteration at once, not at its deadline") {
  // Two stages on two nodes, two micro-batches; the test plays the origin (node 0) by hand.
  skippipe::Schedule s = two_nodes(2);
  skippipe::Costs costs;
  costs.forward_s = 1.0;
  costs.activation_bytes = 1000;
  auto timed = skippipe::simulate(s, skippipe::uniform_network(2, 0.01, 1e9), costs);
  REQUIRE(timed.ok());
  s.timetable = timed->timetable;
  REQUIRE(skippipe::validate(s).ok());
  auto links = mesh(2);
  PipelineNode node(1, s, model::Gpt(two_block_gpt()), links[1]);
  Result<IterationStats> result = error(ErrorCode::kInternal, "not run");
  const auto started = std::chrono::steady_clock::now();
  std::thread t([&] { result = node.run_iteration(1, {}, Deadline::after(real_clock(), 60s)); });
  const transport::Tag tag = transport::tags::kPipeline | 1u;
  ActivationHeader fwd;
  fwd.iteration = 1;
  fwd.microbatch = 0;
  fwd.hop = 1;
  const Bytes m = encode_activation(fwd, torch::randn({2, 8, 16}), quant::EncodeOptions{});
  REQUIRE(links[0][1]->send(tag, m, Deadline::after(real_clock(), 5s)).ok());
  REQUIRE(links[0][1]->recv(tag, Deadline::after(real_clock(), 10s)).ok());  // its output, on to the origin
  REQUIRE(links[0][1]->send(tag, m, Deadline::after(real_clock(), 5s)).ok());  // the same forward again
  t.join();
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == ErrorCode::kMalformed);
  CHECK(result.status().message().find("twice") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - started < 30s);
}
