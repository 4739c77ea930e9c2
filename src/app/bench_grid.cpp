// `gossamer bench grid`: one round's all-reduce across many simulated peers on an emulated network
// (the simulator's, in virtual time), over a full mesh and over a grid (optim/collectives.h), side by
// side in one run: the time to link a new group, the time of the all-reduce, links, messages and bytes
// per peer, and whether every peer of both layouts ends with the same bits.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/commands.h"
#include "optim/collectives.h"
#include "quant/codec.h"
#include "sim/network.h"
#include "sim/scheduler.h"
#include "sim/transport_fabric.h"
#include "transport/link_profile.h"

namespace gossamer::app {

namespace {

using namespace std::chrono_literals;

std::string address_of(int r) { return fmt::format("198.18.{}.{}:7001", r / 250, r % 250 + 1); }

struct LayoutRun {
  double link_s = 0;       // virtual seconds until every link of the group was up
  double allreduce_s = 0;  // virtual seconds of the all-reduce, until the last peer had its result
  double links = 0;        // per peer, on average
  double bytes = 0;        // sent per peer, on average
  std::vector<at::Tensor> results;
  Status failed;
};

// m peers on `profile` links link up as `width` says (the smaller rank dials, kDialedAtOnce at a
// time) and all-reduce their tensors.
LayoutRun run_layout(int m, int width, const transport::LinkProfile& profile, const std::vector<at::Tensor>& inputs, const quant::EncodeOptions& codec) {
  sim::NetworkSpec spec;
  for (int r = 0; r < m; ++r) spec.nodes.push_back(sim::NodeSpec{profile, -1});
  sim::Scheduler scheduler;
  sim::Network net(scheduler, spec);
  sim::TransportFabric fabric(scheduler, net);
  LayoutRun out;
  out.results.resize(static_cast<std::size_t>(m));
  auto main = scheduler.start_thread([&] {
    std::vector<std::unique_ptr<transport::Transport>> transports;
    for (int r = 0; r < m; ++r) {
      auto t = fabric.make(r, address_of(r), transport::PeerId{static_cast<std::uint64_t>(r + 1)});
      if (!t.ok()) {
        out.failed = t.status();
        return;
      }
      transports.push_back(std::move(*t));
    }
    std::vector<optim::Group> groups(static_cast<std::size_t>(m));
    for (int r = 0; r < m; ++r) {
      auto& g = groups[static_cast<std::size_t>(r)];
      g.rank = r;
      g.size = m;
      g.width = width;
      g.clock = &scheduler;
      g.peers.resize(static_cast<std::size_t>(m));
    }
    const Nanos start = scheduler.now();
    const Deadline deadline = Deadline::after(scheduler, 600s);
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (int r = 0; r < m; ++r) {
      std::vector<int> ours;
      int theirs = 0;
      for (int j = 0; j < m; ++j) {
        if (j == r || !optim::grid_linked(r, j, m, width)) continue;
        if (r < j) ours.push_back(j);
        else ++theirs;
      }
      threads.push_back(scheduler.start_thread([&, r, theirs] {
        for (int k = 0; k < theirs; ++k) {
          auto link = transports[static_cast<std::size_t>(r)]->accept(deadline);
          if (!link.ok()) {
            out.failed = link.status();
            return;
          }
          groups[static_cast<std::size_t>(r)].peers[(*link)->peer().value - 1] = *link;
        }
      }));
      auto next = std::make_shared<std::size_t>(0);
      auto list = std::make_shared<std::vector<int>>(std::move(ours));
      for (int d = 0; d < std::min<int>(optim::kDialedAtOnce, static_cast<int>(list->size())); ++d) {
        threads.push_back(scheduler.start_thread([&, r, next, list] {
          while (*next < list->size()) {
            const int j = (*list)[(*next)++];
            auto link = transports[static_cast<std::size_t>(r)]->connect(address_of(j), deadline);
            if (!link.ok()) {
              out.failed = link.status();
              return;
            }
            groups[static_cast<std::size_t>(r)].peers[static_cast<std::size_t>(j)] = *link;
          }
        }));
      }
    }
    for (auto& t : threads) t->join();
    threads.clear();
    if (!out.failed.ok()) return;
    const Nanos linked = scheduler.now();
    out.link_s = std::chrono::duration<double>(linked - start).count();
    std::vector<optim::CommStats> stats(static_cast<std::size_t>(m));
    Nanos last = linked;
    for (int r = 0; r < m; ++r) {
      threads.push_back(scheduler.start_thread([&, r] {
        const auto i = static_cast<std::size_t>(r);
        out.results[i] = inputs[i].clone();
        Status st = optim::allreduce_mean(groups[i], out.results[i], codec, 1, deadline, &stats[i]);
        if (!st.ok()) out.failed = st;
        last = std::max(last, scheduler.now());
      }));
    }
    for (auto& t : threads) t->join();
    out.allreduce_s = std::chrono::duration<double>(last - linked).count();
    for (int r = 0; r < m; ++r) {
      for (const auto& p : groups[static_cast<std::size_t>(r)].peers) out.links += p ? 1 : 0;
      out.bytes += static_cast<double>(stats[static_cast<std::size_t>(r)].bytes_sent);
    }
    out.links /= m;
    out.bytes /= m;
    groups.clear();
  });
  if (Status st = scheduler.run(); !st.ok() && out.failed.ok()) out.failed = st;
  return out;
}

}  // namespace

int bench_grid(const BenchArgs& args) {
  auto profile = transport::link_profile_preset(args.network);
  if (!profile.ok()) return report_failure(error(ErrorCode::kInvalidArgument, "--network: " + profile.status().message()));
  // In virtual time a link that costs nothing would take no time at all: nothing to compare.
  if (!std::isfinite(profile->bandwidth_bytes_per_s) && profile->latency.count() == 0) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--network " + args.network + " costs no time in the simulation (unbounded bandwidth, no "
                                                             "latency), so the layouts cannot differ: choose a preset with a finite bandwidth or a latency"));
  }
  quant::EncodeOptions codec;
  auto id = quant::codec_from_name(args.codec);
  if (!id.ok()) return report_failure(error(ErrorCode::kInvalidArgument, "--codec: " + id.status().message()));
  codec.codec = *id;
  const std::vector<int> sizes(args.sim_ranks.begin(), args.sim_ranks.end());
  fmt::print("one all-reduce of {} values ({}) per peer, on '{}' links ({:.0f} ms round trip), in virtual time\n", args.grid_values, args.codec,
             args.network, 2e3 * std::chrono::duration<double>(profile->latency).count());
  fmt::print("{:>6} {:>10} {:>7} {:>10} {:>12} {:>14} {:>12}   {}\n", "peers", "layout", "links", "link-up", "all-reduce", "sent/peer", "vs mesh", "same bits");
  for (int m : sizes) {
    torch::manual_seed(static_cast<std::uint64_t>(m));
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < m; ++r) inputs.push_back(torch::randn({args.grid_values}));
    const int width = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(m))));
    const LayoutRun mesh = run_layout(m, 0, *profile, inputs, codec);
    if (!mesh.failed.ok()) return report_failure(mesh.failed.with_context(fmt::format("the full mesh of {}", m)));
    const LayoutRun grid = run_layout(m, width, *profile, inputs, codec);
    if (!grid.failed.ok()) return report_failure(grid.failed.with_context(fmt::format("the grid of {}", m)));
    bool same = true;
    for (int r = 0; r < m; ++r) {
      same = same && torch::equal(grid.results[static_cast<std::size_t>(r)], mesh.results[static_cast<std::size_t>(r)]) &&
             torch::equal(mesh.results[static_cast<std::size_t>(r)], mesh.results[0]);
    }
    const double payload = static_cast<double>(args.grid_values) * quant::bits_per_value(codec) / 8;
    const int chosen = optim::choose_width(m, payload, 2 * profile->latency, profile->bandwidth_bytes_per_s);
    const auto row = [&](const char* name, const LayoutRun& r, const std::string& vs) {
      fmt::print("{:>6} {:>10} {:>7.1f} {:>9.2f}s {:>11.3f}s {:>11.1f} KB {:>12}   {}\n", m, name, r.links, r.link_s, r.allreduce_s, r.bytes / 1e3, vs,
                 same ? "yes" : "NO");
    };
    row("mesh", mesh, "");
    row(fmt::format("grid {}", width).c_str(), grid,
        fmt::format("{:.2f}x time", (grid.link_s + grid.allreduce_s) / std::max(1e-9, mesh.link_s + mesh.allreduce_s)));
    fmt::print("{:>6} the layout rule (optim::choose_width) picks {}\n", "", chosen == 0 ? std::string("the full mesh") : fmt::format("a grid of width {}", chosen));
    if (!same) return report_failure(error(ErrorCode::kInternal, fmt::format("the layouts of {} peers ended with different bits", m)));
  }
  return 0;
}

}  // namespace gossamer::app
