#include "train/outer.h"

#include <torch/torch.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "train/device.h"

namespace gossamer::train {

namespace {

quant::EncodeOptions codec(quant::CodecId id, std::int64_t block) {
  quant::EncodeOptions o;
  o.codec = id;
  o.block_size = static_cast<std::uint32_t>(block);
  return o;
}

}  // namespace


namespace {

// A run in which the method never synchronizes trains independent models and sends nothing: refused.
Status check_synchronizes(const RunConfig& c, optim::Method method, std::int64_t fragments) {
  const std::string m = name_of(c.outer.method);
  const bool streaming = method == optim::Method::kStreamingDiLoCo;
  std::int64_t first = 0;
  std::string key;
  switch (method) {
    case optim::Method::kDiLoCo: first = c.diloco.inner_steps, key = "diloco.inner_steps"; break;
    case optim::Method::kNoLoCo: first = c.noloco.inner_steps, key = "noloco.inner_steps"; break;
    case optim::Method::kCO2: first = c.co2.inner_steps, key = "co2.inner_steps"; break;
    case optim::Method::kSparseLoCo: first = sparseloco_period(c), key = "sparseloco.inner_steps"; break;
    case optim::Method::kMuLoCo: first = c.muloco.inner_steps, key = "muloco.inner_steps"; break;
    case optim::Method::kStreamingDiLoCo:
      first = c.streaming_diloco.inner_steps / std::max<std::int64_t>(1, fragments), key = "streaming_diloco.inner_steps";
      break;
    case optim::Method::kDdp:
    case optim::Method::kLocal: break;
  }
  if (key.empty() || first <= c.train.steps) return Status();
  return error(ErrorCode::kInvalidArgument,
               m + " would never synchronize: its first round comes after step " + std::to_string(first) + " (" + key + " = " +
                   std::to_string(streaming ? c.streaming_diloco.inner_steps : first) + (streaming ? ", over " + std::to_string(fragments) + " fragments" : "") +
                   "), beyond train.steps = " + std::to_string(c.train.steps) + "; lower " + key + " or raise train.steps (outer.method = \"local\" trains without synchronizing)");
}

}  // namespace

std::vector<std::string> config_warnings(const RunConfig& c) {
  std::vector<std::string> out;
  const auto& sd = c.streaming_diloco;
  const optim::Method method = c.outer.method;
  if (method == optim::Method::kStreamingDiLoCo && sd.fragment_layers > c.model.layers) {
    out.push_back("streaming_diloco.fragment_layers (" + std::to_string(sd.fragment_layers) + ") exceeds model.layers (" + std::to_string(c.model.layers) +
                  "): the whole model is one fragment, synchronized every streaming_diloco.inner_steps steps as DiLoCo would; set it to at most " +
                  std::to_string(c.model.layers) + " for fragments that take turns");
  }
  if (c.outer.round_budget == RoundBudget::kTime && budget_period(c) == 0) {
    std::string applies;
    for (const auto& m : optim::kMethods) {
      if (m.time_budget) applies += (applies.empty() ? "" : ", ") + std::string(m.name);
    }
    out.push_back("outer.round_budget = time applies to " + applies + "; " + name_of(c.outer.method) +
                  " runs every member's steps in lockstep as with outer.round_budget = steps");
  }
  return out;
}

std::int64_t sparseloco_period(const RunConfig& c) {
  if (c.sparseloco.inner_steps > 0) return c.sparseloco.inner_steps;
  constexpr std::int64_t kCovenantPeriod = 30, kDrains = 3;
  const std::int64_t drain_rounds = (c.sparseloco.chunk + c.sparseloco.topk - 1) / std::max<std::int64_t>(1, c.sparseloco.topk);
  return std::clamp<std::int64_t>(c.train.steps / (kDrains * drain_rounds), 1, kCovenantPeriod);
}

std::int64_t budget_period(const RunConfig& c) {
  if (c.outer.round_budget != RoundBudget::kTime) return 0;
  switch (c.outer.method) {
    case optim::Method::kDiLoCo: return c.diloco.inner_steps;
    case optim::Method::kStreamingDiLoCo: return c.streaming_diloco.inner_steps;
    case optim::Method::kSparseLoCo: return sparseloco_period(c);
    case optim::Method::kMuLoCo: return c.muloco.inner_steps;
    default: return 0;
  }
}

namespace {

void set_diloco_and_muloco(const RunConfig& c, optim::OuterConfig& o, const quant::EncodeOptions& diloco_codec, const quant::EncodeOptions& muloco_codec) {
  o.diloco.inner_steps = c.diloco.inner_steps;
  o.diloco.outer_lr = c.diloco.outer_lr;
  o.diloco.outer_momentum = c.diloco.outer_momentum;
  o.diloco.codec = diloco_codec;
  o.diloco.delay_rounds = c.diloco.delay_rounds;
  if (c.diloco.outer_step == OuterStep::kCgad) {
    o.diloco.outer_step = optim::OuterStep::kCGAD;
    // The rule: an Adam step moves each weight by about its lr; H inner steps of random sign move it
    // by about sqrt(H) inner lrs.
    o.diloco.cgad.lr = c.diloco.cgad_lr > 0 ? c.diloco.cgad_lr : c.train.lr * std::sqrt(static_cast<double>(c.diloco.inner_steps));
    o.diloco.cgad.gate = optim::AgeGate{c.outer.age_decay, c.outer.age_cutoff};
  }
  o.muloco.inner_steps = c.muloco.inner_steps;
  o.muloco.outer_lr = c.muloco.outer_lr;
  o.muloco.outer_momentum = c.muloco.outer_momentum;
  o.muloco.codec = muloco_codec;
  o.muloco.error_feedback = true;
  o.muloco.error_decay = c.muloco.error_decay;
}

// Streaming DiLoCo's options and fragments; their count in `fragments`.
Status set_streaming(const RunConfig& c, optim::OuterConfig& o, const quant::EncodeOptions& codec, std::int64_t& fragments) {
  const auto& sd = c.streaming_diloco;
  o.fragments.pattern = sd.pattern == FragmentOrder::kSequential ? optim::FragmentPattern::kSequential : optim::FragmentPattern::kStrided;
  o.fragments.edges = sd.edges == FragmentEdges::kOwnFragments ? optim::EdgePlacement::kOwnFragments : optim::EdgePlacement::kWithNeighbors;
  o.fragments.fragments = static_cast<int>((c.model.layers + sd.fragment_layers - 1) / sd.fragment_layers);
  const std::int64_t p = optim::fragment_count(o.fragments);
  fragments = p;
  o.streaming.inner_steps = sd.inner_steps;
  o.streaming.overlap = sd.overlap;
  o.streaming.mixing = sd.mixing;
  o.streaming.outer_lr = sd.outer_lr;
  o.streaming.outer_momentum = sd.outer_momentum;
  o.streaming.codec = codec;
  if (o.method != optim::Method::kStreamingDiLoCo) return Status();
  if (sd.inner_steps % p != 0) {
    return error(ErrorCode::kInvalidArgument, "streaming_diloco.inner_steps (" + std::to_string(sd.inner_steps) + ") must be a multiple of the " +
                                                  std::to_string(p) + " fragments (" + std::to_string(c.model.layers) + " layers in fragments of " +
                                                  std::to_string(sd.fragment_layers) + ")");
  }
  if (sd.overlap >= sd.inner_steps / p) {
    return error(ErrorCode::kInvalidArgument, "streaming_diloco.overlap (" + std::to_string(sd.overlap) + ") must be below inner_steps / fragments = " +
                                                  std::to_string(sd.inner_steps / p));
  }
  return Status();
}

void set_noloco_and_co2(const RunConfig& c, optim::OuterConfig& o, const quant::EncodeOptions& noloco_codec, const quant::EncodeOptions& co2_codec) {
  o.noloco.inner_steps = c.noloco.inner_steps;
  o.noloco.outer_lr = c.noloco.outer_lr;
  o.noloco.outer_lr_gamma = c.noloco.outer_lr;
  o.noloco.outer_momentum = c.noloco.outer_momentum;
  o.noloco.seed = static_cast<std::uint64_t>(c.train.seed);
  o.noloco.codec = noloco_codec;
  o.co2.inner_steps = c.co2.inner_steps;
  o.co2.outer_lr = c.co2.outer_lr;
  o.co2.outer_momentum = c.co2.outer_momentum;
  o.co2.gap_penalty = c.co2.gap_penalty;
  o.co2.clip = c.co2.clip_threshold > 0;
  o.co2.clip_threshold = c.co2.clip_threshold > 0 ? c.co2.clip_threshold : 1.0;
  o.co2.codec = co2_codec;
}

Status set_sparseloco(const RunConfig& c, optim::OuterConfig& o) {
  o.sparseloco.inner_steps = sparseloco_period(c);
  o.sparseloco.outer_lr = c.sparseloco.outer_lr;
  o.sparseloco.error_decay = c.sparseloco.error_decay;
  o.sparseloco.sparse.chunk = static_cast<std::uint32_t>(c.sparseloco.chunk);
  o.sparseloco.sparse.topk = static_cast<std::uint32_t>(c.sparseloco.topk);
  if (c.sparseloco.flush_codec) {
    o.sparseloco.flush_codec = codec(*c.sparseloco.flush_codec, c.outer.codec_block);
    o.sparseloco.last_step = c.train.steps;
  }
  return Status();
}

// What every method shares: where the outer state lives, how contributions combine, token weights.
Status set_shared(const RunConfig& c, optim::OuterConfig& o) {
  at::Device state_device = at::kCPU;
  if (c.outer.state_device == StateDevice::kDevice) {
    auto device = resolve_device(c.train.device);
    if (!device.ok()) return device.status().with_context("outer.state_device = \"device\"");
    state_device = *device;
  }
  o.diloco.state_device = o.streaming.state_device = o.noloco.state_device = o.co2.state_device = o.sparseloco.state_device = o.muloco.state_device =
      state_device;
  optim::Aggregation agg;
  agg.rule = c.outer.aggregation == Aggregation::kFiltered       ? optim::Aggregation::Rule::kFiltered
             : c.outer.aggregation == Aggregation::kTrimmedMean ? optim::Aggregation::Rule::kTrimmedMean
                                                                : optim::Aggregation::Rule::kMean;
  agg.outlier_factor = c.outer.outlier_factor;
  agg.trim = static_cast<int>(c.outer.trim);
  o.diloco.aggregation = o.streaming.aggregation = o.co2.aggregation = o.sparseloco.aggregation = o.muloco.aggregation = o.ddp_aggregation = agg;
  o.diloco.token_weighted = o.streaming.token_weighted = o.sparseloco.token_weighted = o.muloco.token_weighted = c.outer.round_budget == RoundBudget::kTime;
  return Status();
}

}  // namespace

Result<optim::OuterConfig> outer_config(const RunConfig& c) {
  optim::OuterConfig o;
  o.method = c.outer.method;
  const std::int64_t block = c.outer.codec_block;
  o.ddp_codec = codec(c.ddp.codec, block);
  switch (c.ddp.engine) {
    case DdpEngine::kLinks: o.ddp_engine = optim::OuterConfig::DdpEngine::kLinks; break;
    case DdpEngine::kGloo: o.ddp_engine = optim::OuterConfig::DdpEngine::kGloo; break;
    case DdpEngine::kNccl: o.ddp_engine = optim::OuterConfig::DdpEngine::kNccl; break;
  }
  set_diloco_and_muloco(c, o, codec(c.diloco.codec, block), codec(c.muloco.codec, block));
  std::int64_t fragments = 0;
  if (Status st = set_streaming(c, o, codec(c.streaming_diloco.codec, block), fragments); !st.ok()) return st;
  if (Status st = check_synchronizes(c, o.method, fragments); !st.ok()) return st;
  if (Status st = set_shared(c, o); !st.ok()) return st;
  set_noloco_and_co2(c, o, codec(c.noloco.codec, block), codec(c.co2.codec, block));
  if (Status st = set_sparseloco(c, o); !st.ok()) return st;
  return o;
}

std::vector<optim::ParamBlock> param_blocks(const model::LanguageModel& model) {
  std::vector<optim::ParamBlock> out;
  for (const auto& b : model.blocks()) {
    optim::ParamBlock pb;
    pb.name = b.name;
    for (const auto& p : b.parameters) pb.tensors.push_back(p.tensor);
    out.push_back(std::move(pb));
  }
  return out;
}

nlohmann::json WorkerAccount::to_json() const {
  nlohmann::json j = {{"steps", steps},           {"tokens", tokens},
                       {"rounds", rounds},         {"skipped_rounds", skipped_rounds},
                       {"bytes_sent", bytes_sent}, {"bytes_received", bytes_received},
                       {"compute_s", compute_s},   {"blocked_s", blocked_s},
                       {"computed_steps", computed_steps}, {"computed_tokens", computed_tokens}, {"merged_tokens", merged_tokens},
                       {"loop_s", loop_s}};
  if (state_bytes_sent > 0) j["state_bytes_sent"] = state_bytes_sent;
  if (state_bytes_received > 0) j["state_bytes_received"] = state_bytes_received;
  if (gossip_bytes_sent > 0) j["gossip_bytes_sent"] = gossip_bytes_sent;
  if (gossip_bytes_received > 0) j["gossip_bytes_received"] = gossip_bytes_received;
  if (membership_bytes_sent > 0) j["membership_bytes_sent"] = membership_bytes_sent;
  if (left_out > 0) j["left_out"] = left_out;
  if (late_tokens_carried > 0) j["late_tokens_carried"] = late_tokens_carried;
  if (late_tokens_lost > 0) j["late_tokens_lost"] = late_tokens_lost;
  return j;
}

double goodput(const WorkerAccount& a) {
  if (a.compute_s <= 0 || a.loop_s <= 0 || a.computed_tokens <= 0) return 0.0;
  return static_cast<double>(a.merged_tokens) / (static_cast<double>(a.computed_tokens) / a.compute_s * a.loop_s);
}

namespace {

// The loop's state and its phases: agree the group, one inner step (gradients averaged inside it for
// data parallelism), the outer round, evaluation and the record.
class WorkerLoop {
 public:
  WorkerLoop(Worker& worker, optim::OuterSetup& setup, Clock& clock, const LoopOptions& o, const LoopHooks& hooks)
      : worker_(worker), setup_(setup), outer_(*setup.outer), clock_(clock), o_(o), hooks_(hooks), budget_(o.budget_period),
        shares_state_(outer_.name() != optim::method_name(optim::Method::kLocal)) {}

  WorkerAccount run() {
    while (worker_.steps_done() < o_.steps) {
      if (hooks_.keep_going && !hooks_.keep_going(worker_.steps_done() + 1)) break;
      {
        const Nanos t0 = clock_.now();  // agreeing on a group (real peers) is waiting on communication too
        // A regroup that caught this worker up (it was left out of a round and replayed the members'
        // updates) moves it past steps: the group of the step it goes on from is asked for in turn, or
        // a round due there would run over the group it was left with (its own alone).
        for (std::int64_t next = worker_.steps_done() + 1;;) {
          regroup(next);
          const std::int64_t now = worker_.steps_done() + 1;
          if (now == next || now > o_.steps) break;
          next = now;
        }
        blocked_since(t0);
      }
      if (worker_.steps_done() >= o_.steps) break;  // caught up through the run's end
      const StepResult r = budget_.take(worker_.steps_done() + 1) ? inner_step() : idle_step();
      if (r.replaced) {  // left behind, this worker took the members' state: it goes on from there
        pending_tokens_ = 0;  // what it computed since its last merge is lost
        continue;
      }
      if (!r.sync.ok()) {
        spdlog::warn("step {}: gradient averaging failed, the step used local gradients: {}", r.step, r.sync.to_string());
        outer_.skip_round();
      }
      const auto synced = outer_round(r.step);
      if (!synced) continue;  // left behind, as above (its tokens were settled when it was)
      if (synced->ok() && **synced && hooks_.applied) hooks_.applied(r.step);
      merge(r, *synced);
      if (budget_.enabled() && r.step == optim::kCalibrationStep) {
        budget_.observe(last_step_s_, outer_.fastest_step_seconds());  // the members' second steps, timed together
        round_steps_ = 0;
        round_compute_s_ = 0;
      } else if (budget_.enabled() && r.step % budget_.period() == 0) {
        adjust_budget();
      }
      if (r.step == o_.steps) finish();
      record(r, *synced);
    }
    take_counters();
    return acc_;
  }

 private:
  double pace(double measured) const { return hooks_.pace ? hooks_.pace(measured) : measured; }
  void blocked_since(Nanos t0) { acc_.blocked_s += std::chrono::duration<double>(clock_.now() - t0).count(); }

  void take_counters() {  // the optimizer keeps the communication counters
    acc_.loop_s = std::chrono::duration<double>(clock_.now() - started_).count();
    const optim::CommStats comm = outer_.comm();
    if (hooks_.state_traffic) std::tie(acc_.state_bytes_sent, acc_.state_bytes_received) = hooks_.state_traffic();
    if (hooks_.gossip_traffic) std::tie(acc_.gossip_bytes_sent, acc_.gossip_bytes_received) = hooks_.gossip_traffic();
    if (hooks_.membership_traffic) acc_.membership_bytes_sent = hooks_.membership_traffic();
    acc_.bytes_sent = comm.bytes_sent + acc_.state_bytes_sent + acc_.gossip_bytes_sent;
    acc_.bytes_received = comm.bytes_received + acc_.state_bytes_received + acc_.gossip_bytes_received;
    acc_.left_out = comm.left_out;
    acc_.rounds = outer_.rounds();
    acc_.skipped_rounds = outer_.skipped_rounds();
  }

  void emit(nlohmann::json rec) {
    if (!hooks_.record) return;
    take_counters();
    rec.update(acc_.to_json());
    rec["time_s"] = std::chrono::duration<double>(clock_.now()).count();
    hooks_.record(rec);
  }

  // True when the members changed and the optimizer now runs over the new group.
  bool regroup(std::int64_t step) {
    if (!hooks_.regroup) return false;
    auto group = hooks_.regroup(step);
    settle_left_behind();
    if (!group) return false;
    if (Status st = outer_.regroup(std::move(*group)); !st.ok()) {
      spdlog::warn("members changed but {} cannot follow: {}", outer_.name(), st.to_string());
      return false;
    }
    return true;
  }

  // Left behind since the last regroup: what it computed since its last merge is merged, carried into
  // its next contribution, or lost (LoopHooks::left_behind).
  void settle_left_behind() {
    if (!hooks_.left_behind) return;
    const auto left = hooks_.left_behind();
    if (!left) return;
    const auto share = [&](double s) { return std::llround(static_cast<double>(pending_tokens_) * std::clamp(s, 0.0, 1.0)); };
    acc_.merged_tokens += share(left->merged);
    acc_.late_tokens_carried += share(left->carried);
    acc_.late_tokens_lost += pending_tokens_ - share(left->merged) - share(left->carried);
    pending_tokens_ = share(left->carried);
  }

  // A slot in which this member, slower than the group's fastest, computes nothing (StepBudget).
  StepResult idle_step() {
    worker_.skip_step();
    StepResult r;
    r.step = worker_.steps_done();
    r.loss = last_loss_;
    r.lr = last_lr_;
    acc_.steps = r.step;
    return r;
  }

  // Goodput's numerator: a step's tokens reach the shared model when its gradients were averaged
  // (ddp), or when a round that took in the work since the last one was applied (the other methods;
  // a failed round's work rides on the next round's Delta). Independent workers each train their own.
  void merge(const StepResult& r, const Result<bool>& synced) {
    if (!shares_state_) {
      acc_.merged_tokens += pending_tokens_;
      pending_tokens_ = 0;
    } else if (setup_.gradient_sync != nullptr) {
      if (r.sync.ok()) acc_.merged_tokens += pending_tokens_;
      pending_tokens_ = 0;
    } else if (synced.ok() && *synced) {
      acc_.merged_tokens += pending_tokens_;
      pending_tokens_ = 0;
    }
  }

  // At a round's end under a time budget: the steps of the next rounds, from this member's pace and
  // the group's fastest member's.
  void adjust_budget() {
    if (round_steps_ > 0) budget_.observe(round_compute_s_ / static_cast<double>(round_steps_), outer_.fastest_step_seconds());
    round_steps_ = 0;
    round_compute_s_ = 0;
  }

  // One inner step; with data parallelism its gradients are averaged between backward and the update
  // (retried once over a new group), and the compute before and after that is paced apart.
  StepResult inner_step() {
    Stopwatch measured(real_clock());  // compute is measured in real time, whatever the clock
    bool paced = false;
    double before_sync = 0;               // real compute up to the gradient averaging
    std::optional<Stopwatch> after_sync;  // real compute after it (the update)
    GradientHook hook;
    if (setup_.gradient_sync != nullptr) {
      hook = [&](const std::vector<at::Tensor>& params) -> Status {
        before_sync = measured.elapsed_seconds();
        acc_.compute_s += pace(before_sync);
        paced = true;
        struct StartAfter {  // whichever way the hook returns
          std::optional<Stopwatch>& w;
          ~StartAfter() { w.emplace(real_clock()); }
        } start_after{after_sync};
        return average_gradients(params);
      };
    }
    const double compute_before = acc_.compute_s;
    const StepResult r = worker_.step(hook);
    const double step_real = paced && after_sync ? before_sync + after_sync->elapsed_seconds() : measured.elapsed_seconds();
    acc_.step_wall_s += step_real;
    if (!paced) acc_.compute_s += pace(step_real);
    acc_.steps = r.step;
    acc_.tokens = worker_.tokens_seen();
    if (!r.replaced) {
      const double seconds = acc_.compute_s - compute_before;
      ++acc_.computed_steps;
      acc_.computed_tokens += r.tokens;
      pending_tokens_ += r.tokens;
      ++round_steps_;
      round_compute_s_ += seconds;
      last_step_s_ = seconds;
      outer_.count_step(seconds);
      last_loss_ = r.loss;
      last_lr_ = r.lr;
    }
    return r;
  }

  Status average_gradients(const std::vector<at::Tensor>& params) {
    const Nanos t0 = clock_.now();
    const std::int64_t step = worker_.steps_done() + 1;
    Status st = setup_.gradient_sync->sync_gradients(params, step, Deadline::after(clock_, o_.round_timeout));
    const std::uint64_t restores = worker_.restores();
    if (!st.ok() && regroup(step)) {
      if (worker_.restores() != restores) return st;  // left behind: the step is dropped (Worker::step)
      spdlog::info("step {}: gradient averaging failed ({}); retrying it with the remaining members", step, st.to_string());
      st = setup_.gradient_sync->sync_gradients(params, step, Deadline::after(clock_, o_.round_timeout));
    }
    blocked_since(t0);
    return st;
  }

  // The outer optimizer's part after step `step` (retried once over a new group): whether a round
  // was applied, or nothing when this worker was left behind and took the members' state instead.
  std::optional<Result<bool>> outer_round(std::int64_t step) {
    const Nanos t0 = clock_.now();
    const std::uint64_t restores = worker_.restores();
    auto synced = outer_.step(step, Deadline::after(clock_, o_.round_timeout));
    if (!synced.ok() && regroup(step)) {
      if (worker_.restores() != restores) {
        blocked_since(t0);
        acc_.steps = worker_.steps_done();
        return std::nullopt;
      }
      spdlog::info("step {}: {} round failed ({}); retrying it with the remaining members", step, outer_.name(), synced.status().to_string());
      synced = outer_.step(step, Deadline::after(clock_, o_.round_timeout));
    }
    blocked_since(t0);
    if (!synced.ok()) {
      spdlog::warn("step {}: {} round failed and was skipped: {}", step, outer_.name(), synced.status().to_string());
      outer_.skip_round();
    }
    return synced;
  }

  // After the last step: what the method still has in flight is applied before the final evaluation
  // (and the caller's checkpoint).
  void finish() {
    const Nanos t0 = clock_.now();
    if (Status st = outer_.finish(Deadline::after(clock_, o_.round_timeout)); !st.ok()) {
      spdlog::warn("{}: the last round's average was not applied: {}", outer_.name(), st.to_string());
    }
    blocked_since(t0);
  }

  // Evaluation when due, and the step's record after a round, an evaluation or the last step.
  void record(const StepResult& r, const Result<bool>& synced) {
    const bool last = r.step == o_.steps;
    std::optional<double> val;
    if (o_.evaluate && ((o_.eval_every > 0 && r.step % o_.eval_every == 0) || last)) {
      Stopwatch eval_watch(real_clock());
      val = outer_.evaluate_outer([&] { return worker_.evaluate(); });
      acc_.eval_wall_s += eval_watch.elapsed_seconds();
    }
    const bool round = synced.ok() && *synced && setup_.gradient_sync == nullptr;
    if (val || round || last) {
      nlohmann::json rec = {{"step", r.step}, {"train_loss", r.loss}, {"lr", r.lr}};
      if (val) rec["val_loss"] = *val;
      emit(std::move(rec));
    }
  }

  Worker& worker_;
  optim::OuterSetup& setup_;
  optim::OuterOptimizer& outer_;
  Clock& clock_;
  const LoopOptions& o_;
  const LoopHooks& hooks_;
  WorkerAccount acc_;
  StepBudget budget_;
  const Nanos started_ = clock_.now();  // (declared after clock_)
  const bool shares_state_;            // not independent workers
  std::int64_t pending_tokens_ = 0;    // computed since this member's work last reached the shared model
  std::int64_t round_steps_ = 0;       // computed in this round (the budget's pace)
  double round_compute_s_ = 0.0;
  double last_step_s_ = 0.0;  // the latest computed step's
  double last_loss_ = 0.0, last_lr_ = 0.0;  // of the last computed step (an idle slot's record)
};

}  // namespace

Result<WorkerAccount> run_worker_loop(Worker& worker, optim::OuterSetup& setup, Clock& clock, const LoopOptions& o, const LoopHooks& hooks) {
  return WorkerLoop(worker, setup, clock, o, hooks).run();
}

}  // namespace gossamer::train
