// The checks of a whole run config (validate(), train/config.h): what no key's own range can say,
// the keys taken together.
#include "train/config.h"

#include <cmath>
#include <string>

#include "optim/method.h"
#include "train/speeds.h"

namespace gossamer::train {

namespace {

// The value of a method's codec key (optim::MethodInfo::codec_key).
const quant::CodecId* codec_value(const RunConfig& c, std::string_view key) {
  for (const auto& [name, value] : {std::pair<std::string_view, const quant::CodecId*>{"ddp.codec", &c.ddp.codec},
                                    {"diloco.codec", &c.diloco.codec},
                                    {"streaming_diloco.codec", &c.streaming_diloco.codec},
                                    {"noloco.codec", &c.noloco.codec},
                                    {"co2.codec", &c.co2.codec},
                                    {"muloco.codec", &c.muloco.codec}}) {
    if (name == key) return value;
  }
  return nullptr;
}

// What a check needs to know of the run's method.
struct MethodFacts {
  const optim::MethodInfo& m;
  bool on_c10d;         // ddp on Gloo's or NCCL's all-reduce
  bool own_collective;  // its round is Gossamer's own all-reduce or all-gather over the group's links
};

Status bad(const std::string& m) { return error(ErrorCode::kInvalidArgument, m); }

Status check_model_data_pipeline(const RunConfig& c) {
  if (c.model.width % c.model.heads != 0) {
    return bad("model.width (" + std::to_string(c.model.width) + ") must be divisible by model.heads (" + std::to_string(c.model.heads) + ")");
  }
  if (c.train.warmup_steps > c.train.steps) {
    return bad("train.warmup_steps (" + std::to_string(c.train.warmup_steps) + ") must not exceed train.steps (" + std::to_string(c.train.steps) + ")");
  }
  if (c.data.shard_block != 0 && c.data.shard_block <= c.model.context) {
    return bad("data.shard_block (" + std::to_string(c.data.shard_block) + ") must exceed model.context (" + std::to_string(c.model.context) +
               ") so that a window fits in a block, or be 0 for contiguous shards");
  }
  if (const auto& d = c.train.device; d != "auto" && d != "cpu" && d != "cuda" &&
                                      !(d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.find_first_not_of("0123456789", 5) == std::string::npos)) {
    return bad("train.device = " + d + ": use auto, cpu, cuda or cuda:N");
  }
  if (c.model.kind == ModelKind::kTorchScript && c.model.path.empty()) {
    return bad("model.kind = torchscript needs model.path: the file torch.jit.script(model).save(path) wrote");
  }
  if (c.model.kind == ModelKind::kExternal && c.model.signature.empty()) {
    return bad("model.kind = external needs model.signature: the Python package sets it from the model (gossamer.Peer)");
  }
  if (c.data.format == DataFormat::kTokens && c.data.path.empty()) {
    return bad("data.format = tokens needs data.path: a token file, or a folder holding train.bin and val.bin");
  }
  if (c.data.format == DataFormat::kTokens && c.data.vocab_size == 0) {
    return bad("data.format = tokens needs data.vocab_size: the size of the tokenizer's vocabulary (50257 for GPT-2's, 128256 for Llama 3's)");
  }
  if (c.data.format == DataFormat::kText && c.data.vocab_size != 0 && c.data.vocab_size < 256) {
    return bad("data.vocab_size (" + std::to_string(c.data.vocab_size) + ") is below 256: text is read as bytes, which need 256 ids; use 0");
  }
  if (c.data.synthetic.classes > c.data.synthetic.words) {
    return bad("data.synthetic.classes (" + std::to_string(c.data.synthetic.classes) + ") must not exceed data.synthetic.words (" +
               std::to_string(c.data.synthetic.words) + ")");
  }
  if (!optim::method_info(c.pipeline.stage_sync).stage_sync) {
    std::string allowed;
    for (const auto& name : optim::stage_sync_names()) allowed += (allowed.empty() ? "" : ", ") + name;
    return bad("pipeline.stage_sync = " + name_of(c.pipeline.stage_sync) + " cannot synchronise a stage's replicas: use one of " + allowed);
  }
  if (c.pipeline.crash_node >= 0 && c.pipeline.stage_sync != optim::Method::kDdp) {
    return bad("pipeline.crash_node needs pipeline.stage_sync = ddp: with an outer method inside the stages, replicas step on their own before an "
               "iteration is known to have failed, so running it again without the lost node would step them twice");
  }
  if (c.pipeline.crash_node >= 0 && c.pipeline.crash_at_iteration > c.train.steps) {
    return bad("pipeline.crash_at_iteration (" + std::to_string(c.pipeline.crash_at_iteration) + ") is past the run's last iteration (train.steps = " +
               std::to_string(c.train.steps) + "): the drill would never fire");
  }
  if (c.pipeline.crash_node >= c.pipeline.nodes) {
    return bad("pipeline.crash_node (" + std::to_string(c.pipeline.crash_node) + ") must name one of the " + std::to_string(c.pipeline.nodes) + " pipeline nodes");
  }
  if (c.sim.crash_worker >= c.sim.workers) {
    return bad("sim.crash_worker (" + std::to_string(c.sim.crash_worker) + ") must name one of the " + std::to_string(c.sim.workers) + " workers");
  }
  return Status();
}

Status check_sim(const RunConfig& c, const MethodFacts& f) {
  const bool on_c10d = f.on_c10d, own_collective = f.own_collective;
  if (c.sim.slow_link_workers > c.sim.workers) {
    return bad("sim.slow_link_workers (" + std::to_string(c.sim.slow_link_workers) + ") exceeds sim.workers (" + std::to_string(c.sim.workers) + ")");
  }
  if (c.sim.straggler >= c.sim.workers) {
    return bad("sim.straggler (" + std::to_string(c.sim.straggler) + ") must name one of the " + std::to_string(c.sim.workers) + " workers");
  }
  if (auto speeds = parse_speeds(c.sim.speeds, c.sim.workers); !speeds.ok()) return speeds.status();
  if (c.sim.sites > c.sim.workers) {
    return bad("sim.sites (" + std::to_string(c.sim.sites) + ") exceeds sim.workers (" + std::to_string(c.sim.workers) + "): every site needs a worker");
  }
  if ((c.sim.churn_rate > 0 || c.sim.churn_per_minute > 0) && c.sim.workers < 3) {
    return bad(std::string(c.sim.churn_rate > 0 ? "sim.churn_rate" : "sim.churn_per_minute") +
               " needs sim.workers >= 3: with fewer, a crash leaves no group to rejoin");
  }
  if (c.sim.crash_mid_round > 0) {
    if (c.sim.crash_worker < 0 || c.sim.crash_worker == c.sim.join_worker || c.sim.crash_at_step > 0) {
      return bad("sim.crash_mid_round needs sim.crash_worker to name a worker of the run from its start (not sim.join_worker), and "
                 "sim.crash_at_step = 0: the worker dies in that round instead");
    }
    if (!own_collective) {
      return bad("sim.crash_mid_round needs a method whose round is Gossamer's all-reduce or all-gather (diloco, streaming_diloco, "
                 "sparseloco, muloco, co2, or ddp with ddp.engine = links), not outer.method = " + name_of(c.outer.method) + (on_c10d ? " on " + name_of(c.ddp.engine) : ""));
    }
  }
  if (c.sim.join_worker >= 0) {
    if (c.sim.join_worker >= c.sim.workers) {
      return bad("sim.join_worker (" + std::to_string(c.sim.join_worker) + ") must name one of the " + std::to_string(c.sim.workers) + " workers");
    }
    if (c.sim.workers < 2) return bad("sim.join_worker needs sim.workers >= 2: a newcomer joins a running group");
    if (c.sim.join_worker == c.sim.crash_worker && c.sim.crash_at_step <= c.sim.join_at_step) {
      return bad("sim.crash_at_step (" + std::to_string(c.sim.crash_at_step) + ") must come after sim.join_at_step (" + std::to_string(c.sim.join_at_step) +
                 ") when the newcomer is the one killed: it is killed once the run reaches that step");
    }
    if (c.sim.join_at_step < 2 || c.sim.join_at_step > c.train.steps) {
      return bad("sim.join_at_step (" + std::to_string(c.sim.join_at_step) + ") must lie in [2, train.steps = " + std::to_string(c.train.steps) +
                 "]: the newcomer takes the state after step sim.join_at_step - 1");
    }
  }
  return Status();
}

Status check_method(const RunConfig& c, const MethodFacts& f) {
  const optim::MethodInfo& m = f.m;
  const bool on_c10d = f.on_c10d, own_collective = f.own_collective;
  if (c.outer.aggregation != Aggregation::kMean && on_c10d) {
    return bad("outer.aggregation = " + name_of(c.outer.aggregation) + " needs ddp.engine = links: " + name_of(c.ddp.engine) + "'s all-reduce only sums");
  }
  if (c.outer.aggregation != Aggregation::kMean && m.exchange == optim::Exchange::kPairs) {
    return bad("outer.aggregation = " + name_of(c.outer.aggregation) + " does not apply to " + name_of(c.outer.method) + ", which averages pairs (a partner's "
               "malformed or non-finite contribution already fails that round alone); use mean");
  }
  if (c.outer.aggregation != Aggregation::kMean && m.exchange == optim::Exchange::kNone) {
    return bad("outer.aggregation = " + name_of(c.outer.aggregation) + " does not apply to " + name_of(c.outer.method) + ", which combines nothing; use mean");
  }
  if (c.sparseloco.topk > c.sparseloco.chunk) {
    return bad("sparseloco.topk (" + std::to_string(c.sparseloco.topk) + ") must not exceed sparseloco.chunk (" + std::to_string(c.sparseloco.chunk) + ")");
  }
  if (c.outer.aggregation == Aggregation::kTrimmedMean && !m.trimmed_aggregation && m.filtered_aggregation) {
    return bad("outer.aggregation = trimmed_mean does not apply to " + name_of(c.outer.method) +
               " (a coordinate-wise trim of sparse updates is mostly of zeros); use mean or filtered");
  }
  if (c.sim.poison != PoisonKind::kNone) {
    if (c.sim.poison_workers >= c.sim.workers) {
      return bad("sim.poison_workers (" + std::to_string(c.sim.poison_workers) + ") must leave at least one of the " + std::to_string(c.sim.workers) +
                 " workers honest");
    }
    if (!own_collective) {
      return bad("sim.poison applies to all-reduces over our links: ddp (links), diloco, streaming_diloco, co2, sparseloco and muloco, not " + name_of(c.outer.method));
    }
    if (c.sim.poison == PoisonKind::kNan && m.exchange == optim::Exchange::kAllGather) {
      return bad("sim.poison = nan writes a NaN into fp32 payloads; sparseloco's are sparse 2-bit ones: use scale or sign");
    }
    const quant::CodecId* codec = codec_value(c, m.codec_key);
    if (c.sim.poison == PoisonKind::kNan && codec != nullptr && *codec != quant::CodecId::kFp32) {
      return bad("sim.poison = nan writes a NaN into fp32 payloads: set " + std::string(m.codec_key) + " to fp32 (it is " + name_of(*codec) + ")");
    }
  }
  const auto& sd = c.streaming_diloco;
  if (sd.overlap >= sd.inner_steps) {
    return bad("streaming_diloco.overlap (" + std::to_string(sd.overlap) + ") must be below streaming_diloco.inner_steps (" +
               std::to_string(sd.inner_steps) + ")");
  }
  return Status();
}

}  // namespace

Status validate(const RunConfig& c) {
  const optim::MethodInfo& m = optim::method_info(c.outer.method);
  const bool on_c10d = m.id == optim::Method::kDdp && train::on_c10d(c.ddp.engine);
  const MethodFacts facts{m, on_c10d, (m.exchange == optim::Exchange::kAllReduce || m.exchange == optim::Exchange::kAllGather) && !on_c10d};
  if (Status st = check_model_data_pipeline(c); !st.ok()) return st;
  if (Status st = check_sim(c, facts); !st.ok()) return st;
  return check_method(c, facts);
}

}  // namespace gossamer::train
