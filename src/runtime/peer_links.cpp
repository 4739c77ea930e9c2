#include "runtime/peer_links.h"

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/wire.h"
#include "transport/shaped_link.h"

namespace gossamer::runtime {

namespace {
using namespace std::chrono_literals;
}  // namespace

Result<std::uint64_t> PeerLinks::read_epoch(transport::Link& link, Deadline deadline) {
  auto first = link.recv(kEpochTag, deadline);
  if (!first.ok()) return first.status();
  Reader r(*first, "epoch of a group link");
  const std::uint64_t epoch = r.u64();
  r.expect_end();
  if (!r.ok()) return r.status();
  return epoch;
}

PeerLinks::PeerLinks(transport::Transport& transport, Clock& clock, std::function<void(std::shared_ptr<transport::Link>)> on_state_link,
                     std::function<std::string(transport::PeerId, const std::string&)> reachable)
    : transport_(transport),
      on_state_link_(std::move(on_state_link)),
      reachable_(std::move(reachable)),
      clock_(clock),
      filed_(clock.make_signal()) {
  acceptor_ = clock.start_thread([this] { accept_loop(); });
}

PeerLinks::~PeerLinks() {
  stop_ = true;
  acceptor_->join();
  std::lock_guard lock(mu_);
  for (auto& [key, link] : links_) link->close();
}

void PeerLinks::accept_loop() {
  while (!stop_) {
    auto link = transport_.accept(Deadline::after(clock_, 100ms));
    if (!link.ok()) {
      if (link.status().code() != ErrorCode::kTimeout) spdlog::debug("accept: {}", link.status().to_string());
      continue;
    }
    auto first = read_epoch(**link, Deadline::after(clock_, 5s));
    if (!first.ok()) {
      ++refused_;
      spdlog::warn("closed an incoming link from peer {}: {}", (*link)->peer().to_string(), first.status().to_string());
      (*link)->close();
      continue;
    }
    const std::uint64_t epoch = *first;
    if (epoch == 0) {  // a state transfer
      if (on_state_link_) {
        on_state_link_(std::move(*link));
      } else {
        (*link)->close();
      }
      continue;
    }
    const transport::PeerId from = (*link)->peer();
    std::lock_guard lock(mu_);
    file_locked(epoch, from, std::move(*link));
  }
}

void PeerLinks::close_through(std::uint64_t epoch) {
  // As a relay, the pairs of the epoch before go too: this peer being done with `epoch` means every
  // member it shared that group with was done with the one before (relay.h, relay_hub.h).
  if (epoch > 1) transport_.retire_relayed(epoch - 1);
  std::lock_guard lock(mu_);
  closed_through_ = std::max(closed_through_, epoch);
  for (auto it = links_.begin(); it != links_.end();) {
    if (it->first.first <= epoch) {
      it->second->close();
      it = links_.erase(it);
    } else {
      ++it;
    }
  }
}

void PeerLinks::shape(const transport::LinkProfile& profile) {
  std::lock_guard lock(mu_);
  shape_ = profile;
}

void PeerLinks::poison(const optim::Poison& poison) {
  std::lock_guard lock(mu_);
  poison_ = poison;
}

void PeerLinks::tap_means(std::shared_ptr<optim::MeanTap> tap) {
  std::lock_guard lock(mu_);
  tap_ = std::move(tap);
}

void PeerLinks::crash_drill(std::function<void()> drill) {
  std::lock_guard lock(mu_);
  drill_ = std::move(drill);
}

Result<std::shared_ptr<transport::Link>> PeerLinks::open(const MemberInfo& m, const std::optional<MemberInfo>& relay, std::uint64_t epoch,
                                                         Deadline deadline) {
  const transport::PeerId self = transport_.self();
  const bool sends_epoch = !relay || self < m.id;
  const auto dial_at = [&](const MemberInfo& x) { return reachable_ ? reachable_(x.id, x.address) : x.address; };
  auto link = relay ? transport_.connect_relayed(dial_at(*relay), relay->id, m.id, epoch, self < m.id, deadline) : transport_.connect(dial_at(m), deadline);
  if (!link.ok()) return link.status().with_context("connecting to peer " + m.id.to_string() + " for epoch " + std::to_string(epoch));
  if ((*link)->peer() != m.id) {  // another peer answers at that address (two hosts behind one NAT, a stale address)
    const std::string who = (*link)->peer().to_string();
    (*link)->close();
    return error(ErrorCode::kPeerLost, "peer " + m.id.to_string() + "'s address " + m.address + " is answered by peer " + who);
  }
  if (relay) ++relayed_;
  if (sends_epoch) {
    Writer w;
    w.u64(epoch);
    if (Status st = (*link)->send(kEpochTag, std::move(w).take(), deadline); !st.ok()) {
      (*link)->close();
      return st.with_context("opening the epoch " + std::to_string(epoch) + " link to peer " + m.id.to_string());
    }
    return link;
  }
  // The other end of a relayed link names the epoch, as an accepted link would.
  auto got = read_epoch(**link, deadline);
  if (got.ok() && *got != epoch) got = error(ErrorCode::kMalformed, "epoch " + std::to_string(*got) + " instead of " + std::to_string(epoch));
  if (!got.ok()) {
    (*link)->close();
    return got.status().with_context("the relayed link from peer " + m.id.to_string());
  }
  return link;
}

Result<std::vector<PeerLinks::ToDial>> PeerLinks::to_dial_locked(const GroupView& view) const {
  const transport::PeerId self = transport_.self();
  const auto reachable = [](const MemberInfo& m) { return !m.address.empty(); };
  const int rank = view.rank_of(self);
  const bool self_reachable = reachable(view.members[static_cast<std::size_t>(rank)]);
  std::vector<MemberInfo> relays;
  for (const MemberInfo& m : view.members) {
    if (reachable(m)) relays.push_back(m);
  }
  std::vector<ToDial> out;
  const int size = static_cast<int>(view.members.size());
  for (std::size_t j = 0; j < view.members.size(); ++j) {
    const MemberInfo& m = view.members[j];
    if (m.id == self || links_.count({view.epoch, m.id}) == 1) continue;
    if (!optim::grid_linked(rank, static_cast<int>(j), size, static_cast<int>(view.width))) continue;  // (a grid: its row and column only)
    if (self_reachable && reachable(m)) {
      if (self < m.id) out.push_back(ToDial{m, std::nullopt});
    } else if (!self_reachable && reachable(m)) {
      out.push_back(ToDial{m, std::nullopt});  // it accepts, this peer cannot: this peer dials
    } else if (!self_reachable) {
      if (relays.empty()) {
        return error(ErrorCode::kUnavailable, "peers " + self.to_string() + " and " + m.id.to_string() +
                                                  " both accept no connections (behind NAT) and no member of the group accepts them to relay "
                                                  "between the two: start a peer with a reachable address (a public IP, or a port forward and "
                                                  "--advertise; see docs/deploy.md)");
      }
      // Both sides pick the same relay: from the epoch and the pair, spread over the relays.
      const std::uint64_t lo = std::min(self, m.id).value, hi = std::max(self, m.id).value;
      const std::uint64_t h = (view.epoch * 0x9E3779B97F4A7C15ULL) ^ (lo * 0xC2B2AE3D27D4EB4FULL) ^ (hi * 0x165667B19E3779F9ULL);
      out.push_back(ToDial{m, relays[static_cast<std::size_t>((h ^ (h >> 29)) % relays.size())]});
    }
  }
  return out;
}

// The links a group needs this peer to make (to every member with a larger id), dialed side by side
// by a few threads while the ones the others make arrive: a group of N is up after about one round
// trip instead of N in a row. Each link is filed as it comes up; the first failure is kept. The
// destructor stops taking new members and joins the threads. Shared state is under links.mu_.
class PeerLinks::Dialing {
 public:
  Dialing(PeerLinks& links, std::vector<ToDial> ours, std::uint64_t epoch, Deadline deadline)
      : links_(links), ours_(std::move(ours)), epoch_(epoch), deadline_(deadline) {
    for (std::size_t i = 0; i < std::min(ours_.size(), kDialers); ++i) threads_.push_back(links_.clock_.start_thread([this] { dial(); }));
  }
  ~Dialing() {
    {
      std::lock_guard lock(links_.mu_);
      cancel_ = true;
    }
    for (auto& t : threads_) t->join();
  }
  Dialing(const Dialing&) = delete;
  Dialing& operator=(const Dialing&) = delete;

  const std::optional<Status>& failed() const { return failed_; }  // under links.mu_

 private:
  void dial() {
    for (;;) {
      const ToDial* d = nullptr;
      {
        std::lock_guard lock(links_.mu_);
        if (cancel_ || next_ == ours_.size()) return;
        d = &ours_[next_++];
      }
      auto link = links_.open(d->member, d->relay, epoch_, deadline_);
      std::lock_guard lock(links_.mu_);
      if (!link.ok()) {
        if (!failed_) failed_ = link.status();
        links_.filed_->notify_all();
        return;
      }
      links_.file_locked(epoch_, d->member.id, std::move(*link));
    }
  }

  PeerLinks& links_;
  const std::vector<ToDial> ours_;
  const std::uint64_t epoch_;
  const Deadline deadline_;
  std::size_t next_ = 0;  // the next of ours_ to dial
  bool cancel_ = false;
  std::optional<Status> failed_;
  std::vector<std::unique_ptr<ClockThread>> threads_;
};

void PeerLinks::file_locked(std::uint64_t epoch, transport::PeerId peer, std::shared_ptr<transport::Link> link) {
  if (epoch <= closed_through_) {
    link->close();  // for a group this peer has left already
    return;
  }
  auto& slot = links_[{epoch, peer}];
  if (slot) slot->close();
  slot = std::move(link);
  filed_->notify_all();
}

std::optional<transport::PeerId> PeerLinks::missing_locked(const GroupView& view) const {
  const int rank = view.rank_of(transport_.self()), size = static_cast<int>(view.members.size());
  for (std::size_t j = 0; j < view.members.size(); ++j) {
    const MemberInfo& m = view.members[j];
    if (m.id == transport_.self() || !optim::grid_linked(rank, static_cast<int>(j), size, static_cast<int>(view.width))) continue;
    if (links_.count({view.epoch, m.id}) == 0) return m.id;
  }
  return std::nullopt;
}

Status PeerLinks::await_links(const GroupView& view, Deadline deadline, const std::function<bool()>& abandoned, const Dialing& dialing) {
  const std::string epoch = std::to_string(view.epoch);
  std::unique_lock lock(mu_);
  while (auto missing = missing_locked(view)) {
    if (dialing.failed()) return *dialing.failed();
    if (deadline.expired(clock_)) return error(ErrorCode::kTimeout, "peer " + missing->to_string() + " did not open its link for epoch " + epoch + " in time");
    if (abandoned) {
      lock.unlock();
      const bool gone = abandoned();
      lock.lock();
      if (gone) return error(ErrorCode::kAborted, "the group of epoch " + epoch + " was abandoned by its members");
    }
    filed_->wait(lock, Deadline::at(std::min(clock_.now() + 20ms, deadline.time())),
                 [&] { return !missing_locked(view) || dialing.failed().has_value(); });
  }
  return Status();
}

Result<optim::Group> PeerLinks::group(const GroupView& view, Deadline deadline, const std::function<bool()>& abandoned) {
  const transport::PeerId self = transport_.self();
  const int rank = view.rank_of(self);
  GOSSAMER_CHECK(rank >= 0, "PeerLinks::group: this peer is not a member of the group");
  if (view.epoch > 1) close_through(view.epoch - 1);
  std::vector<ToDial> ours;
  {
    std::lock_guard lock(mu_);
    auto dial = to_dial_locked(view);
    if (!dial.ok()) return dial.status();
    ours = std::move(*dial);
  }
  {
    Dialing dialing(*this, std::move(ours), view.epoch, deadline);
    if (Status st = await_links(view, deadline, abandoned, dialing); !st.ok()) return st;
  }

  optim::Group g;
  g.clock = &clock_;
  g.rank = rank;
  g.size = static_cast<int>(view.members.size());
  g.width = static_cast<int>(view.width);
  g.peers.resize(view.members.size());
  std::lock_guard lock(mu_);
  g.poison = poison_;
  g.mean_tap = tap_;
  g.crash_drill = drill_;
  for (std::size_t j = 0; j < view.members.size(); ++j) {
    if (view.members[j].id == self || !optim::grid_linked(rank, static_cast<int>(j), g.size, g.width)) continue;
    auto it = links_.find({view.epoch, view.members[j].id});
    if (it == links_.end()) return error(ErrorCode::kAborted, "the links of epoch " + std::to_string(view.epoch) + " were closed while the group was made");
    g.peers[j] = it->second;
  }
  if (shape_) {
    for (auto& p : g.peers) {
      if (!p) continue;
      auto shaped = transport::make_shaped_link(p, *shape_, ++shaped_ ^ transport_.self().value);
      if (!shaped.ok()) return shaped.status();
      p = std::move(*shaped);
    }
  }
  return g;
}

}  // namespace gossamer::runtime
