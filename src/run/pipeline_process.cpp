#include "run/pipeline_process.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/wire.h"
#include "model/gpt.h"
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

// Links to every other node: dial those below, accept those above; each one's peer checked.
Result<Links> connect_mesh(const PipelineProcessRequest& req, transport::Transport& transport) {
  const int n = static_cast<int>(req.addresses.size()), self = req.node;
  Links links(static_cast<std::size_t>(n));
  const Deadline deadline = Deadline::after(real_clock(), req.connect_timeout);
  Status accepted;
  std::thread acceptor([&] {
    for (int k = self + 1; k < n; ++k) {
      // In short waits, so that a stop is seen at once.
      auto link = transport.accept(Deadline::at(std::min(deadline.time(), real_clock().now() + std::chrono::milliseconds(250))));
      if (!link.ok() && link.status().code() == ErrorCode::kTimeout && !deadline.expired(real_clock()) && !(req.stop != nullptr && req.stop->load())) {
        --k;
        continue;
      }
      if (!link.ok()) {
        accepted = link.status().with_context("waiting for the nodes above " + std::to_string(self) + " to connect (start them, with the same --addresses)");
        return;
      }
      const std::uint64_t id = (*link)->peer().value;
      if (id < static_cast<std::uint64_t>(self) + 2 || id > static_cast<std::uint64_t>(n) || links[static_cast<std::size_t>(id - 1)]) {
        (*link)->close();
        spdlog::warn("pipeline node {}: refused a link from peer {}, which is no node above this one or came twice", self, (*link)->peer().to_string());
        --k;
        continue;
      }
      links[static_cast<std::size_t>(id - 1)] = std::move(*link);
    }
  });
  Status dialled;
  for (int j = 0; j < self && dialled.ok(); ++j) {
    for (;;) {
      auto link = transport.connect(req.addresses[static_cast<std::size_t>(j)], Deadline::after(real_clock(), std::chrono::seconds(5)));
      if (link.ok()) {
        if ((*link)->peer().value != static_cast<std::uint64_t>(j) + 1) {
          dialled = error(ErrorCode::kInvalidArgument, "the process at " + req.addresses[static_cast<std::size_t>(j)] + " is not pipeline node " + std::to_string(j) +
                                                          ": check --addresses (the same list, in node order, on every node)");
          (*link)->close();
          break;
        }
        links[static_cast<std::size_t>(j)] = std::move(*link);
        break;
      }
      if (link.status().code() == ErrorCode::kVersionMismatch || link.status().code() == ErrorCode::kUnauthenticated) {
        dialled = link.status().with_context("pipeline node " + std::to_string(j) + " at " + req.addresses[static_cast<std::size_t>(j)] +
                                             " (another config? every node must be given the same one)");
        break;
      }
      if (deadline.expired(real_clock()) || (req.stop != nullptr && req.stop->load())) {
        dialled = error(ErrorCode::kUnavailable, "pipeline node " + std::to_string(j) + " at " + req.addresses[static_cast<std::size_t>(j)] +
                                                     " did not answer: start it, or check the address (" + link.status().message() + ")");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // not up yet: try again
    }
  }
  if (!dialled.ok()) {
    // The acceptor waits for nodes that may never come, until its deadline or a stop.
    acceptor.join();
    close_all(links);
    return dialled;
  }
  acceptor.join();
  if (!accepted.ok()) {
    close_all(links);
    return accepted;
  }
  if (req.shape) {
    for (std::size_t j = 0; j < links.size(); ++j) {
      if (!links[j]) continue;
      auto shaped = transport::make_shaped_link(links[j], *req.shape, static_cast<std::uint64_t>(req.node) * 1000 + j + 1);
      if (!shaped.ok()) {
        close_all(links);
        return shaped.status();
      }
      links[j] = std::move(*shaped);
    }
  }
  return links;
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
  auto mesh = connect_mesh(req, transport);
  if (!mesh.ok() && req.stop != nullptr && req.stop->load()) {
    PipelineProcessOutcome stopped;
    stopped.stopped = true;  // while linking
    return stopped;
  }
  if (!mesh.ok()) return mesh.status();
  const Links links = std::move(*mesh);
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
  env.link = [&links](int, int to, int) { return links[static_cast<std::size_t>(to)]; };
  auto made = train::PipelineTrainer::make(c, data, env);
  if (!made.ok()) return made.status();
  train::PipelineTrainer& t = **made;
  const skippipe::Schedule& s = t.plan().schedule;
  PipelineProcessOutcome outcome;
  outcome.stage = s.stage_of[static_cast<std::size_t>(req.node)];
  outcome.schedule_hash = s.hash().hex();

  // One schedule: every node's hash against ours.
  const Deadline hello_deadline = Deadline::after(real_clock(), req.connect_timeout);
  const Digest mine = s.hash();
  for (int j = 0; j < n; ++j) {
    if (j == req.node) continue;
    if (Status st = links[static_cast<std::size_t>(j)]->send(transport::tags::kPipelineHello, ByteView(reinterpret_cast<const std::byte*>(mine.bytes.data()), mine.bytes.size()), hello_deadline); !st.ok()) {
      return st.with_context("sending the schedule's hash to node " + std::to_string(j));
    }
  }
  for (int j = 0; j < n; ++j) {
    if (j == req.node) continue;
    auto theirs = links[static_cast<std::size_t>(j)]->recv(transport::tags::kPipelineHello, hello_deadline);
    if (!theirs.ok()) return theirs.status().with_context("waiting for node " + std::to_string(j) + "'s schedule hash");
    if (theirs->size() != mine.bytes.size() || !std::equal(mine.bytes.begin(), mine.bytes.end(), reinterpret_cast<const std::uint8_t*>(theirs->data()))) {
      return error(ErrorCode::kInvalidArgument, "node " + std::to_string(j) + " planned another schedule than this node (" + outcome.schedule_hash.substr(0, 16) +
                                                    "...): every node must run the same build with the same config");
    }
  }
  spdlog::info("pipeline node {} (stage {}): schedule {} agreed by all {} nodes", req.node, outcome.stage, outcome.schedule_hash.substr(0, 16), n);

  const std::vector<int> holders = t.stage_holders();
  const int evaluator = holders[0];
  const auto shapes = stage_shapes(c);
  for (std::int64_t i = 1; i <= c.train.steps; ++i) {
    if (req.stop != nullptr && req.stop->load()) {
      outcome.stopped = true;
      return outcome;
    }
    auto rec = t.step();
    if (!rec.ok()) return rec.status().with_context("iteration " + std::to_string(i));
    ++outcome.iterations;
    std::optional<double> val;
    if ((c.train.eval_every > 0 && i % c.train.eval_every == 0) || i == c.train.steps) {
      const transport::Tag tag = transport::tags::kPipelineEval | static_cast<transport::Tag>(i & 0xFFFF);
      const Deadline deadline = Deadline::after(real_clock(), std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(c.train.round_timeout_s)));
      if (req.node == evaluator) {
        std::map<int, std::vector<at::Tensor>> stages;
        for (int stage = 0; stage < static_cast<int>(holders.size()); ++stage) {
          const int h = holders[static_cast<std::size_t>(stage)];
          if (h == req.node) {
            stages[stage] = t.node_parameters(h);
            continue;
          }
          auto got = links[static_cast<std::size_t>(h)]->recv(tag, deadline);
          if (!got.ok()) return got.status().with_context("waiting for stage " + std::to_string(stage) + "'s weights from node " + std::to_string(h));
          auto w = decode_weights(*got, shapes.at(stage));
          if (!w.ok()) return w.status().with_context("from node " + std::to_string(h));
          stages[stage] = std::move(*w);
        }
        val = t.evaluate_with(stages);
        outcome.final_val_loss = val;
      } else if (holders[static_cast<std::size_t>(outcome.stage)] == req.node) {
        if (Status st = links[static_cast<std::size_t>(evaluator)]->send(tag, encode_weights(t.node_parameters(req.node)), deadline); !st.ok()) {
          return st.with_context("sending stage " + std::to_string(outcome.stage) + "'s weights to node " + std::to_string(evaluator));
        }
      }
    }
    if (req.on_iteration) req.on_iteration(*rec, val);
  }
  // Goodbye: a node that is done says so to every other and waits for theirs, so none closes a
  // link (a shaped one drops what it still holds) while another still waits on it.
  const Deadline bye = Deadline::after(real_clock(), std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(c.train.round_timeout_s)));
  const transport::Tag bye_tag = transport::tags::kPipelineHello | 1u;
  for (int j = 0; j < n; ++j) {
    if (j == req.node) continue;
    if (Status st = links[static_cast<std::size_t>(j)]->send(bye_tag, ByteView(), bye); !st.ok()) return st.with_context("saying goodbye to node " + std::to_string(j));
  }
  for (int j = 0; j < n; ++j) {
    if (j == req.node) continue;
    if (auto got = links[static_cast<std::size_t>(j)]->recv(bye_tag, bye); !got.ok()) return got.status().with_context("waiting for node " + std::to_string(j) + "'s goodbye");
  }
  closer.done = true;  // the links close gracefully as they go
  return outcome;
}

}  // namespace gossamer::run
