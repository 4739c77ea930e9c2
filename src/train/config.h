// RunConfig: every hyper-parameter of a run, with defaults, loaded from TOML and `--set key=value`
// overrides, validated against one schema (each key has a type, a range or a set of allowed values,
// and a help line). The effective config is written back as commented TOML into the run folder.
//
// Errors: any bad input (missing file, TOML syntax, unknown key, wrong type, out-of-range value) is a
// kInvalidArgument Status whose message names the key and what is allowed; the CLI exits with 2.
// Threading: plain values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "optim/method.h"
#include "quant/format.h"
#include "train/choice.h"

namespace gossamer::train {

// The keys whose value is one of a few names (choice.h): their enums and tables.
enum class ModelKind : std::uint8_t { kGpt, kTorchScript, kExternal };  // what computes the model
template <>
struct Choices<ModelKind> {
  static constexpr std::array<ChoiceRow<ModelKind>, 3> rows = {{{ModelKind::kGpt, "gpt"}, {ModelKind::kTorchScript, "torchscript"}, {ModelKind::kExternal, "external"}}};
};
enum class DataFormat : std::uint8_t { kText, kTokens };  // what data.path holds
template <>
struct Choices<DataFormat> {
  static constexpr std::array<ChoiceRow<DataFormat>, 2> rows = {{{DataFormat::kText, "text"}, {DataFormat::kTokens, "tokens"}}};
};
enum class InnerOptimizer : std::uint8_t { kAdamW, kMuon };  // the inner optimizer
template <>
struct Choices<InnerOptimizer> {
  static constexpr std::array<ChoiceRow<InnerOptimizer>, 2> rows = {{{InnerOptimizer::kAdamW, "adamw"}, {InnerOptimizer::kMuon, "muon"}}};
};
enum class Precision : std::uint8_t { kFp32, kBf16 };  // the forward pass's arithmetic
template <>
struct Choices<Precision> {
  static constexpr std::array<ChoiceRow<Precision>, 2> rows = {{{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}}};
};
enum class StateDevice : std::uint8_t { kHost, kDevice };  // where the outer optimizer's state lives
template <>
struct Choices<StateDevice> {
  static constexpr std::array<ChoiceRow<StateDevice>, 2> rows = {{{StateDevice::kHost, "host"}, {StateDevice::kDevice, "device"}}};
};
enum class Aggregation : std::uint8_t { kMean, kFiltered, kTrimmedMean };  // how a chunk's owner combines contributions
template <>
struct Choices<Aggregation> {
  static constexpr std::array<ChoiceRow<Aggregation>, 3> rows = {{{Aggregation::kMean, "mean"}, {Aggregation::kFiltered, "filtered"}, {Aggregation::kTrimmedMean, "trimmed_mean"}}};
};
enum class RoundBudget : std::uint8_t { kSteps, kTime };  // what a round is
template <>
struct Choices<RoundBudget> {
  static constexpr std::array<ChoiceRow<RoundBudget>, 2> rows = {{{RoundBudget::kSteps, "steps"}, {RoundBudget::kTime, "time"}}};
};
enum class LateWork : std::uint8_t { kMerge, kDrop };  // what a late member's work becomes
template <>
struct Choices<LateWork> {
  static constexpr std::array<ChoiceRow<LateWork>, 2> rows = {{{LateWork::kMerge, "merge"}, {LateWork::kDrop, "drop"}}};
};
enum class DdpEngine : std::uint8_t { kLinks, kGloo, kNccl };  // what carries ddp's all-reduce
template <>
struct Choices<DdpEngine> {
  static constexpr std::array<ChoiceRow<DdpEngine>, 3> rows = {{{DdpEngine::kLinks, "links"}, {DdpEngine::kGloo, "gloo"}, {DdpEngine::kNccl, "nccl"}}};
};
// outer.method: its names are the method table's (optim/method.h), in the table's order.
template <>
struct Choices<optim::Method> {
  static constexpr std::array<ChoiceRow<optim::Method>, optim::kMethods.size()> rows = [] {
    std::array<ChoiceRow<optim::Method>, optim::kMethods.size()> r{};
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = {optim::kMethods[i].id, optim::kMethods[i].name};
    return r;
  }();
};
// Gloo and NCCL are c10d's process groups: fp32 sums of their own, over connections they dial themselves.
inline bool on_c10d(DdpEngine e) { return e != DdpEngine::kLinks; }
enum class OuterStep : std::uint8_t { kNesterov, kCgad };  // DiLoCo's outer step
template <>
struct Choices<OuterStep> {
  static constexpr std::array<ChoiceRow<OuterStep>, 2> rows = {{{OuterStep::kNesterov, "nesterov"}, {OuterStep::kCgad, "cgad"}}};
};
enum class FragmentOrder : std::uint8_t { kStrided, kSequential };  // which layers a Streaming DiLoCo fragment holds
template <>
struct Choices<FragmentOrder> {
  static constexpr std::array<ChoiceRow<FragmentOrder>, 2> rows = {{{FragmentOrder::kStrided, "strided"}, {FragmentOrder::kSequential, "sequential"}}};
};
enum class FragmentEdges : std::uint8_t { kWithNeighbors, kOwnFragments };  // what a fragment's embeddings and head go with
template <>
struct Choices<FragmentEdges> {
  static constexpr std::array<ChoiceRow<FragmentEdges>, 2> rows = {{{FragmentEdges::kWithNeighbors, "with_neighbors"}, {FragmentEdges::kOwnFragments, "own_fragments"}}};
};
enum class PipelineMode : std::uint8_t { kFull, kRandom, kNoca, kSkipPipe };  // a pipeline's paths
template <>
struct Choices<PipelineMode> {
  static constexpr std::array<ChoiceRow<PipelineMode>, 4> rows = {{{PipelineMode::kFull, "full"}, {PipelineMode::kRandom, "random"}, {PipelineMode::kNoca, "noca"}, {PipelineMode::kSkipPipe, "skippipe"}}};
};
enum class PipelineNetwork : std::uint8_t { kGeo, kGeoFixed, kUniform, kMeasured };  // the scheduler's view of the nodes
template <>
struct Choices<PipelineNetwork> {
  static constexpr std::array<ChoiceRow<PipelineNetwork>, 4> rows = {{{PipelineNetwork::kGeo, "geo"}, {PipelineNetwork::kGeoFixed, "geo-fixed"}, {PipelineNetwork::kUniform, "uniform"}, {PipelineNetwork::kMeasured, "measured"}}};
};
enum class PipelineOrder : std::uint8_t { kTimetable, kArrival };  // the order of a node's work
template <>
struct Choices<PipelineOrder> {
  static constexpr std::array<ChoiceRow<PipelineOrder>, 2> rows = {{{PipelineOrder::kTimetable, "timetable"}, {PipelineOrder::kArrival, "arrival"}}};
};
enum class ComputeModel : std::uint8_t { kFixed, kDevice, kMeasured };  // the simulator's compute time
template <>
struct Choices<ComputeModel> {
  static constexpr std::array<ChoiceRow<ComputeModel>, 3> rows = {{{ComputeModel::kFixed, "fixed"}, {ComputeModel::kDevice, "device"}, {ComputeModel::kMeasured, "measured"}}};
};
enum class PoisonKind : std::uint8_t { kNone, kScale, kSign, kNan };  // what the simulator's poisoned workers send
template <>
struct Choices<PoisonKind> {
  static constexpr std::array<ChoiceRow<PoisonKind>, 4> rows = {{{PoisonKind::kNone, "none"}, {PoisonKind::kScale, "scale"}, {PoisonKind::kSign, "sign"}, {PoisonKind::kNan, "nan"}}};
};

// The codec keys: quant's codec table (quant/format.h), in its order.
template <>
struct Choices<quant::CodecId> {
  static inline const std::array<ChoiceRow<quant::CodecId>, quant::kNumCodecs> rows = [] {
    std::array<ChoiceRow<quant::CodecId>, quant::kNumCodecs> r{};
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = {quant::codec_table()[i].id, quant::codec_table()[i].name};
    return r;
  }();
};

struct ModelSection {
  ModelKind kind = ModelKind::kGpt;       // gpt (built in), torchscript (model.path) or external (the Python package's caller's)
  std::string signature;          // external: the digest of the caller's parameters' names, shapes and types
  std::string preset;             // "" or a shape of model_presets(): sets layers, width, heads, context
  std::string path;               // torchscript: the module file
  std::string block_pattern = R"((?:^|[._])(\d+)(?:[._]|$))";  // torchscript: regex whose first group is the layer index
  std::int64_t layers = 2;
  std::int64_t width = 128;
  std::int64_t heads = 4;
  std::int64_t context = 64;
  double dropout = 0.0;
  std::int64_t init_seed = 1234;
};

struct SyntheticSection {
  std::int64_t words = 64;
  std::int64_t classes = 4;
  double zipf = 1.1;
  std::int64_t bytes = 4'000'000;
  std::int64_t seed = 1;
};

struct DataSection {
  DataFormat format = DataFormat::kText;    // text (bytes are tokens) or tokens (token files, data/token_files.h)
  std::string path;               // empty: the built-in synthetic language
  std::int64_t vocab_size = 0;    // 0: 256 (bytes); token files need their tokenizer's size
  double val_fraction = 0.05;
  std::int64_t max_bytes = 1LL << 32;
  std::int64_t shard_block = 0;   // > 0: the training text is dealt to the workers in blocks of this
                                  // many bytes, block i to worker i mod workers; 0: contiguous slices
  SyntheticSection synthetic;
};

struct TrainSection {
  std::int64_t steps = 500;
  std::int64_t batch_size = 32;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;
  std::int64_t warmup_steps = 50;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  // The inner optimizer: adamw, or muon (optim/muon.h: the hidden layers' weight matrices by Muon at
  // muon_lr, with muon_momentum; embeddings, norms and biases by AdamW at lr). Both follow the lr
  // schedule. muon_lr 0: Moonlight's scale at lr (every matrix's step of RMS 0.2 lr, as an AdamW
  // step's); the reference's 0.02 was set for a 768-wide model and stalls small ones on long runs.
  InnerOptimizer optimizer = InnerOptimizer::kAdamW;
  double muon_lr = 0.0;
  double muon_momentum = 0.95;
  double grad_clip = 1.0;
  std::int64_t eval_every = 50;
  std::int64_t eval_batches = 8;
  std::int64_t checkpoint_every = 100;
  std::int64_t log_every = 1;
  std::int64_t seed = 42;
  std::int64_t threads = 0;  // 0: all cores
  std::string device = "auto";     // auto, cpu, cuda, cuda:N (train/device.h)
  Precision precision = Precision::kFp32;  // fp32, or bf16 (autocast forward, fp32 master weights)
  double round_timeout_s = 600;  // a synchronization round gives up after this long
  // Real runs and the simulator: a round closes once every member is ready, or once this share of
  // the members' expected work is and a grace learned from recent arrivals (their median lag plus
  // grace_spread robust spreads) has passed since (runtime/coordinator.h; docs/peer.md).
  double quorum = 0.5;
  double grace_spread = 3.0;
};

// The outer method and each method's options (the spec's defaults). Codecs are quant's (quant/format.h:
// fp32, bf16, int8, fp8_e4m3, fp8_e5m2, fp16, int4, fp4_e3m0, fp4_e2m1, int2), by name in the config.
struct OuterSection {
  optim::Method method = optim::Method::kDiLoCo;  // one row of optim/method.h's table, by its name
  std::int64_t codec_block = 128;  // values per scale block of the scaled codecs
  // Where the outer optimizer keeps its state (outer weights, momentum, pending averages): host
  // memory, sparing the training device's, or the training device itself (no copies per round).
  StateDevice state_device = StateDevice::kHost;
  // How each chunk's owner combines the workers' contributions (optim/collectives.h): mean, filtered
  // (outliers and non-finite left out) or trimmed_mean; all-reduce methods only.
  Aggregation aggregation = Aggregation::kMean;
  double outlier_factor = 3.0;  // filtered: left out beyond this many times the median distance
  std::int64_t trim = 1;        // trimmed_mean: values dropped at each end, per coordinate
  // What a round is: "steps", every member runs the method's inner steps (lockstep among equals);
  // "time", a round lasts the inner steps of the group's fastest member, each member runs the steps
  // that fit, and the round's mean weighs each contribution by the steps behind it (diloco,
  // streaming_diloco and sparseloco; train/step_budget.h, optim/token_weights.h).
  RoundBudget round_budget = RoundBudget::kSteps;
  // A member left out of a round (late) and caught up: what it computed since its last merge
  // rides on into its next contribution at the age gate's weight (optim/age_gate.h; "merge"), or is
  // dropped ("drop"); counted either way (diloco, streaming_diloco, sparseloco in real runs and
  // the simulator).
  LateWork late_work = LateWork::kMerge;
  // The age gate sigma(tau) = gamma(tau) e^{-decay tau}, gamma zero from `age_cutoff` rounds on
  // (CGAD's; defaults by the rule in optim/age_gate.h).
  double age_decay = 0.10536051565782628;
  double age_cutoff = 20.0;
};
struct DdpSection {
  quant::CodecId codec = quant::CodecId::kFp32;
  DdpEngine engine = DdpEngine::kLinks;  // links (our all-reduce), gloo or nccl (c10d's process groups, real runs)
  std::int64_t round_steps = 10;  // real runs: members are agreed (newcomers join) every this many steps
};
struct DiLoCoSection {
  std::int64_t inner_steps = 500;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  quant::CodecId codec = quant::CodecId::kFp32;
  // The outer step: "nesterov" (the paper's SGD) or "cgad" (Adam on age-gated pseudo-gradients,
  // optim/diloco.h; its lr: cgad_lr, or 0 for the rule train.lr x sqrt(inner_steps)), and a
  // controlled delay: each round's mean applied this many rounds later (docs/methods.md).
  OuterStep outer_step = OuterStep::kNesterov;
  double cgad_lr = 0.0;
  std::int64_t delay_rounds = 0;
};
struct StreamingSection {
  std::int64_t inner_steps = 100;
  std::int64_t fragment_layers = 3;  // transformer blocks per fragment
  FragmentOrder pattern = FragmentOrder::kStrided;
  FragmentEdges edges = FragmentEdges::kWithNeighbors;
  std::int64_t overlap = 1;
  double mixing = 0.5;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  quant::CodecId codec = quant::CodecId::kFp4E3M0;
};
struct NoLoCoSection {
  std::int64_t inner_steps = 50;
  double outer_lr = 0.7;
  double outer_momentum = 0.5;
  quant::CodecId codec = quant::CodecId::kFp32;
};
struct CO2Section {
  std::int64_t inner_steps = 48;
  double outer_lr = 1.0;
  double outer_momentum = 0.5;
  double gap_penalty = 1.0;
  double clip_threshold = 0.0;  // 0: no clipping
  quant::CodecId codec = quant::CodecId::kFp32;
};
// MuLoCo (Therien et al. 2025): Muon inner steps (train.muon_lr, train.muon_momentum, whatever
// train.optimizer says), DiLoCo's Nesterov outer step, the pseudo-gradient error-fed through a
// low-bit codec. Defaults: the paper's quantized runs (H 30, outer lr 0.9 and momentum 0.8, 2 bits,
// error decay 0.9).
struct MuLoCoSection {
  std::int64_t inner_steps = 30;
  double outer_lr = 0.9;
  double outer_momentum = 0.8;
  quant::CodecId codec = quant::CodecId::kInt2;
  double error_decay = 0.9;
};
struct SparseLoCoSection {
  // H; 0: by the rule of train/outer.h (sparseloco_period): Covenant's 30, shortened on short runs.
  std::int64_t inner_steps = 0;
  double outer_lr = 1.0;
  double error_decay = 0.95;
  std::int64_t chunk = 4096;  // values per chunk of the pseudo-gradient
  std::int64_t topk = 64;     // values kept per chunk (64 of 4096: 1.56%)
  // "none": the last round is like the others, and what the accumulators still hold at the end is
  // left out of the model; a codec: the last round all-reduces the whole accumulator in it
  // (optim/sparseloco.h). Off by default: on the text benchmark the flush overshot (docs/methods.md).
  std::optional<quant::CodecId> flush_codec;  // "none" in the config
};

// Joining a run under way (docs/joining.md): what donors keep for newcomers and how fast they serve.
struct JoinSection {
  std::int64_t keep_rounds = 16;  // rounds of updates a donor keeps after its snapshot for newcomers to catch up
  double keep_mb = 4096.0;        // at most this much memory for them (the oldest go first)
  double serve_share = 0.5;       // share of a donor's link serving may take, where its bandwidth is known
  bool align = true;              // a newcomer starts at the members' step (false: at the round end its state is from)
};

// SkipPipe pipelines (docs/skippipe.md): the model cut into stages hosted by different nodes,
// micro-batches whose paths skip and reorder stages (skippipe/schedule.h).
struct PipelineSection {
  bool enabled = false;               // `gossamer peer` runs the run as a pipeline over its peers
  PipelineMode mode = PipelineMode::kSkipPipe;      // full, random (cost-blind skip), noca (without TC2), skippipe
  std::int64_t nodes = 20;
  std::int64_t stages = 6;            // model.layers must be divisible by it
  std::int64_t path_length = 4;       // stages each micro-batch visits, stage 0 included
  std::int64_t memory = 3;            // micro-batches in flight per node
  std::int64_t mbs_per_origin = 6;    // micro-batches each stage-0 node starts per iteration (train.batch_size samples each)
  std::int64_t mbs_per_agent = 2;
  PipelineNetwork network = PipelineNetwork::kGeo;        // the scheduler's view of the nodes: geo (the reference's table) or uniform
  double forward_s = 1.76;            // the scheduler's cost of one stage's forward of one micro-batch
  double activation_mib = 32;         // and of one hop's bytes
  quant::CodecId activation_codec = quant::CodecId::kFp32;
  optim::Method stage_sync = optim::Method::kDdp;  // how a stage's replicas synchronise: ddp (every iteration) or a method whose row allows it (diloco, streaming_diloco, noloco, co2)
  std::int64_t gcma_trials = 8000;
  std::int64_t crash_node = -1;           // the simulator's scenario: this node crashes (-1: none) ...
  std::int64_t crash_at_iteration = 0;    // ... half-way through this iteration (by the scheduler's prediction)
  PipelineOrder order = PipelineOrder::kTimetable;    // a node's work: in the planned timetable's order (deterministic) or as messages arrive
  // The assembled model (evaluation, omission) scales each non-zero stage's residual branches by the
  // share of trained micro-batches that visited it (stochastic depth's inference rule); false: as trained.
  bool depth_scaling = true;
};

// The simulator: workers, their network, their compute and what goes wrong.
struct SimSection {
  std::int64_t workers = 4;
  std::string network = "wan-100m-80ms";  // a LinkProfile preset, or "custom" (the keys below)
  double bandwidth_mbit = 100.0;          // custom: access link of every worker
  double latency_ms = 40.0;               // custom: one way
  double jitter_ms = 0.0;
  double loss = 0.0;
  double shared_uplink_mbit = 0.0;        // > 0: every worker sits behind one shared uplink (a hub)
  std::int64_t slow_link_workers = 0;     // the last N workers have slow_link_mbit links instead
  double slow_link_mbit = 10.0;
  std::int64_t sites = 0;                 // > 0: workers split into this many sites (contiguous blocks),
  double site_uplink_mbit = 100.0;        //   each behind its own shared uplink and downlink
  double site_latency_ms = 0.0;           //   extra one-way latency to leave or enter a site
  ComputeModel compute = ComputeModel::kDevice;         // fixed (step_time_s), device (FLOP/s model) or measured
  double step_time_s = 0.1;
  double device_tflops = 100.0;           // peak
  double device_utilization = 0.4;
  std::int64_t crash_worker = -1;         // -1: nobody crashes
  std::int64_t crash_at_step = 0;
  std::int64_t crash_mid_round = 0;       // > 0: sim.crash_worker dies inside this outer round's collective instead
  double crash_restart_s = -1.0;          // >= 0: it restarts this long after, from its last checkpoint
  std::int64_t join_worker = -1;          // -1: nobody joins late; else absent until sim.join_at_step
  std::int64_t join_at_step = 0;
  std::int64_t straggler = -1;            // -1: no straggler
  double straggler_factor = 2.0;          // its compute takes this many times longer
  // Per-worker compute speeds (1: as sim.compute says; 0.5: steps take twice as long): a list in
  // worker order, "SPEED" or "SPEEDxCOUNT" items separated by commas, the workers not listed at 1 ...
  std::string speeds;
  double speed_spread = 0.0;              // ... times a seeded log-normal draw of this sigma per worker (0: none)
  double churn_rate = 0.0;                // share of the workers that crash per 100 inner steps (seeded), each
  double churn_downtime_s = 30.0;         //   restarting this long after, from its last checkpoint
  double churn_per_minute = 0.0;          // steady churn by time: failures per minute per 10 workers (seeded), each
                                          //   restarting sim.churn_downtime_s later from its last checkpoint
  double stalls_per_minute = 0.0;         // stalls per minute per 10 workers (seeded): a worker stops computing for
  double stall_s = 10.0;                  //   this many virtual seconds and goes on (a hiccup: it neither dies nor restarts)
  PoisonKind poison = PoisonKind::kNone;            // none, scale, sign or nan: what poisoned workers send
  std::int64_t poison_workers = 1;        //   the last N workers (when poison is not none)
  double poison_scale = 10.0;             //   scale: contributions multiplied by this
  std::int64_t seed = 1;
};

struct RunConfig {
  ModelSection model;
  DataSection data;
  TrainSection train;
  OuterSection outer;
  DdpSection ddp;
  DiLoCoSection diloco;
  StreamingSection streaming_diloco;
  NoLoCoSection noloco;
  CO2Section co2;
  SparseLoCoSection sparseloco;
  MuLoCoSection muloco;
  JoinSection join;
  PipelineSection pipeline;
  SimSection sim;
};

// The inner optimizer steps the weight matrices with Muon: train.optimizer = muon, or MuLoCo, which is
// Muon's by definition.
inline bool muon_inner(const RunConfig& c) {
  return c.train.optimizer == InnerOptimizer::kMuon || optim::method_info(c.outer.method).muon_inner;
}

// Overlays a TOML document onto `config`. Keys not given keep their current values.
[[nodiscard]] Status apply_toml(RunConfig& config, std::string_view toml_text, std::string_view source_name);
[[nodiscard]] Status apply_toml_file(RunConfig& config, const std::filesystem::path& path);
// "model.layers=4". The value is read as TOML (so strings may be quoted or bare).
[[nodiscard]] Status apply_override(RunConfig& config, std::string_view assignment);
// Cross-key checks (width divisible by heads, warm-up within the run, ...).
[[nodiscard]] Status validate(const RunConfig& config);

// The keys whose values differ between `a` and `b`, as "key: A -> B", in schema order; only keys that
// start with one of `prefixes` ("model." ...) when any are given.
std::vector<std::string> config_differences(const RunConfig& a, const RunConfig& b, const std::vector<std::string>& prefixes = {});

// Shapes of well-known models (no weights): model.preset sets model.layers, width, heads and context
// at once, before the other model.* keys of the same file or command line, which may refine them.
struct ModelPreset {
  const char* name;
  std::int64_t layers, width, heads, context;
  const char* note;
};
const std::vector<ModelPreset>& model_presets();

// The model's vocabulary: data.vocab_size, or 256 (bytes) when it is 0.
std::int64_t vocab_size(const RunConfig& config);

// Commented TOML holding every key, loadable by apply_toml.
std::string to_toml(const RunConfig& config);

// Every key with its type and help line (for `gossamer config --keys`).
struct KeyInfo {
  std::string name, type, help, allowed;
};
std::vector<KeyInfo> config_keys();

}  // namespace gossamer::train
