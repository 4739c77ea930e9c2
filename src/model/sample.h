// Sampling text from a trained language model: the prompt's tokens, then `tokens` more, each drawn
// from the model's next-token distribution at `temperature` (0: always the most likely token),
// restricted to the `top_k` most likely (0: all), with a generator seeded by `seed`, so the same
// model, prompt and options give the same tokens. The window fed to the model is the last
// context() tokens.
//
// Threading: drives the model (not thread-safe, as the model). Errors: misuse (empty prompt,
// negative counts) throws ContractError.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/language_model.h"

namespace gossamer::model {

struct SampleOptions {
  std::int64_t tokens = 200;
  double temperature = 0.8;
  std::int64_t top_k = 0;
  std::uint64_t seed = 1;
};

// Returns only the new tokens. Calls `on_token` (if set) after each one, for streaming output.
std::vector<std::int64_t> sample(LanguageModel& model, const std::vector<std::int64_t>& prompt, const SampleOptions& options,
                                 const std::function<void(std::int64_t)>& on_token = {});

}  // namespace gossamer::model
