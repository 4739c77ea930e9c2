// A run (and a network) small enough for the simulator's tests: a 2-block GPT of width 32 on a small synthetic
// corpus, fixed compute of 0.05 s per step. Tests set their own steps, methods and networks.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

#include <doctest/doctest.h>

#include "sim/cluster.h"
#include "sim/network.h"
#include "train/run.h"
#include "train/config.h"

namespace gossamer::sim::testing {

inline train::RunConfig tiny_run(const std::string& method, int workers, int steps) {
  train::RunConfig c;
  c.model.layers = 2;
  c.model.width = 32;
  c.model.heads = 2;
  c.model.context = 16;
  c.data.synthetic.bytes = 60'000;
  c.train.batch_size = 4;
  c.train.steps = steps;
  c.train.warmup_steps = steps / 6;
  c.train.eval_every = steps / 2;
  c.train.eval_batches = 2;
  const auto parsed = optim::parse_method(method);
  if (!parsed.ok()) throw std::invalid_argument(parsed.status().message());
  c.outer.method = *parsed;
  c.sim.workers = workers;
  c.sim.compute = train::ComputeModel::kFixed;
  c.sim.step_time_s = 0.05;
  return c;
}

// Runs the simulation of `c`, failing the test (with the error) when it does not run.
inline ClusterResult simulate(const train::RunConfig& c) {
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  auto r = run_cluster(c, *corpus);
  if (!r.ok()) FAIL(r.status().to_string());
  return std::move(*r);
}

// n nodes on 100 Mbit/s links of 10 ms one way with 1 ms of jitter, no shared uplinks.
inline NetworkSpec lan(int n) {
  NetworkSpec spec;
  transport::LinkProfile link;
  link.bandwidth_bytes_per_s = 100e6 / 8;
  link.latency = std::chrono::milliseconds(10);
  link.jitter = std::chrono::milliseconds(1);
  for (int i = 0; i < n; ++i) spec.nodes.push_back(NodeSpec{link, -1});
  return spec;
}

}  // namespace gossamer::sim::testing
