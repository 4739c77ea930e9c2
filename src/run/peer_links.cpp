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

Result<optim::Group> PeerLinks::group(const GroupView& view, Deadline deadline, const std::function<bool()>& abandoned) {
  const transport::PeerId self = transport_.self();
  const int rank = view.rank_of(self);
  GOSSAMER_CHECK(rank >= 0, "PeerLinks::group: this peer is not a member of the group");
  if (view.epoch > 1) close_through(view.epoch - 1);
  optim::Group g;
  g.clock = &clock_;
  g.rank = rank;
  g.size = static_cast<int>(view.members.size());
  g.peers.resize(view.members.size());
  for (std::size_t j = 0; j < view.members.size(); ++j) {
    const MemberInfo& m = view.members[j];
    if (m.id == self) continue;
    const auto key = std::make_pair(view.epoch, m.id);
    std::unique_lock lock(mu_);
    if (auto it = links_.find(key); it != links_.end()) {
      g.peers[j] = it->second;
      continue;
    }
    if (self < m.id) {  // ours to make
      lock.unlock();
      auto link = transport_.connect(reachable_ ? reachable_(m.id, m.address) : m.address, deadline);
      if (!link.ok()) return link.status().with_context("connecting to peer " + m.id.to_string() + " for epoch " + std::to_string(view.epoch));
      Writer w;
      w.u64(view.epoch);
      if (Status st = (*link)->send(kEpochTag, std::move(w).take(), deadline); !st.ok()) {
        return st.with_context("opening the epoch " + std::to_string(view.epoch) + " link to peer " + m.id.to_string());
      }
      lock.lock();
      auto& slot = links_[key];
      if (slot) slot->close();
      slot = *link;
      g.peers[j] = slot;
      continue;
    }
    // Theirs to make: wait for the acceptor to file it.
    while (links_.count(key) == 0) {
      if (deadline.expired(clock_)) {
        return error(ErrorCode::kTimeout, "peer " + m.id.to_string() + " did not open its link for epoch " + std::to_string(view.epoch) + " in time");
      }
      if (abandoned) {
        lock.unlock();
        const bool gone = abandoned();
        lock.lock();
        if (gone) return error(ErrorCode::kAborted, "the group of epoch " + std::to_string(view.epoch) + " was abandoned by its members");
      }
      filed_->wait(lock, Deadline::at(std::min(clock_.now() + 20ms, deadline.time())), [&] { return links_.count(key) == 1; });
    }
    g.peers[j] = links_[key];
  }
  std::lock_guard lock(mu_);
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
