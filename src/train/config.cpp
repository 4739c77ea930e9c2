#include "train/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iomanip>
#include <iterator>
#include <limits>
#include <sstream>
#include <variant>

#include <toml++/toml.h>

#include "core/file.h"
#include "core/text.h"
#include "optim/method.h"
#include "quant/format.h"
#include "train/key_specs.h"
#include "train/speeds.h"

namespace gossamer::train {

namespace {

using namespace key_specs;

struct ChoiceKey {
  const char* name;
  const char* help;
  ChoiceField (*ref)(RunConfig&);
};
using KeySpec = std::variant<IntKey, FloatKey, StringKey, BoolKey, ChoiceKey>;

constexpr std::int64_t kBig = std::numeric_limits<std::int32_t>::max();


std::vector<std::string> preset_names() {
  std::vector<std::string> out = {""};
  for (const auto& p : model_presets()) out.emplace_back(p.name);
  return out;
}

// The keys of the model and its data, in the order the effective config lists them.
std::vector<KeySpec> model_and_data_keys() {
  return {
      ChoiceKey{"model.kind", "gpt: the built-in GPT (model.layers, width, heads); torchscript: a module saved by PyTorch (model.path); external: a model the Python package's caller computes itself (model.signature)", [](RunConfig& c) { return choice_field(c.model.kind); }},
      StringKey{"model.signature", "external: the digest of the caller's parameters' names, shapes and types (set by the Python package); peers with another model are refused", [](RunConfig& c) -> std::string& { return c.model.signature; }, {}},
      StringKey{"model.preset", "a well-known shape (layers, width, heads, context; no weights) to start from, e.g. gpt2-124m; later model.* keys refine it", [](RunConfig& c) -> std::string& { return c.model.preset; }, preset_names()},
      StringKey{"model.path", "torchscript: the file torch.jit.script(model).save(path) wrote; forward(tokens int64 [B, T]) -> logits [B, T, vocab]", [](RunConfig& c) -> std::string& { return c.model.path; }, {}},
      StringKey{"model.block_pattern", "torchscript and external: a regular expression whose first group is the layer index in a parameter's name (the default takes the first all-digit part between dots or underscores, as in h.3.attn or block_3.qkv)", [](RunConfig& c) -> std::string& { return c.model.block_pattern; }, {}},
      IntKey{"model.layers", "transformer blocks", [](RunConfig& c) -> std::int64_t& { return c.model.layers; }, 1, 256},
      IntKey{"model.width", "d_model, divisible by model.heads", [](RunConfig& c) -> std::int64_t& { return c.model.width; }, 8, 65536},
      IntKey{"model.heads", "attention heads", [](RunConfig& c) -> std::int64_t& { return c.model.heads; }, 1, 1024},
      IntKey{"model.context", "sequence length T (bytes)", [](RunConfig& c) -> std::int64_t& { return c.model.context; }, 2, 65536},
      FloatKey{"model.dropout", "dropout probability", [](RunConfig& c) -> double& { return c.model.dropout; }, 0.0, 0.99, false},
      IntKey{"model.init_seed", "seed of the GPT-2-style initialization", [](RunConfig& c) -> std::int64_t& { return c.model.init_seed; }, 0, std::numeric_limits<std::int64_t>::max()},
      ChoiceKey{"data.format", "text: the bytes of text files are the tokens; tokens: token files of nanoGPT (raw uint16) or llm.c (with its header)", [](RunConfig& c) { return choice_field(c.data.format); }},
      StringKey{"data.path", "text file or folder of text files (empty: the built-in synthetic language); with data.format = tokens, a token file or a folder holding *train*.bin and *val*.bin files", [](RunConfig& c) -> std::string& { return c.data.path; }, {}},
      IntKey{"data.vocab_size", "vocabulary of the model: 0 means 256 (bytes); token files need their tokenizer's size (50257 for GPT-2)", [](RunConfig& c) -> std::int64_t& { return c.data.vocab_size; }, 0, 1LL << 31},
      FloatKey{"data.val_fraction", "fraction of the corpus (its end) held out for validation", [](RunConfig& c) -> double& { return c.data.val_fraction; }, 0.0, 0.5, true},
      IntKey{"data.max_bytes", "refuse corpora larger than this", [](RunConfig& c) -> std::int64_t& { return c.data.max_bytes; }, 1024, std::numeric_limits<std::int64_t>::max()},
      IntKey{"data.shard_block", "bytes per block when the training text is dealt to the workers in turns (block i to worker i mod workers: every shard spans the corpus, as shards of a shuffled dataset do); 0: one contiguous slice per worker", [](RunConfig& c) -> std::int64_t& { return c.data.shard_block; }, 0, std::numeric_limits<std::int64_t>::max()},
      IntKey{"data.synthetic.words", "vocabulary size of the synthetic language", [](RunConfig& c) -> std::int64_t& { return c.data.synthetic.words; }, 2, 100000},
      IntKey{"data.synthetic.classes", "word classes (the next word depends on the class of the current one)", [](RunConfig& c) -> std::int64_t& { return c.data.synthetic.classes; }, 1, 100000},
      FloatKey{"data.synthetic.zipf", "Zipf exponent of the next-word distribution", [](RunConfig& c) -> double& { return c.data.synthetic.zipf; }, 0.0, 10.0, false},
      IntKey{"data.synthetic.bytes", "size of the generated corpus", [](RunConfig& c) -> std::int64_t& { return c.data.synthetic.bytes; }, 10000, 1LL << 34},
      IntKey{"data.synthetic.seed", "seed of the synthetic language and its text", [](RunConfig& c) -> std::int64_t& { return c.data.synthetic.seed; }, 0, std::numeric_limits<std::int64_t>::max()},
  };
}

// The keys of the inner loop, in the order the effective config lists them.
std::vector<KeySpec> train_keys() {
  return {
      IntKey{"train.steps", "inner optimizer steps of the run", [](RunConfig& c) -> std::int64_t& { return c.train.steps; }, 1, 1LL << 40},
      IntKey{"train.batch_size", "sequences per step per worker", [](RunConfig& c) -> std::int64_t& { return c.train.batch_size; }, 1, kBig},
      FloatKey{"train.lr", "peak AdamW learning rate", [](RunConfig& c) -> double& { return c.train.lr; }, 0.0, 10.0, true},
      FloatKey{"train.min_lr_ratio", "cosine decay ends at lr * min_lr_ratio", [](RunConfig& c) -> double& { return c.train.min_lr_ratio; }, 0.0, 1.0, false},
      IntKey{"train.warmup_steps", "linear warm-up steps", [](RunConfig& c) -> std::int64_t& { return c.train.warmup_steps; }, 0, 1LL << 40},
      FloatKey{"train.weight_decay", "AdamW weight decay (matrices only)", [](RunConfig& c) -> double& { return c.train.weight_decay; }, 0.0, 10.0, false},
      FloatKey{"train.beta1", "AdamW beta1", [](RunConfig& c) -> double& { return c.train.beta1; }, 0.0, 0.999999, false},
      FloatKey{"train.beta2", "AdamW beta2", [](RunConfig& c) -> double& { return c.train.beta2; }, 0.0, 0.999999, false},
      FloatKey{"train.eps", "AdamW epsilon", [](RunConfig& c) -> double& { return c.train.eps; }, 0.0, 1.0, true},
      ChoiceKey{"train.optimizer", "inner optimizer: adamw, or muon (the hidden layers' weight matrices by Muon, orthogonalized momentum, at train.muon_lr; embeddings, norms and biases by AdamW at train.lr)", [](RunConfig& c) { return choice_field(c.train.optimizer); }},
      FloatKey{"train.muon_lr", "muon: 0 (the default): the weight matrices at AdamW's train.lr and weight decay with Moonlight's scale, every matrix's step of RMS 0.2 lr; above 0: their peak lr in the reference's form (its 0.02 was set for 768-wide models), scaled by the lr schedule as train.lr is", [](RunConfig& c) -> double& { return c.train.muon_lr; }, 0.0, 10.0, false},
      FloatKey{"train.muon_momentum", "muon: momentum (Nesterov) of the weight matrices", [](RunConfig& c) -> double& { return c.train.muon_momentum; }, 0.0, 0.999999, false},
      FloatKey{"train.grad_clip", "clip the global gradient norm to this; 0 disables", [](RunConfig& c) -> double& { return c.train.grad_clip; }, 0.0, 1e6, false},
      IntKey{"train.eval_every", "evaluate on validation data every k steps (and at the end)", [](RunConfig& c) -> std::int64_t& { return c.train.eval_every; }, 1, 1LL << 40},
      IntKey{"train.eval_batches", "validation batches per evaluation", [](RunConfig& c) -> std::int64_t& { return c.train.eval_batches; }, 1, kBig},
      IntKey{"train.checkpoint_every", "write a checkpoint every k steps (and at the end); 0 only at the end", [](RunConfig& c) -> std::int64_t& { return c.train.checkpoint_every; }, 0, 1LL << 40},
      IntKey{"train.log_every", "write a metrics line every k steps", [](RunConfig& c) -> std::int64_t& { return c.train.log_every; }, 1, 1LL << 40},
      IntKey{"train.seed", "seed of data order and dropout", [](RunConfig& c) -> std::int64_t& { return c.train.seed; }, 0, std::numeric_limits<std::int64_t>::max()},
      IntKey{"train.threads", "CPU threads for LibTorch; 0 uses every core", [](RunConfig& c) -> std::int64_t& { return c.train.threads; }, 0, 1024},
      StringKey{"train.device", "where the model trains: auto (a GPU when LibTorch has CUDA, else the CPU), cpu, cuda or cuda:N", [](RunConfig& c) -> std::string& { return c.train.device; }, {}},
      ChoiceKey{"train.precision", "fp32, or bf16: forward passes under autocast to bfloat16, weights, gradients and optimizer state in fp32", [](RunConfig& c) { return choice_field(c.train.precision); }},
      FloatKey{"train.quorum", "a round closes short of some members once this share of the members' expected work (inner steps) is ready and the learned grace has passed since", [](RunConfig& c) -> double& { return c.train.quorum; }, 0.0, 1.0, false},
      FloatKey{"train.grace_spread", "the learned grace: the median lag of the last members in recent rounds plus this many robust spreads", [](RunConfig& c) -> double& { return c.train.grace_spread; }, 0.0, 100.0, false},
      FloatKey{"train.round_timeout_s", "a synchronization round (all-reduce, pair exchange) gives up after this many seconds and is skipped", [](RunConfig& c) -> double& { return c.train.round_timeout_s; }, 0.0, 1e7, true},
  };
}

// The keys of the outer method and each method's own, in the order the effective config lists them.
std::vector<KeySpec> method_keys() {
  return {
      ChoiceKey{"outer.method", "outer optimizer: how the workers synchronize", [](RunConfig& c) { return choice_field(c.outer.method); }},
      IntKey{"outer.codec_block", "values per scale block of the scaled codecs (int8, fp8, int4, fp4)", [](RunConfig& c) -> std::int64_t& { return c.outer.codec_block; }, 1, 1 << 20},
      ChoiceKey{"outer.aggregation", "how the workers' contributions are combined: mean; filtered (non-finite ones and outliers left out); trimmed_mean (per coordinate, outer.trim values dropped at each end); all-reduce methods", [](RunConfig& c) { return choice_field(c.outer.aggregation); }},
      FloatKey{"outer.outlier_factor", "filtered: a contribution farther from the coordinate-wise median than this many times the median distance is left out", [](RunConfig& c) -> double& { return c.outer.outlier_factor; }, 1.0, 1e6, false},
      ChoiceKey{"outer.round_budget", "steps: every member runs the method's inner steps each round (lockstep); time: a round lasts the inner steps of the group's fastest member, each member runs the steps that fit and the mean weighs each contribution by the steps behind it (diloco, streaming_diloco, sparseloco, muloco)", [](RunConfig& c) { return choice_field(c.outer.round_budget); }},
      ChoiceKey{"outer.late_work", "a member left out of a round (late) and caught up: merge (what it computed rides on into its next contribution, weighted by the age gate) or drop; counted either way", [](RunConfig& c) { return choice_field(c.outer.late_work); }},
      FloatKey{"outer.age_decay", "age gate sigma(tau) = gamma(tau) exp(-decay tau) of late contributions and the cgad outer step: the decay per round of age (default -ln 0.9)", [](RunConfig& c) -> double& { return c.outer.age_decay; }, 0.0, 100.0, false},
      FloatKey{"outer.age_cutoff", "age gate: contributions this many rounds old or older weigh nothing (cosine gate to zero)", [](RunConfig& c) -> double& { return c.outer.age_cutoff; }, 1e-3, 1e6, false},
      IntKey{"outer.trim", "trimmed_mean: values dropped at each end of every coordinate (fewer when too few workers remain)", [](RunConfig& c) -> std::int64_t& { return c.outer.trim; }, 0, 1 << 20},
      ChoiceKey{"outer.state_device", "where the outer optimizer keeps its state: host (memory of the machine, sparing the GPU's) or device (train.device's memory)", [](RunConfig& c) { return choice_field(c.outer.state_device); }},
      ChoiceKey{"ddp.codec", "codec of the gradients ddp all-reduces", [](RunConfig& c) { return choice_field(c.ddp.codec); }},
      ChoiceKey{"ddp.engine", "links: our all-reduce; gloo: c10d ProcessGroupGloo (real runs, fp32); nccl: c10d ProcessGroupNCCL (real runs, fp32, one GPU per peer)", [](RunConfig& c) { return choice_field(c.ddp.engine); }},
      IntKey{"ddp.round_steps", "real runs: steps between agreements on the members (a newcomer joins there; a lost member is dropped at once)", [](RunConfig& c) -> std::int64_t& { return c.ddp.round_steps; }, 1, 1LL << 40},
      IntKey{"diloco.inner_steps", "H: inner steps per outer round", [](RunConfig& c) -> std::int64_t& { return c.diloco.inner_steps; }, 1, 1LL << 40},
      FloatKey{"diloco.outer_lr", "outer Nesterov learning rate", [](RunConfig& c) -> double& { return c.diloco.outer_lr; }, 0.0, 10.0, true},
      ChoiceKey{"diloco.outer_step", "the outer step: nesterov (Nesterov momentum SGD, the paper's) or cgad (Cosine-Gated Adam-Decay: Adam on pseudo-gradients scaled by the age gate, outer.age_decay and outer.age_cutoff; beta1 = diloco.outer_momentum)", [](RunConfig& c) { return choice_field(c.diloco.outer_step); }},
      FloatKey{"diloco.cgad_lr", "cgad's learning rate; 0: the rule train.lr x sqrt(diloco.inner_steps) (the size of H inner steps of random sign)", [](RunConfig& c) -> double& { return c.diloco.cgad_lr; }, 0.0, 10.0, false},
      IntKey{"diloco.delay_rounds", "a controlled delay: each round's averaged pseudo-gradient is applied this many rounds later (asynchronous DiLoCo's staleness, for stability studies); 0: none", [](RunConfig& c) -> std::int64_t& { return c.diloco.delay_rounds; }, 0, 64},
      FloatKey{"diloco.outer_momentum", "outer Nesterov momentum", [](RunConfig& c) -> double& { return c.diloco.outer_momentum; }, 0.0, 0.999999, false},
      ChoiceKey{"diloco.codec", "codec of the pseudo-gradient on the wire", [](RunConfig& c) { return choice_field(c.diloco.codec); }},
      IntKey{"streaming_diloco.inner_steps", "H: each fragment is synchronized once every H steps", [](RunConfig& c) -> std::int64_t& { return c.streaming_diloco.inner_steps; }, 1, 1LL << 40},
      IntKey{"streaming_diloco.fragment_layers", "transformer blocks per fragment (the paper uses 3)", [](RunConfig& c) -> std::int64_t& { return c.streaming_diloco.fragment_layers; }, 1, 1024},
      ChoiceKey{"streaming_diloco.pattern", "how blocks are grouped into fragments", [](RunConfig& c) { return choice_field(c.streaming_diloco.pattern); }},
      ChoiceKey{"streaming_diloco.edges", "embedding and final layer: with_neighbors (first / last fragment) or own_fragments", [](RunConfig& c) { return choice_field(c.streaming_diloco.edges); }},
      IntKey{"streaming_diloco.overlap", "tau: inner steps a fragment's all-reduce may overlap", [](RunConfig& c) -> std::int64_t& { return c.streaming_diloco.overlap; }, 0, 1LL << 40},
      FloatKey{"streaming_diloco.mixing", "alpha: local share when merging a synchronized fragment (0: take the global one)", [](RunConfig& c) -> double& { return c.streaming_diloco.mixing; }, 0.0, 1.0, false},
      FloatKey{"streaming_diloco.outer_lr", "outer Nesterov learning rate", [](RunConfig& c) -> double& { return c.streaming_diloco.outer_lr; }, 0.0, 10.0, true},
      FloatKey{"streaming_diloco.outer_momentum", "outer Nesterov momentum", [](RunConfig& c) -> double& { return c.streaming_diloco.outer_momentum; }, 0.0, 0.999999, false},
      ChoiceKey{"streaming_diloco.codec", "codec of the fragments' pseudo-gradients", [](RunConfig& c) { return choice_field(c.streaming_diloco.codec); }},
      IntKey{"noloco.inner_steps", "H: inner steps between pairwise averagings", [](RunConfig& c) -> std::int64_t& { return c.noloco.inner_steps; }, 1, 1LL << 40},
      FloatKey{"noloco.outer_lr", "beta = gamma of the coded update", [](RunConfig& c) -> double& { return c.noloco.outer_lr; }, 0.0, 10.0, true},
      FloatKey{"noloco.outer_momentum", "alpha: momentum of the outer update", [](RunConfig& c) -> double& { return c.noloco.outer_momentum; }, 0.0, 0.999999, false},
      ChoiceKey{"noloco.codec", "codec of the weights sent to the partner", [](RunConfig& c) { return choice_field(c.noloco.codec); }},
      IntKey{"co2.inner_steps", "tau: inner steps per round (the average is applied one round late)", [](RunConfig& c) -> std::int64_t& { return c.co2.inner_steps; }, 1, 1LL << 40},
      FloatKey{"co2.outer_lr", "outer learning rate", [](RunConfig& c) -> double& { return c.co2.outer_lr; }, 0.0, 10.0, true},
      FloatKey{"co2.outer_momentum", "outer momentum beta", [](RunConfig& c) -> double& { return c.co2.outer_momentum; }, 0.0, 0.999999, false},
      FloatKey{"co2.gap_penalty", "Lambda: the stale update is divided by it", [](RunConfig& c) -> double& { return c.co2.gap_penalty; }, 1e-6, 1e6, false},
      FloatKey{"co2.clip_threshold", "clip outer momentum elementwise to +-this; 0 disables", [](RunConfig& c) -> double& { return c.co2.clip_threshold; }, 0.0, 1e6, false},
      ChoiceKey{"co2.codec", "codec of the averaged parameters", [](RunConfig& c) { return choice_field(c.co2.codec); }},
      IntKey{"sparseloco.inner_steps", "H: inner steps per outer round; 0: by the rule, Covenant-72B's 30, shortened so the run has at least three accumulator drains (3 x chunk / topk rounds): min(30, train.steps x topk / (3 x chunk))", [](RunConfig& c) -> std::int64_t& { return c.sparseloco.inner_steps; }, 0, 1LL << 40},
      FloatKey{"sparseloco.outer_lr", "alpha: outer learning rate on the mean of the sparse updates", [](RunConfig& c) -> double& { return c.sparseloco.outer_lr; }, 0.0, 10.0, true},
      FloatKey{"sparseloco.error_decay", "beta: decay of the error-feedback accumulator (it stands in for outer momentum; 1: nothing unsent is ever dropped)", [](RunConfig& c) -> double& { return c.sparseloco.error_decay; }, 0.0, 1.0, false},
      IntKey{"sparseloco.chunk", "values per chunk of the pseudo-gradient; the top-k is taken in each", [](RunConfig& c) -> std::int64_t& { return c.sparseloco.chunk; }, 2, 1 << 20},
      ChoiceKey{"sparseloco.flush_codec", "none: the last round sends its top-k like the others, and what the accumulators still hold at the end stays out of the model; a codec: the last round sends the whole error accumulator, all-reduced in it (one dense round: 4.25 bits a value in fp4_e2m1; it overshot on the text benchmark, docs/methods.md)", [](RunConfig& c) { return flush_codec_field(c.sparseloco.flush_codec); }},
      IntKey{"sparseloco.topk", "values kept (and sent, 2 bits each plus the index) per chunk", [](RunConfig& c) -> std::int64_t& { return c.sparseloco.topk; }, 1, 1 << 20},
      IntKey{"muloco.inner_steps", "H: inner steps (by Muon, whatever train.optimizer says) per outer round", [](RunConfig& c) -> std::int64_t& { return c.muloco.inner_steps; }, 1, 1LL << 40},
      FloatKey{"muloco.outer_lr", "outer Nesterov learning rate", [](RunConfig& c) -> double& { return c.muloco.outer_lr; }, 0.0, 10.0, true},
      FloatKey{"muloco.outer_momentum", "outer Nesterov momentum", [](RunConfig& c) -> double& { return c.muloco.outer_momentum; }, 0.0, 0.999999, false},
      ChoiceKey{"muloco.codec", "codec of the error-fed pseudo-gradient (int2: 2 bits, int4 or fp4_e2m1: 4 bits, ...)", [](RunConfig& c) { return choice_field(c.muloco.codec); }},
      FloatKey{"muloco.error_decay", "beta: decay per round of what the codec has not sent yet (1: nothing unsent is ever dropped)", [](RunConfig& c) -> double& { return c.muloco.error_decay; }, 0.0, 1.0, false},
  };
}

// The keys of joining runs and pipelines, in the order the effective config lists them.
std::vector<KeySpec> join_and_pipeline_keys() {
  return {
      IntKey{"join.keep_rounds", "outer rounds of updates a donor keeps after the snapshot it offers (Streaming DiLoCo: rounds of all its fragments, H inner steps each), so that a newcomer whose state takes that long to arrive catches up instead of fetching again", [](RunConfig& c) -> std::int64_t& { return c.join.keep_rounds; }, 1, 1 << 20},
      FloatKey{"join.keep_mb", "memory (MB) a donor's kept updates may take at most (the oldest go first)", [](RunConfig& c) -> double& { return c.join.keep_mb; }, 1.0, 1e9, true},
      BoolKey{"join.align", "true: a newcomer starts at the step the members are at when it has caught up (the donors say where), leaving out the slots they computed before it arrived, so nobody waits at the round's end while it computes them; false: it starts at the round end its state is from, and the group waits (a run whose newcomers start where a simulation of it starts them, whatever their timing)", [](RunConfig& c) -> bool& { return c.join.align; }},
      FloatKey{"join.serve_share", "share of a donor's link that serving newcomers may take, where the link's bandwidth is known (--shape, the simulator); 1: all of it", [](RunConfig& c) -> double& { return c.join.serve_share; }, 0.0, 1.0, true},
      BoolKey{"pipeline.enabled", "true: `gossamer peer` trains the run as a SkipPipe pipeline over its peers (a node per peer; the pipeline.* keys), not data-parallel; `gossamer pipeline` and `gossamer sim --pipeline` run pipelines whatever it says", [](RunConfig& c) -> bool& { return c.pipeline.enabled; }},
      ChoiceKey{"pipeline.mode", "SkipPipe paths: full (every stage in order), random (skipping, cost-blind), noca (cost-aware, without collision awareness), skippipe (CBS with TC2)", [](RunConfig& c) { return choice_field(c.pipeline.mode); }},
      IntKey{"pipeline.nodes", "nodes of the pipeline (over peers, pipeline.enabled: the peers the first one waits for unless given --wait-for; the pipeline is planned over every peer there at its start)", [](RunConfig& c) -> std::int64_t& { return c.pipeline.nodes; }, 2, 4096},
      IntKey{"pipeline.stages", "stages the model is cut into (model.layers divisible by it)", [](RunConfig& c) -> std::int64_t& { return c.pipeline.stages; }, 2, 64},
      IntKey{"pipeline.path_length", "stages each micro-batch visits, stage 0 included (the rest are skipped)", [](RunConfig& c) -> std::int64_t& { return c.pipeline.path_length; }, 2, 64},
      IntKey{"pipeline.memory", "micro-batches in flight per node", [](RunConfig& c) -> std::int64_t& { return c.pipeline.memory; }, 1, 1024},
      IntKey{"pipeline.mbs_per_origin", "micro-batches (of train.batch_size samples) each stage-0 node starts per iteration", [](RunConfig& c) -> std::int64_t& { return c.pipeline.mbs_per_origin; }, 1, 1 << 16},
      IntKey{"pipeline.mbs_per_agent", "micro-batches one planned path carries", [](RunConfig& c) -> std::int64_t& { return c.pipeline.mbs_per_agent; }, 1, 1 << 16},
      ChoiceKey{"pipeline.network", "the nodes' links, as the scheduler plans on them and the simulator emulates them: geo (the reference's table of 12 places, as published), geo-fixed (the same with its suspicious NL-LDN entry, 1000 times below the other European pairs, replaced by BE-LDN's), uniform (50 ms, 1 Gbit/s) or measured (across processes and peers only: the nodes time each pair's latency and bandwidth and each machine's stage forward at the start, and the scheduler plans on that)", [](RunConfig& c) { return choice_field(c.pipeline.network); }},
      FloatKey{"pipeline.forward_s", "the scheduler's cost of one stage's forward of one micro-batch (s)", [](RunConfig& c) -> double& { return c.pipeline.forward_s; }, 0.0, 1e6, true},
      FloatKey{"pipeline.activation_mib", "the scheduler's size of one hop (MiB)", [](RunConfig& c) -> double& { return c.pipeline.activation_mib; }, 0.0, 1e6, false},
      ChoiceKey{"pipeline.activation_codec", "codec of activations and their gradients between stages", [](RunConfig& c) { return choice_field(c.pipeline.activation_codec); }},
      ChoiceKey{"pipeline.stage_sync", "how a stage's replicas synchronise: ddp (all-reduce of the gradients every iteration) or an outer optimizer over the stage's replicas, each stepping on its own between rounds: diloco, streaming_diloco, noloco or co2 (their own sections' keys)", [](RunConfig& c) { return stage_sync_field(c.pipeline.stage_sync); }},
      IntKey{"pipeline.gcma_trials", "children the genetic node-to-stage assignment tries", [](RunConfig& c) -> std::int64_t& { return c.pipeline.gcma_trials; }, 0, 1 << 24},
      IntKey{"pipeline.crash_node", "simulator scenario (gossamer sim --pipeline, compare): this node crashes half-way through pipeline.crash_at_iteration, and the pipeline goes on without it; -1: none", [](RunConfig& c) -> std::int64_t& { return c.pipeline.crash_node; }, -1, 4095},
      IntKey{"pipeline.crash_at_iteration", "the iteration during which pipeline.crash_node crashes", [](RunConfig& c) -> std::int64_t& { return c.pipeline.crash_at_iteration; }, 0, 1LL << 40},
      ChoiceKey{"pipeline.order", "the order of a node's work: timetable (the scheduler's simulated timetable: every run adds its gradients in the same order, bit for bit the same on any network) or arrival (first come, first served: no waiting for a late message's turn, last bits vary between runs)", [](RunConfig& c) { return choice_field(c.pipeline.order); }},
      BoolKey{"pipeline.depth_scaling", "true: the model assembled from the stages (evaluation, the omission check) scales each non-zero stage's residual branches by the share of the trained micro-batches that visited it, stochastic depth's inference rule (a model trained on paths of 4 of 6 stages then gets from all six what it got on average in training; the full pipeline's shares are 1, so it is unchanged); false: the stages' weights as trained", [](RunConfig& c) -> bool& { return c.pipeline.depth_scaling; }},
  };
}

// The keys of the simulator, in the order the effective config lists them.
std::vector<KeySpec> sim_keys() {
  return {
      IntKey{"sim.workers", "simulated workers", [](RunConfig& c) -> std::int64_t& { return c.sim.workers; }, 1, 4096},
      StringKey{"sim.network", "network preset of every worker's link, or custom; skippipe-geo: worker i at the SkipPipe reference's place i mod 12, each pair of places its own latency and bandwidth from the reference's table", [](RunConfig& c) -> std::string& { return c.sim.network; }, {"custom", "loopback", "datacenter", "cross-region", "intercontinental", "home", "wan-100m-80ms", "skippipe-geo"}},
      FloatKey{"sim.bandwidth_mbit", "custom network: access bandwidth per worker (Mbit/s)", [](RunConfig& c) -> double& { return c.sim.bandwidth_mbit; }, 0.0, 1e9, true},
      FloatKey{"sim.latency_ms", "custom network: one-way latency (ms)", [](RunConfig& c) -> double& { return c.sim.latency_ms; }, 0.0, 1e6, false},
      FloatKey{"sim.jitter_ms", "custom network: jitter, standard deviation (ms)", [](RunConfig& c) -> double& { return c.sim.jitter_ms; }, 0.0, 1e6, false},
      FloatKey{"sim.loss", "custom network: packet loss probability (costs retransmission delay)", [](RunConfig& c) -> double& { return c.sim.loss; }, 0.0, 0.5, false},
      IntKey{"sim.slow_link_workers", "heterogeneous links: the last N workers have sim.slow_link_mbit access links", [](RunConfig& c) -> std::int64_t& { return c.sim.slow_link_workers; }, 0, 4096},
      FloatKey{"sim.slow_link_mbit", "bandwidth of the slow workers' links (Mbit/s)", [](RunConfig& c) -> double& { return c.sim.slow_link_mbit; }, 0.0, 1e9, true},
      FloatKey{"sim.shared_uplink_mbit", "> 0 puts every worker behind one shared link of this bandwidth (a hub); 0: none", [](RunConfig& c) -> double& { return c.sim.shared_uplink_mbit; }, 0.0, 1e9, false},
      IntKey{"sim.sites", "> 0 splits the workers into this many sites (contiguous blocks), each behind its own shared link; 0: none", [](RunConfig& c) -> std::int64_t& { return c.sim.sites; }, 0, 4096},
      FloatKey{"sim.site_uplink_mbit", "bandwidth of each site's shared uplink (and, separately, downlink) (Mbit/s)", [](RunConfig& c) -> double& { return c.sim.site_uplink_mbit; }, 0.0, 1e9, true},
      FloatKey{"sim.site_latency_ms", "extra one-way latency to leave or enter a site (ms)", [](RunConfig& c) -> double& { return c.sim.site_latency_ms; }, 0.0, 1e6, false},
      ChoiceKey{"sim.compute", "step time: fixed (sim.step_time_s), device (6 x params x tokens / (FLOP/s x utilization)) or measured (this machine; not deterministic)", [](RunConfig& c) { return choice_field(c.sim.compute); }},
      FloatKey{"sim.step_time_s", "fixed compute: seconds per inner step", [](RunConfig& c) -> double& { return c.sim.step_time_s; }, 0.0, 1e6, true},
      FloatKey{"sim.device_tflops", "device compute: peak TFLOP/s of each worker", [](RunConfig& c) -> double& { return c.sim.device_tflops; }, 0.0, 1e6, true},
      FloatKey{"sim.device_utilization", "device compute: fraction of peak reached (MFU)", [](RunConfig& c) -> double& { return c.sim.device_utilization; }, 0.0, 1.0, true},
      IntKey{"sim.crash_worker", "worker that crashes at sim.crash_at_step; -1: none", [](RunConfig& c) -> std::int64_t& { return c.sim.crash_worker; }, -1, 4095},
      IntKey{"sim.crash_at_step", "inner step at which sim.crash_worker crashes (the newcomer, sim.join_worker: when the run reaches it, wherever it is, e.g. mid-transfer)", [](RunConfig& c) -> std::int64_t& { return c.sim.crash_at_step; }, 0, 1LL << 40},
      IntKey{"sim.crash_mid_round", "fault drill: sim.crash_worker dies inside this outer round's all-reduce (or all-gather), once its own share of the average reached half the group and before the rest (instead of at sim.crash_at_step); 0: off", [](RunConfig& c) -> std::int64_t& { return c.sim.crash_mid_round; }, 0, 1LL << 40},
      FloatKey{"sim.crash_restart_s", "virtual seconds after which sim.crash_worker restarts from its last checkpoint and catches up with the members; -1: it stays down", [](RunConfig& c) -> double& { return c.sim.crash_restart_s; }, -1.0, 1e9, false},
      IntKey{"sim.join_worker", "worker that joins late, at sim.join_at_step, fetching the training state from a member; -1: none", [](RunConfig& c) -> std::int64_t& { return c.sim.join_worker; }, -1, 4095},
      IntKey{"sim.join_at_step", "inner step from which sim.join_worker takes part (a round boundary joins cleanly)", [](RunConfig& c) -> std::int64_t& { return c.sim.join_at_step; }, 0, 1LL << 40},
      IntKey{"sim.straggler", "worker whose compute is sim.straggler_factor times slower; -1: none", [](RunConfig& c) -> std::int64_t& { return c.sim.straggler; }, -1, 4095},
      FloatKey{"sim.straggler_factor", "compute slowdown of the straggler", [](RunConfig& c) -> double& { return c.sim.straggler_factor; }, 1.0, 1e6, false},
      StringKey{"sim.speeds", "per-worker compute speeds in worker order (1: as sim.compute says, 0.5: steps take twice as long), SPEED or SPEEDxCOUNT items separated by commas, e.g. 1x11,0.5x4,0.25; workers not listed run at 1", [](RunConfig& c) -> std::string& { return c.sim.speeds; }, {}},
      FloatKey{"sim.speed_spread", "sigma of a seeded log-normal factor on each worker's speed (0: none)", [](RunConfig& c) -> double& { return c.sim.speed_spread; }, 0.0, 3.0, false},
      ChoiceKey{"sim.poison", "what the poisoned workers send in all-reduces: none; scale (contributions times sim.poison_scale); sign (times -1); nan (a NaN in each, fp32 codec)", [](RunConfig& c) { return choice_field(c.sim.poison); }},
      IntKey{"sim.poison_workers", "how many workers are poisoned (the last ones)", [](RunConfig& c) -> std::int64_t& { return c.sim.poison_workers; }, 1, 4095},
      FloatKey{"sim.poison_scale", "sim.poison = scale: the factor", [](RunConfig& c) -> double& { return c.sim.poison_scale; }, -1e6, 1e6, false},
      FloatKey{"sim.churn_rate", "share of the workers that crash per 100 inner steps, at seeded steps, each restarting sim.churn_downtime_s later from its last checkpoint; 0: none", [](RunConfig& c) -> double& { return c.sim.churn_rate; }, 0.0, 1.0, false},
      FloatKey{"sim.churn_per_minute", "steady churn by time: failures per minute per 10 workers, each worker but the evaluating one failing at seeded virtual times (a Poisson process while it is up) and restarting sim.churn_downtime_s later from its last checkpoint; 0: none", [](RunConfig& c) -> double& { return c.sim.churn_per_minute; }, 0.0, 600.0, false},
      FloatKey{"sim.stalls_per_minute", "stalls per minute per 10 workers: a worker (not the evaluating one) stops computing for sim.stall_s at seeded virtual times and goes on where it was (a preempted or throttled machine); 0: none", [](RunConfig& c) -> double& { return c.sim.stalls_per_minute; }, 0.0, 600.0, false},
      FloatKey{"sim.stall_s", "virtual seconds each stall lasts", [](RunConfig& c) -> double& { return c.sim.stall_s; }, 0.0, 1e9, false},
      FloatKey{"sim.churn_downtime_s", "virtual seconds a worker crashed by churn stays down before it restarts", [](RunConfig& c) -> double& { return c.sim.churn_downtime_s; }, 0.0, 1e9, false},
      IntKey{"sim.seed", "seed of the network's jitter and loss draws", [](RunConfig& c) -> std::int64_t& { return c.sim.seed; }, 0, std::numeric_limits<std::int64_t>::max()},
  };
}

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> keys = [] {
    std::vector<KeySpec> all;
    for (auto part : {&model_and_data_keys, &train_keys, &method_keys, &join_and_pipeline_keys, &sim_keys}) {
      auto more = part();
      all.insert(all.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
    return all;
  }();
  return keys;
}

const char* key_name(const KeySpec& k) {
  return std::visit([](const auto& s) { return s.name; }, k);
}

std::string format_double(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest form that round-trips
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string allowed_text(const KeySpec& k) {
  return std::visit(
      [](const auto& s) -> std::string {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, IntKey>) {
          // A bound of the type rather than of the meaning (2^31 - 1, 2^63 - 1) is not worth printing.
          if (s.max >= std::numeric_limits<std::int32_t>::max()) return "an integer >= " + std::to_string(s.min);
          return "an integer in [" + std::to_string(s.min) + ", " + std::to_string(s.max) + "]";
        } else if constexpr (std::is_same_v<T, BoolKey>) {
          return "true or false";
        } else if constexpr (std::is_same_v<T, ChoiceKey>) {
          RunConfig scratch;
          std::string out = "one of";
          for (const auto& c : s.ref(scratch).names()) out += " '" + c + "'";
          return out;
        } else if constexpr (std::is_same_v<T, FloatKey>) {
          return std::string("a number in ") + (s.min_exclusive ? "(" : "[") + format_double(s.min) + ", " + format_double(s.max) + "]";
        } else {
          if (s.choices.empty()) return "a string";
          std::string out = "one of";
          for (const auto& c : s.choices) out += " '" + c + "'";
          return out;
        }
      },
      k);
}

Status unknown_key(std::string_view key, std::string_view source) {
  std::vector<std::string> names;
  for (const auto& k : schema()) names.emplace_back(key_name(k));
  std::string msg = std::string(source) + ": unknown config key '" + std::string(key) + "'";
  if (auto best = closest_match(key, names)) msg += "; did you mean '" + *best + "'?";
  msg += " (`gossamer config --keys` lists every key)";
  return error(ErrorCode::kInvalidArgument, msg);
}

Status set_value(RunConfig& config, const KeySpec& spec, const toml::node& node, std::string_view source) {
  const std::string where = std::string(source) + ": " + key_name(spec);
  auto bad = [&](const std::string& what) {
    return error(ErrorCode::kInvalidArgument, where + " " + what + "; allowed: " + allowed_text(spec));
  };
  return std::visit(
      [&](const auto& s) -> Status {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, IntKey>) {
          if (!node.is_integer()) return bad("has the wrong type (" + std::string(toml::impl::node_type_friendly_names[static_cast<int>(node.type())]) + ")");
          const std::int64_t v = node.as_integer()->get();
          if (v < s.min || v > s.max) return bad("= " + std::to_string(v) + " is out of range");
          s.ref(config) = v;
        } else if constexpr (std::is_same_v<T, FloatKey>) {
          double v = 0;
          if (node.is_integer()) {
            v = static_cast<double>(node.as_integer()->get());
          } else if (node.is_floating_point()) {
            v = node.as_floating_point()->get();
          } else {
            return bad("has the wrong type (" + std::string(toml::impl::node_type_friendly_names[static_cast<int>(node.type())]) + ")");
          }
          const bool below = s.min_exclusive ? !(v > s.min) : !(v >= s.min);
          if (below || !(v <= s.max)) return bad("= " + format_double(v) + " is out of range");
          s.ref(config) = v;
        } else if constexpr (std::is_same_v<T, BoolKey>) {
          if (!node.is_boolean()) return bad("has the wrong type (" + std::string(toml::impl::node_type_friendly_names[static_cast<int>(node.type())]) + ")");
          s.ref(config) = node.as_boolean()->get();
        } else if constexpr (std::is_same_v<T, ChoiceKey>) {
          if (!node.is_string()) return bad("has the wrong type (" + std::string(toml::impl::node_type_friendly_names[static_cast<int>(node.type())]) + ")");
          const std::string v = node.as_string()->get();
          const ChoiceField field = s.ref(config);
          if (!field.set(field.at, v)) return bad("= '" + v + "' is not allowed");
        } else {
          if (!node.is_string()) return bad("has the wrong type (" + std::string(toml::impl::node_type_friendly_names[static_cast<int>(node.type())]) + ")");
          std::string v = node.as_string()->get();
          if (!s.choices.empty() && std::find(s.choices.begin(), s.choices.end(), v) == s.choices.end()) {
            return bad("= '" + v + "' is not allowed");
          }
          s.ref(config) = std::move(v);
          if (std::string_view(s.name) == "model.preset") {
            for (const auto& p : model_presets()) {
              if (config.model.preset == p.name) {
                config.model.layers = p.layers;
                config.model.width = p.width;
                config.model.heads = p.heads;
                config.model.context = p.context;
              }
            }
          }
        }
        return Status();
      },
      spec);
}

const KeySpec* find_key(std::string_view name) {
  for (const auto& k : schema()) {
    if (name == key_name(k)) return &k;
  }
  return nullptr;
}

bool is_section(std::string_view prefix) {
  for (const auto& k : schema()) {
    std::string_view n = key_name(k);
    if (n.size() > prefix.size() && n.substr(0, prefix.size()) == prefix && n[prefix.size()] == '.') return true;
  }
  return false;
}

Status apply_table(RunConfig& config, const toml::table& table, const std::string& prefix, std::string_view source) {
  // A preset first, so that the other keys of its table refine it whatever their order.
  if (prefix == "model" && table.contains("preset") && !table.get("preset")->is_table()) {
    if (Status st = set_value(config, *find_key("model.preset"), *table.get("preset"), source); !st.ok()) return st;
  }
  for (auto&& [k, v] : table) {
    const std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (name == "model.preset") continue;
    if (v.is_table()) {
      if (!is_section(name)) return unknown_key(name, source);
      Status st = apply_table(config, *v.as_table(), name, source);
      if (!st.ok()) return st;
      continue;
    }
    const KeySpec* spec = find_key(name);
    if (spec == nullptr) return unknown_key(name, source);
    Status st = set_value(config, *spec, v, source);
    if (!st.ok()) return st;
  }
  return Status();
}

}  // namespace

Status apply_toml(RunConfig& config, std::string_view toml_text, std::string_view source_name) {
  toml::table table;
  try {
    table = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << source_name << ":" << e.source().begin.line << ":" << e.source().begin.column << ": TOML syntax error: " << e.description();
    return error(ErrorCode::kInvalidArgument, os.str());
  }
  RunConfig updated = config;
  Status st = apply_table(updated, table, "", source_name);
  if (!st.ok()) return st;
  config = updated;
  return Status();
}

Status apply_toml_file(RunConfig& config, const std::filesystem::path& path) {
  auto text = read_text_file(path, 16 << 20);
  if (!text.ok()) {
    return error(ErrorCode::kInvalidArgument, "cannot read config file: " + text.status().message() +
                                                  " (write one with `gossamer config > run.toml`)");
  }
  return apply_toml(config, *text, path.string());
}

Status apply_override(RunConfig& config, std::string_view assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return error(ErrorCode::kInvalidArgument, "--set expects key=value (for example --set model.layers=4), got '" + std::string(assignment) + "'");
  }
  const std::string key(assignment.substr(0, eq));
  const std::string value(assignment.substr(eq + 1));
  const KeySpec* spec = find_key(key);
  if (spec == nullptr) return unknown_key(key, "--set");
  toml::table parsed;
  bool is_toml = true;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    is_toml = false;
  }
  RunConfig updated = config;
  Status st;
  // A string key takes the text as typed unless it is a quoted TOML string: --set data.path=123 is the
  // file "123", not an integer.
  const bool string_key = std::holds_alternative<StringKey>(*spec) || std::holds_alternative<ChoiceKey>(*spec);
  if (is_toml && parsed.contains("v") && (!string_key || parsed.get("v")->is_string())) {
    st = set_value(updated, *spec, *parsed.get("v"), "--set");
  } else {
    // A bare word such as a path: take it as a string.
    st = set_value(updated, *spec, toml::value<std::string>(value), "--set");
  }
  if (!st.ok()) return st;
  config = updated;
  return Status();
}

const std::vector<ModelPreset>& model_presets() {
  // GPT-2's published shapes (Radford et al. 2019; Hugging Face's gpt2 configs).
  static const std::vector<ModelPreset> presets = {
      {"gpt2-124m", 12, 768, 12, 1024, "GPT-2 small"},
      {"gpt2-350m", 24, 1024, 16, 1024, "GPT-2 medium"},
      {"gpt2-774m", 36, 1280, 20, 1024, "GPT-2 large"},
      {"gpt2-1558m", 48, 1600, 25, 1024, "GPT-2 XL"},
  };
  return presets;
}

std::int64_t vocab_size(const RunConfig& c) { return c.data.vocab_size > 0 ? c.data.vocab_size : 256; }

std::string to_toml(const RunConfig& config_in) {
  RunConfig config = config_in;
  std::ostringstream os;
  os << "# Gossamer run configuration. Every key, with its value; `gossamer config --keys` explains them.\n";
  std::string section;
  for (const auto& spec : schema()) {
    const std::string name = key_name(spec);
    const auto dot = name.rfind('.');
    const std::string sec = name.substr(0, dot), leaf = name.substr(dot + 1);
    if (sec != section) {
      os << "\n[" << sec << "]\n";
      section = sec;
    }
    std::visit(
        [&](const auto& s) {
          using T = std::decay_t<decltype(s)>;
          os << "# " << s.help << "\n" << leaf << " = ";
          if constexpr (std::is_same_v<T, IntKey>) {
            os << s.ref(config);
          } else if constexpr (std::is_same_v<T, FloatKey>) {
            os << format_double(s.ref(config));
          } else if constexpr (std::is_same_v<T, BoolKey>) {
            os << (s.ref(config) ? "true" : "false");
          } else if constexpr (std::is_same_v<T, ChoiceKey>) {
            os << toml::value<std::string>(s.ref(config).name());
          } else {
            os << toml::value<std::string>(s.ref(config));
          }
          os << "\n";
        },
        spec);
  }
  return os.str();
}

std::vector<std::string> config_differences(const RunConfig& a_in, const RunConfig& b_in, const std::vector<std::string>& prefixes) {
  RunConfig a = a_in, b = b_in;  // the schema's accessors take mutable references
  std::vector<std::string> out;
  for (const auto& spec : schema()) {
    const std::string name = key_name(spec);
    if (!prefixes.empty() && std::none_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; })) continue;
    std::visit(
        [&](const auto& s) {
          using T = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<T, ChoiceKey>) {
            const std::string x = s.ref(a).name(), y = s.ref(b).name();
            if (x != y) out.push_back(name + ": '" + x + "' -> '" + y + "'");
          } else if (s.ref(a) == s.ref(b)) {
            return;
          } else if constexpr (std::is_same_v<T, FloatKey>) {
            out.push_back(name + ": " + format_double(s.ref(a)) + " -> " + format_double(s.ref(b)));
          } else if constexpr (std::is_same_v<T, IntKey>) {
            out.push_back(name + ": " + std::to_string(s.ref(a)) + " -> " + std::to_string(s.ref(b)));
          } else if constexpr (std::is_same_v<T, BoolKey>) {
            out.push_back(name + ": " + (s.ref(a) ? "true" : "false") + " -> " + (s.ref(b) ? "true" : "false"));
          } else {
            out.push_back(name + ": '" + s.ref(a) + "' -> '" + s.ref(b) + "'");
          }
        },
        spec);
  }
  return out;
}

std::vector<KeyInfo> config_keys() {
  std::vector<KeyInfo> out;
  for (const auto& spec : schema()) {
    KeyInfo info;
    info.name = key_name(spec);
    info.allowed = allowed_text(spec);
    std::visit(
        [&](const auto& s) {
          using T = std::decay_t<decltype(s)>;
          info.help = s.help;
          info.type = std::is_same_v<T, IntKey> ? "integer" : std::is_same_v<T, FloatKey> ? "number" : std::is_same_v<T, BoolKey> ? "boolean" : "string";
        },
        spec);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace gossamer::train
