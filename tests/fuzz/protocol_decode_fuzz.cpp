// libFuzzer target: the link handshake's HELLO and the frame header decoders on arbitrary bytes.
// An accepted HELLO must re-encode to exactly its bytes; an accepted frame header must be in bounds.
#include <cstddef>
#include <cstdint>

#include "transport/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gossamer;
  const ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  if (auto hello = transport::decode_hello(bytes); hello.ok()) {
    const Bytes again = transport::encode_hello(*hello);
    if (again.size() != size || !std::equal(again.begin(), again.end(), bytes.begin())) __builtin_trap();
  }
  if (auto header = transport::decode_frame_header(bytes, 1 << 20); header.ok() && (size != transport::kFrameHeaderBytes || header->length > (1u << 20))) {
    __builtin_trap();
  }
  return 0;
}
