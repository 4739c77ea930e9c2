// The simulator over the real peer runtime: the same training as the scenario runner, in virtual
// time, deterministic.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include "sim/cluster.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;

namespace {

train::RunConfig tiny(const std::string& method) {
  train::RunConfig c = testing::tiny_run(method, 3, 24);
  c.diloco.inner_steps = 6;
  c.noloco.inner_steps = 6;
  c.co2.inner_steps = 6;
  c.streaming_diloco.inner_steps = 6;
  c.streaming_diloco.fragment_layers = 1;
  return c;
}

std::vector<double> losses(const ClusterResult& r) {
  std::vector<double> out;
  for (const auto& rec : r.records) {
    if (rec.contains("val_loss")) out.push_back(rec["val_loss"].get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("peer runtime in the simulator: the same losses as the scenario runner, bit for bit") {
  for (const char* method : {"ddp", "diloco", "streaming_diloco", "noloco", "co2"}) {
    CAPTURE(method);
    const auto c = tiny(method);
    auto corpus = train::load_corpus(c);
    REQUIRE(corpus.ok());
    auto a = run_cluster(c, *corpus);
    REQUIRE(a.ok());
    auto b = run_peer_cluster(c, *corpus);
    REQUIRE(b.ok());
    CHECK(losses(*a) == losses(*b));
    for (std::size_t w = 0; w < a->final_params.size(); ++w) CHECK(torch::equal(a->final_params[w], b->final_params[w]));
    MESSAGE(method << ": sim time " << a->sim_time_s << " s -> " << b->sim_time_s << " s; bytes " << a->accounts[0].bytes_sent << " -> "
                   << b->accounts[0].bytes_sent << " (gossip " << b->accounts[0].gossip_bytes_sent << ")");
  }
}
