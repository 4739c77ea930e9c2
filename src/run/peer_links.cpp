#include "run/peer_links.h"

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/wire.h"
#include "transport/shaped_link.h"

namespace gossamer::run {

namespace {
using namespace std::chrono_literals;
}  // namespace

PeerLinks::PeerLinks(transport::Transport& transport, std::function<void(std::shared_ptr<transport::Link>)> on_state_link,
                     std::function<std::string(transport::PeerId, const std::string&)> reachable, Clock& clock)
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
    auto first = (*link)->recv(kEpochTag, Deadline::after(clock_, 5s));
    std::uint64_t epoch = 0;
    if (first.ok()) {
      Reader r(*first, "epoch of a group link");
      epoch = r.u64();
      r.expect_end();
      if (!r.ok()) first = r.status();
    }
    if (!first.ok()) {
      ++refused_;
      spdlog::warn("closed an incoming link from peer {}: {}", (*link)->peer().to_string(), first.status().to_string());
      (*link)->close();
      continue;
    }
    if (epoch == 0) {  // a state transfer
      if (on_state_link_) {
        on_state_link_(std::move(*link));
      } else {
        (*link)->close();
      }
      continue;
    }
    std::lock_guard lock(mu_);
    if (epoch <= closed_through_) {
      (*link)->close();  // for a group this peer has left already
      continue;
    }
    auto& slot = links_[{epoch, (*link)->peer()}];
    if (slot) slot->close();
    slot = std::move(*link);
    filed_->notify_all();
  }
}

void PeerLinks::close_through(std::uint64_t epoch) {
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

Result<std::shared_ptr<transport::Link>> PeerLinks::open(const MemberInfo& m, std::uint64_t epoch, Deadline deadline) {
  auto link = transport_.connect(reachable_ ? reachable_(m.id, m.address) : m.address, deadline);
  if (!link.ok()) return link.status().with_context("connecting to peer " + m.id.to_string() + " for epoch " + std::to_string(epoch));
  Writer w;
  w.u64(epoch);
  if (Status st = (*link)->send(kEpochTag, std::move(w).take(), deadline); !st.ok()) {
    (*link)->close();
    return st.with_context("opening the epoch " + std::to_string(epoch) + " link to peer " + m.id.to_string());
  }
  return link;
}

Result<optim::Group> PeerLinks::group(const GroupView& view, Deadline deadline, const std::function<bool()>& abandoned) {
  const transport::PeerId self = transport_.self();
  const int rank = view.rank_of(self);
  GOSSAMER_CHECK(rank >= 0, "PeerLinks::group: this peer is not a member of the group");
  if (view.epoch > 1) close_through(view.epoch - 1);

  // The links this peer makes (to every member with a larger id) are opened side by side, a few
  // dialers at a time, while the ones the others make arrive: a group of N is up after about one
  // round trip instead of N in a row.
  std::vector<const MemberInfo*> ours;
  {
    std::lock_guard lock(mu_);
    for (const MemberInfo& m : view.members) {
      if (self < m.id && links_.count({view.epoch, m.id}) == 0) ours.push_back(&m);
    }
  }
  std::size_t next = 0;  // the next of `ours` to dial
  bool cancel = false;
  std::optional<Status> failed;  // the first dial that failed
  std::vector<std::unique_ptr<ClockThread>> dialers;
  const auto dial = [&] {
    for (;;) {
      const MemberInfo* m = nullptr;
      {
        std::lock_guard lock(mu_);
        if (cancel || next == ours.size()) break;
        m = ours[next++];
      }
      auto link = open(*m, view.epoch, deadline);
      std::lock_guard lock(mu_);
      if (!link.ok()) {
        if (!failed) failed = link.status();
        filed_->notify_all();
        break;
      }
      if (view.epoch <= closed_through_) {
        (*link)->close();
        continue;
      }
      auto& slot = links_[{view.epoch, m->id}];
      if (slot) slot->close();
      slot = std::move(*link);
      filed_->notify_all();
    }
  };
  for (std::size_t i = 0; i < std::min(ours.size(), kDialers); ++i) dialers.push_back(clock_.start_thread(dial));
  // Every return below first stops the dialers: they reference this frame.
  const auto finish = [&](Status st) -> Status {
    {
      std::unique_lock lock(mu_);
      cancel = true;
    }
    for (auto& d : dialers) d->join();
    return st;
  };

  const auto all_up = [&] {
    for (const MemberInfo& m : view.members) {
      if (m.id != self && links_.count({view.epoch, m.id}) == 0) return false;
    }
    return true;
  };
  {
    std::unique_lock lock(mu_);
    while (!all_up()) {
      if (failed) {
        Status st = *failed;
        lock.unlock();
        return finish(st);
      }
      if (deadline.expired(clock_)) {
        std::string missing;
        for (const MemberInfo& m : view.members) {
          if (m.id != self && links_.count({view.epoch, m.id}) == 0) {
            missing = m.id.to_string();
            break;
          }
        }
        lock.unlock();
        return finish(error(ErrorCode::kTimeout, "peer " + missing + " did not open its link for epoch " + std::to_string(view.epoch) + " in time"));
      }
      if (abandoned) {
        lock.unlock();
        const bool gone = abandoned();
        if (gone) return finish(error(ErrorCode::kAborted, "the group of epoch " + std::to_string(view.epoch) + " was abandoned by its members"));
        lock.lock();
        if (all_up()) break;
      }
      filed_->wait(lock, Deadline::at(std::min(clock_.now() + 20ms, deadline.time())), [&] { return all_up() || failed.has_value(); });
    }
  }
  if (Status st = finish(Status()); !st.ok()) return st;

  optim::Group g;
  g.clock = &clock_;
  g.rank = rank;
  g.size = static_cast<int>(view.members.size());
  g.peers.resize(view.members.size());
  std::lock_guard lock(mu_);
  for (std::size_t j = 0; j < view.members.size(); ++j) {
    if (view.members[j].id == self) continue;
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

}  // namespace gossamer::run
