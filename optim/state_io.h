// Saving and loading an outer optimizer's state: a kind tag, integer counters and fp32 tensors, in a
// versioned container. Loading treats the bytes as untrusted and requires every tensor to match the
// size the optimizer already has (a checkpoint of another model is refused, never reshaped).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer::optim {

// The container: magic "GOST" | version u32 | kind str | count u32, counters i64 each | count u32,
// tensors as fp32 codec payloads (quant/codec.h), each a blob.
inline constexpr std::uint32_t kStateFormatVersion = 1;

Bytes save_state(std::string_view kind, const std::vector<std::int64_t>& counters, const std::vector<at::Tensor>& tensors);
// On success, counters and tensors are replaced (tensors keep their sizes; values are copied in).
[[nodiscard]] Status load_state(ByteView bytes, std::string_view kind, std::vector<std::int64_t>& counters,
                                std::vector<at::Tensor>& tensors);

// The state DiLoCo and NoLoCo keep: flat outer weights, momentum and round counters.
struct OuterState {
  at::Tensor outer, momentum;
  std::int64_t rounds = 0, skipped = 0;

  Bytes save(std::string_view kind) const;
  // Refuses another kind's state or other sizes; on success replaces every field.
  [[nodiscard]] Status load(ByteView bytes, std::string_view kind);
};

}  // namespace gossamer::optim
