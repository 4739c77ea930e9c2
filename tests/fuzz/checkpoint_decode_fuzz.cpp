// libFuzzer target: the checkpoint container decoder on arbitrary bytes.
#include <cstddef>
#include <cstdint>

#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const gossamer::ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  auto state = gossamer::train::decode_checkpoint(bytes, "fuzz");
  if (state.ok() && (state->step < 0 || state->tensors.size() > size)) __builtin_trap();
  return 0;
}
