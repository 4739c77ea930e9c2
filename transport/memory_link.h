// MemoryLink: an in-process Link pair (what one end sends, the other receives), for ranks that live in
// one process: collective tests, and the base of the simulator's emulated links.
// Thread-safety: like any Link. Blocking: send() never blocks (it copies the message into the peer's
// queue, up to a cap: kResourceExhausted beyond it); recv() blocks until a message or its real-time
// Deadline. Closing either end fails both with kPeerLost once their queued messages are consumed.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "transport/link.h"

namespace gossamer::transport {

std::pair<std::shared_ptr<Link>, std::shared_ptr<Link>> make_memory_link_pair(PeerId a, PeerId b,
                                                                              std::uint64_t max_buffered_bytes = std::uint64_t{4} << 30);

}  // namespace gossamer::transport
