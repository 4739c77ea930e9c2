// libFuzzer target: quant::decode and quant::inspect on arbitrary bytes must never crash, read out of
// bounds or allocate without bound, and anything they accept must be consistent.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>

#include "quant/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const gossamer::ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  auto info = gossamer::quant::inspect(bytes);
  auto decoded = gossamer::quant::decode(bytes);
  if (decoded.ok()) {
    if (!info.ok() || decoded->numel() != info->numel) __builtin_trap();
    if (!torch::isfinite(decoded->to(torch::kFloat)).all().item<bool>()) __builtin_trap();
  }
  return 0;
}
