#include "runtime/pipeline_process.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>

#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/signal.h"
#include "core/wire.h"
#include "model/gpt.h"
#include "optim/flat_params.h"
#include "runtime/link_probe.h"
#include "runtime/pipeline_agreement.h"
#include "runtime/pipeline_mesh.h"
#include "runtime/rounds.h"
#include "quant/codec.h"
#include "train/pipeline.h"
#include "train/run.h"
#include "train/worker.h"
#include "transport/tags.h"

namespace gossamer::runtime {

namespace {

using pipeline_mesh::Links;
using pipeline_mesh::close_all;
using pipeline_mesh::exchange;

constexpr transport::Tag kHashTag = transport::tags::kPipelineHash;
constexpr transport::Tag kByeTag = transport::tags::kPipelineBye;
constexpr transport::Tag kCommitTag = transport::tags::kPipelineCommit;
constexpr transport::Tag kViewTag = transport::tags::kPipelineView;
constexpr transport::Tag kProbeRowTag = transport::tags::kPipelineProbeRow;

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

// pipeline.network = measured: every node measures its links and its machine (runtime/link_probe.h),
// then sends its row to every other; each assembles the same network from the same rows.
Result<MeasuredNetwork> measure_network(const PipelineProcessRequest& req, const Links& links, int n) {
  const auto& c = req.config;
  ProbeOptions o;
  // A hop's size, but at least 64 KiB (a smaller message takes too little time to show a bandwidth)
  // and at most 4 MiB (enough to see one; 20 nodes' 19 rounds of three must not take minutes).
  o.bulk_bytes = std::clamp<std::size_t>(train::hop_bytes(c), std::size_t{64} << 10, std::size_t{4} << 20);
  o.deadline = Deadline::after(*req.clock, req.connect_timeout);
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

namespace {

// One node's run: links, the schedule's agreement, the iterations with their confirmations and
// evaluations, and the recovery after a lost node. Every step of the agreement is noted in
// outcome().agreement, so a test can hold a simulated node's against a process's.
class PipelineProcess {
 public:
  PipelineProcess(const PipelineProcessRequest& req, transport::Transport& transport, const data::Dataset& data)
      : req_(req), clock_(*req.clock), transport_(transport), data_(data), n_(static_cast<int>(req.addresses.size())),
        alive_(static_cast<std::size_t>(n_), true),
        round_timeout_(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(req.config.train.round_timeout_s))) {}
  ~PipelineProcess() {
    waiting_.clear();  // (an evaluation in flight reads the trainer)
    if (!done_) close_all(links_);  // a run that failed or stopped: the others learn at once
  }

  Result<PipelineProcessOutcome> run();

 private:
  // Each iteration's record, passed on in order once its evaluation (if any) is done.
  struct Evaluation {
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<double> value = std::make_shared<double>(0.0);
    std::unique_ptr<ClockThread> thread;
  };
  struct Waiting {
    train::PipelineRecord rec;
    std::unique_ptr<Evaluation> eval;  // null: no evaluation at this iteration
  };

  bool stopped() const { return req_.stop != nullptr && req_.stop->load(); }
  Deadline after(Nanos d) const { return Deadline::after(clock_, d); }
  void note(std::string line) { outcome_.agreement.push_back(std::move(line)); }
  // This node's weights as they stand (what the summary names), whenever the run ends.
  PipelineProcessOutcome& with_digest() {
    outcome_.params_digest = digest_of(bytes_of(optim::flatten(trainer_->node_parameters(req_.node)))).hex();
    return outcome_;
  }
  PipelineProcessOutcome& stop_now() {
    flush(true);
    outcome_.stopped = true;
    return trainer_ ? with_digest() : outcome_;
  }
  // Epoch epoch_'s links (pipeline_mesh::Want says what the deadlines mean).
  Status link(Deadline deadline, bool tolerate, Deadline alive_deadline);
  // As long as the slowest node's iteration may take (PipelineTrainer::step's deadlines): how long
  // the others wait for a node's confirmation, and for a node that has not noticed a failure yet.
  Nanos iteration_patience() const {
    return 2 * round_timeout_ + std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(4 * trainer_->plan().simulation.makespan_s));
  }
  Status make_trainer();
  Status agree_on_schedule(Deadline deadline);
  Status commit();
  Status recover(const Status& failure, std::int64_t iteration);
  Result<std::uint64_t> check_views(const std::vector<Bytes>& views, const std::vector<bool>& left);
  std::unique_ptr<Evaluation> evaluate(std::int64_t i);
  void flush(bool all);
  Status goodbye();

  const PipelineProcessRequest& req_;
  Clock& clock_;
  transport::Transport& transport_;
  const data::Dataset& data_;
  const int n_;
  std::vector<bool> alive_;
  const Nanos round_timeout_;
  std::uint64_t epoch_ = 0;
  Links links_;
  bool done_ = false;  // the links closed gracefully
  PipelineProcessOutcome outcome_;
  std::unique_ptr<train::PipelineTrainer> trainer_;
  std::map<int, std::vector<std::vector<std::int64_t>>> shapes_;  // what a stage's weights sent for evaluation must be
  std::int64_t committing_ = 0;
  std::deque<Waiting> waiting_;  // after trainer_: destroyed (evaluations joined) first
};

Status PipelineProcess::link(Deadline deadline, bool tolerate, Deadline alive_deadline) {
  auto mesh = pipeline_mesh::connect(req_, transport_, pipeline_mesh::Want{alive_, epoch_, deadline, tolerate, alive_deadline});
  if (!mesh.ok()) return mesh.status();
  links_ = std::move(*mesh);
  std::vector<bool> linked(static_cast<std::size_t>(n_));
  for (int j = 0; j < n_; ++j) linked[static_cast<std::size_t>(j)] = j == req_.node || links_[static_cast<std::size_t>(j)] != nullptr;
  note("linked " + std::to_string(epoch_) + ": " + pipeline_mesh::node_list(linked));
  return Status();
}

Status PipelineProcess::make_trainer() {
  train::PipelineEnvironment env;
  env.clock = &clock_;
  env.compute = req_.compute;
  env.plans = req_.plans;
  env.local = {req_.node};
  env.link = [this](int, int to, int) { return links_[static_cast<std::size_t>(to)]; };  // this epoch's
  if (req_.config.pipeline.network == train::PipelineNetwork::kMeasured) {
    auto measured = measure_network(req_, links_, n_);
    if (!measured.ok()) return measured.status();
    env.network = measured->network;
    env.node_forward_s = measured->forward_s;
    outcome_.measured = std::move(*measured);
  }
  auto made = train::PipelineTrainer::make(req_.config, data_, env);
  if (!made.ok()) return made.status();
  trainer_ = std::move(*made);
  shapes_ = stage_shapes(req_.config);
  outcome_.stage = trainer_->plan().schedule.stage_of[static_cast<std::size_t>(req_.node)];
  return Status();
}

// One schedule: every node's hash against ours.
Status PipelineProcess::agree_on_schedule(Deadline deadline) {
  const Digest mine = trainer_->plan().schedule.hash();
  outcome_.schedule_hash = mine.hex();
  auto theirs = exchange(links_, req_.node, kHashTag, ByteView(reinterpret_cast<const std::byte*>(mine.bytes.data()), mine.bytes.size()), deadline,
                         "agreeing on the schedule");
  if (!theirs.ok()) return theirs.status();
  for (std::size_t j = 0; j < theirs->size(); ++j) {
    const Bytes& b = (*theirs)[j];
    if (!links_[j] || static_cast<int>(j) == req_.node) continue;
    if (b.size() != mine.bytes.size() || !std::equal(mine.bytes.begin(), mine.bytes.end(), reinterpret_cast<const std::uint8_t*>(b.data()))) {
      return error(ErrorCode::kInvalidArgument, "node " + std::to_string(j) + " planned another schedule than this node (" + outcome_.schedule_hash.substr(0, 16) +
                                                    "...): every node must run the same build with the same config");
    }
  }
  note("schedule " + outcome_.schedule_hash.substr(0, 16));
  return Status();
}

// Every node confirms it got through the iteration before any weight moves (ddp), so a lost node
// leaves every survivor's weights as they were.
Status PipelineProcess::commit() {
  const Bytes confirmation = pipeline_agreement::encode_commit(static_cast<std::uint64_t>(committing_));
  if (req_.crash_while_confirming == committing_) {
    for (int j = 0; j < req_.node; ++j) {
      if (links_[static_cast<std::size_t>(j)]) (void)links_[static_cast<std::size_t>(j)]->send(kCommitTag, confirmation, after(round_timeout_));
    }
    clock_.sleep_for(std::chrono::milliseconds(200));  // (what was sent leaves before the links go)
    close_all(links_);
    return error(ErrorCode::kAborted, "fault drill: died while confirming iteration " + std::to_string(committing_));
  }
  auto acks = exchange(links_, req_.node, kCommitTag, confirmation, after(iteration_patience()), "confirming the iteration");
  if (!acks.ok()) return acks.status();
  for (std::size_t j = 0; j < acks->size(); ++j) {
    if (!links_[j] || static_cast<int>(j) == req_.node) continue;
    auto it = pipeline_agreement::decode_commit((*acks)[j], "node " + std::to_string(j));
    if (!it.ok()) return it.status();
    if (*it != static_cast<std::uint64_t>(committing_)) return error(ErrorCode::kMalformed, "node " + std::to_string(j) + " confirmed another iteration");
  }
  note("confirmed " + std::to_string(committing_));
  return Status();
}

// The other nodes' views (how far each got, whom each reaches) against this node's: the furthest
// iteration done, or why they disagree.
Result<std::uint64_t> PipelineProcess::check_views(const std::vector<Bytes>& views, const std::vector<bool>& left) {
  const auto mine = static_cast<std::uint64_t>(trainer_->iterations_done());
  std::uint64_t furthest = mine;
  for (std::size_t j = 0; j < views.size(); ++j) {
    if (!links_[j] || static_cast<int>(j) == req_.node) continue;
    auto view = pipeline_agreement::decode_view(views[j], n_, "node " + std::to_string(j));
    if (!view.ok()) return view.status();
    const std::uint64_t done = view->done;
    const std::vector<bool>& theirs = view->reaches;
    // A node lost while it confirmed an iteration may have confirmed it to some nodes and not to
    // others: those that heard every confirmation applied it, the others not yet. Every survivor
    // sent its own confirmation (the ones ahead heard it), so each holds that iteration's
    // gradients: the ones behind by one apply it, and all go on from there.
    if (done + 1 < mine || done > mine + 1 || (done == mine + 1 && !trainer_->pending())) {
      return error(ErrorCode::kAborted, "node " + std::to_string(j) + " finished " + std::to_string(done) + " iterations, this one " + std::to_string(mine) +
                                            ": the nodes' weights no longer agree; restart the pipeline");
    }
    furthest = std::max(furthest, done);
    if (theirs != left) {
      return error(ErrorCode::kAborted, "node " + std::to_string(j) + " reaches nodes " + pipeline_mesh::node_list(theirs) + ", this one " +
                                            pipeline_mesh::node_list(left) + " (a network split?): the pipeline cannot agree on who is left");
    }
  }
  return furthest;
}

// After a failed iteration: link again with every node that answers, agree on who they are, and go
// on without the others (ddp inside the stages: no weight moved in the failed iteration).
Status PipelineProcess::recover(const Status& failure, std::int64_t iteration) {
  if (req_.config.pipeline.stage_sync != optim::Method::kDdp) return failure.with_context("(rescheduling around a lost node needs pipeline.stage_sync = ddp)");
  close_all(links_);
  ++epoch_;
  spdlog::warn("pipeline node {}: iteration {} failed ({}); linking again with the nodes that answer", req_.node, iteration, failure.message());
  // The nodes that notice the failure an iteration later are waited for, in linking and after (a
  // node linked late sends its view late).
  if (Status st = link(after(req_.rejoin_timeout), true, after(req_.rejoin_timeout + iteration_patience())); !st.ok()) {
    return st.with_context("after: " + failure.message());
  }
  const Deadline patient = after(req_.rejoin_timeout + iteration_patience() + std::chrono::seconds(5));
  std::vector<bool> left(static_cast<std::size_t>(n_), false);
  for (int j = 0; j < n_; ++j) left[static_cast<std::size_t>(j)] = j == req_.node || links_[static_cast<std::size_t>(j)] != nullptr;
  const auto mine = static_cast<std::uint64_t>(trainer_->iterations_done());
  // Who this node reached, and how far it got: they must agree.
  const Bytes view = pipeline_agreement::encode_view(pipeline_agreement::View{mine, left});
  note("view " + std::to_string(epoch_) + ": done " + std::to_string(mine) + ", reaching " + pipeline_mesh::node_list(left));
  auto views = exchange(links_, req_.node, kViewTag, view, patient, "agreeing on the nodes left");
  if (!views.ok()) return views.status().with_context("after: " + failure.message());
  auto furthest = check_views(*views, left);
  if (!furthest.ok()) return furthest.status();
  std::vector<int> dead;
  for (int j = 0; j < n_; ++j) {
    if (alive_[static_cast<std::size_t>(j)] && !left[static_cast<std::size_t>(j)]) dead.push_back(j);
  }
  if (dead.empty()) return failure;  // every node answered: the failure was not a lost node
  if (*furthest == mine + 1) {
    auto caught_up = trainer_->apply_pending();
    if (!caught_up.ok()) return caught_up.status();
    spdlog::warn("pipeline node {}: the others applied iteration {} (a lost node confirmed it to them, not to this one): applied it too", req_.node,
                 caught_up->iteration);
    note("caught up " + std::to_string(caught_up->iteration));
    ++outcome_.iterations;
    waiting_.push_back(Waiting{*caught_up, nullptr});
    flush(false);
  }
  if (Status st = trainer_->exclude(dead); !st.ok()) return st.with_context("after: " + failure.message());
  std::vector<bool> gone(static_cast<std::size_t>(n_), false);
  for (int j : dead) gone[static_cast<std::size_t>(j)] = true;
  note("without " + pipeline_mesh::node_list(gone));
  alive_ = left;
  return agree_on_schedule(patient);
}

// Evaluation at iteration i: each stage's holder sends its weights to stage 0's, which evaluates
// them on copies on a thread of its own; null where this node does not evaluate.
std::unique_ptr<PipelineProcess::Evaluation> PipelineProcess::evaluate(std::int64_t i) {
  train::PipelineTrainer& t = *trainer_;
  const std::vector<int> holders = t.stage_holders();
  const int evaluator = holders[0];
  const transport::Tag tag = transport::tags::kPipelineEval | static_cast<transport::Tag>(i & 0xFFFF);
  const Deadline deadline = after(round_timeout_);
  if (req_.node != evaluator) {
    if (holders[static_cast<std::size_t>(outcome_.stage)] != req_.node) return nullptr;
    if (Status st = links_[static_cast<std::size_t>(evaluator)]->send(tag, encode_weights(t.node_parameters(req_.node)), deadline); !st.ok()) {
      spdlog::warn("pipeline node {}: could not send stage {}'s weights for the evaluation at iteration {} to node {}: {}", req_.node, outcome_.stage, i,
                   evaluator, st.message());
    }
    return nullptr;
  }
  std::map<int, std::vector<at::Tensor>> stages;
  for (int stage = 0; stage < static_cast<int>(holders.size()); ++stage) {
    const int h = holders[static_cast<std::size_t>(stage)];
    if (h == req_.node) {
      stages[stage] = t.node_parameters(h);
      continue;
    }
    // A holder lost (or sending garbage) costs this evaluation, not the run: the next iteration
    // finds out whether a node is gone.
    auto got = links_[static_cast<std::size_t>(h)]->recv(tag, deadline);
    auto w = got.ok() ? decode_weights(*got, shapes_.at(stage)) : Result<std::vector<at::Tensor>>(got.status());
    if (!w.ok()) {
      spdlog::warn("pipeline node {}: evaluation at iteration {} skipped: stage {}'s weights from node {}: {}", req_.node, i, stage, h, w.status().message());
      ++outcome_.skipped_evaluations;
      return nullptr;
    }
    stages[stage] = std::move(*w);
  }
  // Evaluated beside the next iterations, on copies: an evaluation that takes long must not make
  // this node late to link again after a loss (the others would leave it out).
  flush(true);  // (the previous evaluation first: one at a time)
  for (auto& [stage, params] : stages) {
    for (auto& p : params) p = p.detach().clone();
  }
  if (i == req_.config.train.steps) outcome_.model = std::make_shared<model::Gpt>(t.assemble(stages, t.depth_scales()));
  auto e = std::make_unique<Evaluation>();
  std::optional<train::EndEvaluation> end;
  if (i == req_.config.train.steps && req_.omission_check) end.emplace(t, train::default_omitted_stages(req_.config.pipeline.stages));
  e->thread = clock_.start_thread([this, &t, stages = std::move(stages), scales = t.depth_scales(), end = std::move(end), done = e->done, value = e->value] {
    *value = t.evaluate_with(stages, scales);
    if (end) outcome_.end = end->measure(t, stages, *value);  // (read once this evaluation is joined)
    done->store(true);
  });
  return e;
}

void PipelineProcess::flush(bool all) {
  while (!waiting_.empty()) {
    Waiting& w = waiting_.front();
    std::optional<double> val;
    if (w.eval) {
      if (!all && !w.eval->done->load()) break;
      w.eval->thread->join();
      val = *w.eval->value;
      outcome_.final_val_loss = val;
    }
    if (req_.on_iteration) req_.on_iteration(w.rec, val);
    waiting_.pop_front();
  }
}

// A node that is done says so to every other and waits for theirs, so none closes a link (a shaped
// one drops what it still holds) while another still waits on it.
Status PipelineProcess::goodbye() {
  auto byes = exchange(links_, req_.node, kByeTag, ByteView(), after(round_timeout_), "saying goodbye");
  if (!byes.ok()) return byes.status();
  note("goodbye");
  done_ = true;  // the links close gracefully as they go
  return Status();
}

Result<PipelineProcessOutcome> PipelineProcess::run() {
  const auto& c = req_.config;
  const Deadline linked_by = after(req_.connect_timeout);
  if (Status st = link(linked_by, false, linked_by); !st.ok()) {
    if (stopped()) return stop_now();  // while linking
    return st;
  }
  spdlog::info("pipeline node {}: linked to the other {} nodes", req_.node, n_ - 1);
  if (Status st = make_trainer(); !st.ok()) {
    if (stopped()) return stop_now();  // Ctrl-C while measuring
    return st.with_context("before training (a node lost now ends the start: start the nodes again)");
  }
  if (Status st = agree_on_schedule(after(req_.connect_timeout)); !st.ok()) return st;
  spdlog::info("pipeline node {} (stage {}): schedule {} agreed by all {} nodes", req_.node, outcome_.stage, outcome_.schedule_hash.substr(0, 16), n_);
  outcome_.first_plan = trainer_->plan();
  for (std::int64_t i = 1; i <= c.train.steps; ++i) {
    if (stopped()) return stop_now();
    committing_ = i;
    if (req_.on_iteration_start) req_.on_iteration_start(i, trainer_->plan().simulation.makespan_s);
    const Nanos started = clock_.now();
    auto rec = trainer_->step([this] { return commit(); });
    if (!rec.ok() && (rec.status().code() == ErrorCode::kPeerLost || rec.status().code() == ErrorCode::kTimeout) && !stopped()) {
      const Nanos failed = clock_.now();
      outcome_.retried_s += std::chrono::duration<double>(failed - started).count();
      if (Status st = recover(rec.status(), i); !st.ok()) {
        if (stopped()) return stop_now();  // Ctrl-C while linking again
        return st.with_context("iteration " + std::to_string(i));
      }
      outcome_.rejoin_s += std::chrono::duration<double>(clock_.now() - failed).count();
      outcome_.stage = trainer_->plan().schedule.stage_of[static_cast<std::size_t>(req_.node)];
      ++outcome_.retried_iterations;
      // The same iteration again, without the lost nodes (or the next, when this one was caught up).
      i = trainer_->iterations_done();
      continue;
    }
    if (!rec.ok()) return rec.status().with_context("iteration " + std::to_string(i));
    ++outcome_.iterations;
    outcome_.lost_nodes = trainer_->lost_nodes();
    std::unique_ptr<Evaluation> eval;
    if ((c.train.eval_every > 0 && i % c.train.eval_every == 0) || i == c.train.steps) eval = evaluate(i);
    waiting_.push_back(Waiting{*rec, std::move(eval)});
    flush(false);
  }
  flush(true);
  outcome_.last_plan = trainer_->plan();
  // Training is done: a node gone now costs nothing but its goodbye.
  if (Status st = goodbye(); !st.ok()) spdlog::warn("pipeline node {}: {}", req_.node, st.message());
  return with_digest();
}

}  // namespace

Result<PipelineProcessOutcome> run_pipeline_process(const PipelineProcessRequest& req, transport::Transport& transport, const data::Dataset& data) {
  const auto& c = req.config;
  const int n = static_cast<int>(req.addresses.size());
  GOSSAMER_CHECK(req.clock != nullptr, "run_pipeline_process: the request names no clock");
  if (n != c.pipeline.nodes) {
    return error(ErrorCode::kInvalidArgument, "--addresses names " + std::to_string(n) + " nodes, pipeline.nodes is " + std::to_string(c.pipeline.nodes) + ": give one per node");
  }
  if (req.node < 0 || req.node >= n) return error(ErrorCode::kInvalidArgument, "--node " + std::to_string(req.node) + ": use 0 .. " + std::to_string(n - 1));
  if (!req.ids.empty() && req.ids.size() != req.addresses.size()) {
    return error(ErrorCode::kInvalidArgument, "pipeline: " + std::to_string(req.ids.size()) + " peer ids for " + std::to_string(n) + " addresses");
  }
  PipelineProcess process(req, transport, data);
  return process.run();
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

}  // namespace gossamer::runtime
