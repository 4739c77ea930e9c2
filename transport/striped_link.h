// Striped links: several TCP connections ("lanes") to one peer that behave as one Link, to fill long,
// fat WAN paths where one TCP stream's congestion window cannot (PCCL reaches its WAN figures this
// way). Large messages are cut into one stripe per lane and sent on all lanes at once; small ones go
// whole on lane 0.
//
// Wire use (on top of the link protocol): every lane first carries a LANE message on kLaneTag:
//   magic "LANE" | link id u64 | lane index u32 | lane count u32.
// Then each message on tag T starts on lane 0 with a descriptor on T:
//   kind u8 = 0 then the whole message (small), or kind u8 = 1 | total u64 | stripes u32 (large),
// after which lane i carries stripe i on T (stripe 0 on lane 0, after the descriptor).
// Threading: like any Link. Sends are serialized; receives of the same tag are serialized.
// Errors: any lane's failure fails the striped link (a half-sent message cannot be resumed).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/link.h"
#include "transport/transport.h"
#include "transport/tags.h"

namespace gossamer::transport {

inline constexpr Tag kLaneTag = tags::kLane;
inline constexpr std::size_t kMaxLanes = 64;

struct StripeOptions {
  std::size_t lanes = 4;
  std::size_t min_stripe_bytes = std::size_t{1} << 20;  // smaller messages go whole on lane 0
};

[[nodiscard]] Result<std::shared_ptr<Link>> connect_striped(Transport& transport, const std::string& address,
                                                            const StripeOptions& options, Deadline deadline);

// Accepts lanes from the transport and returns a striped link once all lanes of one arrived. Use it
// instead of Transport::accept on a transport whose peers connect with connect_striped.
class StripedAcceptor {
 public:
  explicit StripedAcceptor(Transport& transport, StripeOptions options = {}) : transport_(&transport), options_(options) {}
  [[nodiscard]] Result<std::shared_ptr<Link>> accept(Deadline deadline);

 private:
  Transport* transport_;
  StripeOptions options_;
  // (peer, link id) -> lanes received so far (index -> link), and the announced count.
  struct Partial {
    std::uint32_t count = 0;
    std::map<std::uint32_t, std::shared_ptr<Link>> lanes;
  };
  std::map<std::pair<std::uint64_t, std::uint64_t>, Partial> partial_;
};

}  // namespace gossamer::transport
