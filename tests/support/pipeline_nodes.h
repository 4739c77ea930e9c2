// Pipeline nodes as processes run them (runtime/pipeline_process.h), each with its own TCP transport on
// loopback and its own trainer hosting only that node, all in threads of the test.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/pipeline_process.h"
#include "transport/tcp_transport.h"

namespace gossamer::testing {

struct Node {
  std::unique_ptr<transport::Transport> transport;
  Result<runtime::PipelineProcessOutcome> outcome = error(ErrorCode::kInternal, "not run");
  std::vector<train::PipelineRecord> records;
  std::vector<std::optional<double>> vals;
};

inline runtime::PipelineProcessRequest request(const train::RunConfig& c, int node, const std::vector<std::string>& addresses, Nanos connect_timeout) {
  runtime::PipelineProcessRequest req;
  req.config = c;
  req.clock = &real_clock();
  req.node = node;
  req.addresses = addresses;
  req.connect_timeout = connect_timeout;
  return req;
}

inline std::vector<Node> start_transports(const train::RunConfig& c, std::vector<std::string>& addresses) {
  std::vector<Node> nodes(static_cast<std::size_t>(c.pipeline.nodes));
  for (std::size_t v = 0; v < nodes.size(); ++v) {
    transport::TcpOptions o;
    o.self = transport::PeerId{v + 1};
    o.run = runtime::pipeline_run_id(c);
    auto t = transport::make_tcp_transport(o);
    REQUIRE(t.ok());
    addresses.push_back((*t)->address());
    nodes[v].transport = std::move(*t);
  }
  return nodes;
}

// Every node in a thread of its own, each one's request as `adjust` leaves it; each iteration's
// summed losses (train_loss x losses) and validation losses, per node.
struct Curves {
  std::vector<std::vector<double>> losses;
  std::vector<std::optional<double>> vals;
};
inline Curves run_nodes(const train::RunConfig& config, std::vector<Node>& nodes, const std::vector<std::string>& addresses, const data::Dataset& data,
                        const std::function<void(std::size_t, runtime::PipelineProcessRequest&)>& adjust) {
  Curves out;
  out.losses.resize(nodes.size());
  out.vals.resize(nodes.size());
  std::vector<std::thread> threads;
  for (std::size_t v = 0; v < nodes.size(); ++v) {
    threads.emplace_back([&, v] {
      runtime::PipelineProcessRequest req = request(config, static_cast<int>(v), addresses, std::chrono::seconds(30));
      req.rejoin_timeout = std::chrono::seconds(3);
      req.on_iteration = [&out, v](const train::PipelineRecord& r, std::optional<double> val) {
        out.losses[v].push_back(r.train_loss * static_cast<double>(r.losses));
        if (val) out.vals[v] = val;
      };
      adjust(v, req);
      nodes[v].outcome = runtime::run_pipeline_process(req, *nodes[v].transport, data);
      // A node that failed or stopped is a process that exits: it listens no more, and the others
      // stop waiting for it as for one still inside the failed iteration.
      if (!nodes[v].outcome.ok() || nodes[v].outcome->stopped) nodes[v].transport.reset();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace gossamer::testing
