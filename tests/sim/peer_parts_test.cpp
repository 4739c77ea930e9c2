// The Peer's parts taken one at a time over the simulator's gossip and links: learn_run alone, then
// link_up and join_or_start, each checked for what it settles.
#include <doctest/doctest.h>

#include <memory>
#include <set>
#include <vector>

#include "runtime/peer_runtime.h"
#include "sim/gossip_fabric.h"
#include "sim/network.h"
#include "sim/scheduler.h"
#include "sim/transport_fabric.h"
#include "tiny.h"
#include "train/run.h"

using namespace gossamer;
using namespace gossamer::sim;
using namespace std::chrono_literals;

namespace {

using testing::lan;

std::string host_of(int i) { return "198.18.0." + std::to_string(i + 1); }

// n simulated hosts, each with a gossip node (seeded with host 0) and a Peer on it.
struct Hosts {
  explicit Hosts(int n, const train::RunConfig& config)
      : config(config), net(scheduler, lan(n)), gossip(scheduler, net), links(scheduler, net) {
    auto c = train::load_corpus(config);
    REQUIRE(c.ok());
    corpus = std::make_shared<const train::Corpus>(std::move(*c));
  }

  // Gossip node i (call from an actor).
  transport::Gossip& node(int i) {
    transport::GossipOptions o;
    o.bind = "tcp://" + host_of(i) + ":7000";
    if (i > 0) o.seeds = {"tcp://" + host_of(0) + ":7000"};
    o.self = transport::PeerId{static_cast<std::uint64_t>(i + 1)};
    auto g = gossip.make(i, o, static_cast<std::uint64_t>(i) + 11);
    REQUIRE(g.ok());
    nodes.push_back(std::move(*g));
    return *nodes.back();
  }

  // Host i: the virtual clock, gossip node `g`, links from the fabric; no dial-back check.
  struct TestHost final : runtime::Host {
    TestHost(Hosts& h, int i, transport::Gossip& g) : hosts(h), index(i), gossip_node(g) {}
    Clock& clock() override { return hosts.scheduler; }
    transport::Gossip& gossip() override { return gossip_node; }
    std::string gossip_announced() const override { return host_of(index) + ":7000"; }
    Result<runtime::OpenedLinks> open_links(const Digest&) override {
      auto t = hosts.links.make(index, host_of(index) + ":7001", gossip_node.self());
      if (!t.ok()) return t.status();
      runtime::OpenedLinks out;
      out.transport = std::move(*t);
      out.announced = out.bound = host_of(index) + ":7001";
      return out;
    }
    std::optional<Result<transport::Reachability>> check_reachable(const std::vector<std::string>&, const std::atomic<bool>*) override {
      return std::nullopt;
    }
    Hosts& hosts;
    int index;
    transport::Gossip& gossip_node;
  };

  runtime::PeerEnvironment environment(int i, transport::Gossip& g) {
    hosts.push_back(std::make_unique<TestHost>(*this, i, g));
    runtime::PeerEnvironment env;
    env.host = hosts.back().get();
    env.name = std::to_string(i);
    env.evaluate = false;
    env.set_threads = false;
    env.corpus = [this](const train::RunConfig&) -> Result<std::shared_ptr<const train::Corpus>> { return corpus; };
    return env;
  }

  train::RunConfig config;
  std::shared_ptr<const train::Corpus> corpus;
  Scheduler scheduler;
  Network net;
  GossipFabric gossip;
  TransportFabric links;
  std::vector<std::unique_ptr<transport::Gossip>> nodes;  // cleared by the tests inside their actor, after the peers
  std::vector<std::unique_ptr<TestHost>> hosts;            // outlive the peers on them
};

train::RunConfig small() {
  train::RunConfig c = testing::tiny_run("diloco", 3, 24);
  c.diloco.inner_steps = 6;
  return c;
}

runtime::PeerPlan first_plan(const std::string& toml, std::uint32_t wait_for) {
  runtime::PeerPlan plan;
  plan.own_spec = toml;
  plan.first = true;
  plan.wait_for = wait_for;
  return plan;
}

}  // namespace

TEST_CASE("learn_run alone: a joiner takes the announced spec and its schedule, and one whose own config differs is told what to do") {
  const train::RunConfig config = small();
  const std::string toml = train::to_toml(config);
  Hosts hosts(3, config);
  auto actor = hosts.scheduler.start_thread([&] {
    transport::Gossip& g0 = hosts.node(0);
    transport::Gossip& g1 = hosts.node(1);
    transport::Gossip& g2 = hosts.node(2);
    {
      runtime::Peer first(first_plan(toml, 3), hosts.environment(0, g0));
      const Status learned = first.learn_run();
      REQUIRE_MESSAGE(learned.ok(), learned.to_string());
      CHECK(first.config().train.steps == 24);

      runtime::Peer joiner(runtime::PeerPlan{}, hosts.environment(1, g1));
      REQUIRE(joiner.learn_run().ok());
      CHECK(joiner.config().train.steps == 24);
      CHECK(joiner.config().outer.method == optim::Method::kDiLoCo);
      CHECK(joiner.schedule().period == first.schedule().period);

      train::RunConfig other = config;
      other.train.steps = 48;
      runtime::PeerPlan plan;
      plan.own_spec = train::to_toml(other);
      runtime::Peer stranger(std::move(plan), hosts.environment(2, g2));
      const Status st = stranger.learn_run();
      CHECK(st.code() == ErrorCode::kInvalidArgument);
      CHECK(st.message().find("drop --config") != std::string::npos);
    }
    hosts.nodes.clear();
  });
  REQUIRE(hosts.scheduler.run().ok());
}

TEST_CASE("link_up and join_or_start alone: the peers form the starting group, each on its own shard, before any step") {
  const train::RunConfig config = small();
  const std::string toml = train::to_toml(config);
  Hosts hosts(3, config);
  std::vector<int> shards, counts;
  std::vector<std::size_t> members;
  auto main = hosts.scheduler.start_thread([&] {
    std::vector<transport::Gossip*> g;
    for (int i = 0; i < 3; ++i) g.push_back(&hosts.node(i));
    std::vector<std::unique_ptr<runtime::Peer>> peers;
    peers.push_back(std::make_unique<runtime::Peer>(first_plan(toml, 3), hosts.environment(0, *g[0])));
    for (int i = 1; i < 3; ++i) peers.push_back(std::make_unique<runtime::Peer>(runtime::PeerPlan{}, hosts.environment(i, *g[static_cast<std::size_t>(i)])));
    std::vector<Status> outcome(3);
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (std::size_t i = 0; i < 3; ++i) {
      threads.push_back(hosts.scheduler.start_thread([&, i] {
        runtime::Peer& p = *peers[i];
        outcome[i] = p.learn_run();
        if (outcome[i].ok()) outcome[i] = p.link_up();
        if (outcome[i].ok()) outcome[i] = p.join_or_start();
      }));
    }
    for (auto& t : threads) t->join();
    for (std::size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      REQUIRE_MESSAGE(outcome[i].ok(), outcome[i].to_string());
      shards.push_back(peers[i]->shard());
      counts.push_back(peers[i]->shards());
      members.push_back(peers[i]->members().size());
      CHECK(peers[i]->steps_done() == 0);
    }
    CHECK(hosts.scheduler.now() < 10s);
    peers.clear();
    hosts.nodes.clear();
  });
  REQUIRE(hosts.scheduler.run().ok());
  CHECK(std::set<int>(shards.begin(), shards.end()) == std::set<int>{0, 1, 2});
  CHECK(counts == std::vector<int>{3, 3, 3});
  CHECK(members == std::vector<std::size_t>{3, 3, 3});
}
