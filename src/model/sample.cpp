#include "model/sample.h"

#include <torch/torch.h>

#include <functional>

#include "core/check.h"

namespace gossamer::model {

std::vector<std::int64_t> sample(LanguageModel& model, const std::vector<std::int64_t>& prompt, const SampleOptions& o,
                                 const std::function<void(std::int64_t)>& on_token) {
  GOSSAMER_CHECK(!prompt.empty(), "sample: the prompt needs at least one token");
  GOSSAMER_CHECK(o.tokens >= 0 && o.top_k >= 0 && o.temperature >= 0.0, "sample: tokens, top_k and temperature must not be negative");
  const bool was_training = model.is_training();
  model.train(false);
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto device = model.parameters().front().device();
  std::vector<std::int64_t> all = prompt, out;
  for (std::int64_t i = 0; i < o.tokens; ++i) {
    const auto n = static_cast<std::int64_t>(all.size());
    const std::int64_t T = std::min(n, model.context());
    auto window = torch::from_blob(all.data() + (n - T), {1, T}, torch::kLong).to(device);
    auto logits = model.forward(window).index({0, T - 1}).to(torch::kCPU, torch::kFloat);
    std::int64_t next = 0;
    // Scaled in double; a temperature so small that the scaled logits overflow even so is the
    // limit it tends to: the most likely token.
    const at::Tensor scaled = o.temperature == 0.0 ? at::Tensor() : logits.to(torch::kDouble) / o.temperature;
    if (o.temperature == 0.0 || !torch::isfinite(scaled).all().item<bool>()) {
      next = logits.argmax().item<std::int64_t>();
    } else {
      logits = scaled;
      if (o.top_k > 0 && o.top_k < logits.size(0)) {
        const auto kth = std::get<0>(logits.topk(o.top_k)).index({o.top_k - 1});
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, 0), 1, /*replacement=*/false, gen).item<std::int64_t>();
    }
    all.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  model.train(was_training);
  return out;
}

}  // namespace gossamer::model
