// A payload's body computed with LibTorch ops on the tensor's own device, so that a tensor on a GPU
// crosses to the host as its encoded bytes (an eighth of its fp32 bytes at 4 bits) instead of whole.
// The bytes are those of the CPU kernels (kernels.h): the same scales, codes and packing, with the
// exponent taken by frexp (exact on every device) rather than a logarithm. Round to nearest even
// only: stochastic rounding's draws stay on the host. Threading: pure, thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "quant/format.h"

namespace gossamer::quant::device {

// Whether body() encodes these options (scaled codecs and bf16/fp16, nearest-even rounding).
[[nodiscard]] bool covers(const EncodeOptions& options);

// Appends the body (format.h: scales, then packed codes) of `x`, a tensor on any device, to `out` on
// the host; false when a value of x is not finite (what was appended is then meaningless).
[[nodiscard]] bool append_body(const at::Tensor& x, const EncodeOptions& options, Bytes& out);

}  // namespace gossamer::quant::device
