// libFuzzer target: quant::inspect_sparse, decode_sparse_add and sparse_norm2 on arbitrary bytes must
// never crash, read out of bounds or allocate without bound; what they accept must be finite, and a
// refused payload must leave the sum untouched.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/sparse.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const gossamer::ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  // A receiver states the most values it accepts (the model's size), which bounds what it allocates.
  auto info = gossamer::quant::inspect_sparse(bytes, std::int64_t{1} << 22);
  if (!info.ok()) return 0;
  std::vector<float> acc(static_cast<std::size_t>(info->numel), 1.0f);
  const gossamer::Status st = gossamer::quant::decode_sparse_add(bytes, acc);
  for (float v : acc) {
    if (!std::isfinite(v)) __builtin_trap();
    if (!st.ok() && v != 1.0f) __builtin_trap();  // refused: untouched
  }
  auto norm = gossamer::quant::sparse_norm2(bytes, info->numel);
  if (norm.ok() != st.ok()) __builtin_trap();  // the same validation
  return 0;
}
