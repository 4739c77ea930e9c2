#include "train/worker.h"

#include <torch/torch.h>

#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/wire.h"
#include "model/external_model.h"
#include "model/torchscript_model.h"
#include "optim/muon.h"
#include "optim/updates.h"
#include "train/device.h"
#include "train/fused_steps.h"
#include "train/schedule.h"

namespace gossamer::train {

model::GptConfig gpt_config(const RunConfig& c, int rank) {
  model::GptConfig g;
  g.vocab_size = vocab_size(c);
  g.context = c.model.context;
  g.layers = c.model.layers;
  g.width = c.model.width;
  g.heads = c.model.heads;
  g.dropout = c.model.dropout;
  g.init_seed = static_cast<std::uint64_t>(c.model.init_seed);
  g.dropout_seed = static_cast<std::uint64_t>(c.train.seed) * 1000003u + static_cast<std::uint64_t>(rank);
  return g;
}

Result<std::unique_ptr<model::LanguageModel>> make_model(const RunConfig& c, int rank) {
  const auto g = gpt_config(c, rank);
  if (c.model.kind == ModelKind::kExternal) {
    return error(ErrorCode::kInvalidArgument, "model.kind = external is a model its caller computes: train it from Python with the gossamer "
                                              "package (gossamer.Peer and an outer optimizer; see examples/python)");
  }
  if (c.model.kind == ModelKind::kTorchScript) {
    model::TorchScriptOptions o;
    o.path = c.model.path;
    o.block_pattern = c.model.block_pattern;
    o.context = c.model.context;
    o.vocab_size = g.vocab_size;
    o.dropout_seed = g.dropout_seed;
    auto m = model::TorchScriptModel::load(o);
    if (!m.ok()) return m.status();
    return std::unique_ptr<model::LanguageModel>(std::move(*m));
  }
  return std::unique_ptr<model::LanguageModel>(std::make_unique<model::Gpt>(g));
}

namespace {

c10::Device must_resolve(const RunConfig& c) {
  auto d = resolve_device(c.train.device);
  GOSSAMER_CHECK(d.ok(), "Worker: " + d.status().message() + " (check_resources checks the device before workers are made)");
  return *d;
}

// The model on its device, before the optimizer is made (its state then lives there too).
std::unique_ptr<model::LanguageModel> must_make_model(const RunConfig& c, int rank, const c10::Device& device) {
  auto m = make_model(c, rank);
  GOSSAMER_CHECK(m.ok(), "Worker: " + m.status().message() + " (check_resources checks the model before workers are made)");
  if (!device.is_cpu()) (*m)->to(device);
  return std::move(*m);
}

// Muon's peak lr: train.muon_lr, or with 0 (Moonlight's scale) AdamW's train.lr.
double muon_peak_lr(const TrainSection& t) { return t.muon_lr == 0 ? t.lr : t.muon_lr; }

// With train.optimizer = muon, the parameters Muon steps: the hidden layers' weight matrices, every
// 2-D parameter but the embedding tables and the output head, told by their names (wte, wpe, emb,
// head) or, in a module with other names, by a first dimension of the vocabulary's or the context's
// size. The rest stays with AdamW, as Muon's reference does.
bool muon_steps(const model::NamedParameter& p, const RunConfig& c) {
  if (p.tensor.dim() != 2) return false;
  for (const char* word : {"wte", "wpe", "emb", "head"}) {
    if (p.name.find(word) != std::string::npos) return false;
  }
  return p.tensor.size(0) != vocab_size(c) && p.tensor.size(0) != c.model.context;
}

// Weight decay applies to matrices (dim >= 2: linear weights and embeddings) only, never to biases or
// LayerNorm gains. `params`: the ones AdamW steps (all, or those Muon does not).
std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& params, const TrainSection& t) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = [&](double wd) {
    return torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(wd);
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options(t.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(options(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options(t.weight_decay));
}

}  // namespace

struct Worker::Impl {
  Impl(const RunConfig& c, const data::Dataset& d, int rank, int world, Clock& clk)
      : config(c),
        clock(&clk),
        device(must_resolve(c)),
        bf16(c.train.precision == Precision::kBf16),
        model(must_make_model(c, rank, device)),
        sampler(std::in_place, d.train(), rank, world, c.train.batch_size, c.model.context, static_cast<std::uint64_t>(c.train.seed), c.data.shard_block),
        eval_set(data::validation_batches(d.val(), c.train.batch_size, c.model.context, c.train.eval_batches)) {
    std::vector<torch::Tensor> adam_params, muon_params;
    for (const auto& p : model->named_parameters()) {
      (muon_inner(c) && muon_steps(p, c) ? muon_params : adam_params).push_back(p.tensor);
    }
    optimizer = make_adamw(adam_params, c.train);
    if (muon_inner(c)) {
      optim::MuonOptions mo;
      mo.match_adamw = c.train.muon_lr == 0;
      mo.lr = muon_peak_lr(c.train);
      mo.momentum = c.train.muon_momentum;
      mo.weight_decay = c.train.weight_decay;
      mo.bf16 = device.is_cuda();  // bf16 matrix products are slow on CPUs without bf16 units
      auto made = optim::Muon::make(std::move(muon_params), mo);
      GOSSAMER_CHECK(made.ok(), "Worker: " + made.status().message());
      muon.emplace(std::move(*made));
    }
    schedule.lr = c.train.lr;
    schedule.min_lr_ratio = c.train.min_lr_ratio;
    schedule.warmup_steps = c.train.warmup_steps;
    schedule.total_steps = c.train.steps;
    params = model->parameters();
  }
  Impl(const RunConfig& c, std::shared_ptr<ExternalTraining> e, Clock& clk)
      : config(c), clock(&clk), device(e->parameters.empty() ? c10::Device(c10::kCPU) : e->parameters.front().tensor.device()), bf16(false),
        external(std::move(e)) {
    auto made = model::ExternalModel::make(external->parameters, external->block_pattern);
    GOSSAMER_CHECK(made.ok(), "Worker: " + made.status().message());
    model = std::move(*made);
    params = model->parameters();
  }

  RunConfig config;
  Clock* clock;
  c10::Device device;
  bool bf16;
  std::unique_ptr<model::LanguageModel> model;
  std::optional<data::ShardSampler> sampler;  // (none for a caller's own training)
  std::vector<data::Batch> eval_set;
  std::shared_ptr<ExternalTraining> external;  // a caller's own training: it steps, evaluates and keeps its optimizer
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::optional<optim::Muon> muon;  // train.optimizer = muon: the weight matrices
  std::vector<torch::Tensor> params;

  // The lr schedule's rate for this step, on AdamW's groups and, scaled alike, on Muon's.
  void set_lr(double lr) {
    for (auto& group : optimizer->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    if (muon) muon->set_lr(muon_peak_lr(config.train) * (config.train.lr > 0 ? lr / config.train.lr : 1.0));
  }
  void zero_grad() {
    optimizer->zero_grad();
    if (!muon) return;
    for (const auto& p : muon->parameters()) {
      if (p.grad().defined()) p.grad().zero_();
    }
  }
  void update() {
    if (!fused_adamw_step(*optimizer)) optimizer->step();
    if (muon) muon->step();
  }
  ScheduleOptions schedule;
  std::int64_t step = 0;
  std::int64_t next_batch = 0;
  std::int64_t tokens = 0;
  std::uint64_t restores = 0;
};

Worker::Worker(const RunConfig& config, const data::Dataset& dataset, int rank, int world, Clock& clock)
    : impl_(std::make_unique<Impl>(config, dataset, rank, world, clock)) {}

Worker::Worker(const RunConfig& config, std::shared_ptr<ExternalTraining> external, Clock& clock)
    : impl_(std::make_unique<Impl>(config, std::move(external), clock)) {}

Worker::~Worker() = default;

StepResult Worker::step(const GradientHook& before_update) {
  auto& s = *impl_;
  if (s.external) {
    // The caller's step: its gradients averaged and its optimizer stepped in between where there is
    // a hook (ddp), unless the hook replaced the state.
    const std::uint64_t restores = s.restores;
    Status sync;
    StepResult r = s.external->step(s.step + 1, [&] {
      if (!before_update) return;
      sync = before_update(s.params);
      if (s.restores != restores) return;
      if (Status st = s.external->update(); !st.ok() && sync.ok()) sync = st.with_context("the optimizer's step after averaging");
    });
    r.sync = std::move(sync);
    r.replaced = r.replaced || s.restores != restores;  // (or the caller made no step: it stopped)
    if (!r.replaced) {
      s.step += 1;
      s.tokens += r.tokens;
    }
    r.step = s.step;
    return r;
  }
  Stopwatch watch(*s.clock);
  const data::Batch batch = s.sampler->batch(s.next_batch);
  s.model->train(true);
  s.zero_grad();
  at::Tensor loss;
  {
    AutocastScope autocast(s.device, s.bf16);
    loss = s.model->loss(batch.tokens.to(s.device), batch.targets.to(s.device));
  }
  loss.backward();
  Status sync;
  const std::uint64_t restores = s.restores;
  if (before_update) sync = before_update(s.params);
  if (s.restores != restores) {  // the state this step started from is gone: nothing to update
    StepResult r;
    r.step = s.step;
    r.seconds = watch.elapsed_seconds();
    r.sync = std::move(sync);
    r.replaced = true;
    return r;
  }
  double norm = 0.0;
  if (s.config.train.grad_clip > 0.0) {
    const auto fused = fused_clip_grad_norm(s.params, s.config.train.grad_clip);
    norm = fused ? *fused : torch::nn::utils::clip_grad_norm_(s.params, s.config.train.grad_clip);
  } else {
    double sq = 0.0;
    for (const auto& p : s.params) {
      if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
    }
    norm = std::sqrt(sq);
  }
  const double lr = learning_rate(s.schedule, s.step);
  s.set_lr(lr);
  s.update();

  StepResult r;
  r.loss = loss.item<double>();
  r.grad_norm = norm;
  r.lr = lr;
  r.tokens = batch.tokens.numel();
  s.step += 1;
  s.next_batch += 1;
  s.tokens += r.tokens;
  r.step = s.step;
  r.seconds = watch.elapsed_seconds();
  r.sync = std::move(sync);
  return r;
}

Status Worker::replay_gradients(std::int64_t step, const at::Tensor& flat) {
  auto& s = *impl_;
  if (step != s.step + 1) {
    return error(ErrorCode::kMalformed, "gradients of step " + std::to_string(step) + " given to a worker at step " + std::to_string(s.step));
  }
  std::int64_t numel = 0;
  for (const auto& p : s.params) numel += p.numel();
  if (Status st = optim::check_update(flat, numel, "ddp", step); !st.ok()) return st;
  std::int64_t offset = 0;
  for (auto& p : s.params) {
    const at::Tensor slice = flat.slice(0, offset, offset + p.numel()).view_as(p);
    offset += p.numel();
    // A member averages zeros for a parameter its model gives no gradient and leaves it without one
    // (AdamW then skips it): a parameter without a gradient here whose share is all zeros stays so.
    if (!p.grad().defined()) {
      if (!slice.any().item<bool>()) continue;
      p.mutable_grad() = torch::zeros_like(p);
    }
    p.grad().copy_(slice.to(p.grad().device()));
  }
  if (s.external) {
    if (Status st = s.external->update(); !st.ok()) return st.with_context("replaying step " + std::to_string(step));
  } else {
    if (s.config.train.grad_clip > 0.0) torch::nn::utils::clip_grad_norm_(s.params, s.config.train.grad_clip);
    s.set_lr(learning_rate(s.schedule, s.step));
    s.update();
  }
  s.step += 1;
  s.next_batch += 1;
  return Status();
}

void Worker::skip_step() { impl_->step += 1; }

void Worker::move_to(std::int64_t step) {
  GOSSAMER_CHECK(step >= 0, "Worker::move_to: a negative step");
  impl_->step = step;
  impl_->next_batch = step;
}

double Worker::evaluate() {
  auto& s = *impl_;
  if (s.external) return s.external->evaluate ? s.external->evaluate() : std::numeric_limits<double>::quiet_NaN();
  torch::NoGradGuard no_grad;
  AutocastScope autocast(s.device, s.bf16);
  s.model->train(false);
  double total = 0.0;
  std::int64_t count = 0;
  for (const auto& b : s.eval_set) {
    total += s.model->loss(b.tokens.to(s.device), b.targets.to(s.device)).item<double>() * static_cast<double>(b.tokens.numel());
    count += b.tokens.numel();
  }
  s.model->train(true);
  return total / static_cast<double>(count);
}

std::int64_t Worker::steps_done() const { return impl_->step; }
std::int64_t Worker::tokens_seen() const { return impl_->tokens; }
model::LanguageModel& Worker::model() { return *impl_->model; }

CheckpointState Worker::checkpoint_state(const std::string& config_toml) const {
  const auto& s = *impl_;
  release_free_heap();  // the last step's freed activations must not sit beside the buffers below
  CheckpointState out;
  out.config_toml = config_toml;
  out.step = s.step;
  out.next_batch = s.next_batch;
  out.tokens_seen = s.tokens;

  const auto rng = s.model->rng_state();
  const auto* rp = reinterpret_cast<const std::byte*>(rng.data());
  out.rng_state.assign(rp, rp + rng.size());

  torch::serialize::OutputArchive archive, model_archive, optim_archive;
  s.model->save(model_archive);
  archive.write("model", model_archive);
  if (s.external) {
    // The caller's optimizer, as its own bytes (kept out when it cannot give them: said, not lost).
    auto bytes = s.external->save_optimizer();
    if (bytes.ok()) {
      archive.write("external_optimizer", torch::from_blob(bytes->data(), {static_cast<std::int64_t>(bytes->size())}, torch::kUInt8).clone());
    } else {
      spdlog::warn("checkpoint without the optimizer's state: {}", bytes.status().to_string());
    }
  } else {
    s.optimizer->save(optim_archive);
    archive.write("optimizer", optim_archive);
  }
  if (s.muon) {
    torch::serialize::OutputArchive muon_archive;
    const auto& m = s.muon->momenta();
    for (std::size_t i = 0; i < m.size(); ++i) muon_archive.write(fmt::format("m{}", i), m[i]);
    archive.write("muon", muon_archive);
  }
  // Straight into the checkpoint's buffer, reserved for the tensors' bytes and some room (pages not
  // written cost no memory): no string stream and no copies of a model-sized buffer.
  std::size_t estimate = std::size_t{1} << 20;
  for (const auto& p : s.params) estimate += static_cast<std::size_t>(p.numel()) * 4 * 4;  // weights, AdamW's two moments, slack
  out.tensors.reserve(estimate);
  archive.save_to([&out](const void* data, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(data);
    out.tensors.insert(out.tensors.end(), b, b + n);
    return n;
  });
  return out;
}

Status Worker::restore(const CheckpointState& state) {
  auto& s = *impl_;
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& p : s.params) shapes.push_back(p.sizes().vec());
  try {
    torch::serialize::InputArchive archive, model_archive, optim_archive;
    // From the checkpoint's own buffer (no copy), tensors straight to the model's device.
    archive.load_from(reinterpret_cast<const char*>(state.tensors.data()), state.tensors.size(), s.device);
    archive.read("model", model_archive);
    s.model->load(model_archive);
    if (s.external) {
      at::Tensor bytes;
      if (!archive.try_read("external_optimizer", bytes)) {
        spdlog::warn("the checkpoint holds no optimizer state: the optimizer starts afresh");
      } else if (bytes.scalar_type() != torch::kUInt8 || bytes.dim() != 1) {
        return error(ErrorCode::kMalformed, "checkpoint: the optimizer's state is not bytes");
      } else {
        bytes = bytes.contiguous();
        if (Status st = s.external->load_optimizer(ByteView(reinterpret_cast<const std::byte*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel())));
            !st.ok()) {
          return st.with_context("checkpoint");
        }
      }
    } else {
      archive.read("optimizer", optim_archive);
      s.optimizer->load(optim_archive);
    }
    if (s.muon) {
      torch::serialize::InputArchive muon_archive;
      if (!archive.try_read("muon", muon_archive)) {
        return error(ErrorCode::kMalformed, "the checkpoint holds no Muon state: it was written with train.optimizer = adamw");
      }
      std::vector<at::Tensor> momenta(s.muon->momenta().size());
      for (std::size_t i = 0; i < momenta.size(); ++i) muon_archive.read(fmt::format("m{}", i), momenta[i]);
      if (Status st = s.muon->set_momenta(momenta); !st.ok()) return error(ErrorCode::kMalformed, "checkpoint: " + st.message());
    }
    const auto* rp = reinterpret_cast<const std::uint8_t*>(state.rng_state.data());
    s.model->set_rng_state(std::vector<std::uint8_t>(rp, rp + state.rng_state.size()));
  } catch (const c10::Error& e) {
    return error(ErrorCode::kMalformed, std::string("checkpoint tensors do not match this model: ") + e.what_without_backtrace() +
                                            " (was it written with another model config?)");
  } catch (const ContractError& e) {
    return error(ErrorCode::kMalformed, std::string("checkpoint does not match this model: ") + e.what() +
                                            " (was it written with another model config?)");
  }
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].sizes().vec() != shapes[i]) {
      return error(ErrorCode::kMalformed, "checkpoint parameter " + std::to_string(i) + " has shape " +
                                              c10::str(s.params[i].sizes()) + " but this model expects " + c10::str(at::IntArrayRef(shapes[i])) +
                                              ": the checkpoint was written with another model config");
    }
  }
  s.step = state.step;
  s.next_batch = state.next_batch;
  s.tokens = state.tokens_seen;
  ++s.restores;
  return Status();
}

std::uint64_t Worker::restores() const { return impl_->restores; }

namespace {
constexpr char kAdamMagic[4] = {'G', 'S', 'A', 'W'};
constexpr std::uint8_t kAdamVersion = Worker::kOptimizerStateVersion;

void write_floats(Writer& w, const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU, at::kFloat).contiguous();
  w.raw(ByteView(reinterpret_cast<const std::byte*>(c.data_ptr<float>()), static_cast<std::size_t>(c.numel()) * 4));
}
}  // namespace

// Each Muon parameter's index among Muon's, by the parameter's storage.
std::map<const void*, std::size_t> muon_index(const std::optional<optim::Muon>& muon) {
  std::map<const void*, std::size_t> out;
  if (!muon) return out;
  for (std::size_t i = 0; i < muon->parameters().size(); ++i) out[muon->parameters()[i].unsafeGetTensorImpl()] = i;
  return out;
}

Bytes Worker::optimizer_state() const {
  const auto& s = *impl_;
  if (s.external) {
    auto bytes = s.external->save_optimizer();
    if (bytes.ok()) return std::move(*bytes);
    spdlog::warn("the optimizer's state: {}", bytes.status().to_string());
    return Bytes();
  }
  Writer w;
  w.raw(ByteView(reinterpret_cast<const std::byte*>(kAdamMagic), 4));
  w.u8(kAdamVersion);
  w.u32(static_cast<std::uint32_t>(s.params.size()));
  const auto& state = s.optimizer->state();
  const auto by_muon = muon_index(s.muon);
  for (const auto& p : s.params) {
    if (auto m = by_muon.find(p.unsafeGetTensorImpl()); m != by_muon.end()) {  // flag 2: Muon's momentum
      w.u8(2);
      w.u64(static_cast<std::uint64_t>(p.numel()));
      write_floats(w, s.muon->momenta()[m->second]);
      continue;
    }
    const auto it = state.find(adam_state_key(p));
    if (it == state.end()) {
      w.u8(0);
      continue;
    }
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    GOSSAMER_CHECK(!st.max_exp_avg_sq().defined(), "Worker::optimizer_state: amsgrad is not used here");
    w.u8(1);
    w.i64(st.step());
    w.u64(static_cast<std::uint64_t>(p.numel()));
    write_floats(w, st.exp_avg());
    write_floats(w, st.exp_avg_sq());
  }
  return std::move(w).take();
}

Status Worker::load_optimizer_state(ByteView bytes) {
  auto& s = *impl_;
  if (s.external) return s.external->load_optimizer(bytes);
  Reader r(bytes, "optimizer state");
  const ByteView magic = r.raw(4);
  const std::uint8_t version = r.u8();
  const std::uint32_t count = r.u32();
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kAdamMagic, 4) != 0 || version != kAdamVersion) return error(ErrorCode::kMalformed, "optimizer state: bad magic or version");
  if (count != s.params.size()) {
    return error(ErrorCode::kMalformed, "optimizer state: " + std::to_string(count) + " parameters, this model has " + std::to_string(s.params.size()));
  }
  // Read everything first: a malformed state changes nothing.
  std::vector<std::unique_ptr<torch::optim::AdamWParamState>> loaded(s.params.size());
  const auto by_muon = muon_index(s.muon);
  std::vector<at::Tensor> momenta;
  if (s.muon) momenta = s.muon->momenta();
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const std::uint8_t has = r.u8();
    if (!r.ok()) return r.status();
    const auto muon_at = by_muon.find(s.params[i].unsafeGetTensorImpl());
    if ((has == 2) != (muon_at != by_muon.end())) {
      return error(ErrorCode::kMalformed, "optimizer state: parameter " + std::to_string(i) + " is another optimizer's (train.optimizer differs)");
    }
    if (has == 2) {
      const std::uint64_t n = r.u64();
      const auto& p = s.params[i];
      if (!r.ok() || n != static_cast<std::uint64_t>(p.numel()) || r.remaining() < n * 4) {
        return error(ErrorCode::kMalformed, "optimizer state: parameter " + std::to_string(i) + " does not match this model");
      }
      at::Tensor t = torch::empty(p.sizes(), torch::kFloat);
      const ByteView v = r.raw(n * 4);
      std::memcpy(t.data_ptr<float>(), v.data(), v.size());
      momenta[muon_at->second] = t;
      continue;
    }
    if (has == 0) continue;
    if (has != 1) return error(ErrorCode::kMalformed, "optimizer state: bad flag for parameter " + std::to_string(i));
    const std::int64_t step = r.i64();
    const std::uint64_t n = r.u64();
    if (!r.ok()) return r.status();
    const auto& p = s.params[i];
    if (step < 0 || n != static_cast<std::uint64_t>(p.numel()) || r.remaining() < n * 8) {
      return error(ErrorCode::kMalformed, "optimizer state: parameter " + std::to_string(i) + " does not match this model");
    }
    auto moment = [&]() {
      at::Tensor t = torch::empty(p.sizes(), torch::kFloat);
      const ByteView v = r.raw(n * 4);
      std::memcpy(t.data_ptr<float>(), v.data(), v.size());
      return t.to(p.device());
    };
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(step);
    st->exp_avg(moment());
    st->exp_avg_sq(moment());
    if (!torch::isfinite(st->exp_avg()).all().item<bool>() || !torch::isfinite(st->exp_avg_sq()).all().item<bool>() ||
        (st->exp_avg_sq() < 0).any().item<bool>()) {
      return error(ErrorCode::kMalformed, "optimizer state: parameter " + std::to_string(i) + " holds non-finite or negative moments");
    }
    loaded[i] = std::move(st);
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  if (s.muon) {
    if (Status st = s.muon->set_momenta(momenta); !st.ok()) return error(ErrorCode::kMalformed, "optimizer state: " + st.message());
  }
  auto& state = s.optimizer->state();
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const AdamStateKey key = adam_state_key(s.params[i]);
    if (loaded[i]) {
      state[key] = std::move(loaded[i]);
    } else {
      state.erase(key);
    }
  }
  return Status();
}

}  // namespace gossamer::train
