#include "transport/protocol.h"

#include <cstring>

#include "core/wire.h"

namespace gossamer::transport {

namespace {
constexpr char kHelloMagic[4] = {'G', 'S', 'M', 'W'};
constexpr char kFrameMagic[2] = {'G', 'F'};
}  // namespace

Bytes encode_hello(const Hello& h) {
  Writer w(kHelloBytes);
  w.raw(as_bytes(std::string_view(kHelloMagic, 4)));
  w.u16(h.major);
  w.u16(h.minor);
  w.u64(h.capabilities);
  w.u64(h.peer.value);
  w.raw(ByteView(reinterpret_cast<const std::byte*>(h.run.bytes.data()), h.run.bytes.size()));
  return std::move(w).take();
}

Result<Hello> decode_hello(ByteView bytes) {
  Reader r(bytes, "HELLO");
  ByteView magic = r.raw(4);
  if (r.ok() && std::memcmp(magic.data(), kHelloMagic, 4) != 0) {
    return error(ErrorCode::kMalformed, "the remote end is not a Gossamer peer (bad HELLO magic)");
  }
  Hello h;
  h.major = r.u16();
  h.minor = r.u16();
  h.capabilities = r.u64();
  h.peer.value = r.u64();
  ByteView run = r.raw(16);
  r.expect_end();
  if (!r.ok()) return r.status();
  std::memcpy(h.run.bytes.data(), run.data(), 16);
  return h;
}

Status check_hello(const Hello& ours, const Hello& theirs) {
  if (theirs.major != ours.major) {
    const std::string versions = "peer " + theirs.peer.to_string() + " speaks wire " + std::to_string(theirs.major) + "." +
                                 std::to_string(theirs.minor) + ", we speak " + std::to_string(ours.major) + "." +
                                 std::to_string(ours.minor);
    return error(ErrorCode::kVersionMismatch,
                 versions + (theirs.major > ours.major ? ": upgrade this node" : ": that peer must upgrade"));
  }
  if (theirs.run != ours.run) {
    return error(ErrorCode::kUnauthenticated, "peer " + theirs.peer.to_string() + " belongs to run " + theirs.run.to_string() +
                                                  ", we are in run " + ours.run.to_string() + ": check the --join address");
  }
  if (theirs.peer == ours.peer) {
    return error(ErrorCode::kInvalidArgument, "peer id " + ours.peer.to_string() + " is ours: a node connected to itself");
  }
  return Status();
}

void encode_frame_header(const FrameHeader& h, std::uint8_t out[kFrameHeaderBytes]) {
  out[0] = static_cast<std::uint8_t>(kFrameMagic[0]);
  out[1] = static_cast<std::uint8_t>(kFrameMagic[1]);
  out[2] = static_cast<std::uint8_t>(h.type);
  out[3] = h.flags;
  for (int i = 0; i < 4; ++i) out[4 + i] = static_cast<std::uint8_t>(h.tag >> (8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<std::uint8_t>(h.length >> (8 * i));
}

Result<FrameHeader> decode_frame_header(ByteView bytes, std::uint64_t max_length) {
  Reader r(bytes, "frame header");
  ByteView magic = r.raw(2);
  const std::uint8_t type = r.u8(), flags = r.u8();
  FrameHeader h;
  h.tag = r.u32();
  h.length = r.u64();
  r.expect_end();
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kFrameMagic, 2) != 0) return error(ErrorCode::kMalformed, "frame header: bad magic (garbage on the link)");
  if (type != static_cast<std::uint8_t>(FrameType::kData) && type != static_cast<std::uint8_t>(FrameType::kClose)) {
    return error(ErrorCode::kMalformed, "frame header: unknown frame type " + std::to_string(type));
  }
  if (flags != 0) return error(ErrorCode::kMalformed, "frame header: unknown flags " + std::to_string(flags));
  h.type = static_cast<FrameType>(type);
  if (h.type == FrameType::kClose && h.length != 0) return error(ErrorCode::kMalformed, "frame header: CLOSE frame with a payload");
  if (h.length > max_length) {
    return error(ErrorCode::kOutOfRange, "frame of " + std::to_string(h.length) + " bytes exceeds the cap of " + std::to_string(max_length));
  }
  return h;
}

}  // namespace gossamer::transport
