// Coordinator: who takes part in each round of a real run, agreed over gossip with no fixed leader,
// at a cost per peer that does not grow with the run.
//
// Each round k (round 0 is the start of training) goes like this. Every peer that reaches it says
// READY(k), with the address of its links, to the round's leader and to the next in line (its
// fallback), directly, not to everyone (and to the lowest live id, when that is neither: a peer
// left on its own, or a few split off, hear of the main group from its leader and come back to it).
// The leader is the lowest live id (gossip's view; live: alive or suspect, not yet declared dead)
// among the previous group's members (at the start, and once a straggler's grace is over, among the
// ready peers; a newcomer never leads before that); it waits until every live peer of the previous
// group is ready (at round 0: until `min_members` peers are), or until a quorum of their work is
// ready and an adaptive grace has passed since (the usual lag of the last members plus a few times
// its spread; see CoordinatorOptions), and sends GROUP(k) to each ready peer: the members, sorted by id, and an
// epoch. A GROUP is sent as the change from a group its receiver holds (it says which in its
// READY): a few bytes when the members stay, the whole list only to a newcomer. The epoch names the
// group's links: a group with the same members as the last one, which nobody retries, keeps its
// epoch (and so its links, and a collective in flight over them, as CO2's is); any other group gets
// a new one, so nothing of a failed round can reach a later one. A peer may ask for a round's group
// ahead of time (agree() from another thread) to take the agreement off its critical path. When a
// collective over epoch e fails, the members call agree(k, e) again (READY with "after e" and the
// step whose collective failed), and the attempt is decided once, all-or-nothing (below). When it is
// abandoned, the leader announces a group with a larger epoch, without the peers that are gone, and
// without those retrying an earlier step than others (ddp: a crash that cut a step's averaging short
// for some members only, the rest went on to the next step; those behind are left out and catch up
// through a state transfer). If the leader
// dies, its fallback, which has every READY too, takes over, since every peer runs the same rule. A
// peer that gets a READY it is not in line for (the sender's view of the members differs, or the
// sender is a newcomer that knows only a few members) passes it on once to its own leader and
// fallback. READYs are repeated to the leader until a GROUP answers, and whoever holds the round's
// group answers a READY with it: a lost message only delays. A peer still waiting when its grace is
// over says READY to everyone. A peer that did not run for 2 s (its process was stopped, its machine
// swapped) starts its waits afresh and says READY again: its own stall is nobody else's lateness,
// and it must not lead a group of the few peers it happens to have heard of meanwhile. Per round a peer sends one READY (to two or three) and one DONE (to
// two), and the leader one GROUP per member: O(N) messages in all, not O(N^2); a failed round adds
// one decision to everyone.
//
// All-or-nothing rounds (CoordinatorOptions::commit_rounds: every method but ddp). A crash in the
// middle of an all-reduce can leave some members with the average and others without it (the dead
// member's share of the mean reached only some). Every member that applied round k over epoch e says
// DONE(k, e) to the group's first two live members (the decider and its fallback). The decider of an
// attempt is the lowest live member of its group; once a member asks to retry it, the decider waits
// until every live member has said DONE or asked to retry (or its grace has passed), and decides
// once for everyone: COMMIT when any member applied the round (it went through: those who retried
// are left out, named in the COMMIT, and catch up through a state transfer to the committed state,
// while the rest go on without waiting), else ABANDON (nobody applied it: it is retried over a new
// group). A later retry of a committed attempt is answered with the COMMIT. The next round's GROUP
// names the epoch its leader applied the round before over, and a member that applied it over
// another (it missed an ABANDON) catches up instead of going on with a state the others do not hold.
// So a round's outer step is taken by every member of the group that goes on, or by none. ddp
// (commit_rounds off) keeps the step rule above: the first retry abandons the epoch at once.
//
// Messages (topic "gossamer.round", direct or broadcast; little-endian through core/wire; varint:
// LEB128; address: a link address in gossip's compact form, transport/member_table.h), version 5:
//   version u8 | type u8 (1 READY, 2 GROUP, 3 INTENT, 4 AT, 5 ABANDON, 6 DONE, 7 COMMIT) | round varint
//   READY:  after_epoch varint | step varint (of the retried collective; 0 first time) | id u64 |
//           known epoch varint (the last group it took part in; 0 none) | flags u8 (1 passed on,
//           2 sent to everyone, 4 its links for after_epoch never came up) | link address
//   GROUP:  epoch varint | leader u64 | width varint (the layout: 0 a full mesh) | prior varint (the
//           epoch its leader applied round-1 over; 0 none) | form u8, then
//           form 0 (whole): count varint | count x (id u64, link address)
//           form 1 (change): base epoch varint | count varint | check u64 (of the members it makes) |
//                  removed varint x id u64 | added varint x (id u64, link address)
//   INTENT: id u64 (a newcomer holding the state of round-1) | flags u8 (1 passed on)
//   AT:     (nothing: the run is at `round`, past the one a READY asked about)
//   ABANDON: epoch varint (the group of `round` over it failed and is retried; to everyone, once)
//   DONE:   epoch varint (the sender applied `round` over it; to the decider and its fallback)
//   COMMIT: epoch varint | count varint | count x id u64 (the attempt went through; the members
//           named retried it and are left out; to everyone, and to each later retry)
// A READY takes about 22 bytes (version 3: 67).
// A message of another version or a malformed one is dropped, logged and counted (dropped()). A
// change from a group this peer does not hold (or whose check fails) is not applied: the peer asks
// the sender for the whole group.
//
// Threading: agree() is called by the training thread; the gossip handler runs on the gossip
// thread; every method is thread-safe. Blocking: agree() blocks until a group is announced or the
// deadline passes. Errors: kTimeout at the deadline; kAborted when this peer was left out of the
// round (a straggler) or is leaving (stop()); kUnavailable when round 0 is asked for after the run
// started (the caller joins through a state transfer).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/signal.h"
#include "core/status.h"
#include "core/wire.h"
#include "transport/gossip.h"

namespace gossamer::runtime {

struct MemberInfo {
  transport::PeerId id;
  std::string address;  // where its links listen; empty: it accepts no connections (behind NAT), see peer_links.h
  friend bool operator==(const MemberInfo&, const MemberInfo&) = default;
};

struct GroupView {
  std::int64_t round = 0;
  std::uint64_t epoch = 0;
  transport::PeerId leader;
  std::vector<MemberInfo> members;  // sorted by id
  // How the members link up for the collective (optim::grid_linked): 0, every one to every other.
  std::uint32_t width = 0;
  // The epoch its leader applied the round before over (0: none, or not known): a member that applied
  // that round over another holds a state the group does not share.
  std::uint64_t prior = 0;
  int rank_of(transport::PeerId id) const;  // -1 when not a member
};

struct CoordinatorOptions {
  std::size_t min_members = 1;                      // round 0 waits for this many peers
  // How long a leader waits for the rest (docs/peer.md, "Quorum and grace"). A round closes when
  // every expected member is ready; or once `quorum` of the expected work (the inner steps behind
  // each member's last contribution, set_work(); equal shares where unknown) is ready and a grace
  // has passed since; or, short of a quorum, at straggler_grace. The grace is learned from the last
  // 8 rounds this peer led whole: the median of their lags (how long after the quorum the last
  // member became ready) plus `grace_spread` times their spread (1.4826 times the median absolute
  // deviation, the standard deviation's robust estimate, and at least a quarter of the median: a
  // few rounds under-state it), within [min_grace, straggler_grace]; straggler_grace itself until
  // it has led 3 such rounds. The defaults follow a rule, not a tuning: a quorum of half the work
  // (no round closes on a minority of it), and 3 spreads (a lag drawn from the same spread as the
  // recent ones exceeds it about once in 700 rounds).
  Nanos straggler_grace = std::chrono::seconds(60);
  Nanos min_grace = std::chrono::seconds(2);
  double quorum = 0.5;
  double grace_spread = 3.0;
  Nanos repeat_every = std::chrono::milliseconds(300);  // the first repeat of a READY; then doubling, up to 5 s
  // The layout of a group of so many members (GroupView::width), chosen by its leader; none: a full
  // mesh. A group with the same members and layout as the last keeps its epoch (and links).
  std::function<std::uint32_t(std::size_t members)> layout;
  // Rounds are committed all-or-nothing (see the top of this file): members say applied(), and a
  // retried attempt is decided COMMIT or ABANDON once. Off (ddp): the first retry abandons it.
  bool commit_rounds = false;
};

struct CoordinatorStats {
  std::int64_t groups_announced = 0;  // as leader
  std::int64_t retries = 0;           // agree() after a failed epoch
  std::int64_t left_out = 0;          // peers a group announced by this leader left behind
  std::int64_t dropped = 0;           // malformed or foreign messages
  std::int64_t messages_sent = 0;     // READY, GROUP, INTENT and AT messages (a broadcast counts once)
  std::int64_t passed_on = 0;         // READYs and INTENTs passed on to this peer's leader
  std::int64_t committed = 0;         // attempts this peer decided went through (COMMIT)
  std::int64_t abandoned = 0;         // attempts this peer decided nobody applied (ABANDON)
  std::int64_t missed_commits = 0;    // attempts that went through for the others but not here
  std::int64_t quorum_closes = 0;     // groups this leader closed on a quorum and its grace, someone missing
};

class Coordinator : public std::enable_shared_from_this<Coordinator> {
 public:
  // Subscribes to the round topic; the gossip's handler holds the coordinator only weakly, so it may
  // go before the gossip does.
  // Waits and reads time on `clock` (the simulator's, in a simulation).
  static std::shared_ptr<Coordinator> make(transport::Gossip& gossip, std::string link_address, CoordinatorOptions options,
                                           Clock& clock);
  Coordinator(transport::Gossip& gossip, std::string link_address, CoordinatorOptions options, Clock& clock);
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The group of round `round`. after_epoch: 0 for the first attempt, else the epoch whose
  // collective failed (the answer then has a larger epoch), and `step` the step of that collective;
  // `unlinked`: its links never all came up here, so this peer never joined that collective (and
  // nobody can have applied it: an all-or-nothing attempt is abandoned at once).
  [[nodiscard]] Result<GroupView> agree(std::int64_t round, std::uint64_t after_epoch, Deadline deadline, std::int64_t step = 0,
                                        bool unlinked = false);
  // A newcomer that holds the state of round-1 announces it will take part in `round`: the leader
  // then waits for it like for a member (INTENT: version | 3 | round | id u64).
  void intend(std::int64_t round);
  // This peer's own note that `id` (a newcomer it offered state to) is due at `round`: as leader it
  // waits for it at most `wait` (at least its usual grace) from when it became ready itself.
  void expect(std::int64_t round, transport::PeerId id, Nanos wait);
  // True when the group of `round` over `epoch` is abandoned: a later group for the round is out,
  // or some member is ready to retry after that epoch (its collective or its links failed).
  bool superseded(std::int64_t round, std::uint64_t epoch) const;
  // True when the attempt (round, epoch) was decided abandoned, or a later group for the round is
  // out: a member that applied it holds a state the others do not, and catches up.
  bool abandoned(std::int64_t round, std::uint64_t epoch) const;
  // This peer applied the collective of `round` over `epoch` (commit_rounds): DONE to the attempt's
  // decider and fallback, and the decision when this peer decides it and a retry is waiting.
  void applied(std::int64_t round, std::uint64_t epoch);
  // True when the attempt (round, epoch) went through for the other members (COMMIT): a member whose
  // collective failed there is left out, its contribution in the average the others applied.
  bool went_through(std::int64_t round, std::uint64_t epoch) const;
  // The inner steps behind each member's contribution to the last round (its token weights): the
  // work a leader expects of each member in the next one, which its quorum counts.
  void set_work(std::map<transport::PeerId, std::int64_t> work);
  // Members of the run a newcomer knows (those it took the state from): until it takes part in a
  // group, its READYs and INTENTs go to them, and they pass them on to their leader.
  void join_through(std::vector<transport::PeerId> members);
  // This peer is leaving: agree() calls now and later return kAborted at once.
  void stop();
  CoordinatorStats stats() const;

 private:
  struct Ready {
    std::uint64_t after_epoch = 0;
    std::int64_t step = 0;  // of the collective retried
    std::uint64_t known_epoch = 0;  // the last group it took part in
    std::string address;  // empty: this peer accepts no connections (behind NAT)
    Nanos at{0};  // on the coordinator's clock
    bool heard = false;
    bool unlinked = false;  // a retry whose links never came up (it never joined the collective)
  };
  struct Outgoing {  // a message to send once the lock is released
    std::optional<transport::PeerId> to;  // nothing: to everyone
    Bytes payload;
  };
  void on_message(transport::PeerId origin, const Bytes& payload);
  struct Attempt {  // what agree() was asked
    std::int64_t round = 0;
    std::uint64_t after_epoch = 0;
    std::int64_t step = 0;
  };
  // agree()'s parts (under mu_): this peer's READY noted and rounds long past dropped; its READYs to
  // send now (`told`: those told already); the ABANDON a retrying leader sends; and the attempt's
  // outcome once there is one (its group, or why it is left out).
  void begin_attempt_locked(std::int64_t round, std::uint64_t after_epoch, std::int64_t step, bool unlinked, Nanos ready_since);
  std::vector<Outgoing> ready_messages_locked(const Attempt& a, std::set<transport::PeerId>& told, bool everyone, bool repeat);
  std::optional<Bytes> abandon_message_locked(std::int64_t round, std::uint64_t after_epoch);
  std::optional<Result<GroupView>> outcome_locked(const Attempt& a);
  // Each kind of message, read from `r` (under mu_); false when it was dropped.
  bool on_ready_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::vector<Outgoing>& out);
  bool on_group_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::vector<Outgoing>& out);
  bool on_intent_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::vector<Outgoing>& out);
  void drop_locked(const std::string& what, transport::PeerId origin, const std::string& why);
  void send(std::vector<Outgoing> out);
  // Whom this peer's READYs and INTENTs go to: the leader and its fallback in this peer's view (the
  // two lowest live members of its last group; a newcomer's contacts; at the start, the two lowest
  // live ids), possibly this peer itself.
  std::vector<transport::PeerId> in_line_locked() const;
  // Gossip's live ids and this peer's (copied at most every 50 ms).
  const std::set<transport::PeerId>& live_locked() const;
  std::vector<transport::PeerId> in_line_locked(const std::set<transport::PeerId>& alive) const;
  Bytes ready_message_locked(std::int64_t round, std::uint64_t after_epoch, std::int64_t step, std::uint8_t flags) const;
  // A READY or INTENT of `id` that this peer is not in line for: to the leader and fallback it sees, once.
  void pass_on_locked(transport::PeerId id, const Bytes& message, std::vector<Outgoing>& out);
  // `g` for a peer that holds the group of epoch `known` (0: none): a change from it where this peer
  // holds that group too, else the whole list.
  Bytes group_message_locked(const GroupView& g, std::uint64_t known) const;
  // Answers a READY from `id` with the group of `round` it waits for, or says the run is past it (at
  // most once per repeat_every per peer, unless it asks for the whole group now).
  void answer_locked(transport::PeerId id, std::int64_t round, const Ready& ready, std::vector<Outgoing>& out);
  void remember_locked(const GroupView& g);
  // Leader side: the group to announce now, or nothing yet (under mu_).
  std::optional<GroupView> leader_decision(std::int64_t round, std::uint64_t after_epoch, std::int64_t step,
                                           Nanos ready_since);
  // Its parts (under mu_): who leads this attempt; whom the leader waits for; the group it announces.
  transport::PeerId leader_locked(std::int64_t round, std::uint64_t after_epoch, const std::set<transport::PeerId>& alive, bool grace_over);
  std::set<transport::PeerId> expected_locked(std::int64_t round, const std::set<transport::PeerId>& alive,
                                              const std::map<transport::PeerId, std::string>& ready, std::optional<Nanos>& newcomer_wait);
  GroupView make_group_locked(std::int64_t round, std::uint64_t after_epoch, std::int64_t step,
                              const std::map<transport::PeerId, std::string>& ready, const std::set<transport::PeerId>& expected);
  // The group, to every peer ready for this attempt (under mu_).
  void announce_locked(const GroupView& g, std::uint64_t after_epoch, std::vector<Outgoing>& out);
  bool superseded_locked(std::int64_t round, std::uint64_t epoch) const;
  bool abandoned_locked(std::int64_t round, std::uint64_t epoch) const;
  Nanos grace() const;  // the straggler grace now (under mu_)
  // When `quorum` of the work of the expected and ready peers was ready (the arrival that made it),
  // or nothing while it is not (under mu_).
  std::optional<Nanos> quorum_at_locked(std::int64_t round, const std::set<transport::PeerId>& expected,
                                        const std::map<transport::PeerId, std::string>& ready, Nanos ready_since) const;
  // All-or-nothing rounds (under mu_): the first two live members of the group of `epoch` (its
  // decider first), and the decision on a retried attempt when this peer is its decider and it is due.
  std::vector<transport::PeerId> deciders_locked(std::uint64_t epoch) const;
  void decide_locked(std::int64_t round, std::uint64_t epoch, std::vector<Outgoing>& out);
  Bytes commit_message_locked(std::int64_t round, std::uint64_t epoch, const std::set<transport::PeerId>& left) const;
  bool on_commit_locked(transport::PeerId origin, std::int64_t round, Reader& r);

  static constexpr std::size_t kKnownGroups = 8;  // groups held by epoch, to read changes from

  transport::Gossip& gossip_;
  const std::string address_;
  const CoordinatorOptions options_;
  Clock& clock_;
  mutable std::mutex mu_;
  std::unique_ptr<Signal> signal_;  // a round message arrived, or stop()
  std::uint64_t changes_ = 0;       // counts them
  std::map<std::int64_t, std::map<transport::PeerId, Ready>> ready_;  // round -> who is ready
  std::map<std::int64_t, GroupView> groups_;                           // round -> the latest group announced
  std::map<std::int64_t, std::map<transport::PeerId, Nanos>> intents_;  // round -> newcomers that will take part, and how long to wait for each
  std::map<std::pair<std::int64_t, transport::PeerId>, std::pair<Nanos, bool>> answered_;  // (round, peer) -> when, and whether whole
  std::map<std::uint64_t, std::vector<MemberInfo>> known_;  // epoch -> members, the newest few
  std::vector<transport::PeerId> contacts_;                 // join_through()
  std::optional<GroupView> last_;                                      // the last group this peer took part in
  std::set<transport::PeerId> out_;  // members of last_ a COMMIT left out (no longer in line, led or waited for)
  std::uint64_t max_epoch_ = 0;                                        // the largest epoch seen
  std::int64_t run_at_ = -1;                                           // the furthest round an AT named
  std::map<std::int64_t, std::uint64_t> abandoned_;                    // round -> the latest epoch a retry abandoned
  // All-or-nothing rounds: round -> epoch -> who said they applied it (this peer too); round -> epoch
  // -> when this peer first heard it retried; round -> the attempt committed and whom it left out
  // (as far as this peer knows); round -> the epoch this peer applied it over.
  std::map<std::int64_t, std::map<std::uint64_t, std::set<transport::PeerId>>> done_;
  std::map<std::int64_t, std::map<std::uint64_t, Nanos>> doubted_;
  std::map<std::int64_t, std::pair<std::uint64_t, std::set<transport::PeerId>>> committed_;
  std::map<std::int64_t, std::uint64_t> applied_;
  mutable std::set<transport::PeerId> live_;                           // live_locked()'s copy
  mutable std::optional<Nanos> live_at_;
  mutable std::uint64_t live_version_ = 0;
  CoordinatorStats stats_;
  bool stopping_ = false;
  std::deque<Nanos> lags_;  // the adaptive grace's history (leader side)
  std::map<transport::PeerId, std::int64_t> work_;  // set_work()
};

}  // namespace gossamer::runtime
