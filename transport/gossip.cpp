#include "transport/gossip.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>
#include <sodium.h>
#include <zmq.hpp>

#include "core/log.h"
#include "transport/gossip_core.h"

namespace gossamer::transport {

namespace {

constexpr std::size_t kMaxMessage = 8 << 20;

using SteadyTime = std::chrono::steady_clock::time_point;

// The ZeroMQ and CURVE plumbing around a GossipCore (gossip_core.h), which decides what to send.
class ZmqGossip final : public Gossip {
 public:
  explicit ZmqGossip(const GossipOptions& o) : options_(o) {
    if (options_.self.value == 0) options_.self = random_peer_id();
  }

  ~ZmqGossip() override {
    leave();
    stop_ = true;
    if (thread_.joinable()) thread_.join();
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
      bound = router_->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return error(ErrorCode::kIoError, "gossip cannot bind " + options_.bind + ": " + e.what());
    }
    core_ = std::make_unique<GossipCore>(options_, bound, real_clock(), std::random_device{}());
    thread_ = std::thread([this] { loop(); });
    return Status();
  }

  PeerId self() const override { return options_.self; }
  std::string address() const override { return core_->bound(); }
  std::vector<Member> members() const override { return core_->members(); }
  std::vector<Member> sample(std::size_t k) override { return core_->sample(k); }
  Status broadcast(const std::string& topic, ByteView payload) override { return core_->broadcast(topic, payload); }
  void subscribe(const std::string& topic, Handler handler) override { core_->subscribe(topic, std::move(handler)); }

  void leave() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (left_ || !thread_.joinable()) return;
    leave_requested_ = true;
    left_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return left_; });
  }

  std::uint64_t dropped_messages() const override { return core_->dropped() + refused_.load(); }
  std::pair<std::uint64_t, std::uint64_t> bytes() const override { return core_->bytes(); }

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

  void send_all(const std::vector<GossipSend>& sends) {
    for (const auto& s : sends) {
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
          std::this_thread::sleep_for(wake);
          continue;
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_tick) {
        send_all(core_->tick());
        next_tick = now + options_.period;
      } else {
        send_all(core_->take_broadcasts());  // a broadcast leaves within a poll interval, not a whole period
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
            core_->count_drop("multi-frame gossip message");
          }
          // The IP the sender's connection comes from: where a peer that listens on a wildcard
          // address (0.0.0.0, [::]) can be reached.
          const char* observed = zmq_msg_gets(body.handle(), "Peer-Address");
          send_all(core_->handle(ByteView(static_cast<const std::byte*>(body.data()), body.size()),
                                 observed != nullptr ? std::string(observed) : std::string()));
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

  // The refused side learns nothing from ZeroMQ: say so when nobody has answered for a while.
  void check_isolation() {
    if (warned_isolated_ || core_->knows_anyone() || options_.seeds.empty()) return;
    if (std::chrono::steady_clock::now() - started_ < std::max<Nanos>(std::chrono::seconds(2), 10 * options_.period)) return;
    warned_isolated_ = true;
    spdlog::warn("gossip: no peer has answered yet (seeds: {}): check the seed addresses and that every peer uses the same --key",
                 options_.seeds.front());
  }

  GossipOptions options_;
  std::unique_ptr<GossipCore> core_;  // made by start(); thread-safe
  zmq::context_t ctx_;
  std::unique_ptr<zmq::socket_t> router_;  // owned by the gossip thread after start(), as are the others
  std::unique_ptr<zmq::socket_t> zap_, monitor_;
  std::array<std::uint8_t, 32> curve_pk_{}, curve_sk_{};
  SteadyTime started_ = std::chrono::steady_clock::now();
  bool warned_isolated_ = false;  // the gossip thread's, as are the next two
  SteadyTime last_refusal_log_{};
  std::uint64_t refusals_since_log_ = 0;
  std::map<std::string, std::unique_ptr<zmq::socket_t>> dealers_;
  std::thread thread_;
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
