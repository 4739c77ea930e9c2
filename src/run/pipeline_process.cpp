#include "run/pipeline_process.h"

#include "run/link_probe.h"

#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <future>
#include <map>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/wire.h"
#include "model/gpt.h"
#include "optim/flat_params.h"
#include "run/link_probe.h"
#include "run/rounds.h"
#include "quant/codec.h"
#include "train/pipeline.h"
#include "train/run.h"
#include "train/worker.h"
#include "transport/shaped_link.h"
#include "transport/tags.h"

namespace gossamer::run {

namespace {

using Links = std::vector<std::shared_ptr<transport::Link>>;

void close_all(const Links& links) {
  for (const auto& l : links) {
    if (l) l->close();
  }
}

constexpr transport::Tag kHashTag = transport::tags::kPipelineHash;
constexpr transport::Tag kByeTag = transport::tags::kPipelineBye;
constexpr transport::Tag kCommitTag = transport::tags::kPipelineCommit;
constexpr transport::Tag kViewTag = transport::tags::kPipelineView;
constexpr transport::Tag kProbeRowTag = transport::tags::kPipelineProbeRow;
constexpr transport::Tag kEpochTag = transport::tags::kPipelineEpoch;

// Links to the `wanted` nodes: dial those below, accept those above; each one's peer checked, and
// the dialler's first message names the epoch (a late connection of an older one is closed). With
// `tolerate`, a node not linked by the deadline is left out (its slot stays null); else an error.
Result<Links> connect_mesh(const PipelineProcessRequest& req, transport::Transport& transport, const std::vector<bool>& wanted, std::uint64_t epoch,
                           Deadline deadline, bool tolerate) {
  const int n = static_cast<int>(req.addresses.size()), self = req.node;
  Links links(static_cast<std::size_t>(n));
  auto id_of = [&](int node) { return req.ids.empty() ? transport::PeerId{static_cast<std::uint64_t>(node) + 1} : req.ids[static_cast<std::size_t>(node)]; };
  auto node_of = [&](transport::PeerId id) {  // -1: no node of this pipeline
    for (int k = 0; k < n; ++k) {
      if (id_of(k) == id) return k;
    }
    return -1;
  };
  auto stopped = [&] { return req.stop != nullptr && req.stop->load(); };
  int above = 0;
  for (int j = self + 1; j < n; ++j) above += wanted[static_cast<std::size_t>(j)] ? 1 : 0;
  Status accepted;
  std::thread acceptor([&] {
    for (int k = 0; k < above;) {
      // In short waits, so that a stop is seen at once.
      auto link = transport.accept(Deadline::at(std::min(deadline.time(), real_clock().now() + std::chrono::milliseconds(250))));
      if (!link.ok() && link.status().code() == ErrorCode::kTimeout && !deadline.expired(real_clock()) && !stopped()) continue;
      if (!link.ok()) {
        if (!tolerate || stopped()) {
          accepted = link.status().with_context("waiting for the nodes above " + std::to_string(self) + " to connect (start them, with the same --addresses)");
        }
        return;
      }
      const int from = node_of((*link)->peer());
      const bool known = from > self && wanted[static_cast<std::size_t>(from)] && !links[static_cast<std::size_t>(from)];
      auto said = known ? (*link)->recv(kEpochTag, Deadline::after(real_clock(), std::chrono::seconds(5))) : Result<Bytes>(error(ErrorCode::kMalformed, ""));
      Reader r(said.ok() ? ByteView(*said) : ByteView(), "pipeline epoch");
      const std::uint64_t their = r.u64();
      r.expect_end();
      if (!known || !said.ok() || !r.ok() || their != epoch) {
        (*link)->close();
        spdlog::warn("pipeline node {}: closed a link from peer {}: not a node above this one expected in epoch {}", self, (*link)->peer().to_string(), epoch);
        continue;
      }
      Writer ack;  // the dialler keeps the link only once this node said it takes part
      ack.u64(epoch);
      if (!(*link)->send(kEpochTag, ack.bytes(), Deadline::after(real_clock(), std::chrono::seconds(5))).ok()) {
        (*link)->close();
        continue;
      }
      links[static_cast<std::size_t>(from)] = std::move(*link);
      ++k;
    }
  });
  // Every node below at once: one that does not answer must not hold up the others.
  std::vector<Status> dial_status(static_cast<std::size_t>(std::max(self, 0)));
  std::vector<std::thread> dialers;
  for (int j = 0; j < self; ++j) {
    if (!wanted[static_cast<std::size_t>(j)]) continue;
    dialers.emplace_back([&, j] {
      Status& dialled = dial_status[static_cast<std::size_t>(j)];
      const std::string& at = req.addresses[static_cast<std::size_t>(j)];
      for (;;) {
        auto link = transport.connect(at, Deadline::at(std::min(deadline.time(), real_clock().now() + std::chrono::seconds(5))));
        if (link.ok()) {
          if ((*link)->peer() != id_of(j)) {
            dialled = error(ErrorCode::kInvalidArgument, "the process at " + at + " is not pipeline node " + std::to_string(j) +
                                                            ": check --addresses (the same list, in node order, on every node)");
            (*link)->close();
            return;
          }
          // The epoch, and the node's answer: a process that still listens but no longer takes part
          // (it stopped) does not answer, and is left out like one that is gone.
          Writer w;
          w.u64(epoch);
          Status st = (*link)->send(kEpochTag, w.bytes(), deadline);
          auto ack = st.ok() ? (*link)->recv(kEpochTag, deadline) : Result<Bytes>(st);
          Reader r(ack.ok() ? ByteView(*ack) : ByteView(), "pipeline epoch");
          const std::uint64_t their = r.u64();
          r.expect_end();
          if (!ack.ok() || !r.ok() || their != epoch) {
            (*link)->close();
            if (!tolerate) dialled = (ack.ok() ? r.status() : ack.status()).with_context("linking with pipeline node " + std::to_string(j));
            return;
          }
          links[static_cast<std::size_t>(j)] = std::move(*link);
          return;
        }
        if (link.status().code() == ErrorCode::kVersionMismatch || link.status().code() == ErrorCode::kUnauthenticated) {
          dialled = link.status().with_context("pipeline node " + std::to_string(j) + " at " + at + " (another config? every node must be given the same one)");
          return;
        }
        if (stopped()) {
          dialled = error(ErrorCode::kAborted, "stopped while linking");
          return;
        }
        if (deadline.expired(real_clock())) {
          if (!tolerate) {
            dialled = error(ErrorCode::kUnavailable, "pipeline node " + std::to_string(j) + " at " + at + " did not answer: start it, or check the address (" +
                                                         link.status().message() + ")");
          }
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // not up yet: try again
      }
    });
  }
  for (auto& d : dialers) d.join();
  Status dialled;
  for (const auto& st : dial_status) {
    if (dialled.ok() && !st.ok()) dialled = st;
  }
  acceptor.join();  // (it waits for nodes that may never come until its deadline or a stop)
  if (dialled.ok()) dialled = accepted;
  if (!dialled.ok()) {
    close_all(links);
    return dialled;
  }
  if (req.shape) {
    for (std::size_t j = 0; j < links.size(); ++j) {
      if (!links[j]) continue;
      auto shaped = transport::make_shaped_link(links[j], *req.shape, epoch * 1'000'003 + static_cast<std::uint64_t>(req.node) * 1000 + j + 1);
      if (!shaped.ok()) {
        close_all(links);
        return shaped.status();
      }
      links[j] = std::move(*shaped);
    }
  }
  return links;
}

// Sends `payload` to every linked node, then takes one message of the tag from each.
Result<std::vector<Bytes>> exchange(const Links& links, int self, transport::Tag tag, ByteView payload, Deadline deadline, const std::string& what) {
  for (std::size_t j = 0; j < links.size(); ++j) {
    if (!links[j] || static_cast<int>(j) == self) continue;
    if (Status st = links[j]->send(tag, payload, deadline); !st.ok()) return st.with_context(what + ": sending to node " + std::to_string(j));
  }
  std::vector<Bytes> out(links.size());
  for (std::size_t j = 0; j < links.size(); ++j) {
    if (!links[j] || static_cast<int>(j) == self) continue;
    auto got = links[j]->recv(tag, deadline);
    if (!got.ok()) return got.status().with_context(what + ": waiting for node " + std::to_string(j));
    out[j] = std::move(*got);
  }
  return out;
}

// A stage's weights for the evaluator: u32 count, then each tensor as an fp32 codec payload.
Bytes encode_weights(const std::vector<at::Tensor>& params) {
  Writer w;
  w.u32(static_cast<std::uint32_t>(params.size()));
  quant::EncodeOptions fp32;
  for (const auto& p : params) w.blob(quant::encode(p.detach().to(at::kFloat).contiguous(), fp32));
  return std::move(w).take();
}

Result<std::vector<at::Tensor>> decode_weights(ByteView bytes, const std::vector<std::vector<std::int64_t>>& shapes) {
  Reader r(bytes, "stage weights");
  const std::uint32_t count = r.u32();
  if (r.ok() && count != shapes.size()) return error(ErrorCode::kMalformed, "stage weights: " + std::to_string(count) + " tensors, the stage has " + std::to_string(shapes.size()));
  std::vector<at::Tensor> out;
  for (std::size_t k = 0; k < shapes.size() && r.ok(); ++k) {
    std::int64_t numel = 1;
    for (std::int64_t d : shapes[k]) numel *= d;
    const ByteView blob = r.blob(std::size_t{1} << 31);
    if (!r.ok()) break;
    auto t = quant::decode(blob, numel);
    if (!t.ok()) return t.status().with_context("stage weights, tensor " + std::to_string(k));
    if (t->scalar_type() != at::kFloat) return error(ErrorCode::kMalformed, "stage weights: tensor " + std::to_string(k) + " is not fp32");
    if (t->sizes().vec() != shapes[k]) return error(ErrorCode::kMalformed, "stage weights: tensor " + std::to_string(k) + " has another shape than the stage's");
    if (!torch::isfinite(*t).all().item<bool>()) return error(ErrorCode::kMalformed, "stage weights: tensor " + std::to_string(k) + " is not finite");
    out.push_back(std::move(*t));
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  return out;
}

// Each stage's parameter shapes, in model order.
std::map<int, std::vector<std::vector<std::int64_t>>> stage_shapes(const train::RunConfig& c) {
  std::map<int, std::vector<std::vector<std::int64_t>>> out;
  const model::Gpt model(train::gpt_config(c, 0));
  const std::int64_t per = c.model.layers / c.pipeline.stages;
  for (const auto& block : model.blocks()) {
    int stage = 0;
    if (block.name != "embed" && block.name != "final") stage = static_cast<int>(std::stoll(block.name.substr(6)) / per);
    for (const auto& p : block.parameters) out[stage].push_back(p.tensor.sizes().vec());
  }
  return out;
}

// pipeline.network = measured: every node measures its links and its machine (run/link_probe.h),
// then sends its row to every other; each assembles the same network from the same rows.
Result<MeasuredNetwork> measure_network(const PipelineProcessRequest& req, const Links& links, int n) {
  const auto& c = req.config;
  ProbeOptions o;
  // A hop's size, but at least 64 KiB (a smaller message takes too little time to show a bandwidth)
  // and at most 4 MiB (enough to see one; 20 nodes' 19 rounds of three must not take minutes).
  o.bulk_bytes = std::clamp<std::size_t>(train::hop_bytes(c), std::size_t{64} << 10, std::size_t{4} << 20);
  o.deadline = Deadline::after(real_clock(), req.connect_timeout);
  o.stop = req.stop;
  const auto t0 = std::chrono::steady_clock::now();
  auto row = probe_links(links, req.node, o);
  if (!row.ok()) return row.status().with_context("measuring the pipeline's links");
  row->forward_s = train::measure_stage_forward_s(c);
  auto rows = exchange(links, req.node, kProbeRowTag, encode_probe_row(*row), o.deadline, "sharing the link measurements");
  if (!rows.ok()) return rows.status();
  std::vector<ProbeRow> all(static_cast<std::size_t>(n));
  for (int v = 0; v < n; ++v) {
    if (v == req.node) {
      all[static_cast<std::size_t>(v)] = *row;
      continue;
    }
    auto theirs = decode_probe_row((*rows)[static_cast<std::size_t>(v)], n, v);
    if (!theirs.ok()) return theirs.status();
    all[static_cast<std::size_t>(v)] = std::move(*theirs);
  }
  auto measured = measured_network(all);
  if (!measured.ok()) return measured.status();
  double lat_lo = 1e300, lat_hi = 0, bw_lo = 1e300, bw_hi = 0;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      lat_lo = std::min(lat_lo, measured->network.latency(a, b));
      lat_hi = std::max(lat_hi, measured->network.latency(a, b));
      bw_lo = std::min(bw_lo, measured->network.bandwidth(a, b));
      bw_hi = std::max(bw_hi, measured->network.bandwidth(a, b));
    }
  }
  const auto fw = std::minmax_element(measured->forward_s.begin(), measured->forward_s.end());
  spdlog::info("pipeline node {}: links measured in {:.1f} s: latency {:.1f} to {:.1f} ms, bandwidth {:.0f} to {:.0f} Mbit/s (timed with {} bytes); a stage's "
               "forward {:.1f} to {:.1f} ms",
               req.node, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1e3 * lat_lo, 1e3 * lat_hi, 8 * bw_lo / 1e6, 8 * bw_hi / 1e6,
               o.bulk_bytes, 1e3 * *fw.first, 1e3 * *fw.second);
  return measured;
}

}  // namespace

transport::RunId pipeline_run_id(const train::RunConfig& config) {
  const Digest d = digest_of(as_bytes(train::to_toml(config)));
  transport::RunId id;
  std::copy_n(d.bytes.begin(), id.bytes.size(), id.bytes.begin());
  return id;
}

Result<PipelineProcessOutcome> run_pipeline_process(const PipelineProcessRequest& req, transport::Transport& transport, const data::Dataset& data) {
  const auto& c = req.config;
  const int n = static_cast<int>(req.addresses.size());
  if (n != c.pipeline.nodes) {
    return error(ErrorCode::kInvalidArgument, "--addresses names " + std::to_string(n) + " nodes, pipeline.nodes is " + std::to_string(c.pipeline.nodes) + ": give one per node");
  }
  if (req.node < 0 || req.node >= n) return error(ErrorCode::kInvalidArgument, "--node " + std::to_string(req.node) + ": use 0 .. " + std::to_string(n - 1));
  if (!req.ids.empty() && req.ids.size() != req.addresses.size()) {
    return error(ErrorCode::kInvalidArgument, "pipeline: " + std::to_string(req.ids.size()) + " peer ids for " + std::to_string(n) + " addresses");
  }
  auto stopped = [&] { return req.stop != nullptr && req.stop->load(); };
  PipelineProcessOutcome outcome;
  std::vector<bool> alive(static_cast<std::size_t>(n), true);
  std::uint64_t epoch = 0;
  auto mesh = connect_mesh(req, transport, alive, epoch, Deadline::after(real_clock(), req.connect_timeout), false);
  if (!mesh.ok() && stopped()) {
    outcome.stopped = true;  // while linking
    return outcome;
  }
  if (!mesh.ok()) return mesh.status();
  Links links = std::move(*mesh);
  struct Closer {
    const Links& l;
    bool done = false;
    ~Closer() {
      if (!done) close_all(l);  // a run that failed or stopped: the others learn at once
    }
  } closer{links};
  spdlog::info("pipeline node {}: linked to the other {} nodes", req.node, n - 1);

  train::PipelineEnvironment env;
  env.local = {req.node};
  env.link = [&links](int, int to, int) { return links[static_cast<std::size_t>(to)]; };  // this epoch's
  if (c.pipeline.network == train::PipelineNetwork::kMeasured) {
    auto measured = measure_network(req, links, n);
    if (!measured.ok() && stopped()) {
      outcome.stopped = true;  // Ctrl-C while measuring
      return outcome;
    }
    if (!measured.ok()) return measured.status().with_context("before training (a node lost now ends the start: start the nodes again)");
    env.network = measured->network;
    env.node_forward_s = measured->forward_s;
    outcome.measured = std::move(*measured);
  }
  auto made = train::PipelineTrainer::make(c, data, env);
  if (!made.ok()) return made.status();
  train::PipelineTrainer& t = **made;
  outcome.stage = t.plan().schedule.stage_of[static_cast<std::size_t>(req.node)];
  const Nanos round_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(c.train.round_timeout_s));

  // One schedule: every node's hash against ours.
  auto agree_on_schedule = [&](Deadline deadline) -> Status {
    outcome.schedule_hash = t.plan().schedule.hash().hex();
    const Digest mine = t.plan().schedule.hash();
    auto theirs = exchange(links, req.node, kHashTag, ByteView(reinterpret_cast<const std::byte*>(mine.bytes.data()), mine.bytes.size()), deadline,
                           "agreeing on the schedule");
    if (!theirs.ok()) return theirs.status();
    for (std::size_t j = 0; j < theirs->size(); ++j) {
      const Bytes& b = (*theirs)[j];
      if (!links[j] || static_cast<int>(j) == req.node) continue;
      if (b.size() != mine.bytes.size() || !std::equal(mine.bytes.begin(), mine.bytes.end(), reinterpret_cast<const std::uint8_t*>(b.data()))) {
        return error(ErrorCode::kInvalidArgument, "node " + std::to_string(j) + " planned another schedule than this node (" + outcome.schedule_hash.substr(0, 16) +
                                                      "...): every node must run the same build with the same config");
      }
    }
    return Status();
  };
  if (Status st = agree_on_schedule(Deadline::after(real_clock(), req.connect_timeout)); !st.ok()) return st;
  spdlog::info("pipeline node {} (stage {}): schedule {} agreed by all {} nodes", req.node, outcome.stage, outcome.schedule_hash.substr(0, 16), n);

  // Each iteration's record, passed on in order once its evaluation (if any) is done.
  struct Waiting {
    train::PipelineRecord rec;
    std::future<double> val;  // invalid: no evaluation at this iteration
  };
  std::deque<Waiting> waiting;
  auto flush = [&](bool all) {
    while (!waiting.empty()) {
      Waiting& w = waiting.front();
      std::optional<double> val;
      if (w.val.valid()) {
        if (!all && w.val.wait_for(std::chrono::seconds(0)) != std::future_status::ready) break;
        val = w.val.get();
        outcome.final_val_loss = val;
      }
      if (req.on_iteration) req.on_iteration(w.rec, val);
      waiting.pop_front();
    }
  };
  // After a failed iteration: link again with every node that answers, agree on who they are, and
  // go on without the others (ddp inside the stages: no weight moved in the failed iteration).
  auto recover = [&](const Status& failure, std::int64_t iteration) -> Status {
    if (c.pipeline.stage_sync != "ddp") return failure.with_context("(rescheduling around a lost node needs pipeline.stage_sync = ddp)");
    close_all(links);
    ++epoch;
    spdlog::warn("pipeline node {}: iteration {} failed ({}); linking again with the nodes that answer", req.node, iteration, failure.message());
    auto again = connect_mesh(req, transport, alive, epoch, Deadline::after(real_clock(), req.rejoin_timeout), true);
    if (!again.ok()) return again.status().with_context("after: " + failure.message());
    links = std::move(*again);
    // Who each node reached, and how far each got: they must agree.
    Writer w;
    w.u64(static_cast<std::uint64_t>(t.iterations_done()));
    for (int j = 0; j < n; ++j) w.u8(j == req.node || links[static_cast<std::size_t>(j)] ? 1 : 0);
    auto views = exchange(links, req.node, kViewTag, w.bytes(), Deadline::after(real_clock(), req.rejoin_timeout), "agreeing on the nodes left");
    if (!views.ok()) return views.status().with_context("after: " + failure.message());
    std::vector<bool> left(static_cast<std::size_t>(n), false);
    for (int j = 0; j < n; ++j) left[static_cast<std::size_t>(j)] = j == req.node || links[static_cast<std::size_t>(j)] != nullptr;
    // A node lost while it confirmed an iteration may have confirmed it to some nodes and not to
    // others: those that heard every confirmation applied it, the others not yet. Every survivor
    // sent its own confirmation (the ones ahead heard it), so each holds that iteration's
    // gradients: the ones behind by one apply it now, and all go on from there.
    const auto mine = static_cast<std::uint64_t>(t.iterations_done());
    std::uint64_t furthest = mine;
    for (std::size_t j = 0; j < views->size(); ++j) {
      if (!links[j] || static_cast<int>(j) == req.node) continue;
      Reader r((*views)[j], "pipeline view");
      const std::uint64_t done = r.u64();
      std::vector<bool> theirs(static_cast<std::size_t>(n));
      for (int k = 0; k < n; ++k) theirs[static_cast<std::size_t>(k)] = r.u8() != 0;
      r.expect_end();
      if (!r.ok()) return r.status().with_context("from node " + std::to_string(j));
      if (done + 1 < mine || done > mine + 1 || (done == mine + 1 && !t.pending())) {
        return error(ErrorCode::kAborted, "node " + std::to_string(j) + " finished " + std::to_string(done) + " iterations, this one " +
                                              std::to_string(t.iterations_done()) + ": the nodes' weights no longer agree; restart the pipeline");
      }
      furthest = std::max(furthest, done);
      if (theirs != left) {
        auto text = [](const std::vector<bool>& v) {
          std::string out;
          for (std::size_t k = 0; k < v.size(); ++k) {
            if (!v[k]) continue;
            if (!out.empty()) out += ',';
            out += std::to_string(k);
          }
          return out;
        };
        return error(ErrorCode::kAborted, "node " + std::to_string(j) + " reaches nodes " + text(theirs) + ", this one " + text(left) +
                                              " (a network split?): the pipeline cannot agree on who is left");
      }
    }
    std::vector<int> dead;
    for (int j = 0; j < n; ++j) {
      if (alive[static_cast<std::size_t>(j)] && !left[static_cast<std::size_t>(j)]) dead.push_back(j);
    }
    if (dead.empty()) return failure;  // every node answered: the failure was not a lost node
    if (furthest == mine + 1) {
      auto caught_up = t.apply_pending();
      if (!caught_up.ok()) return caught_up.status();
      spdlog::warn("pipeline node {}: the others applied iteration {} (a lost node confirmed it to them, not to this one): applied it too", req.node,
                   caught_up->iteration);
      ++outcome.iterations;
      waiting.push_back(Waiting{*caught_up, {}});
      flush(false);
    }
    if (Status st = t.exclude(dead); !st.ok()) return st.with_context("after: " + failure.message());
    alive = left;
    return agree_on_schedule(Deadline::after(real_clock(), req.rejoin_timeout));
  };

  // This node's weights as they stand (what the summary names), whenever the run ends.
  auto with_digest = [&]() -> PipelineProcessOutcome& {
    outcome.params_digest = digest_of(bytes_of(optim::flatten(t.node_parameters(req.node)))).hex();
    return outcome;
  };
  const auto shapes = stage_shapes(c);  // what a stage's weights sent for evaluation must be
  // Every node confirms it got through the iteration before any weight moves (ddp), so a lost node
  // leaves every survivor's weights as they were.
  std::int64_t committing = 0;
  auto commit = [&]() -> Status {
    Writer w;
    w.u64(static_cast<std::uint64_t>(committing));
    if (req.crash_while_confirming == committing) {
      for (int j = 0; j < req.node; ++j) {
        if (links[static_cast<std::size_t>(j)]) (void)links[static_cast<std::size_t>(j)]->send(kCommitTag, w.bytes(), Deadline::after(real_clock(), round_timeout));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (what was sent leaves before the links go)
      close_all(links);
      return error(ErrorCode::kAborted, "fault drill: died while confirming iteration " + std::to_string(committing));
    }
    // As long as the slowest node's iteration may take (PipelineTrainer::step's deadlines).
    const auto expected = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(4 * t.plan().simulation.makespan_s));
    auto acks = exchange(links, req.node, kCommitTag, w.bytes(), Deadline::after(real_clock(), 2 * round_timeout + expected), "confirming the iteration");
    if (!acks.ok()) return acks.status();
    for (std::size_t j = 0; j < acks->size(); ++j) {
      if (!links[j] || static_cast<int>(j) == req.node) continue;
      Reader r((*acks)[j], "pipeline commit");
      const std::uint64_t it = r.u64();
      r.expect_end();
      if (!r.ok() || it != static_cast<std::uint64_t>(committing)) return error(ErrorCode::kMalformed, "node " + std::to_string(j) + " confirmed another iteration");
    }
    return Status();
  };
  for (std::int64_t i = 1; i <= c.train.steps; ++i) {
    if (stopped()) {
      flush(true);
      outcome.stopped = true;
      return with_digest();
    }
    committing = i;
    auto rec = t.step(commit);
    if (!rec.ok() && (rec.status().code() == ErrorCode::kPeerLost || rec.status().code() == ErrorCode::kTimeout) && !stopped()) {
      if (Status st = recover(rec.status(), i); !st.ok()) {
        if (stopped()) {
          flush(true);
          outcome.stopped = true;  // Ctrl-C while linking again
          return with_digest();
        }
        return st.with_context("iteration " + std::to_string(i));
      }
      outcome.stage = t.plan().schedule.stage_of[static_cast<std::size_t>(req.node)];
      ++outcome.retried_iterations;
      // The same iteration again, without the lost nodes (or the next, when this one was caught up).
      i = t.iterations_done();
      continue;
    }
    if (!rec.ok()) return rec.status().with_context("iteration " + std::to_string(i));
    ++outcome.iterations;
    outcome.lost_nodes = t.lost_nodes();
    std::future<double> evaluating;
    if ((c.train.eval_every > 0 && i % c.train.eval_every == 0) || i == c.train.steps) {
      const std::vector<int> holders = t.stage_holders();
      const int evaluator = holders[0];
      const transport::Tag tag = transport::tags::kPipelineEval | static_cast<transport::Tag>(i & 0xFFFF);
      const Deadline deadline = Deadline::after(real_clock(), round_timeout);
      if (req.node == evaluator) {
        std::map<int, std::vector<at::Tensor>> stages;
        for (int stage = 0; stage < static_cast<int>(holders.size()); ++stage) {
          const int h = holders[static_cast<std::size_t>(stage)];
          if (h == req.node) {
            stages[stage] = t.node_parameters(h);
            continue;
          }
          // A holder lost (or sending garbage) costs this evaluation, not the run: the next
          // iteration finds out whether a node is gone.
          auto got = links[static_cast<std::size_t>(h)]->recv(tag, deadline);
          auto w = got.ok() ? decode_weights(*got, shapes.at(stage)) : Result<std::vector<at::Tensor>>(got.status());
          if (!w.ok()) {
            spdlog::warn("pipeline node {}: evaluation at iteration {} skipped: stage {}'s weights from node {}: {}", req.node, i, stage, h, w.status().message());
            ++outcome.skipped_evaluations;
            stages.clear();
            break;
          }
          stages[stage] = std::move(*w);
        }
        if (!stages.empty()) {
          // Evaluated beside the next iterations, on copies: an evaluation that takes long must not
          // make this node late to link again after a loss (the others would leave it out).
          flush(true);  // (the previous evaluation first: one at a time)
          for (auto& [stage, params] : stages) {
            for (auto& p : params) p = p.detach().clone();
          }
          if (i == c.train.steps) outcome.model = std::make_shared<model::Gpt>(t.assemble(stages, t.depth_scales()));
          evaluating = std::async(std::launch::async, [&t, stages = std::move(stages), scales = t.depth_scales()] { return t.evaluate_with(stages, scales); });
        }
      } else if (holders[static_cast<std::size_t>(outcome.stage)] == req.node) {
        if (Status st = links[static_cast<std::size_t>(evaluator)]->send(tag, encode_weights(t.node_parameters(req.node)), deadline); !st.ok()) {
          spdlog::warn("pipeline node {}: could not send stage {}'s weights for the evaluation at iteration {} to node {}: {}", req.node, outcome.stage, i,
                       evaluator, st.message());
        }
      }
    }
    waiting.push_back(Waiting{*rec, std::move(evaluating)});
    evaluating = {};
    flush(false);
  }
  flush(true);
  // Goodbye: a node that is done says so to every other and waits for theirs, so none closes a
  // link (a shaped one drops what it still holds) while another still waits on it.
  auto byes = exchange(links, req.node, kByeTag, ByteView(), Deadline::after(real_clock(), round_timeout), "saying goodbye");
  if (!byes.ok()) {
    // Training is done: a node gone now costs nothing but its goodbye.
    spdlog::warn("pipeline node {}: {}", req.node, byes.status().message());
    return with_digest();
  }
  closer.done = true;  // the links close gracefully as they go
  return with_digest();
}

nlohmann::json pipeline_record_json(int node, const train::PipelineRecord& r, std::optional<double> val_loss) {
  nlohmann::json j = {{"node", node}, {"step", r.iteration}, {"samples", r.samples}, {"train_loss", r.train_loss}, {"losses", r.losses},
                      {"lr", r.lr}, {"activation_bytes", r.activation_bytes}, {"sync_bytes", r.sync_bytes}, {"seconds", r.seconds},
                      {"makespan_s", r.makespan_s}, {"sync_s", r.sync_s}, {"lost_nodes", r.lost_nodes}};
  if (val_loss) j["val_loss"] = *val_loss;
  return j;
}

nlohmann::json pipeline_summary_json(int node, const PipelineProcessOutcome& o) {
  nlohmann::json j = {{"node", node}, {"stage", o.stage}, {"iterations", o.iterations}, {"schedule_hash", o.schedule_hash},
                      {"stopped", o.stopped}, {"lost_nodes", o.lost_nodes}, {"retried_iterations", o.retried_iterations},
                      {"skipped_evaluations", o.skipped_evaluations}, {"params_digest", o.params_digest}};
  if (o.final_val_loss) j["final_val_loss"] = *o.final_val_loss;
  if (o.measured) {
    // What the schedule was planned on: per pair (row-major, nodes x nodes) and per node.
    j["measured_network"] = {{"nodes", o.measured->network.nodes},
                             {"latency_s", o.measured->network.latency_s},
                             {"bandwidth_Bps", o.measured->network.bandwidth_Bps},
                             {"forward_s", o.measured->forward_s}};
  }
  return j;
}

}  // namespace gossamer::run
