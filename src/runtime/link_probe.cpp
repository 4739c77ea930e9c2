#include "runtime/link_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "core/wire.h"
#include "transport/tags.h"

namespace gossamer::runtime {

namespace {

// The lower node asks (the first byte says what: a ping, a timed message, or done), the higher one
// answers each ask but the last with one byte.
constexpr transport::Tag kAskTag = transport::tags::kLinkProbeAsk;
constexpr transport::Tag kAnswerTag = transport::tags::kLinkProbeAnswer;
constexpr std::uint8_t kPing = 0, kBulk = 1, kDone = 2;
// Times a pair is measured again when its timed message came back faster than a ping did (traffic
// of other pairs held the pings up, so the round trip is not the link's).
constexpr int kAttempts = 3;

// What a row may say: a forward of at most an hour, latencies of at most a minute, bandwidths from
// 1 byte/s to 1 TB/s (a link faster than the probe can time is counted at the top).
constexpr double kMaxForward = 3600, kMaxLatency = 60, kMinBandwidth = 1, kMaxBandwidth = 1e12;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A receive that gives up when `o.stop` turns true: it waits in slices of 200 ms.
Result<Bytes> receive(transport::Link& link, transport::Tag tag, const ProbeOptions& o) {
  while (true) {
    if (o.stop != nullptr && o.stop->load()) return error(ErrorCode::kAborted, "stopped");
    const Deadline slice = Deadline::at(std::min(o.deadline.time(), real_clock().now() + std::chrono::milliseconds(200)));
    auto got = link.recv(tag, o.stop != nullptr ? slice : o.deadline);
    if (got.ok() || got.status().code() != ErrorCode::kTimeout || o.deadline.expired(real_clock())) return got;
  }
}

}  // namespace

int probe_rounds(int nodes) { return nodes < 2 ? 0 : (nodes % 2 == 0 ? nodes - 1 : nodes); }

std::vector<int> probe_partners(int nodes, int round) {
  // The circle method over an even count m (a ghost node m - 1 when nodes is odd): m - 1 stays put,
  // the others turn one place a round.
  const int m = nodes % 2 == 0 ? nodes : nodes + 1;
  std::vector<int> partner(static_cast<std::size_t>(nodes), -1);
  auto pair = [&](int a, int b) {
    if (a < nodes && b < nodes) {
      partner[static_cast<std::size_t>(a)] = b;
      partner[static_cast<std::size_t>(b)] = a;
    }
  };
  if (m < 2) return partner;
  pair(m - 1, round % (m - 1));
  for (int k = 1; k < m / 2; ++k) pair((round + k) % (m - 1), (round - k + (m - 1)) % (m - 1));
  return partner;
}

Result<ProbeRow> probe_links(const std::vector<std::shared_ptr<transport::Link>>& links, int self, const ProbeOptions& o) {
  const int n = static_cast<int>(links.size());
  ProbeRow row;
  row.latency_s.assign(static_cast<std::size_t>(std::max(0, n - self - 1)), 0.0);
  row.bandwidth_Bps.assign(row.latency_s.size(), 0.0);
  const Bytes ping(8, std::byte{kPing});
  Bytes bulk(std::max<std::size_t>(o.bulk_bytes, 8));
  bulk.front() = std::byte{kBulk};
  for (int round = 0; round < probe_rounds(n); ++round) {
    const int p = probe_partners(n, round)[static_cast<std::size_t>(self)];
    if (p < 0) continue;
    const auto& link = links[static_cast<std::size_t>(p)];
    if (!link) return error(ErrorCode::kInvalidArgument, "probing the links: no link to node " + std::to_string(p));
    const std::string whom = "probing the link to node " + std::to_string(p);
    if (self > p) {  // the lower node measures; this one answers until it is done
      while (true) {
        auto got = receive(*link, kAskTag, o);
        if (!got.ok()) return got.status().with_context(whom);
        if (got->empty() || got->front() == std::byte{kDone}) break;
        if (Status st = link->send(kAnswerTag, ByteView(ping.data(), 1), o.deadline); !st.ok()) return st.with_context(whom);
      }
      continue;
    }
    // The fastest of `count` round trips of `payload`, answered by a byte.
    auto fastest_round_trip = [&](const Bytes& payload, int count) -> Result<double> {
      double fastest = std::numeric_limits<double>::infinity();
      for (int k = 0; k < count; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        if (Status st = link->send(kAskTag, payload, o.deadline); !st.ok()) return st.with_context(whom);
        auto got = receive(*link, kAnswerTag, o);
        if (!got.ok()) return got.status().with_context(whom);
        fastest = std::min(fastest, seconds_since(t0));
      }
      return fastest;
    };
    double rtt = std::numeric_limits<double>::infinity(), timed = 0;
    for (int attempt = 0; attempt < kAttempts && !(timed > rtt); ++attempt) {
      // Pings before and after the timed messages: the fastest is the link's round trip.
      auto before = fastest_round_trip(ping, o.pings);
      if (!before.ok()) return before.status();
      auto bulked = fastest_round_trip(bulk, o.bulks);
      if (!bulked.ok()) return bulked.status();
      auto after = fastest_round_trip(ping, std::max(1, o.pings / 2));
      if (!after.ok()) return after.status();
      rtt = std::min(*before, *after);
      timed = *bulked;
    }
    const Bytes done(1, std::byte{kDone});
    if (Status st = link->send(kAskTag, done, o.deadline); !st.ok()) return st.with_context(whom);
    // (After every attempt a timed message that still came back no slower than a ping: the link is
    // faster than the probe can time, and counted at the top.)
    const double transfer = timed - rtt;
    const auto k = static_cast<std::size_t>(p - self - 1);
    row.latency_s[k] = std::clamp(rtt / 2, 0.0, kMaxLatency);
    row.bandwidth_Bps[k] = transfer > 0 ? std::clamp(static_cast<double>(bulk.size()) / transfer, kMinBandwidth, kMaxBandwidth) : kMaxBandwidth;
  }
  return row;
}

Bytes encode_probe_row(const ProbeRow& row) {
  Writer w;
  w.u8(kRowVersion);
  w.f64(row.forward_s);
  w.u32(static_cast<std::uint32_t>(row.latency_s.size()));
  for (std::size_t k = 0; k < row.latency_s.size(); ++k) {
    w.f64(row.latency_s[k]);
    w.f64(row.bandwidth_Bps[k]);
  }
  return std::move(w).take();
}

Result<ProbeRow> decode_probe_row(ByteView bytes, int nodes, int from) {
  const std::string what = "node " + std::to_string(from) + "'s link measurements";
  Reader r(bytes, what);
  const std::uint8_t version = r.u8();
  if (r.ok() && version != kRowVersion) {
    return error(ErrorCode::kVersionMismatch, what + ": version " + std::to_string(version) + ", this node reads " + std::to_string(kRowVersion) +
                                                  ": run the same build on every node");
  }
  ProbeRow row;
  row.forward_s = r.f64();
  const std::uint32_t pairs = r.u32();
  const auto expected = static_cast<std::uint32_t>(std::max(0, nodes - from - 1));
  if (r.ok() && pairs != expected) return error(ErrorCode::kMalformed, what + ": " + std::to_string(pairs) + " pairs, expected " + std::to_string(expected));
  for (std::uint32_t k = 0; k < pairs && r.ok(); ++k) {
    row.latency_s.push_back(r.f64());
    row.bandwidth_Bps.push_back(r.f64());
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  if (!(std::isfinite(row.forward_s) && row.forward_s >= 0 && row.forward_s <= kMaxForward)) {
    return error(ErrorCode::kMalformed, what + ": a forward time out of range");
  }
  for (std::size_t k = 0; k < row.latency_s.size(); ++k) {
    if (!(std::isfinite(row.latency_s[k]) && row.latency_s[k] >= 0 && row.latency_s[k] <= kMaxLatency) ||
        !(std::isfinite(row.bandwidth_Bps[k]) && row.bandwidth_Bps[k] >= kMinBandwidth && row.bandwidth_Bps[k] <= kMaxBandwidth)) {
      return error(ErrorCode::kMalformed, what + ": the pair with node " + std::to_string(from + 1 + static_cast<int>(k)) + " is out of range");
    }
  }
  return row;
}

Result<MeasuredNetwork> measured_network(const std::vector<ProbeRow>& rows) {
  const int n = static_cast<int>(rows.size());
  MeasuredNetwork out;
  out.network.nodes = n;
  const auto cells = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  out.network.latency_s.assign(cells, 0.0);
  out.network.bandwidth_Bps.assign(cells, kMaxBandwidth);
  for (int a = 0; a < n; ++a) {
    const ProbeRow& row = rows[static_cast<std::size_t>(a)];
    if (row.latency_s.size() != static_cast<std::size_t>(n - a - 1) || row.bandwidth_Bps.size() != row.latency_s.size()) {
      return error(ErrorCode::kMalformed, "node " + std::to_string(a) + "'s link measurements do not cover the nodes above it");
    }
    out.forward_s.push_back(row.forward_s);
    for (int b = a + 1; b < n; ++b) {
      const auto k = static_cast<std::size_t>(b - a - 1);
      for (const auto cell : {static_cast<std::size_t>(a * n + b), static_cast<std::size_t>(b * n + a)}) {
        out.network.latency_s[cell] = row.latency_s[k];
        out.network.bandwidth_Bps[cell] = row.bandwidth_Bps[k];
      }
    }
  }
  if (Status st = out.network.check(); !st.ok()) return st;
  return out;
}

}  // namespace gossamer::runtime
