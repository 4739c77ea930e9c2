// The plain reference implementation of every codec, written with LibTorch tensor ops only (round to
// nearest even, fp32 scales). Tests check the fast kernels against it bit for bit, and the benchmark
// uses it as the naive baseline. Slow on purpose: clarity over speed.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "quant/codec.h"

namespace gossamer::quant::reference {

struct Encoded {
  at::Tensor scales;  // float (blocks) for scaled codecs; undefined otherwise
  at::Tensor codes;   // uint8, one code per element (not packed); for bf16/fp16 the converted tensor
};

Encoded encode(const at::Tensor& x, CodecId codec, std::uint32_t block);
at::Tensor decode(const Encoded& e, CodecId codec, std::uint32_t block, at::IntArrayRef shape);

}  // namespace gossamer::quant::reference
