// libFuzzer target: the join board's messages (JOIN, OFFER; src/runtime/announcements.h) from arbitrary
// bytes, delivered on topic "gossamer.state" to a JoinBoard. The input is a sequence of records
// (records.h): the selector picks the origin (its low two bits) and whether the board then forgets
// the offers up to the oldest round offered (bit 2); the payload is the message.
// The board must hold exactly what the well-formed messages said, read here from the layout in the
// header: the newcomers waiting are the ids of the JOINs, the newest offer is the highest round
// offered and not forgotten (of the newest 8), with one donor per id that offered it, named by its id, at the address
// it gave (a wildcard one made reachable through gossip's view, which knows a few peers).
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/wire.h"
#include "fake_gossip.h"
#include "records.h"
#include "runtime/announcements.h"
#include "transport/endpoint.h"

namespace {

using namespace gossamer;

// Time stands still, so a JOIN is still wanted when the board is asked.
class StillClock final : public Clock {
 public:
  Nanos now() const override { return std::chrono::seconds(100); }
  void sleep_until(Nanos) override {}
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // every dropped message is logged
  if (fuzz::seeds_wanted()) {
    // Peer 9 asks to join (sent to the member it knows), then, having heard a JOIN from peer 2, offers
    // round 12 at an address and round 13 at a wildcard one (made reachable through its gossip
    // address); the board then forgets round 12.
    fuzz::FakeGossip peer(transport::PeerId{9}, {transport::Member{transport::PeerId{1}, "tcp://192.0.2.1:7000"}});
    auto b = runtime::JoinBoard::make(peer, real_clock());
    b->set_member(true);
    b->ask_to_join();
    // Peer 2's JOIN, by the board's own encoder.
    peer.deliver(transport::PeerId{2}, "gossamer.state", runtime::announcement_wire::encode_board({runtime::announcement_wire::kJoin, 2, 0, "", 0}));
    b->offer(12, "192.0.2.9:7001");
    b->offer(13, "0.0.0.0:7001");
    const auto sent = peer.direct();
    if (sent.size() == 3) {
      fuzz::write_seed("board", fuzz::join_records({{1, std::get<2>(sent[0])}, {1, std::get<2>(sent[1])}, {5, std::get<2>(sent[2])}}));
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static StillClock clock;
  fuzz::FakeGossip gossip(transport::PeerId{1}, {
                                                    transport::Member{transport::PeerId{9}, "tcp://192.0.2.9:7000"},
                                                    transport::Member{transport::PeerId{10}, "tcp://0.0.0.0:7000"},
                                                    transport::Member{transport::PeerId{11}, "tcp://[2001:db8::7]:7000"},
                                                });
  auto board = runtime::JoinBoard::make(gossip, clock);
  board->set_member(true);  // (a peer outside the run answers a JOIN with ABSENT and keeps nothing)
  std::set<transport::PeerId> joined;
  std::map<std::int64_t, std::map<transport::PeerId, std::string>> offered;
  for (const auto& record : fuzz::split_records(data, size)) {
    const ByteView m = record.payload;
    gossip.deliver(transport::PeerId{1u + record.selector % 4u}, "gossamer.state", m);
    // What the message says, if it is well-formed.
    Reader r(m);
    const std::uint8_t version = r.u8(), kind = r.u8();
    const transport::PeerId id{r.u64()};
    std::int64_t round = 0;
    std::string address;
    if (kind == 1 && r.remaining() == 8) (void)r.u64();  // the newcomer's link speed (optional)
    if (kind == 2) {
      round = r.i64();
      address = r.str(256);
    }
    r.expect_end();
    if (r.ok() && version == 1 && kind == 1) joined.insert(id);
    if (r.ok() && version == 1 && kind == 2) {
      offered[round][id] = address;
      while (offered.size() > 8) offered.erase(offered.begin());  // the board keeps the newest 8 rounds offered
    }
    if ((record.selector & 4) != 0 && !offered.empty()) {
      const std::int64_t oldest = offered.begin()->first;
      board->forget(oldest);
      offered.erase(oldest);
    }

    const auto waiting = board->waiting();
    if (std::set<transport::PeerId>(waiting.begin(), waiting.end()) != joined || waiting.size() != joined.size()) __builtin_trap();
    const auto newest = board->newest_offer(Nanos{0});
    if (newest.has_value() != !offered.empty()) __builtin_trap();
    if (!newest) continue;
    const auto& [top_round, donors] = *offered.rbegin();
    if (newest->first != top_round || newest->second.size() != donors.size()) __builtin_trap();
    auto donor = newest->second.begin();
    for (const auto& [donor_id, donor_address] : donors) {
      if (donor->name != donor_id.to_string()) __builtin_trap();
      const bool wildcard = transport::is_wildcard_address(donor_address);
      if (!wildcard && donor->address != donor_address) __builtin_trap();
      // A wildcard address is made reachable only for a peer whose gossip address gossip knows.
      if (wildcard && donor_id != transport::PeerId{9} && donor_id != transport::PeerId{11} && donor->address != donor_address) __builtin_trap();
      ++donor;
    }
  }
  return 0;
}
