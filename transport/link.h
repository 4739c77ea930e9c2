// Link: a reliable, ordered byte channel to one peer (gloo's Pair), carrying tagged messages.
//
// Ownership: links are shared_ptr handles created by a Transport; the Transport's I/O thread drives
// them. Thread-safety: every method may be called from any thread; concurrent send()s are serialized
// in call order, and concurrent recv()s of the same tag each get a different message.
// Blocking: send() returns once the message is handed to the kernel (or fails); recv() blocks until a
// message with the tag arrives. Both give up at their Deadline.
// Errors (values, never exceptions): kTimeout when the deadline passes (a send that timed out leaves a
// partial frame behind, so the link is closed), kPeerLost when the peer went away or the link was
// closed, kMalformed / kOutOfRange when the peer sent bytes that break the protocol (the link is then
// dropped; other links are unaffected), kResourceExhausted for a message beyond the size cap.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/status.h"
#include "transport/ids.h"

namespace gossamer::transport {

struct LinkStats {
  std::uint64_t bytes_sent = 0;      // payload plus frame headers
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
};

class Link {
 public:
  virtual ~Link() = default;
  virtual PeerId peer() const = 0;
  virtual std::string remote_address() const = 0;
  [[nodiscard]] virtual Status send(Tag tag, ByteView payload, Deadline deadline) = 0;
  [[nodiscard]] virtual Result<Bytes> recv(Tag tag, Deadline deadline) = 0;
  // Sends one message made of `parts` back to back. Transports that can write them out gathered (no
  // joining copy) do; the default joins them and calls send().
  [[nodiscard]] virtual Status send_parts(Tag tag, std::span<const ByteView> parts, Deadline deadline) {
    std::size_t total = 0;
    for (ByteView p : parts) total += p.size();
    Bytes joined;
    joined.reserve(total);
    for (ByteView p : parts) joined.insert(joined.end(), p.begin(), p.end());
    return send(tag, joined, deadline);
  }
  // Hands back the buffer of a message recv() returned, once the caller is done with it, so a later
  // message of up to its size is read into it (no allocation, no clearing). Optional: the default
  // drops it.
  virtual void recycle(Bytes buffer) { (void)buffer; }
  // Closes the link; pending and later operations fail with kPeerLost. Idempotent.
  virtual void close() = 0;
  virtual LinkStats stats() const = 0;
};

}  // namespace gossamer::transport
