#include "transport/striped_link.h"

#include <cstring>
#include <future>
#include <mutex>

#include <spdlog/spdlog.h>

#include "core/wire.h"

namespace gossamer::transport {

namespace {

constexpr std::uint8_t kWhole = 0, kStriped = 1;

class StripedLink final : public Link {
 public:
  StripedLink(std::vector<std::shared_ptr<Link>> lanes, const StripeOptions& o) : lanes_(std::move(lanes)), options_(o) {}

  PeerId peer() const override { return lanes_[0]->peer(); }
  std::string remote_address() const override { return lanes_[0]->remote_address() + " (" + std::to_string(lanes_.size()) + " lanes)"; }

  Status send(Tag tag, ByteView payload, Deadline deadline) override {
    std::lock_guard<std::mutex> serial(send_mu_);
    const std::size_t k = lanes_.size();
    if (k == 1 || payload.size() < options_.min_stripe_bytes * 2) {
      Bytes whole(payload.size() + 1);
      whole[0] = std::byte{kWhole};
      if (!payload.empty()) std::memcpy(whole.data() + 1, payload.data(), payload.size());
      return checked(lanes_[0]->send(tag, whole, deadline));
    }
    Writer d(13);
    d.u8(kStriped);
    d.u64(payload.size());
    d.u32(static_cast<std::uint32_t>(k));
    if (Status st = checked(lanes_[0]->send(tag, d.bytes(), deadline)); !st.ok()) return st;
    // Stripe i on lane i, all at once: lanes 1..k-1 on helper threads, lane 0 here.
    std::vector<std::future<Status>> others;
    for (std::size_t i = 1; i < k; ++i) {
      others.push_back(std::async(std::launch::async, [this, i, tag, payload, deadline, k] {
        return lanes_[i]->send(tag, stripe(payload, i, k), deadline);
      }));
    }
    Status st = lanes_[0]->send(tag, stripe(payload, 0, k), deadline);
    for (auto& f : others) {
      Status s = f.get();
      if (st.ok() && !s.ok()) st = s;
    }
    return checked(st);
  }

  Result<Bytes> recv(Tag tag, Deadline deadline) override {
    std::mutex& m = tag_mutex(tag);
    std::lock_guard<std::mutex> serial(m);  // stripes of one message must be read together
    auto first = lanes_[0]->recv(tag, deadline);
    if (!first.ok()) return first.status();
    Reader r(*first, "striped message descriptor");
    const std::uint8_t kind = r.u8();
    if (r.ok() && kind == kWhole) return Bytes(first->begin() + 1, first->end());
    const std::uint64_t total = r.u64();
    const std::uint32_t stripes = r.u32();
    r.expect_end();
    if (!r.ok() || kind != kStriped || stripes != lanes_.size()) {
      return fail_with(error(ErrorCode::kMalformed, "peer " + peer().to_string() + " sent a bad striped-message descriptor"));
    }
    Bytes out(static_cast<std::size_t>(total));  // each lane's frame cap bounds what it can deliver
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      auto s = lanes_[i]->recv(tag, deadline);
      if (!s.ok()) return fail_with(s.status());
      const ByteView want = stripe(out, i, lanes_.size());
      if (s->size() != want.size()) {
        return fail_with(error(ErrorCode::kMalformed, "peer " + peer().to_string() + " sent a stripe of the wrong size"));
      }
      if (!want.empty()) std::memcpy(out.data() + (want.data() - out.data()), s->data(), s->size());
    }
    return out;
  }

  void close() override {
    for (auto& l : lanes_) l->close();
  }

  LinkStats stats() const override {
    LinkStats sum;
    for (const auto& l : lanes_) {
      const LinkStats s = l->stats();
      sum.bytes_sent += s.bytes_sent;
      sum.bytes_received += s.bytes_received;
      sum.messages_sent += s.messages_sent;
      sum.messages_received += s.messages_received;
    }
    return sum;
  }

 private:
  static ByteView stripe(ByteView all, std::size_t i, std::size_t k) {
    const std::size_t base = all.size() / k, extra = all.size() % k;
    const std::size_t begin = i * base + std::min(i, extra);
    return all.subspan(begin, base + (i < extra ? 1 : 0));
  }

  Status checked(Status st) {
    if (!st.ok() && st.code() != ErrorCode::kTimeout) return fail_with(st).status();
    if (!st.ok()) close();  // a timed-out send left partial stripes behind
    return st;
  }

  Result<Bytes> fail_with(Status st) {
    close();
    return st;
  }

  std::mutex& tag_mutex(Tag tag) {
    std::lock_guard<std::mutex> lock(tags_mu_);
    auto& p = tag_mutexes_[tag];
    if (!p) p = std::make_unique<std::mutex>();
    return *p;
  }

  std::vector<std::shared_ptr<Link>> lanes_;
  StripeOptions options_;
  std::mutex send_mu_, tags_mu_;
  std::map<Tag, std::unique_ptr<std::mutex>> tag_mutexes_;
};

Bytes lane_message(std::uint64_t link_id, std::uint32_t index, std::uint32_t count) {
  Writer w(20);
  w.raw(as_bytes("LANE"));
  w.u64(link_id);
  w.u32(index);
  w.u32(count);
  return std::move(w).take();
}

}  // namespace

Result<std::shared_ptr<Link>> connect_striped(Transport& transport, const std::string& address, const StripeOptions& o, Deadline deadline) {
  if (o.lanes < 1 || o.lanes > kMaxLanes) return error(ErrorCode::kInvalidArgument, "lanes must be in [1, 64]");
  const std::uint64_t link_id = random_peer_id().value;  // any random 64-bit value will do
  std::vector<std::shared_ptr<Link>> lanes;
  for (std::size_t i = 0; i < o.lanes; ++i) {
    auto l = transport.connect(address, deadline);
    if (!l.ok()) {
      for (auto& done : lanes) done->close();
      return l.status().with_context("lane " + std::to_string(i));
    }
    if (Status st = (*l)->send(kLaneTag, lane_message(link_id, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(o.lanes)), deadline);
        !st.ok()) {
      (*l)->close();
      for (auto& done : lanes) done->close();
      return st.with_context("lane " + std::to_string(i));
    }
    lanes.push_back(*l);
  }
  return std::shared_ptr<Link>(std::make_shared<StripedLink>(std::move(lanes), o));
}

Result<std::shared_ptr<Link>> StripedAcceptor::accept(Deadline deadline) {
  for (;;) {
    auto l = transport_->accept(deadline);
    if (!l.ok()) return l.status();
    // A connection that does not announce its lane promptly is not a striped peer.
    const Deadline lane_deadline = Deadline::at(std::min(deadline.time(), real_clock().now() + std::chrono::seconds(5)));
    auto m = (*l)->recv(kLaneTag, lane_deadline);
    if (!m.ok()) {
      spdlog::warn("striped accept: dropping a connection from peer {}: no LANE message ({})", (*l)->peer().to_string(), m.status().message());
      (*l)->close();
      continue;
    }
    Reader r(*m, "LANE message");
    ByteView magic = r.raw(4);
    const std::uint64_t link_id = r.u64();
    const std::uint32_t index = r.u32(), count = r.u32();
    r.expect_end();
    if (!r.ok() || std::memcmp(magic.data(), "LANE", 4) != 0 || count < 1 || count > kMaxLanes || index >= count) {
      spdlog::warn("striped accept: dropping a connection from peer {}: bad LANE message", (*l)->peer().to_string());
      (*l)->close();
      continue;
    }
    Partial& p = partial_[{(*l)->peer().value, link_id}];
    if (p.count != 0 && p.count != count) {
      spdlog::warn("striped accept: peer {} announced inconsistent lane counts", (*l)->peer().to_string());
      (*l)->close();
      continue;
    }
    p.count = count;
    p.lanes[index] = *l;
    if (p.lanes.size() < count) continue;
    std::vector<std::shared_ptr<Link>> lanes;
    for (auto& [i, lane] : p.lanes) lanes.push_back(lane);
    partial_.erase({(*l)->peer().value, link_id});
    StripeOptions o = options_;
    o.lanes = count;
    return std::shared_ptr<Link>(std::make_shared<StripedLink>(std::move(lanes), o));
  }
}

}  // namespace gossamer::transport
