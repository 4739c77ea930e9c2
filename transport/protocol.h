// The wire protocol spoken on every link. Versioned from the first byte.
//
// On connect, each side sends its HELLO at once and reads the other's:
//   magic "GSMW" | major u16 | minor u16 | capabilities u64 | peer id u64 | run id 16 bytes  (40 bytes)
// Peers speak to each other only when their major versions match (the minor may differ: features
// beyond the lower minor are off) and they belong to the same run; otherwise both sides refuse the
// link and say which side must upgrade.
// After the HELLOs, the link carries frames:
//   magic "GF" | type u8 | flags u8 | tag u32 | length u64  (16 bytes)  then `length` payload bytes.
// All little-endian. A frame whose magic, type, flags or length is wrong is a protocol error: the link
// is dropped. Lengths are checked against the receiver's cap before anything is allocated.
// Golden-bytes tests pin both layouts; change them only with a version bump.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/bytes.h"
#include "core/status.h"
#include "transport/ids.h"

namespace gossamer::transport {

inline constexpr std::uint16_t kWireMajor = 1;
inline constexpr std::uint16_t kWireMinor = 0;
inline constexpr std::size_t kHelloBytes = 40;
inline constexpr std::size_t kFrameHeaderBytes = 16;

// Capability bits announced in HELLO.
inline constexpr std::uint64_t kCapEncrypted = 1u << 0;

struct Hello {
  std::uint16_t major = kWireMajor;
  std::uint16_t minor = kWireMinor;
  std::uint64_t capabilities = 0;
  PeerId peer;
  RunId run;
};

Bytes encode_hello(const Hello& hello);
[[nodiscard]] Result<Hello> decode_hello(ByteView bytes);
// Whether `ours` may talk to `theirs` (seen from our side): version and run checks, with messages
// that name the peer and the fix.
[[nodiscard]] Status check_hello(const Hello& ours, const Hello& theirs);

enum class FrameType : std::uint8_t {
  kData = 1,   // a tagged message
  kClose = 2,  // graceful goodbye: the sender will send nothing more
};
static_assert(static_cast<int>(FrameType::kClose) == 2, "FrameType values travel on the wire");

struct FrameHeader {
  FrameType type = FrameType::kData;
  std::uint8_t flags = 0;
  Tag tag = 0;
  std::uint64_t length = 0;
};

void encode_frame_header(const FrameHeader& header, std::uint8_t out[kFrameHeaderBytes]);
// Untrusted input: exactly kFrameHeaderBytes; a length above max_length is kOutOfRange.
[[nodiscard]] Result<FrameHeader> decode_frame_header(ByteView bytes, std::uint64_t max_length);

}  // namespace gossamer::transport
