// Link probes: what a pipeline across processes measures of its own network before it plans
// (pipeline.network = measured), so that the scheduler assigns stages and routes micro-batches over
// the links the nodes really have rather than over a table.
//
// Every pair of nodes is measured once, by the lower node, over the link they already share: `pings`
// round trips of a small message, then `bulks` messages of `bulk_bytes` (a hop's size), each
// answered by a byte, then pings again: the pair's latency is half the fastest ping, its bandwidth
// the bytes over the time the fastest timed message took beyond that. A timed message that came
// back no slower than a ping (other pairs' traffic held the pings up) has the pair measured again,
// up to three times. The pairs go in rounds of a round-robin tournament, so a node
// measures one link at a time and no measurement shares a node's access link with another. Each node
// also times a stage's forward on its machine. Then every node sends what it measured to every other
// (a row: its forward time and its pairs above it), and each assembles the same network from the same
// rows, so the nodes plan the same schedule.
//
// Rows come from other processes: decode_probe_row() checks sizes and values (finite, in range) and
// refuses anything else with kMalformed.
// Threading: probe_links() blocks the calling thread (it takes every link's probe messages, tags
// transport::tags::kLinkProbeAsk and kLinkProbeAnswer, and nothing else); the rest are plain functions.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/status.h"
#include "skippipe/topology.h"
#include "transport/link.h"

namespace gossamer::runtime {

struct ProbeOptions {
  int pings = 5;                  // round trips per pair; the fastest counts
  std::size_t bulk_bytes = 1 << 20;  // the timed message (a hop's size)
  int bulks = 3;                  // timed messages per pair; the fastest counts (a machine busy for a moment slows one)
  Deadline deadline = Deadline::never();
  const std::atomic<bool>* stop = nullptr;  // true: give up at once (kAborted), a waiting receive included
};

// One node's measurements: its stage forward time, and one entry per node above it.
struct ProbeRow {
  double forward_s = 0;
  std::vector<double> latency_s;      // to node self + 1 + k, one way
  std::vector<double> bandwidth_Bps;  // the same pairs
};

// Measures this node's links to the nodes above it (links[j] reaches node j; links[self] unused)
// and answers the probes of the nodes below it. Every node of `links` must call it at the same time.
[[nodiscard]] Result<ProbeRow> probe_links(const std::vector<std::shared_ptr<transport::Link>>& links, int self, const ProbeOptions& options);

inline constexpr std::uint8_t kRowVersion = 1;  // of encode_probe_row's bytes (docs/wire.md)
Bytes encode_probe_row(const ProbeRow& row);
// Node `from`'s row among `nodes`: nodes - from - 1 pairs.
[[nodiscard]] Result<ProbeRow> decode_probe_row(ByteView bytes, int nodes, int from);

// The network and per-node forward times that every node's row (rows[v] is node v's) describe.
struct MeasuredNetwork {
  skippipe::Network network;
  std::vector<double> forward_s;  // per node
};
[[nodiscard]] Result<MeasuredNetwork> measured_network(const std::vector<ProbeRow>& rows);

// The pairs of round `round` (0 .. rounds - 1) of a round-robin over `nodes` nodes: partner[v] is v's
// partner, or -1 where v sits the round out (an odd count). Every pair meets in exactly one round.
int probe_rounds(int nodes);
std::vector<int> probe_partners(int nodes, int round);

}  // namespace gossamer::runtime
