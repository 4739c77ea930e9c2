// PeerLinks: the links of a real peer to the members of its current group, one set per epoch.
//
// A group (coordinator.h) names an epoch; its links are made for it (in a grid layout, GroupView::width,
// only between members of a row or a column, optim::grid_linked): between two members the one
// with the smaller id connects and first sends the epoch, the other accepts and files the link
// under (peer, epoch). A member that accepts no connections (behind NAT: announced with an empty
// address) dials every member that does; between two such members the link goes through a relay
// (transport/relay.h), a member of the group that accepts connections, the same one on both sides
// (chosen from the epoch and the pair); the smaller id then sends the epoch. A group with two such
// members and no member to relay between them cannot be linked: kUnavailable, saying what to do (the
// round fails like any other; a peer that can reach nobody any more stops, see peer_runtime.h).
// A link is kept only if the peer that answers is the member dialled. Moving to a new epoch closes every link of the older ones, so a peer still
// waiting in an abandoned collective fails at once and nothing of an abandoned round reaches a new
// one. Links that arrive before this peer asks for them (a faster peer) wait in the table.
//
// Threading: one accept thread (owned) files incoming links; group() and the rest are called from
// the training thread and are thread-safe; group() dials its links from a few threads of its own
// (joined before it returns). Blocking: group() blocks until every link of the group is up or its
// deadline passes. Errors: the connect or accept failure, with the peer's id.
// Incoming connections that do not send a well-formed epoch in time are closed and counted.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/signal.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "runtime/coordinator.h"
#include "transport/link_profile.h"
#include "transport/transport.h"
#include "transport/tags.h"

namespace gossamer::runtime {

// The first message on every link a peer opens to another: the epoch (u64; 0 for a state transfer).
inline constexpr transport::Tag kEpochTag = transport::tags::kEpoch;

class PeerLinks {
 public:
  // on_state_link: what to do with incoming links opened with epoch 0 (state transfers, see
  // state_sync.h); without it they are closed.
  // reachable: where to dial a member at the address it announced (see reachable_address); the
  // address itself when empty.
  PeerLinks(transport::Transport& transport, Clock& clock, std::function<void(std::shared_ptr<transport::Link>)> on_state_link = {},
            std::function<std::string(transport::PeerId, const std::string&)> reachable = {});
  ~PeerLinks();  // stops the accept thread and closes every link
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;

  // The collective group of `view` for this peer (its rank, a link to every other member), with the
  // links of older epochs closed first. While waiting for a member's link it asks `abandoned` every
  // few milliseconds and gives up (kAborted) once the group is abandoned by the others.
  [[nodiscard]] Result<optim::Group> group(const GroupView& view, Deadline deadline, const std::function<bool()>& abandoned = {});
  // Closes every link of `epoch` and older (a collective over it failed).
  void close_through(std::uint64_t epoch);
  std::uint64_t refused_connections() const { return refused_.load(); }
  // Links of this peer that went through a relay so far.
  std::uint64_t relayed_links() const { return relayed_.load(); }
  // From now on, group() hands out links shaped like `profile` (what this peer sends; every peer
  // shapes its own side), so processes on one machine behave as if far apart (shaped_link.h).
  void shape(const transport::LinkProfile& profile);
  // From now on, group() hands out groups whose all-reduces send poisoned contributions (simulation).
  void poison(const optim::Poison& poison);
  // From now on, group() hands out groups whose all-reduces leave their means' bytes in `tap`
  // (optim/mean_tap.h) while it is on.
  void tap_means(std::shared_ptr<optim::MeanTap> tap);
  // From now on, group() hands out groups with this fault drill (optim::Group::crash_drill).
  void crash_drill(std::function<void()> drill);

 private:
  class Dialing;  // the links this peer makes for a group, dialed side by side

  void accept_loop();
  // The first message of a link: the epoch it is for.
  static Result<std::uint64_t> read_epoch(transport::Link& link, Deadline deadline);
  // Connects to member `m` (through `relay` when given) and sends or checks the epoch.
  Result<std::shared_ptr<transport::Link>> open(const MemberInfo& m, const std::optional<MemberInfo>& relay, std::uint64_t epoch, Deadline deadline);
  struct ToDial {
    MemberInfo member;
    std::optional<MemberInfo> relay;
  };
  // The links of `view` this peer makes (under mu_), or kUnavailable when a pair has no relay.
  Result<std::vector<ToDial>> to_dial_locked(const GroupView& view) const;
  // Files a link of `epoch` to `peer` (closed at once when that epoch is over). Under mu_.
  void file_locked(std::uint64_t epoch, transport::PeerId peer, std::shared_ptr<transport::Link> link);
  // A member of `view` whose link is not up yet. Under mu_.
  std::optional<transport::PeerId> missing_locked(const GroupView& view) const;
  // Until every link of `view` is up, a dial fails, the deadline passes or the group is abandoned.
  Status await_links(const GroupView& view, Deadline deadline, const std::function<bool()>& abandoned, const Dialing& dialing);

  static constexpr std::size_t kDialers = 16;  // links of one group opened at a time

  transport::Transport& transport_;
  std::function<void(std::shared_ptr<transport::Link>)> on_state_link_;
  std::function<std::string(transport::PeerId, const std::string&)> reachable_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> refused_{0}, relayed_{0};
  Clock& clock_;
  std::mutex mu_;
  std::unique_ptr<Signal> filed_;  // the acceptor filed a link
  std::map<std::pair<std::uint64_t, transport::PeerId>, std::shared_ptr<transport::Link>> links_;  // (epoch, peer)
  std::uint64_t closed_through_ = 0;  // links of epochs up to this are closed on arrival
  std::optional<transport::LinkProfile> shape_;
  std::optional<optim::Poison> poison_;
  std::shared_ptr<optim::MeanTap> tap_;
  std::function<void()> drill_;
  std::uint64_t shaped_ = 0;  // seeds the shapers' loss draws
  std::unique_ptr<ClockThread> acceptor_;
};

}  // namespace gossamer::runtime
