// libFuzzer target: quant::inspect and quant::decode_into (the LibTorch-free core of quant::decode) on
// arbitrary bytes must never crash, read out of bounds or allocate without bound, and what they accept
// must be consistent and finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/format.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const gossamer::ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  // A receiver states the most values it accepts, which bounds what a (zstd) payload can make it allocate.
  auto info = gossamer::quant::inspect(bytes, std::int64_t{1} << 22);
  if (!info.ok()) return 0;
  std::vector<float> out(static_cast<std::size_t>(info->numel));
  const gossamer::Status st = gossamer::quant::decode_into(bytes, out);
  if (st.ok()) {
    for (float v : out) {
      if (!std::isfinite(v)) __builtin_trap();
    }
  }
  return 0;
}
