// A SkipPipe pipeline across "processes" (runtime/pipeline_process.h): each node with its own TCP
// transport on loopback, its own trainer hosting only that node, all in threads of this test. The
// losses and the final validation loss are those of the same config in one trainer, bit for bit; a
// process of another config is refused at the handshake; a node that stops makes the others fail at
// once instead of hanging.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <thread>

#include "runtime/pipeline_process.h"
#include "support/pipeline_config.h"
#include "support/pipeline_nodes.h"
#include "train/run.h"
#include "transport/tcp_transport.h"

using namespace gossamer;
using namespace gossamer::runtime;
using namespace gossamer::testing;

namespace {

train::RunConfig small_pipeline() { return small_pipeline_processes(4); }

// The survivors learnt what one trainer that drops `dead` after `before` iterations learns: each
// iteration's mean loss (but `unrecorded`'s, when the lost node's own losses of it are missing) and
// the final validation loss, to the last bit.
void check_as_excluding(const train::RunConfig& run, const data::Dataset& data, const Curves& curves, int dead, int before, int unrecorded = -1) {
  auto whole = train::PipelineTrainer::make(run, data);
  REQUIRE(whole.ok());
  for (int i = 0; i < run.train.steps; ++i) {
    if (i == before) REQUIRE((*whole)->exclude({dead}).ok());
    auto one = (*whole)->step();
    REQUIRE(one.ok());
    if (i == unrecorded) continue;
    double sum = 0;
    for (const auto& node : curves.losses) {
      if (static_cast<std::size_t>(i) < node.size()) sum += node[static_cast<std::size_t>(i)];
    }
    CHECK(sum / static_cast<double>(one->losses) == doctest::Approx(one->train_loss).epsilon(1e-12));
  }
  std::optional<double> val;
  for (std::size_t v = 0; v < curves.vals.size(); ++v) {
    if (static_cast<int>(v) != dead && curves.vals[v]) val = curves.vals[v];
  }
  REQUIRE(val.has_value());
  CHECK(*val == (*whole)->evaluate());
}

}  // namespace

TEST_CASE("a pipeline across processes over shaped TCP links: the same losses and validation loss as one trainer, bit for bit") {
  const auto c = small_pipeline();
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  std::vector<std::string> addresses;
  auto nodes = start_transports(c, addresses);
  {
    std::vector<std::thread> threads;
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      threads.emplace_back([&, v] {
        PipelineProcessRequest req = request(c, static_cast<int>(v), addresses, std::chrono::seconds(30));
        // Shaped links keep what is still on its way when closed abruptly: the goodbye at the end
        // lets every node finish first.
        transport::LinkProfile shape;
        shape.bandwidth_bytes_per_s = 1e9 / 8;
        shape.latency = std::chrono::milliseconds(2);
        req.shape = shape;
        req.on_iteration = [&, v](const train::PipelineRecord& r, std::optional<double> val) {
          nodes[v].records.push_back(r);
          nodes[v].vals.push_back(val);
        };
        nodes[v].outcome = run_pipeline_process(req, *nodes[v].transport, corpus->dataset);
      });
    }
    for (auto& t : threads) t.join();
  }
  auto whole = train::PipelineTrainer::make(c, corpus->dataset);
  REQUIRE(whole.ok());
  std::string hash;
  int evaluators = 0;
  for (auto& n : nodes) {
    REQUIRE_MESSAGE(n.outcome.ok(), n.outcome.status().to_string());
    CHECK(n.outcome->iterations == 4);
    if (hash.empty()) hash = n.outcome->schedule_hash;
    CHECK(n.outcome->schedule_hash == hash);
  }
  CHECK(hash == (*whole)->plan().schedule.hash().hex());
  for (int i = 0; i < 4; ++i) {
    auto one = (*whole)->step();
    REQUIRE(one.ok());
    // Each origin's losses, summed in node order as the single trainer sums them: the same value.
    double sum = 0;
    std::int64_t count = 0;
    std::uint64_t bytes = 0;
    for (auto& n : nodes) {
      const auto& r = n.records[static_cast<std::size_t>(i)];
      sum += r.train_loss * static_cast<double>(r.losses);
      count += r.losses;
      bytes += r.activation_bytes;
    }
    CHECK(count == one->losses);
    CHECK(sum / static_cast<double>(count) == doctest::Approx(one->train_loss).epsilon(1e-12));
    CHECK(bytes == one->activation_bytes);
    if (i % 2 == 1) {
      const double expected = (*whole)->evaluate();
      for (auto& n : nodes) {
        const auto& val = n.vals[static_cast<std::size_t>(i)];
        if (!val) continue;
        ++evaluators;
        CHECK(*val == expected);  // the weights sent over TCP assemble the same model
      }
    }
  }
  CHECK(evaluators == 2);  // one node evaluates, at iterations 2 and 4
  // The evaluator keeps the whole model of the end, the one-process trainer's (depth-scaled alike).
  int models = 0;
  const auto assembled = (*whole)->assemble((*whole)->stage_weights(), (*whole)->depth_scales());
  for (auto& n : nodes) {
    if (!n.outcome->model) continue;
    ++models;
    CHECK(n.outcome->final_val_loss.has_value());
    const auto mine = n.outcome->model->blocks(), theirs = assembled.blocks();
    REQUIRE(mine.size() == theirs.size());
    for (std::size_t b = 0; b < mine.size(); ++b) {
      for (std::size_t k = 0; k < mine[b].parameters.size(); ++k) CHECK(torch::equal(mine[b].parameters[k].tensor, theirs[b].parameters[k].tensor));
    }
  }
  CHECK(models == 1);
}

TEST_CASE("a pipeline across processes: another config is refused at the handshake, and a node that stops fails the others at once") {
  const auto c = small_pipeline();
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  SUBCASE("another config") {
    std::vector<std::string> addresses;
    auto nodes = start_transports(c, addresses);
    auto other = c;
    other.train.lr = 2e-2;
    transport::TcpOptions o;
    o.self = transport::PeerId{2};
    o.run = pipeline_run_id(other);
    auto stranger = transport::make_tcp_transport(o);
    REQUIRE(stranger.ok());
    const PipelineProcessRequest req = request(other, 1, addresses, std::chrono::seconds(5));
    auto r = run_pipeline_process(req, **stranger, corpus->dataset);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("another config") != std::string::npos);
  }
  SUBCASE("a stop while linking, with a node that never comes") {
    std::vector<std::string> addresses;
    auto nodes = start_transports(c, addresses);
    std::atomic<bool> stop{true};  // Ctrl-C already pressed: seen within one short accept wait
    PipelineProcessRequest req = request(c, 0, addresses, std::chrono::minutes(5));  // waits for the 7 above it, which never start
    req.stop = &stop;
    const auto started = std::chrono::steady_clock::now();
    auto r = run_pipeline_process(req, *nodes[0].transport, corpus->dataset);
    REQUIRE(r.ok());
    CHECK(r->stopped);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));  // not the 5 minutes
  }
  SUBCASE("a node stops, and the others go on without it as one trainer excluding it would") {
    std::vector<std::string> addresses;
    auto nodes = start_transports(c, addresses);
    auto run = c;
    run.train.steps = 6;
    std::atomic<bool> stop{false};
    const Curves curves = run_nodes(run, nodes, addresses, corpus->dataset, [&](std::size_t v, PipelineProcessRequest& req) {
      if (v != 3) return;
      req.stop = &stop;
      req.on_iteration = [&, record = req.on_iteration](const train::PipelineRecord& r, std::optional<double> val) {
        record(r, val);
        if (r.iteration == 2) stop = true;
      };
    });
    REQUIRE(nodes[3].outcome.ok());
    CHECK(nodes[3].outcome->stopped);
    CHECK(nodes[3].outcome->iterations == 2);
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      if (v == 3) continue;
      REQUIRE_MESSAGE(nodes[v].outcome.ok(), "node " << v << ": " << nodes[v].outcome.status().to_string());
      CHECK(nodes[v].outcome->iterations == 6);
      CHECK(nodes[v].outcome->lost_nodes == 1);
      CHECK(nodes[v].outcome->retried_iterations == 1);
    }
    check_as_excluding(run, corpus->dataset, curves, 3, 2);
  }
  SUBCASE("a node lost while it confirms an iteration: the nodes that did not hear it catch up, and all go on as one trainer excluding it would") {
    std::vector<std::string> addresses;
    auto nodes = start_transports(c, addresses);
    auto run = c;
    run.train.steps = 6;
    // Node 3 confirms iteration 2 to nodes 0-2 only: they apply it, nodes 4-7 do not yet.
    const Curves curves = run_nodes(run, nodes, addresses, corpus->dataset, [](std::size_t v, PipelineProcessRequest& req) {
      if (v == 3) req.crash_while_confirming = 2;
    });
    REQUIRE_FALSE(nodes[3].outcome.ok());
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      if (v == 3) continue;
      REQUIRE_MESSAGE(nodes[v].outcome.ok(), "node " << v << ": " << nodes[v].outcome.status().to_string());
      CHECK(nodes[v].outcome->iterations == 6);
      CHECK(nodes[v].outcome->lost_nodes == 1);
      CHECK(curves.losses[v].size() == 6);  // the caught-up iteration recorded once, in its place
    }
    // Node 3 took part in iteration 2, but its own losses of it were never recorded.
    check_as_excluding(run, corpus->dataset, curves, 3, 2, 1);
  }
}

TEST_CASE("a pipeline across processes planned on measured links: every node measures the same network and plans the same schedule on it") {
  auto c = small_pipeline();
  c.pipeline.network = train::PipelineNetwork::kMeasured;
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  // One process and the simulator have no links to measure.
  CHECK(train::PipelineTrainer::make(c, corpus->dataset).status().code() == ErrorCode::kInvalidArgument);
  std::vector<std::string> addresses;
  auto nodes = start_transports(c, addresses);
  // Node 5 sends through a slow link: 20 Mbit/s, 15 ms.
  run_nodes(c, nodes, addresses, corpus->dataset, [](std::size_t v, PipelineProcessRequest& req) {
    if (v != 5) return;
    transport::LinkProfile slow;
    slow.bandwidth_bytes_per_s = 20e6 / 8;
    slow.latency = std::chrono::milliseconds(15);
    req.shape = slow;
  });
  std::string hash;
  for (auto& n : nodes) {
    REQUIRE_MESSAGE(n.outcome.ok(), n.outcome.status().to_string());
    CHECK(n.outcome->iterations == 4);
    REQUIRE(n.outcome->measured.has_value());
    if (hash.empty()) hash = n.outcome->schedule_hash;
    CHECK(n.outcome->schedule_hash == hash);
    // The same rows everywhere: the same network, to the bit.
    CHECK(n.outcome->measured->network.latency_s == nodes[0].outcome->measured->network.latency_s);
    CHECK(n.outcome->measured->network.bandwidth_Bps == nodes[0].outcome->measured->network.bandwidth_Bps);
    CHECK(n.outcome->measured->forward_s == nodes[0].outcome->measured->forward_s);
    CHECK(pipeline_summary_json(0, *n.outcome).contains("measured_network"));
  }
  const auto& net = nodes[0].outcome->measured->network;
  for (int v = 0; v < 5; ++v) {
    CAPTURE(v);
    CHECK(net.latency(v, 5) > 0.005);  // half of node 5's 15 ms answer, at least
    for (int w = v + 1; w < 5; ++w) CHECK(net.latency(v, w) < net.latency(v, 5));
  }
  for (double f : nodes[0].outcome->measured->forward_s) CHECK(f > 0);
}
