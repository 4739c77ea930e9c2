// Messages between pipeline stages (docs/skippipe.md): a micro-batch's activations on its way forward
// and their gradients on the way back, each a small versioned header and a quantized tensor.
//
// Layout, version 1 (little-endian, core/wire.h):
//   magic       4 bytes "GSPA"
//   version     u8   kActivationVersion
//   direction   u8   0 activations (forward), 1 gradients (backward)
//   reserved    u16  0
//   iteration   u64
//   microbatch  u32  its index in the schedule's order (agents in order, each one's in turn)
//   hop         u8   where it goes on the path: 1 .. H the path's nodes, H + 1 back to the origin
//                    (forward); H .. 0 (backward), 0 being the origin
//   batch       u32  B
//   tokens      u32  T
//   width       u32  C
//   payload     a quantized tensor of B x T x C values (quant/codec.h; fp32 unless the pipeline's
//               activation codec says otherwise)
//
// Decoding is a hostile-input boundary: the header is checked against the receiver's limits (B at
// most its micro-batch, T at most the context, C exactly the model's width) before the payload is
// decoded, and the payload must hold exactly B x T x C finite values. Threading: pure functions.
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "quant/format.h"

namespace gossamer::train {

inline constexpr std::uint8_t kActivationVersion = 1;
inline constexpr std::size_t kActivationHeaderBytes = 33;

struct ActivationHeader {
  bool backward = false;
  std::uint64_t iteration = 0;
  std::uint32_t microbatch = 0;
  std::uint8_t hop = 0;
  std::uint32_t batch = 0, tokens = 0, width = 0;
};

struct ActivationLimits {
  std::int64_t max_batch = 0;
  std::int64_t context = 0;
  std::int64_t width = 0;
};

// x: (B, T, C) floating point.
Bytes encode_activation(ActivationHeader header, const at::Tensor& x, const quant::EncodeOptions& codec);
[[nodiscard]] Result<std::pair<ActivationHeader, at::Tensor>> decode_activation(ByteView bytes, const ActivationLimits& limits);

}  // namespace gossamer::train
