#include "train/memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "optim/method.h"
#include "train/device.h"
#include "train/worker.h"

namespace gossamer::train {

namespace {

constexpr double kFloat = 4;

// What the outer optimizer holds, in multiples of the parameters' fp32 bytes: the state it keeps
// (first) and the temporaries of its step on top of that (second). Measured with `gossamer bench
// memory` (docs/benchmarks.md): DiLoCo's round flattens the parameters, forms the pseudo-gradient
// and scales the momentum, three full-size temporaries; Streaming DiLoCo's are a fragment's, about
// 1.5 copies with its overlap; ddp keeps one flat gradient. NoLoCo and CO2 are counted as DiLoCo
// (CO2 also keeps the previous outer weights and the pending average).
std::pair<double, double> outer_copies(optim::Method method) {
  switch (method) {
    case optim::Method::kDiLoCo:
    case optim::Method::kNoLoCo:
    case optim::Method::kSparseLoCo: return {2, 3};  // outer weights + momentum (SparseLoCo: its error accumulator)
    case optim::Method::kMuLoCo: return {3, 4};  // DiLoCo's, with the error-feedback residual and its codec image
    case optim::Method::kStreamingDiLoCo: return {2, 1.5};
    case optim::Method::kCO2: return {4, 3};
    case optim::Method::kDdp: return {1, 0};  // the flat gradient buffer
    case optim::Method::kLocal: return {0, 0};
  }
  return {0, 0};
}

// LibTorch's own working memory on the first steps (kernels' workspaces, thread pools), measured.
constexpr double kRuntimeBytes = 60e6;

std::optional<double> read_number(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

MemoryEstimate estimate_memory(const RunConfig& c, std::int64_t workers, std::optional<double> parameters) {
  const double L = static_cast<double>(c.model.layers), C = static_cast<double>(c.model.width), H = static_cast<double>(c.model.heads);
  const double T = static_cast<double>(c.model.context), B = static_cast<double>(c.train.batch_size);
  const double V = static_cast<double>(vocab_size(c));
  MemoryEstimate e;
  e.parameters = parameters.value_or(V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);
  const double masks = parameters ? 0.0 : L * T * T;
  const auto [outer_state, outer_step] = outer_copies(c.outer.method);
  e.state_bytes = e.parameters * kFloat * (4 + outer_state) + masks;
  // One batch: per block about 20 B*T*C floats kept for backward (inputs of the norms, the qkv,
  // attention output, residuals, the MLP's 4C-wide activations) and 1.5 B*H*T*T (the attention
  // probabilities and a backward temporary); the logits, their softmax and gradient (3.3 B*T*V);
  // the tied embedding's two gradients, summed (2 V*C); the runtime's working memory. The heap
  // keeps a step's activations when it ends, so the outer step's temporaries come on top of them.
  // Coefficients measured with `gossamer bench memory` over shapes from 1 to 12 layers (docs).
  const double blocks = parameters ? 0.0 : L * (20 * B * T * C + 1.5 * B * H * T * T) + 2 * V * C;
  e.activation_bytes = (blocks + 3.3 * B * T * V) * kFloat + kRuntimeBytes + e.parameters * kFloat * outer_step;
  // Text files are checked by size when read; token files are mapped, not read.
  e.corpus_bytes = c.data.path.empty() ? 2.0 * static_cast<double>(c.data.synthetic.bytes) : 0.0;
  e.checkpoint_bytes = e.parameters * kFloat * (3 + outer_state);
  const double n = static_cast<double>(std::max<std::int64_t>(1, workers));
  e.total_bytes = n * e.state_bytes + std::max(e.activation_bytes, e.checkpoint_bytes) + e.corpus_bytes;
  e.outer_bytes = e.parameters * kFloat * outer_state;
  const std::string& d = c.train.device;
  e.on_gpu = d.starts_with("cuda") || (d == "auto" && [] {
               auto resolved = resolve_device("auto");
               return resolved.ok() && resolved->is_cuda();
             }());
  if (!e.on_gpu) {
    e.host_bytes = e.total_bytes;
  } else {
    const bool outer_on_host = c.outer.state_device == StateDevice::kHost || optim::method_info(c.outer.method).flat_gradient_on_host;
    const double outer_host = outer_on_host ? n * e.outer_bytes + e.parameters * kFloat * outer_step : 0.0;
    e.host_bytes = outer_host + e.corpus_bytes + kRuntimeBytes + e.checkpoint_bytes;
    e.device_bytes = n * e.state_bytes + e.activation_bytes - outer_host - kRuntimeBytes;
    e.total_bytes = e.host_bytes + e.device_bytes;
  }
  return e;
}

std::optional<double> available_memory_bytes() {
  std::optional<double> avail;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    double kib = 0;
    if (ls >> key >> kib && key == "MemAvailable:") avail = kib * 1024;
  }
  const auto limit = read_number("/sys/fs/cgroup/memory.max");
  auto used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used) {
    // Page cache the kernel can drop is counted in memory.current: leave out its inactive part.
    std::ifstream stat("/sys/fs/cgroup/memory.stat");
    std::string key;
    double value = 0;
    while (stat >> key >> value) {
      if (key == "inactive_file") *used = std::max(0.0, *used - value);
    }
    avail = std::min(avail.value_or(*limit - *used), *limit - *used);
  }
  return avail;
}

std::string format_bytes(double bytes) {
  if (bytes >= 1e15) return fmt::format("{:.3g} PB", bytes / 1e15);
  if (bytes >= 1e12) return fmt::format("{:.3g} TB", bytes / 1e12);
  if (bytes >= 1e9) return fmt::format("{:.3g} GB", bytes / 1e9);
  return fmt::format("{:.3g} MB", bytes / 1e6);
}

Status check_resources(const RunConfig& c, std::int64_t workers, const std::string& workers_key) {
  if (auto device = resolve_device(c.train.device); !device.ok()) return device.status();
  std::optional<double> parameters;
  if (c.model.kind != ModelKind::kGpt) {
    auto model = make_model(c, 0);
    if (!model.ok()) return model.status();
    parameters = static_cast<double>((*model)->num_parameters());
  }
  const auto avail = available_memory_bytes();
  if (!avail) return Status();
  const MemoryEstimate e = estimate_memory(c, workers, parameters);
  if (0.9 * e.host_bytes <= *avail) return Status();
  if (e.on_gpu && e.host_bytes <= e.corpus_bytes + kRuntimeBytes) {  // the outer state is on the GPU: the corpus is what is left here
    return error(ErrorCode::kInvalidArgument,
                 fmt::format("this configuration needs about {} of host memory and this machine has {} available, {} of it for the corpus; "
                             "lower data.synthetic.bytes or free memory",
                             format_bytes(e.host_bytes), format_bytes(*avail), format_bytes(e.corpus_bytes)));
  }
  if (e.on_gpu) {
    return error(ErrorCode::kInvalidArgument,
                 fmt::format("this configuration needs about {} of host memory and this machine has {} available: the outer optimizer's state takes {} per worker{}; "
                             "set outer.state_device = \"device\" to keep it on the GPU, or lower model.width or model.layers",
                             format_bytes(e.host_bytes), format_bytes(*avail), format_bytes(e.outer_bytes),
                             workers > 1 ? fmt::format(" for {} workers{}", workers, workers_key.empty() ? "" : " (" + workers_key + ")") : std::string()));
  }
  std::string lower;
  if (e.activation_bytes >= e.state_bytes * static_cast<double>(workers)) {
    lower = "lower train.batch_size, model.context or model.width";
  } else {
    lower = workers > 1 && !workers_key.empty() ? "lower model.width or model.layers, or " + workers_key : "lower model.width or model.layers";
  }
  return error(ErrorCode::kInvalidArgument,
               fmt::format("this configuration needs about {} of memory and this machine has {} available: {:.3g} parameters take {} per worker "
                           "(weights, gradients, AdamW and the outer optimizer's state){}, and the activations of one batch of {} x {} take {}; {}",
                           format_bytes(e.total_bytes), format_bytes(*avail), e.parameters, format_bytes(e.state_bytes),
                           workers > 1 ? fmt::format(" for {} workers{}", workers, workers_key.empty() ? "" : " (" + workers_key + ")") : std::string(), c.train.batch_size, c.model.context,
                           format_bytes(e.activation_bytes), lower));
}

}  // namespace gossamer::train
