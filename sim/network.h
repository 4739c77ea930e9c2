// Network: emulated links between simulated nodes, in the Scheduler's virtual time.
//
// Each node reaches the others through its access link (a LinkProfile: bandwidth, one-way latency,
// jitter, loss), and optionally through its site's shared uplink and downlink (workers behind one
// uplink), a hub whose one link every message crosses (hub and spokes), and a link of each pair's
// own (PairSpec: a geo table's latency and bandwidth between two places). Messages
// are fluid flows: every flow in progress gets a max-min fair share of each link it crosses
// (uplink of the sender, site links when it leaves or enters a site, the hub, downlink of the
// receiver), so
// contention is modelled; a message of n bytes on the wire alone on links of b bytes/s arrives
// exactly latency + n/b after it was sent. Bytes on the wire are the payload plus the frame header,
// with per-packet header overhead (LinkProfile::wire_bytes). Latency, jitter and loss come from the
// model the real shaped links use (transport/link_model.h): loss is retransmission delay (each lost
// packet, a seeded draw, adds one round trip), jitter a seeded signed normal draw per message, never
// reordering a link's messages. A path's latency, jitter and loss are the means of its two ends', so
// that between two nodes of one profile a message is delayed as a real link of that profile delays it.
//
// Send blocks the sending actor until its last byte has left (that is how long the sender's link is
// busy); the receiver's mailbox holds messages by tag until recv() takes them. crash(node) closes the
// node's links: peers waiting on it get kPeerLost, as a TCP reset would tell them.
//
// Ownership: the Network owns the emulated links' state and must outlive the links it hands out.
// Threading: used from the Scheduler's actors and callbacks only (one runs at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "sim/scheduler.h"
#include "transport/link.h"
#include "transport/link_profile.h"

namespace gossamer::sim {

struct SiteSpec {
  std::string name;
  double bandwidth_bytes_per_s = 0;  // shared by all traffic leaving (and, separately, entering) the site
  Nanos latency{0};                  // extra one-way latency to cross the site's link
};

struct NodeSpec {
  transport::LinkProfile link;  // the node's access link
  int site = -1;                // index into NetworkSpec::sites, or -1
};

// The path from one node to another, beside their access links (a geo-distributed table: each pair
// of places its own latency and bandwidth). Every message from `from` to `to` crosses it.
struct PairSpec {
  double bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();  // shared by the pair's flows, one direction
  Nanos latency{0};                                                         // added one way
};

struct NetworkSpec {
  std::vector<NodeSpec> nodes;
  std::vector<SiteSpec> sites;
  double hub_bytes_per_s = 0;  // > 0: a hub whose one link every message crosses (hub and spokes)
  // Empty, or nodes x nodes row-major by (from, to): each directed pair's own link (the diagonal unused).
  std::vector<PairSpec> pairs;
  std::uint64_t seed = 1;
  // Empty, or how many bytes of the links' capacity one wire byte of a message with this tag takes
  // (a pipeline's links are scaled down for its activations; its agreement's small messages are
  // not activations, and take what they would on the unscaled links). Traffic counts wire bytes.
  std::function<double(transport::Tag)> byte_weight;
};

struct NodeTraffic {
  std::uint64_t wire_bytes_sent = 0;
  std::uint64_t wire_bytes_received = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t datagram_bytes_sent = 0;      // post(): gossip
  std::uint64_t datagram_bytes_received = 0;
};

class Network {
 public:
  Network(Scheduler& scheduler, NetworkSpec spec);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  int size() const;
  // The link node `from` uses to talk to node `to` (from != to). The same object on every call with
  // the same epoch. Each epoch is a fresh connection with its own mailboxes: a group that re-forms
  // after a failure moves to a new epoch, so nothing of an abandoned round reaches it.
  std::shared_ptr<transport::Link> link(int from, int to, int epoch = 0);
  // Like link(), for a transport's connection: the link names the peer by `peer` and `peer_address`
  // (a process's id and address, not the node's). Each (from, to, epoch) is made once. Its close()
  // is TCP's: what it already sent still arrives, and the peer sees the link closed after it (a
  // link()'s close cuts both ways at once).
  std::shared_ptr<transport::Link> connection(int from, int to, int epoch, transport::PeerId peer, std::string peer_address);
  // a hangs up its link to b of one epoch, as a TCP close does: a stops reading and sending now; what
  // a already sent still reaches b, which then sees the link closed (kPeerLost), one path latency
  // after the close at the earliest.
  void close(int a, int b, int epoch);
  // Closes every link of the node, in both directions, now.
  void crash(int node);
  bool crashed(int node) const;
  // The node is back (a crashed process restarted on the same host): new links and datagrams reach
  // it again; the connections it had stay closed.
  void revive(int node);
  // A datagram (gossip's messages, which are small and many): it takes the path's latency, jitter and
  // loss draw (from generators of its own) plus its wire bytes over the slower of the two access
  // links, without taking part in the fair sharing of the links' bandwidth; its wire bytes are
  // counted in the traffic. `on_arrival` runs in a scheduler callback when it lands (it must not
  // wait); a datagram to or from a crashed node is dropped, as is one landing on a crashed node.
  void post(int from, int to, Bytes message, std::function<void(Bytes)> on_arrival);
  NodeTraffic traffic(int node) const;
  // One-way latency of the path from -> to, without jitter or loss.
  Nanos path_latency(int from, int to) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gossamer::sim
