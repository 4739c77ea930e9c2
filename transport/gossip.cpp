#include "transport/gossip.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>
#include <sodium.h>
#include <zmq.hpp>

#include "core/log.h"
#include "transport/gossip_core.h"
#include "transport/link_model.h"
#include "transport/reach_probe.h"

namespace gossamer::transport {

namespace {

constexpr std::size_t kMaxMessage = 8 << 20;

using SteadyTime = std::chrono::steady_clock::time_point;

// The ZeroMQ and CURVE plumbing around a GossipCore (gossip_core.h), which decides what to send.
class ZmqGossip final : public Gossip {
 public:
  explicit ZmqGossip(const GossipOptions& o) : options_(o) {
    if (options_.self.value == 0) options_.self = random_peer_id();
    if (options_.shape) shaped_.emplace(*options_.shape, options_.self.value);
  }

  ~ZmqGossip() override {
    leave();
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    {
      std::lock_guard<std::mutex> lock(probe_mu_);
      probe_cv_.notify_all();
    }
    for (auto& t : probers_) {
      if (t.joinable()) t.join();
    }
    sodium_memzero(curve_sk_.data(), curve_sk_.size());
  }

  Status start() {
    std::string bound;
    try {
      if (options_.key) {
        // One CURVE keypair per run, derived from the run key: every member holds it, nobody else can.
        std::array<std::uint8_t, 32> seed{};
        static constexpr char kLabel[] = "gossamer-gossip-curve-v1";
        crypto_generichash(seed.data(), seed.size(), reinterpret_cast<const unsigned char*>(kLabel), sizeof(kLabel) - 1,
                           options_.key->bytes.data(), options_.key->bytes.size());
        crypto_box_seed_keypair(curve_pk_.data(), curve_sk_.data(), seed.data());
        sodium_memzero(seed.data(), seed.size());
        // ZAP: libzmq asks this socket to admit each CURVE client; we admit only the run's key.
        zap_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::rep);
        zap_->set(zmq::sockopt::linger, 0);
        zap_->bind("inproc://zeromq.zap.01");
      }
      router_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::router);
      router_->set(zmq::sockopt::linger, 0);
      // A reply to a member that went away fails at once (EHOSTUNREACH) instead of vanishing.
      router_->set(zmq::sockopt::router_mandatory, 1);
      router_->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(kMaxMessage));  // libzmq drops larger ones
      // A connection that has not finished ZeroMQ's handshake in 5 s is dropped (junk held open).
      router_->set(zmq::sockopt::handshake_ivl, 5000);
      if (options_.key) {
        router_->set(zmq::sockopt::curve_server, 1);
        router_->set(zmq::sockopt::curve_secretkey, zmq::const_buffer(curve_sk_.data(), curve_sk_.size()));
        router_->set(zmq::sockopt::zap_domain, "gossamer");
      }
      const std::string monitor = "inproc://gossip-monitor-" + options_.self.to_string();
      if (zmq_socket_monitor(router_->handle(), monitor.c_str(),
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0) {
        monitor_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
        monitor_->set(zmq::sockopt::linger, 0);
        monitor_->connect(monitor);
      }
      // IPv6 only when asked for: with it on, ZeroMQ reports a 0.0.0.0 binding as [::ffff:0.0.0.0].
      if (options_.bind.find('[') != std::string::npos) router_->set(zmq::sockopt::ipv6, 1);
      router_->bind(options_.bind);
      bound = router_->get(zmq::sockopt::last_endpoint);
      // What callers queue (a direct message, a broadcast) wakes the gossip thread at once.
      const std::string wake = "inproc://gossip-wake-" + options_.self.to_string();
      wake_rx_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
      wake_rx_->set(zmq::sockopt::linger, 0);
      wake_rx_->bind(wake);
      wake_tx_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
      wake_tx_->set(zmq::sockopt::linger, 0);
      wake_tx_->connect(wake);
    } catch (const zmq::error_t& e) {
      return error(ErrorCode::kIoError, "gossip cannot bind " + options_.bind + ": " + e.what());
    }
    core_ = std::make_unique<GossipCore>(options_, bound, real_clock(), std::random_device{}());
    thread_ = std::thread([this] { loop(); });
    for (auto& t : probers_) t = std::thread([this] { probe_loop(); });
    return Status();
  }

  PeerId self() const override { return options_.self; }
  std::string address() const override { return core_->bound(); }
  std::vector<Member> members() const override { return core_->members(); }
  std::uint64_t members_version() const override { return core_->members_version(); }
  std::vector<Member> sample(std::size_t k) override { return core_->sample(k); }
  Status broadcast(const std::string& topic, ByteView payload) override { return woken(core_->broadcast(topic, payload)); }
  Status send(PeerId to, const std::string& topic, ByteView payload) override { return woken(core_->send(to, topic, payload)); }
  void subscribe(const std::string& topic, Handler handler) override { core_->subscribe(topic, std::move(handler)); }

  void leave() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (left_ || !thread_.joinable()) return;
    leave_requested_ = true;
    left_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return left_; });
  }

  std::uint64_t dropped_messages() const override { return core_->dropped() + refused_.load(); }
  std::pair<std::uint64_t, std::uint64_t> bytes() const override { return core_->bytes(); }
  std::uint64_t membership_bytes_sent() const override { return core_->membership_bytes_sent(); }
  std::optional<Nanos> round_trip() const override { return core_->round_trip(); }

  Status set_outbound_only(bool outbound_only) override {
    core_->set_outbound_only(outbound_only);
    return Status();
  }

  Result<Reachability> check_reachable(const std::vector<std::string>& addresses, Deadline deadline, const std::atomic<bool>* stop) override {
    if (addresses.empty() || addresses.size() > kMaxReachAddresses) {
      return error(ErrorCode::kInvalidArgument, "a dial-back check names 1 to " + std::to_string(kMaxReachAddresses) + " addresses");
    }
    std::vector<Member> helpers;
    for (auto& m : core_->members()) {
      if (m.state == MemberState::kAlive && !m.outbound_only) helpers.push_back(std::move(m));
    }
    std::shuffle(helpers.begin(), helpers.end(), std::mt19937_64(std::random_device{}()));
    // A node nobody can reach hears from no one until it is known to be outbound-only: its seeds are
    // then the members to ask (they answer through the connection the request came on).
    if (helpers.empty()) {
      for (const auto& seed : options_.seeds) helpers.push_back(Member{PeerId{}, seed, 0, MemberState::kAlive, false});
    }
    if (helpers.size() > 3) helpers.resize(3);
    if (helpers.empty()) return error(ErrorCode::kUnavailable, "no member that accepts connections is known yet to dial this peer back");
    // Asked of up to three members at once (one may have died a moment ago): the first answer counts.
    ReachRequest request;
    request.nonce = random_peer_id().value;
    request.requester = options_.self;
    request.addresses = addresses;
    const Bytes message = encode_reach_request(request);
    std::unique_lock<std::mutex> lock(probe_mu_);
    waiting_nonces_.insert(request.nonce);
    ++checking_;
    struct Done {
      std::atomic<int>& n;
      ~Done() { --n; }
    } done{checking_};
    for (const Member& helper : helpers) requests_out_.emplace_back(helper.address, message);
    // Each helper dials the addresses one after another, with a 3 s timeout each.
    const auto until = std::min(deadline.steady_time(), std::chrono::steady_clock::now() + std::chrono::seconds(3 * addresses.size() + 4));
    const auto stopped = [&] { return stop != nullptr && stop->load(); };
    while (!stop_ && !stopped() && answers_in_.count(request.nonce) == 0 && std::chrono::steady_clock::now() < until) {
      probe_cv_.wait_until(lock, std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
    }
    waiting_nonces_.erase(request.nonce);
    if (stopped()) {
      answers_in_.erase(request.nonce);
      answer_from_.erase(request.nonce);
      return error(ErrorCode::kAborted, "stop requested during the dial-back check");
    }
    auto it = answers_in_.find(request.nonce);
    if (it != answers_in_.end()) {
      ReachAnswer answer = std::move(it->second);
      answers_in_.erase(it);
      if (answer.results.size() == addresses.size()) {
        Reachability out;
        out.helper = answer_from_.count(request.nonce) == 1 ? answer_from_[request.nonce] : std::string();
        answer_from_.erase(request.nonce);
        out.observed_ip = answer.observed_ip;
        out.reachable = true;
        for (std::size_t i = 0; i < addresses.size(); ++i) {
          const ReachResult& res = answer.results[i];
          if (res.outcome == ReachOutcome::kUnchecked) out.unchecked.push_back(addresses[i] + " (" + res.detail + ")");
          if (res.outcome != ReachOutcome::kUnreached) continue;
          out.reachable = false;
          out.failed.push_back(addresses[i] + " (" + res.detail + ")");
        }
        return out;
      }
    }
    answer_from_.erase(request.nonce);
    return error(ErrorCode::kUnavailable, "no member answered the dial-back check in time");
  }

 private:
  // One dial-back job: the request, who asked (its ROUTER identity) and from which IP.
  struct ProbeJob {
    Bytes identity;
    ReachRequest request;
    std::string observed_ip;
  };
  static constexpr std::size_t kMaxProbeJobs = 8;  // queued dial-back requests; more are dropped

  // The prober thread: dials the addresses of each queued request in turn (blocking connects, off
  // the gossip thread) and queues the answer for the gossip thread to send.
  void probe_loop() {
    for (;;) {
      ProbeJob job;
      {
        std::unique_lock<std::mutex> lock(probe_mu_);
        probe_cv_.wait(lock, [&] { return stop_.load() || !probe_jobs_.empty(); });
        if (stop_) return;
        job = std::move(probe_jobs_.front());
        probe_jobs_.pop_front();
      }
      ReachAnswer answer;
      answer.nonce = job.request.nonce;
      answer.observed_ip = job.observed_ip;
      for (const auto& address : job.request.addresses) {
        ReachResult res;
        auto target = reach_target(address, job.observed_ip);
        Status st = target.ok() ? probe_tcp(*target, std::chrono::seconds(3)) : target.status();
        res.outcome = st.ok() ? ReachOutcome::kReached : target.ok() ? ReachOutcome::kUnreached : ReachOutcome::kUnchecked;
        if (!st.ok()) res.detail = (target.ok() ? *target + ": " : std::string()) + st.message();
        answer.results.push_back(std::move(res));
      }
      std::lock_guard<std::mutex> lock(probe_mu_);
      answers_out_.emplace_back(std::move(job.identity), encode_reach_answer(answer));
    }
  }

  // A dial-back message (on the gossip thread); `identity` is empty for one that came on a DEALER.
  void on_reach_message(ReachType type, ByteView body, const Bytes& identity, const std::string& observed, const std::string& from) {
    if (type == ReachType::kRequest) {
      auto request = decode_reach_request(body);
      if (!request.ok() || identity.empty()) return core_->count_drop(request.ok() ? "dial-back request on a reply path" : request.status().message());
      std::lock_guard<std::mutex> lock(probe_mu_);
      if (core_->outbound_only()) return core_->count_drop("dial-back request to an outbound-only peer");
      if (probe_jobs_.size() >= kMaxProbeJobs) return core_->count_drop("dial-back queue full");
      probe_jobs_.push_back(ProbeJob{identity, std::move(*request), observed});
      probe_cv_.notify_all();
      return;
    }
    auto answer = decode_reach_answer(body);
    if (!answer.ok() || !identity.empty()) return core_->count_drop(answer.ok() ? "dial-back answer on a request path" : answer.status().message());
    std::lock_guard<std::mutex> lock(probe_mu_);
    // Only an answer to a check under way, and its first one.
    if (waiting_nonces_.count(answer->nonce) == 0 || answers_in_.count(answer->nonce) == 1) return;
    answer_from_[answer->nonce] = from;
    answers_in_[answer->nonce] = std::move(*answer);
    probe_cv_.notify_all();
  }

  // The dial-back messages queued by other threads (gossip thread).
  void flush_probe_messages() {
    std::deque<std::pair<std::string, Bytes>> requests;
    std::deque<std::pair<Bytes, Bytes>> answers;
    {
      std::lock_guard<std::mutex> lock(probe_mu_);
      requests.swap(requests_out_);
      answers.swap(answers_out_);
    }
    for (auto& [address, message] : requests) {
      try {
        (void)dealer(address).send(zmq::buffer(message.data(), message.size()), zmq::send_flags::dontwait);
      } catch (const zmq::error_t& e) {
        spdlog::debug("gossip: cannot send a dial-back request to {}: {}", address, e.what());
      }
    }
    for (auto& [identity, message] : answers) send_routed(identity, message);
  }

  // Sends through the ROUTER to the connection `identity` names; false when it is gone.
  bool send_routed(const Bytes& identity, const Bytes& message) {
    try {
      if (!router_->send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
      return router_->send(zmq::buffer(message.data(), message.size()), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t& e) {
      spdlog::debug("gossip: cannot answer through a member's connection: {}", e.what());
      return false;
    }
  }

  // A message from the network (gossip thread): a dial-back one, or the core's.
  // `from`: the gossip address of the DEALER's other end, for a message that came on one.
  void receive(const zmq::message_t& body, const Bytes& identity, const std::string& from = std::string()) {
    // The IP the sender's connection comes from: where a peer that listens on a wildcard
    // address (0.0.0.0, [::]) can be reached.
    const char* observed_c = zmq_msg_gets(body.handle(), "Peer-Address");
    const std::string observed = observed_c != nullptr ? std::string(observed_c) : std::string();
    const ByteView bytes(static_cast<const std::byte*>(body.data()), body.size());
    if (const ReachType type = reach_type(bytes); type != ReachType::kNone) return on_reach_message(type, bytes, identity, observed, from);
    // Who opened this connection (the sender field of a gossip header): where replies to an
    // outbound-only member go. A sender could claim another's id and draw that member's replies to
    // itself until the member's own next message sets the route back; with a key, only members can.
    if (!identity.empty() && bytes.size() >= 14 && std::memcmp(bytes.data(), "GSGP", 4) == 0) {
      std::uint64_t sender = 0;
      std::memcpy(&sender, bytes.data() + 6, sizeof(sender));
      if (routes_.size() < options_.max_members || routes_.count(sender) == 1) routes_[sender] = identity;
    }
    send_all(core_->handle(bytes, observed));
  }

 private:
  zmq::socket_t& dealer(const std::string& address) {
    auto it = dealers_.find(address);
    if (it != dealers_.end()) return *it->second;
    auto s = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    s->set(zmq::sockopt::linger, 200);
    s->set(zmq::sockopt::sndhwm, 1000);
    if (options_.key) {
      s->set(zmq::sockopt::curve_serverkey, zmq::const_buffer(curve_pk_.data(), curve_pk_.size()));
      s->set(zmq::sockopt::curve_publickey, zmq::const_buffer(curve_pk_.data(), curve_pk_.size()));
      s->set(zmq::sockopt::curve_secretkey, zmq::const_buffer(curve_sk_.data(), curve_sk_.size()));
    }
    if (address.find('[') != std::string::npos) s->set(zmq::sockopt::ipv6, 1);
    s->connect(address);
    return *dealers_.emplace(address, std::move(s)).first->second;
  }

  // Shaped (options_.shape): each message leaves once the emulated link has carried the ones before
  // it and its latency has passed; send_now() then sends it.
  void send_all(const std::vector<GossipSend>& sends) {
    if (!shaped_) return send_now(sends);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& s : sends) {
      if (delayed_.size() >= kMaxDelayed) {  // a link this slow drops what it cannot carry, as a full socket does
        if (++dropped_shaped_ % 1000 == 1) spdlog::warn("gossip: the shaped link is {} messages behind: dropping ({} so far)", kMaxDelayed, dropped_shaped_);
        continue;
      }
      const LinkModel::Carried c = shaped_->carry(std::chrono::duration_cast<Nanos>(now.time_since_epoch()), s.message.size());
      const auto due = std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(c.due));
      delayed_.emplace_back(due, s);
    }
    core_->run_deliveries();
  }

  // Sends the shaped messages that are due; the time until the next one, if any.
  std::optional<std::chrono::steady_clock::duration> flush_delayed() {
    const auto now = std::chrono::steady_clock::now();
    std::vector<GossipSend> due;
    while (!delayed_.empty() && delayed_.front().first <= now) {
      due.push_back(std::move(delayed_.front().second));
      delayed_.pop_front();
    }
    if (!due.empty()) send_now(due);
    if (delayed_.empty()) return std::nullopt;
    return delayed_.front().first - now;
  }

  void send_now(const std::vector<GossipSend>& sends) {
    for (const auto& s : sends) {
      if (s.route.value != 0) {
        auto it = routes_.find(s.route.value);
        if (it != routes_.end() && !send_routed(it->second, s.message)) routes_.erase(it);
        continue;
      }
      try {
        (void)dealer(s.to).send(zmq::buffer(s.message.data(), s.message.size()), zmq::send_flags::dontwait);
      } catch (const zmq::error_t& e) {
        spdlog::debug("gossip: cannot send to {}: {}", s.to, e.what());
      }
    }
    core_->run_deliveries();
  }

  void loop() {
    auto next_tick = std::chrono::steady_clock::now();
    const auto wake = std::max<Nanos>(std::chrono::milliseconds(5), options_.period / 4);
    while (!stop_) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (leave_requested_ && !left_) {
          lock.unlock();
          send_all(core_->farewell());
          lock.lock();
          left_ = true;
          left_cv_.notify_all();
        }
        if (left_) {
          lock.unlock();
          (void)flush_delayed();  // a shaped farewell still leaves
          std::this_thread::sleep_for(wake);
          continue;
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_tick) {
        send_all(core_->tick());
        next_tick = now + options_.period;
      } else {
        send_all(core_->take_broadcasts());  // what callers queued leaves at once (they wake this thread)
      }
      flush_probe_messages();
      auto poll_for = std::chrono::duration_cast<std::chrono::steady_clock::duration>(wake);
      if (auto next = flush_delayed()) poll_for = std::max<std::chrono::steady_clock::duration>(std::min(poll_for, *next), std::chrono::milliseconds(1));
      std::vector<zmq::pollitem_t> items = {{router_->handle(), 0, ZMQ_POLLIN, 0}};
      const std::size_t zap_at = items.size();
      if (zap_) items.push_back({zap_->handle(), 0, ZMQ_POLLIN, 0});
      const std::size_t monitor_at = items.size();
      if (monitor_) items.push_back({monitor_->handle(), 0, ZMQ_POLLIN, 0});
      const std::size_t wake_at = items.size();
      items.push_back({wake_rx_->handle(), 0, ZMQ_POLLIN, 0});
      // Replies come back on our own connections too: from members that cannot dial this node
      // (it is outbound-only), and dial-back answers.
      const std::size_t dealers_at = items.size();
      std::vector<zmq::socket_t*> dealers;
      std::vector<const std::string*> dealer_addresses;
      for (auto& [address, d] : dealers_) {
        dealers.push_back(d.get());
        dealer_addresses.push_back(&address);
        items.push_back({d->handle(), 0, ZMQ_POLLIN, 0});
      }
      try {
        zmq::poll(items, std::chrono::duration_cast<std::chrono::milliseconds>(poll_for));
        if (zap_ && (items[zap_at].revents & ZMQ_POLLIN)) answer_zap();
        if (monitor_ && (items[monitor_at].revents & ZMQ_POLLIN)) read_monitor();
        if (items[wake_at].revents & ZMQ_POLLIN) {
          zmq::message_t m;
          while (wake_rx_->recv(m, zmq::recv_flags::dontwait)) {
          }
        }
        check_isolation();
        while (items[0].revents & ZMQ_POLLIN) {
          zmq::message_t identity, body;
          if (!router_->recv(identity, zmq::recv_flags::dontwait)) break;
          if (!identity.more()) continue;
          if (!router_->recv(body, zmq::recv_flags::dontwait)) break;
          if (!discard_extra_frames(*router_, body)) continue;
          receive(body, Bytes(static_cast<const std::byte*>(identity.data()), static_cast<const std::byte*>(identity.data()) + identity.size()));
        }
        for (std::size_t i = 0; i < dealers.size(); ++i) {
          if (!(items[dealers_at + i].revents & ZMQ_POLLIN)) continue;
          for (int n = 0; n < 64; ++n) {
            zmq::message_t body;
            if (!dealers[i]->recv(body, zmq::recv_flags::dontwait)) break;
            if (!discard_extra_frames(*dealers[i], body)) continue;
            receive(body, Bytes(), *dealer_addresses[i]);
          }
        }
      } catch (const zmq::error_t& e) {
        spdlog::warn("gossip: {}", e.what());
      }
    }
    dealers_.clear();
    if (router_ && monitor_) zmq_socket_monitor(router_->handle(), nullptr, 0);
    monitor_.reset();
    wake_rx_.reset();
    router_.reset();
    zap_.reset();
  }

  // A well-behaved peer sends one frame: any extra ones are read, counted and dropped. False when
  // the message was cut short.
  bool discard_extra_frames(zmq::socket_t& socket, zmq::message_t& body) {
    bool extra = false;
    while (body.more()) {
      zmq::message_t next;
      if (!socket.recv(next, zmq::recv_flags::dontwait)) return false;
      body = std::move(next);
      extra = true;
    }
    if (extra) core_->count_drop("multi-frame gossip message");
    return !extra;
  }

  // One ZAP request (RFC 27): admit a CURVE client only if its public key is the run's.
  void answer_zap() {
    std::vector<zmq::message_t> frames;
    for (;;) {
      zmq::message_t m;
      if (!zap_->recv(m, zmq::recv_flags::dontwait)) break;
      const bool more = m.more();
      frames.push_back(std::move(m));
      if (!more) break;
    }
    if (frames.size() < 6) return;
    const std::string address = frames[3].to_string();
    const bool curve = frames[5].to_string() == "CURVE";
    const bool ok = curve && frames.size() >= 7 && frames[6].size() == 32 && sodium_memcmp(frames[6].data(), curve_pk_.data(), 32) == 0;
    if (!ok) {
      refused_.fetch_add(1);
      if (refusal_log_.allow()) spdlog::warn("gossip: refused {}: it does not hold this run's key (check --key)", address);
    }
    const std::string code = ok ? "200" : "400", text = ok ? "OK" : "not a member of this run";
    zap_->send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(frames[1].data(), frames[1].size()), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(code), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(text), zmq::send_flags::sndmore);
    zap_->send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    zap_->send(zmq::str_buffer(""), zmq::send_flags::none);
  }

  // Handshake failures on our port: a peer with another key (or none) tried to talk to us.
  void read_monitor() {
    zmq::message_t event, endpoint;
    if (!monitor_->recv(event, zmq::recv_flags::dontwait)) return;
    if (event.more()) (void)monitor_->recv(endpoint, zmq::recv_flags::dontwait);
    // While this node's own dial-back check runs, a failed handshake is most likely the helper's
    // probe (a bare TCP connection): not counted as a refusal nor reported.
    if (checking_.load() > 0) return;
    refused_.fetch_add(1);
    // A refused peer retries every few hundred milliseconds: say it once per 10 s, with a count.
    ++refusals_since_log_;
    const SteadyTime now = std::chrono::steady_clock::now();
    if (now - last_refusal_log_ < std::chrono::seconds(10)) return;
    spdlog::warn("gossip: refused {} connection attempt(s) on {}: security handshake failed (a peer without this run's key, or an insecure one?)",
                 refusals_since_log_, endpoint.to_string());
    refusals_since_log_ = 0;
    last_refusal_log_ = now;
  }

  // Wakes the gossip thread when something was queued for it.
  Status woken(Status st) {
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(wake_mu_);
      try {
        (void)wake_tx_->send(zmq::const_buffer(nullptr, 0), zmq::send_flags::dontwait);  // full: it is awake anyway
      } catch (const zmq::error_t&) {
      }
    }
    return st;
  }

  // The refused side learns nothing from ZeroMQ: say so when nobody has answered for a while.
  void check_isolation() {
    if (warned_isolated_ || core_->knows_anyone() || options_.seeds.empty() || checking_.load() > 0) return;
    if (std::chrono::steady_clock::now() - started_ < std::max<Nanos>(std::chrono::seconds(2), 10 * options_.period)) return;
    warned_isolated_ = true;
    spdlog::warn("gossip: no peer has answered yet (seeds: {}): check the seed addresses and that every peer uses the same --key",
                 options_.seeds.front());
  }

  GossipOptions options_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, GossipSend>> delayed_;  // shaped, not yet due (gossip thread)
  std::optional<LinkModel> shaped_;  // options_.shape's (gossip thread)
  static constexpr std::size_t kMaxDelayed = 10000;
  std::uint64_t dropped_shaped_ = 0;
  std::unique_ptr<GossipCore> core_;  // made by start(); thread-safe
  zmq::context_t ctx_;
  std::unique_ptr<zmq::socket_t> router_;  // owned by the gossip thread after start(), as are the others
  std::unique_ptr<zmq::socket_t> zap_, monitor_, wake_rx_;
  std::mutex wake_mu_;
  std::unique_ptr<zmq::socket_t> wake_tx_;  // callers' end, under wake_mu_
  std::array<std::uint8_t, 32> curve_pk_{}, curve_sk_{};
  SteadyTime started_ = std::chrono::steady_clock::now();
  bool warned_isolated_ = false;  // the gossip thread's, as are the next two
  SteadyTime last_refusal_log_{};
  std::uint64_t refusals_since_log_ = 0;
  std::map<std::string, std::unique_ptr<zmq::socket_t>> dealers_;
  std::map<std::uint64_t, Bytes> routes_;  // member id -> ROUTER identity of the connection it opened
  std::thread thread_;
  std::array<std::thread, 4> probers_;  // dial-back checks run side by side
  // Dial-back checks: jobs for the prober, messages for the gossip thread to send, answers heard.
  std::mutex probe_mu_;
  std::condition_variable probe_cv_;
  std::deque<ProbeJob> probe_jobs_;
  std::deque<std::pair<std::string, Bytes>> requests_out_;  // (helper's gossip address, request)
  std::deque<std::pair<Bytes, Bytes>> answers_out_;         // (requester's identity, answer)
  std::map<std::uint64_t, ReachAnswer> answers_in_;          // by nonce
  std::map<std::uint64_t, std::string> answer_from_;         // who answered, by nonce
  std::set<std::uint64_t> waiting_nonces_;                   // checks under way
  std::atomic<int> checking_{0};                             // this node's own checks under way
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> refused_{0};  // handshakes refused (a wrong key, or none)
  // Anyone on the network can knock with a wrong key: bounded log lines.
  LogLimiter refusal_log_{"gossip: refused peers without this run's key"};

  std::mutex mu_;
  std::condition_variable left_cv_;
  bool leave_requested_ = false, left_ = false;
};

}  // namespace

Result<std::unique_ptr<Gossip>> make_gossip(const GossipOptions& options) {
  if (options.fanout < 1) return error(ErrorCode::kInvalidArgument, "gossip fanout must be >= 1");
  if (!(options.suspect_after < options.dead_after)) return error(ErrorCode::kInvalidArgument, "gossip suspect_after must be below dead_after");
  auto g = std::make_unique<ZmqGossip>(options);
  if (Status st = g->start(); !st.ok()) return st;
  return std::unique_ptr<Gossip>(std::move(g));
}

}  // namespace gossamer::transport
