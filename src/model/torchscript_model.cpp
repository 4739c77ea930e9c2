#include "model/torchscript_model.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <set>

#include <fmt/format.h>

#include "core/check.h"

namespace gossamer::model {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

struct TorchScriptModel::Impl {
  torch::jit::Module module;
  TorchScriptOptions options;
  std::vector<ParameterBlock> blocks;
  std::vector<at::Tensor> buffers;      // saved with the parameters
  std::uint64_t training_forwards = 0;  // the dropout stream's position
};

TorchScriptModel::TorchScriptModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TorchScriptModel::~TorchScriptModel() = default;

Result<std::unique_ptr<TorchScriptModel>> TorchScriptModel::load(const TorchScriptOptions& o) {
  const std::string where = "model.path " + o.path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(o.path, ec)) {
    return error(ErrorCode::kInvalidArgument, where + " is not a file: pass a module saved with torch.jit.script(model).save(path)");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  try {
    impl->module = torch::jit::load(o.path.string());
  } catch (const c10::Error& e) {
    return error(ErrorCode::kInvalidArgument, where + " is not a TorchScript module this LibTorch (" + TORCH_VERSION +
                                                  ") can read: " + e.what_without_backtrace() +
                                                  " (save it with torch.jit.script(model).save(path) from a PyTorch no newer than LibTorch)");
  }
  if (!impl->module.find_method("forward")) return error(ErrorCode::kInvalidArgument, where + " has no forward method");

  // Trainable parameters, each once (a tied head and embedding are one tensor under two names).
  std::vector<NamedParameter> params;
  std::set<const void*> seen;
  for (const auto& p : impl->module.named_parameters(/*recurse=*/true)) {
    if (!p.value.requires_grad() || !seen.insert(p.value.unsafeGetTensorImpl()).second) continue;
    params.push_back({p.name, p.value});
  }
  if (params.empty()) return error(ErrorCode::kInvalidArgument, where + " has no trainable parameter");
  for (const auto& b : impl->module.named_buffers(/*recurse=*/true)) impl->buffers.push_back(b.value);

  auto blocks = cut_into_blocks(params, o.block_pattern, where);
  if (!blocks.ok()) return blocks.status();
  impl->blocks = std::move(*blocks);

  // The contract, checked once: int64 [1, context] in, [1, context, vocab] out.
  std::unique_ptr<TorchScriptModel> model(new TorchScriptModel(std::move(impl)));
  try {
    torch::NoGradGuard no_grad;
    model->impl_->module.eval();
    auto out = model->impl_->module.forward({torch::zeros({1, o.context}, torch::kLong)});
    model->impl_->module.train(true);
    if (!out.isTensor()) return error(ErrorCode::kInvalidArgument, where + ": forward must return one tensor of logits");
    const auto logits = out.toTensor();
    if (logits.dim() != 3 || logits.size(0) != 1 || logits.size(1) != o.context || logits.size(2) != o.vocab_size) {
      return error(ErrorCode::kInvalidArgument,
                   fmt::format("{}: forward(tokens [1, {}]) gave logits of shape {}, expected [1, {}, {}] (the run's context and vocabulary; "
                               "see model.context and data.vocab_size)",
                               where, o.context, c10::str(logits.sizes()), o.context, o.vocab_size));
    }
  } catch (const c10::Error& e) {
    return error(ErrorCode::kInvalidArgument, fmt::format("{}: forward(tokens: int64 [1, {}]) failed: {} (the module must map tokens [B, T] "
                                                          "to logits [B, T, vocab] for T up to model.context)",
                                                          where, o.context, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    // An error raised inside the scripted code (torch::jit::JITException): its message is the
    // module's traceback, whose last line says what went wrong (an index past a position table
    // shorter than model.context, say).
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    if (auto nl = what.rfind('\n'); nl != std::string::npos) what = what.substr(nl + 1);
    return error(ErrorCode::kInvalidArgument, fmt::format("{}: forward(tokens: int64 [1, {}]) failed in the module's own code: {} (the module "
                                                          "must map tokens [B, T] to logits [B, T, vocab] for T up to model.context: is its "
                                                          "position table shorter than model.context?)",
                                                          where, o.context, what));
  }
  return model;
}

at::Tensor TorchScriptModel::forward(const at::Tensor& tokens) {
  GOSSAMER_CHECK(tokens.dim() == 2 && tokens.size(1) <= impl_->options.context, "TorchScriptModel::forward expects tokens (B, T <= context)");
  if (impl_->module.is_training()) torch::manual_seed(mix(impl_->options.dropout_seed ^ mix(impl_->training_forwards++)));
  return impl_->module.forward({tokens}).toTensor();
}

std::vector<ParameterBlock> TorchScriptModel::blocks() const { return impl_->blocks; }
std::int64_t TorchScriptModel::vocab_size() const { return impl_->options.vocab_size; }
std::int64_t TorchScriptModel::context() const { return impl_->options.context; }
void TorchScriptModel::train(bool on) { impl_->module.train(on); }
void TorchScriptModel::to(const c10::Device& device) { impl_->module.to(device); }
bool TorchScriptModel::is_training() const { return impl_->module.is_training(); }

void TorchScriptModel::save(torch::serialize::OutputArchive& archive) const {
  std::int64_t i = 0;
  for (const auto& b : impl_->blocks) {
    for (const auto& p : b.parameters) archive.write("param_" + std::to_string(i++), p.tensor);
  }
  for (std::size_t k = 0; k < impl_->buffers.size(); ++k) archive.write("buffer_" + std::to_string(k), impl_->buffers[k], /*is_buffer=*/true);
}

void TorchScriptModel::load(torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  std::int64_t i = 0;
  for (auto& b : impl_->blocks) {
    for (auto& p : b.parameters) {
      at::Tensor t;
      archive.read("param_" + std::to_string(i++), t);
      GOSSAMER_CHECK(t.sizes() == p.tensor.sizes(), "TorchScriptModel::load: parameter " + p.name + " has another shape in the archive");
      p.tensor.copy_(t);
    }
  }
  for (std::size_t k = 0; k < impl_->buffers.size(); ++k) {
    at::Tensor t;
    archive.read("buffer_" + std::to_string(k), t, /*is_buffer=*/true);
    GOSSAMER_CHECK(t.sizes() == impl_->buffers[k].sizes(), "TorchScriptModel::load: a buffer has another shape in the archive");
    impl_->buffers[k].copy_(t);
  }
}

void TorchScriptModel::save_module(const std::filesystem::path& path) const { impl_->module.save(path.string()); }

std::vector<std::uint8_t> TorchScriptModel::rng_state() const {
  std::vector<std::uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(impl_->training_forwards >> (8 * i));
  return out;
}

void TorchScriptModel::set_rng_state(const std::vector<std::uint8_t>& state) {
  GOSSAMER_CHECK(state.size() == 8, "TorchScriptModel: an rng state is 8 bytes");
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(state[static_cast<std::size_t>(i)]) << (8 * i);
  impl_->training_forwards = v;
}

}  // namespace gossamer::model
