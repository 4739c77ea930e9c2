#include "transport/gossip.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>
#include <sodium.h>
#include <zmq.hpp>

#include "core/log.h"
#include "core/wire.h"
#include "transport/endpoint.h"

namespace gossamer::transport {

namespace {

// Gossip messages (little-endian, through core/wire):
//   magic "GSGP" | version u8 | type u8 | sender id u64 | sender address str
//   kTable:     count u32 | count x (id u64, address str, heartbeat u64, state u8)
//   kBroadcast: origin u64 | sequence u64 | hops u8 | topic str | payload blob
constexpr char kMagic[4] = {'G', 'S', 'G', 'P'};
constexpr std::uint8_t kVersion = 1;
enum class MsgType : std::uint8_t { kTable = 1, kBroadcast = 2 };
constexpr std::size_t kMaxAddress = 256, kMaxTopic = 64, kMaxPayload = 64 * 1024, kMaxMembers = 65536;
constexpr std::size_t kMaxMessage = 8 << 20;

using SteadyTime = std::chrono::steady_clock::time_point;

struct Entry {
  std::string address;
  std::uint64_t heartbeat = 0;
  bool left = false;
  SteadyTime changed;  // when the heartbeat last rose
};

struct Outgoing {
  std::string topic;
  Bytes payload;
};

class ZmqGossip final : public Gossip {
 public:
  explicit ZmqGossip(const GossipOptions& o) : options_(o), rng_(std::random_device{}()) {
    if (options_.self.value == 0) options_.self = random_peer_id();
  }

  ~ZmqGossip() override {
    leave();
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    sodium_memzero(curve_sk_.data(), curve_sk_.size());
  }

  Status start() {
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
      router_->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(kMaxMessage));  // libzmq drops larger ones
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
      address_ = router_->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return error(ErrorCode::kIoError, "gossip cannot bind " + options_.bind + ": " + e.what());
    }
    thread_ = std::thread([this] { loop(); });
    return Status();
  }

  PeerId self() const override { return options_.self; }
  std::string address() const override { return address_; }
  const std::string& announced() const { return options_.advertise.empty() ? address_ : options_.advertise; }

  std::vector<Member> members() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Member> out;
    const SteadyTime now = std::chrono::steady_clock::now();
    for (const auto& [id, e] : table_) out.push_back(Member{PeerId{id}, e.address, e.heartbeat, state_of(e, now)});
    return out;
  }

  std::vector<Member> sample(std::size_t k) override {
    std::vector<Member> live;
    for (auto& m : members()) {
      if (m.state == MemberState::kAlive) live.push_back(std::move(m));
    }
    std::lock_guard<std::mutex> lock(mu_);
    std::shuffle(live.begin(), live.end(), rng_);
    if (live.size() > k) live.resize(k);
    return live;
  }

  Status broadcast(const std::string& topic, ByteView payload) override {
    if (topic.size() > kMaxTopic) return error(ErrorCode::kInvalidArgument, "gossip topic longer than 64 bytes");
    if (payload.size() > kMaxPayload) return error(ErrorCode::kInvalidArgument, "gossip broadcasts are limited to 64 KiB");
    std::lock_guard<std::mutex> lock(mu_);
    if (left_) return error(ErrorCode::kAborted, "this node has left the gossip");
    outbox_.push_back(Outgoing{topic, Bytes(payload.begin(), payload.end())});
    return Status();
  }

  void subscribe(const std::string& topic, Handler handler) override {
    std::lock_guard<std::mutex> lock(mu_);
    handlers_[topic].push_back(std::move(handler));
  }

  void leave() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (left_ || !thread_.joinable()) return;
    leave_requested_ = true;
    left_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return left_; });
  }

  std::uint64_t dropped_messages() const override { return dropped_.load(); }

 private:
  MemberState state_of(const Entry& e, SteadyTime now) const {
    if (e.left) return MemberState::kLeft;
    const auto quiet = now - e.changed;
    if (quiet >= options_.dead_after) return MemberState::kDead;
    if (quiet >= options_.suspect_after) return MemberState::kSuspect;
    return MemberState::kAlive;
  }

  void write_header(Writer& w, MsgType type) {
    w.raw(as_bytes(std::string_view(kMagic, 4)));
    w.u8(kVersion);
    w.u8(static_cast<std::uint8_t>(type));
    w.u64(options_.self.value);
    w.str(announced());
  }

  // Under mu_.
  Bytes table_message(bool leaving) {
    Writer w;
    write_header(w, MsgType::kTable);
    w.u32(static_cast<std::uint32_t>(table_.size() + 1));
    w.u64(options_.self.value);
    w.str(announced());
    w.u64(heartbeat_);
    w.u8(leaving ? 1 : 0);
    for (const auto& [id, e] : table_) {
      w.u64(id);
      w.str(e.address);
      w.u64(e.heartbeat);
      w.u8(e.left ? 1 : 0);
    }
    return std::move(w).take();
  }

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

  void send_to(const std::string& address, const Bytes& message) {
    try {
      (void)dealer(address).send(zmq::buffer(message.data(), message.size()), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      spdlog::debug("gossip: cannot send to {}: {}", address, e.what());
    }
  }

  // Live peers' addresses, at most k, at random (under mu_).
  std::vector<std::string> random_live(std::size_t k, SteadyTime now) {
    std::vector<std::string> live;
    for (const auto& [id, e] : table_) {
      if (state_of(e, now) == MemberState::kAlive) live.push_back(e.address);
    }
    std::shuffle(live.begin(), live.end(), rng_);
    if (live.size() > k) live.resize(k);
    return live;
  }

  // Turns queued broadcasts into rumors (under mu_); with `sends`, also sends each to `fanout`
  // random live peers now instead of at the next tick.
  void take_outbox_locked(std::vector<std::pair<std::string, Bytes>>* sends, SteadyTime now) {
    while (!outbox_.empty()) {
      Outgoing o = std::move(outbox_.front());
      outbox_.pop_front();
      const std::uint64_t seq = ++broadcast_seq_;
      seen_.insert({options_.self.value, seq});
      deliver_locked(options_.self, o.topic, o.payload);
      rumors_.push_back(Rumor{broadcast_message(options_.self.value, seq, 0, o.topic, o.payload), kRumorRounds});
      if (sends != nullptr) {
        for (auto& t : random_live(static_cast<std::size_t>(options_.fanout), now)) sends->emplace_back(t, rumors_.back().message);
      }
    }
  }

  void tick() {
    std::vector<std::pair<std::string, Bytes>> sends;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const SteadyTime now = std::chrono::steady_clock::now();
      ++heartbeat_;
      const Bytes table = table_message(false);
      auto targets = random_live(static_cast<std::size_t>(options_.fanout), now);
      if (targets.empty()) targets = options_.seeds;
      for (auto& t : targets) sends.emplace_back(t, table);
      take_outbox_locked(nullptr, now);
      // Every live rumor goes to `fanout` random peers for a few periods, so it survives lost
      // messages and peers that join late.
      for (auto& rumor : rumors_) {
        for (auto& t : random_live(static_cast<std::size_t>(options_.fanout), now)) sends.emplace_back(t, rumor.message);
        --rumor.rounds_left;
      }
      std::erase_if(rumors_, [](const Rumor& r) { return r.rounds_left <= 0; });
    }
    for (auto& [to, m] : sends) send_to(to, m);
    flush_deliveries();
  }

  Bytes broadcast_message(std::uint64_t origin, std::uint64_t seq, std::uint8_t hops, const std::string& topic, ByteView payload) {
    Writer w;
    write_header(w, MsgType::kBroadcast);
    w.u64(origin);
    w.u64(seq);
    w.u8(hops);
    w.str(topic);
    w.blob(payload);
    return std::move(w).take();
  }

  // Queues a delivery (under mu_); handlers run from flush_deliveries(), outside the lock, so they may
  // call back into this Gossip.
  void deliver_locked(PeerId origin, const std::string& topic, const Bytes& payload) {
    auto it = handlers_.find(topic);
    if (it == handlers_.end()) return;
    for (auto& h : it->second) deliveries_.push_back(Delivery{h, origin, payload});
  }

  void flush_deliveries() {
    std::vector<Delivery> now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      now.swap(deliveries_);
    }
    for (auto& d : now) d.handler(d.origin, d.payload);
  }

  void drop(const std::string& why) {
    dropped_.fetch_add(1);
    if (drop_log_.allow()) spdlog::warn("gossip: dropped a message: {}", why);
  }

  void handle(ByteView data, const std::string& observed_ip) {
    Reader r(data, "gossip message");
    ByteView magic = r.raw(4);
    if (!r.ok() || std::memcmp(magic.data(), kMagic, 4) != 0) return drop("not a Gossamer gossip message");
    const std::uint8_t version = r.u8(), type = r.u8();
    const std::uint64_t sender = r.u64();
    const std::string sender_address = r.str(kMaxAddress);
    if (!r.ok()) return drop(r.status().message());
    if (version != kVersion) return drop("gossip version " + std::to_string(version) + " (we speak " + std::to_string(kVersion) + ")");
    if (sender == options_.self.value) return;
    std::vector<std::pair<std::string, Bytes>> sends;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const SteadyTime now = std::chrono::steady_clock::now();
      if (type == static_cast<std::uint8_t>(MsgType::kTable)) {
        const std::uint32_t n = r.u32();
        if (r.ok() && n > kMaxMembers) return drop("member table of " + std::to_string(n) + " entries");
        struct Row {
          std::uint64_t id;
          std::string address;
          std::uint64_t heartbeat;
          std::uint8_t left;
        };
        std::vector<Row> rows;
        for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
          Row row;
          row.id = r.u64();
          row.address = r.str(kMaxAddress);
          row.heartbeat = r.u64();
          row.left = r.u8();
          rows.push_back(std::move(row));
        }
        r.expect_end();
        if (!r.ok()) return drop(r.status().message());
        for (auto& row : rows) {
          if (row.id == options_.self.value || row.id == 0 || row.left > 1) continue;
          if (is_wildcard_address(row.address)) {
            // A peer listening on every address announces a wildcard: its own row takes the IP its
            // messages come from; another's is left until a peer that heard it directly relays it.
            // From this very host (a loopback IP) the wildcard itself reaches it, and is kept as it
            // is: a loopback address relayed to other hosts would send them to themselves.
            if (row.id != sender || observed_ip.empty()) continue;
            if (!is_loopback_ip(observed_ip)) row.address = with_host(row.address, observed_ip);
          }
          auto [it, fresh] = table_.try_emplace(row.id);
          Entry& e = it->second;
          if (fresh || row.heartbeat > e.heartbeat) {
            e.address = row.address;
            e.heartbeat = row.heartbeat;
            e.changed = now;
            if (row.left == 1 && !e.left) spdlog::info("gossip: peer {} left", PeerId{row.id}.to_string());
            e.left = row.left == 1;
          }
        }
      } else if (type == static_cast<std::uint8_t>(MsgType::kBroadcast)) {
        const std::uint64_t origin = r.u64(), seq = r.u64();
        const std::uint8_t hops = r.u8();
        const std::string topic = r.str(kMaxTopic);
        ByteView payload = r.blob(kMaxPayload);
        r.expect_end();
        if (!r.ok()) return drop(r.status().message());
        if (!seen_.insert({origin, seq}).second) return;  // already delivered
        const Bytes body(payload.begin(), payload.end());
        deliver_locked(PeerId{origin}, topic, body);
        if (hops + 1 < options_.max_hops) {
          Rumor rumor{broadcast_message(origin, seq, static_cast<std::uint8_t>(hops + 1), topic, body), kRumorRounds};
          for (auto& t : random_live(static_cast<std::size_t>(options_.fanout), now)) sends.emplace_back(t, rumor.message);
          rumors_.push_back(std::move(rumor));
        }
      } else {
        return drop("unknown gossip message type " + std::to_string(type));
      }
    }
    (void)sender_address;  // the sender's own table row carries its address (and heartbeat)
    for (auto& [to, m] : sends) send_to(to, m);
    flush_deliveries();
  }

  void loop() {
    auto next_tick = std::chrono::steady_clock::now();
    const auto wake = std::max<Nanos>(std::chrono::milliseconds(5), options_.period / 4);
    while (!stop_) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (leave_requested_ && !left_) {
          // Goodbye to every live member, directly; the higher heartbeat makes it win every merge.
          ++heartbeat_;
          const Bytes bye = table_message(true);
          auto targets = random_live(table_.size(), std::chrono::steady_clock::now());
          lock.unlock();
          for (auto& t : targets) send_to(t, bye);
          lock.lock();
          left_ = true;
          left_cv_.notify_all();
        }
        if (left_) {
          lock.unlock();
          std::this_thread::sleep_for(wake);
          continue;
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_tick) {
        tick();
        next_tick = now + options_.period;
      } else {
        // A broadcast leaves within a poll interval, not a whole period.
        std::vector<std::pair<std::string, Bytes>> sends;
        {
          std::lock_guard<std::mutex> lock(mu_);
          take_outbox_locked(&sends, now);
        }
        for (auto& [to, m] : sends) send_to(to, m);
        flush_deliveries();
      }
      std::vector<zmq::pollitem_t> items = {{router_->handle(), 0, ZMQ_POLLIN, 0}};
      const std::size_t zap_at = items.size();
      if (zap_) items.push_back({zap_->handle(), 0, ZMQ_POLLIN, 0});
      const std::size_t monitor_at = items.size();
      if (monitor_) items.push_back({monitor_->handle(), 0, ZMQ_POLLIN, 0});
      try {
        zmq::poll(items, std::chrono::duration_cast<std::chrono::milliseconds>(wake));
        if (zap_ && (items[zap_at].revents & ZMQ_POLLIN)) answer_zap();
        if (monitor_ && (items[monitor_at].revents & ZMQ_POLLIN)) read_monitor();
        check_isolation();
        while (items[0].revents & ZMQ_POLLIN) {
          zmq::message_t identity, body;
          if (!router_->recv(identity, zmq::recv_flags::dontwait)) break;
          if (!identity.more()) continue;
          if (!router_->recv(body, zmq::recv_flags::dontwait)) break;
          while (body.more()) {  // a well-behaved peer sends one frame; discard any extra ones
            zmq::message_t extra;
            if (!router_->recv(extra, zmq::recv_flags::dontwait)) break;
            body = std::move(extra);
            drop("multi-frame gossip message");
          }
          // The IP the sender's connection comes from: where a peer that listens on a wildcard
          // address (0.0.0.0, [::]) can be reached.
          const char* observed = zmq_msg_gets(body.handle(), "Peer-Address");
          handle(ByteView(static_cast<const std::byte*>(body.data()), body.size()), observed != nullptr ? std::string(observed) : std::string());
        }
      } catch (const zmq::error_t& e) {
        spdlog::warn("gossip: {}", e.what());
      }
    }
    dealers_.clear();
    if (router_ && monitor_) zmq_socket_monitor(router_->handle(), nullptr, 0);
    monitor_.reset();
    router_.reset();
    zap_.reset();
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
      dropped_.fetch_add(1);
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
    dropped_.fetch_add(1);
    // A refused peer retries every few hundred milliseconds: say it once per 10 s, with a count.
    ++refusals_since_log_;
    const SteadyTime now = std::chrono::steady_clock::now();
    if (now - last_refusal_log_ < std::chrono::seconds(10)) return;
    spdlog::warn("gossip: refused {} connection attempt(s) on {}: security handshake failed (a peer without this run's key, or an insecure one?)",
                 refusals_since_log_, endpoint.to_string());
    refusals_since_log_ = 0;
    last_refusal_log_ = now;
  }

  // The refused side learns nothing from ZeroMQ: say so when nobody has answered for a while.
  void check_isolation() {
    std::lock_guard<std::mutex> lock(mu_);
    if (warned_isolated_ || !table_.empty() || options_.seeds.empty()) return;
    if (std::chrono::steady_clock::now() - started_ < std::max<Nanos>(std::chrono::seconds(2), 10 * options_.period)) return;
    warned_isolated_ = true;
    spdlog::warn("gossip: no peer has answered yet (seeds: {}): check the seed addresses and that every peer uses the same --key",
                 options_.seeds.front());
  }

  GossipOptions options_;
  zmq::context_t ctx_;
  std::unique_ptr<zmq::socket_t> router_;  // owned by the gossip thread after start(), as are the others
  std::unique_ptr<zmq::socket_t> zap_, monitor_;
  std::array<std::uint8_t, 32> curve_pk_{}, curve_sk_{};
  SteadyTime started_ = std::chrono::steady_clock::now();
  bool warned_isolated_ = false;
  SteadyTime last_refusal_log_{};
  std::uint64_t refusals_since_log_ = 0;
  std::map<std::string, std::unique_ptr<zmq::socket_t>> dealers_;
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> dropped_{0};
  // Anyone on the network can send junk or knock with a wrong key: bounded log lines for both.
  LogLimiter drop_log_{"gossip: dropped messages"};
  LogLimiter refusal_log_{"gossip: refused peers without this run's key"};

  mutable std::mutex mu_;
  std::condition_variable left_cv_;
  std::map<std::uint64_t, Entry> table_;
  std::uint64_t heartbeat_ = 0;
  std::uint64_t broadcast_seq_ = 0;
  std::set<std::pair<std::uint64_t, std::uint64_t>> seen_;
  std::deque<Outgoing> outbox_;
  struct Rumor {
    Bytes message;
    int rounds_left;
  };
  static constexpr int kRumorRounds = 3;
  std::vector<Rumor> rumors_;
  std::map<std::string, std::vector<Handler>> handlers_;
  struct Delivery {
    Handler handler;
    PeerId origin;
    Bytes payload;
  };
  std::vector<Delivery> deliveries_;
  std::mt19937_64 rng_;
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
