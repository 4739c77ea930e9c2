#include "run/peer.h"

#include <torch/torch.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/file.h"
#include "core/hash.h"
#include "core/wire.h"
#include "optim/flat_params.h"
#include "run/coordinator.h"
#include "run/peer_links.h"
#include "run/state_sync.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/outer.h"
#include "train/run.h"
#include "train/worker.h"
#include "transport/gossip.h"
#include "transport/tcp_transport.h"

namespace gossamer::run {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr const char* kSpecTopic = "gossamer.spec";
constexpr const char* kStateTopic = "gossamer.state";
constexpr std::uint8_t kStateVersion = 1;
constexpr std::uint8_t kSpecVersion = 1;
constexpr std::size_t kMaxSpec = 60 * 1024;  // a gossip broadcast carries at most 64 KiB
constexpr Nanos kLinkTimeout = std::chrono::seconds(30);  // to link up a group's members

std::string zmq_address(const std::string& host_port) {
  return host_port.rfind("tcp://", 0) == 0 ? host_port : "tcp://" + host_port;
}

// The methods whose rounds a peer can agree on so far, and the period of their rounds.
Result<std::int64_t> round_period(const train::RunConfig& c) {
  if (c.outer.method == "diloco") return c.diloco.inner_steps;
  if (c.outer.method == "noloco") return c.noloco.inner_steps;
  return error(ErrorCode::kInvalidArgument, "outer.method = \"" + c.outer.method +
                                                "\": gossamer peer runs diloco and noloco across processes so far; use gossamer sim for the others");
}

// The run spec on the wire: version u8 | BLAKE2b-256 of the TOML u8[32] | TOML str | peers to wait
// for at the start u32 | the announcer's current round i64 (-1 before the start).
struct Spec {
  std::string toml;
  std::uint32_t wait_for = 1;
};

Bytes encode_spec(const Spec& spec, std::int64_t round) {
  Writer w;
  w.u8(kSpecVersion);
  const Digest d = digest_of(as_bytes(spec.toml));
  w.raw(ByteView(reinterpret_cast<const std::byte*>(d.bytes.data()), d.bytes.size()));
  w.str(spec.toml);
  w.u32(spec.wait_for);
  w.i64(round);
  return std::move(w).take();
}

// The run spec as peers repeat it: every second, from a thread of its own, once this peer holds it,
// with the round this peer is at.
class SpecAnnouncer {
 public:
  SpecAnnouncer(transport::Gossip& gossip, Spec spec, const std::atomic<std::int64_t>& round)
      : gossip_(gossip), spec_(std::move(spec)), round_(round) {
    thread_ = std::thread([this] {
      std::unique_lock lock(mu_);
      while (!stop_) {
        lock.unlock();
        (void)gossip_.broadcast(kSpecTopic, encode_spec(spec_, round_.load()));
        lock.lock();
        cv_.wait_for(lock, 1s, [&] { return stop_; });
      }
    });
  }
  ~SpecAnnouncer() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  transport::Gossip& gossip_;
  const Spec spec_;
  const std::atomic<std::int64_t>& round_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// What a peer hears of the run spec; shared with the gossip handler, which stays subscribed.
struct HeardSpec {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Spec> spec;
  std::int64_t latest_round = -1;  // the furthest round any announcer was at
  std::string last_problem;
};

std::shared_ptr<HeardSpec> listen_for_spec(transport::Gossip& gossip) {
  auto heard = std::make_shared<HeardSpec>();
  gossip.subscribe(kSpecTopic, [heard](transport::PeerId origin, const Bytes& payload) {
    Reader r(payload, "run spec from peer " + origin.to_string());
    const std::uint8_t version = r.u8();
    const ByteView hash = r.raw(32);
    std::string toml = r.str(kMaxSpec);
    const std::uint32_t wait_for = r.u32();
    const std::int64_t round = r.i64();
    r.expect_end();
    std::lock_guard lock(heard->mu);
    std::string problem;
    if (!r.ok()) {
      problem = r.status().to_string();
    } else if (version != kSpecVersion) {
      problem = "peer " + origin.to_string() + " announces a run spec of version " + std::to_string(version) + ", this peer reads " +
                std::to_string(kSpecVersion) + ": run the same gossamer version on every peer";
    } else if (std::memcmp(hash.data(), digest_of(as_bytes(toml)).bytes.data(), 32) != 0) {
      problem = "the run spec from peer " + origin.to_string() + " does not match its hash";
    } else {
      if (!heard->spec) heard->spec = Spec{std::move(toml), wait_for};
      heard->latest_round = std::max(heard->latest_round, round);
      heard->cv.notify_all();
      return;
    }
    if (problem != heard->last_problem) spdlog::warn("ignored a run spec: {}", problem);
    heard->last_problem = std::move(problem);
  });
  return heard;
}

// Waits for the run spec (kTimeout when nobody announces one).
Result<Spec> receive_spec(HeardSpec& heard, Nanos timeout) {
  std::unique_lock lock(heard.mu);
  if (!heard.cv.wait_for(lock, timeout, [&] { return heard.spec.has_value(); })) {
    return error(ErrorCode::kTimeout, "no run spec heard from the peers joined within " + std::to_string(timeout.count() / 1000000000) + " s" +
                                          (heard.last_problem.empty() ? std::string(": check the --join addresses (and that every peer has the same --key)")
                                                                      : ": " + heard.last_problem));
  }
  return *heard.spec;
}

// Newcomers and donors (topic "gossamer.state"): version u8 | kind u8 (1 JOIN, 2 OFFER) | id u64,
// then for OFFER: round i64 | link address str.
class JoinBoard {
 public:
  static std::shared_ptr<JoinBoard> make(transport::Gossip& gossip) {
    auto b = std::make_shared<JoinBoard>(gossip);
    gossip.subscribe(kStateTopic, [weak = std::weak_ptr<JoinBoard>(b)](transport::PeerId origin, const Bytes& payload) {
      if (auto self = weak.lock()) self->on_message(origin, payload);
    });
    return b;
  }
  explicit JoinBoard(transport::Gossip& gossip) : gossip_(gossip) {}

  void ask_to_join() { (void)gossip_.broadcast(kStateTopic, encode(1, 0, "")); }
  void offer(std::int64_t round, const std::string& address) { (void)gossip_.broadcast(kStateTopic, encode(2, round, address)); }
  // The newcomers asking for state in the last few seconds.
  std::vector<transport::PeerId> waiting() const {
    std::lock_guard lock(mu_);
    std::vector<transport::PeerId> ids;
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [id, until] : wanted_until_) {
      if (now < until) ids.push_back(id);
    }
    return ids;
  }
  // The newest round offered, with its donors, once it has been offered for `settle`.
  // The newest round offered for at least `settle` (so most donors of it are known), with its donors.
  std::optional<std::pair<std::int64_t, std::vector<Donor>>> newest_offer(Nanos settle) const {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = offers_.rbegin(); it != offers_.rend(); ++it) {
      if (now < first_seen_.at(it->first) + settle) continue;
      std::vector<Donor> out;
      for (const auto& [id, address] : it->second) out.push_back(Donor{address, id.to_string()});
      return std::make_pair(it->first, out);
    }
    return std::nullopt;
  }
  // Drops the offers of `round` and older (they failed, so older ones are gone too).
  void forget(std::int64_t round) {
    std::lock_guard lock(mu_);
    offers_.erase(offers_.begin(), offers_.upper_bound(round));
  }

 private:
  Bytes encode(std::uint8_t kind, std::int64_t round, const std::string& address) {
    Writer w;
    w.u8(kStateVersion);
    w.u8(kind);
    w.u64(gossip_.self().value);
    if (kind == 2) {
      w.i64(round);
      w.str(address);
    }
    return std::move(w).take();
  }
  void on_message(transport::PeerId origin, const Bytes& payload) {
    Reader r(payload, "state message from peer " + origin.to_string());
    const std::uint8_t version = r.u8(), kind = r.u8();
    const transport::PeerId id{r.u64()};
    std::int64_t round = 0;
    std::string address;
    if (kind == 2) {
      round = r.i64();
      address = r.str(256);
    }
    r.expect_end();
    if (!r.ok() || version != kStateVersion || (kind != 1 && kind != 2)) {
      spdlog::warn("dropped a state message from peer {}: {}", origin.to_string(), r.ok() ? "unknown version or kind" : r.status().to_string());
      return;
    }
    std::lock_guard lock(mu_);
    if (kind == 1) {
      wanted_until_[id] = std::chrono::steady_clock::now() + 5s;
    } else {
      offers_[round][id] = address;
      first_seen_.try_emplace(round, std::chrono::steady_clock::now());
    }
  }

  transport::Gossip& gossip_;
  mutable std::mutex mu_;
  std::map<transport::PeerId, std::chrono::steady_clock::time_point> wanted_until_;
  std::map<std::int64_t, std::map<transport::PeerId, std::string>> offers_;
  std::map<std::int64_t, std::chrono::steady_clock::time_point> first_seen_;
};

// A group of this peer alone (a round applied on its own).
optim::Group solo_group() {
  optim::Group g;
  g.peers.resize(1);
  return g;
}

// The state members share after a round: the parameters (fp32) and the outer optimizer's state.
Bytes encode_shared_state(const std::vector<at::Tensor>& params, const optim::OuterOptimizer& outer) {
  const at::Tensor flat = optim::flatten(params);
  Writer w;
  w.blob(ByteView(reinterpret_cast<const std::byte*>(flat.data_ptr<float>()), static_cast<std::size_t>(flat.numel()) * 4));
  w.blob(outer.save());
  return std::move(w).take();
}

Status load_shared_state(ByteView bytes, std::vector<at::Tensor> params, optim::OuterOptimizer& outer) {
  Reader r(bytes, "shared state");
  std::int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  const ByteView flat = r.blob(static_cast<std::size_t>(numel) * 4);
  const ByteView outer_state = r.blob(std::size_t{8} << 30);
  r.expect_end();
  if (!r.ok()) return r.status();
  if (flat.size() != static_cast<std::size_t>(numel) * 4) {
    return error(ErrorCode::kMalformed, "the shared state holds " + std::to_string(flat.size() / 4) + " parameters, this model has " +
                                            std::to_string(numel));
  }
  at::Tensor values = torch::empty({numel}, torch::kFloat);
  std::memcpy(values.data_ptr<float>(), flat.data(), flat.size());
  if (!torch::isfinite(values).all().item<bool>()) return error(ErrorCode::kMalformed, "the shared state holds non-finite parameters");
  if (Status st = outer.load(outer_state); !st.ok()) return st;
  optim::write_flat(params, values);
  return Status();
}

}  // namespace

std::string spec_hash_hex(const train::RunConfig& config) { return digest_of(as_bytes(train::to_toml(config))).hex(); }

Result<PeerOutcome> run_peer(const PeerRequest& req) {
  std::optional<train::CheckpointState> resumed;
  const fs::path ckpt_path = req.out_dir / train::kCheckpointFile;
  if (req.resume) {
    auto state = train::read_checkpoint(ckpt_path);
    if (!state.ok()) {
      if (state.status().code() == ErrorCode::kNotFound) {
        return error(ErrorCode::kInvalidArgument, "nothing to resume: " + ckpt_path.string() + " does not exist (drop --resume to start afresh)");
      }
      return state.status();
    }
    resumed = std::move(*state);
  } else if (fs::exists(ckpt_path)) {
    return error(ErrorCode::kInvalidArgument, "run folder " + req.out_dir.string() + " already holds a checkpoint: pass --resume to restart from it, or choose another --out");
  }
  if (req.join.empty() && !req.config && !resumed) {
    return error(ErrorCode::kInvalidArgument, "the first peer defines the run: pass --config (or --join the address of a running peer)");
  }
  std::error_code ec;
  fs::create_directories(req.out_dir, ec);
  if (ec) return error(ErrorCode::kIoError, "cannot create run folder " + req.out_dir.string() + ": " + ec.message());

  // Gossip first: joiners learn the run from it.
  transport::GossipOptions go;
  go.bind = zmq_address(req.listen);
  for (const auto& j : req.join) go.seeds.push_back(zmq_address(j));
  go.self = transport::random_peer_id();
  go.key = req.key;
  auto gossip = transport::make_gossip(go);
  if (!gossip.ok()) return gossip.status().with_context("starting gossip on " + req.listen);
  std::string address = (*gossip)->address();
  if (address.rfind("tcp://", 0) == 0) address = address.substr(6);
  if (Status st = write_file_atomic(req.out_dir / "address", as_bytes(address + "\n")); !st.ok()) return st;
  spdlog::info("peer {}: gossip on {}", go.self.to_string(), address);
  auto heard = listen_for_spec(**gossip);
  auto board = JoinBoard::make(**gossip);

  Spec run_spec;
  std::optional<std::string> own_spec;  // the run this peer means to take part in, if it says so
  if (resumed) {
    own_spec = resumed->config_toml;
  } else if (req.config) {
    own_spec = train::to_toml(*req.config);
  }
  if (req.join.empty()) {
    run_spec = Spec{*own_spec, static_cast<std::uint32_t>(req.wait_for)};
  } else {
    auto got = receive_spec(*heard, req.spec_timeout);
    if (!got.ok()) return got.status();
    run_spec = std::move(*got);
    if (own_spec && *own_spec != run_spec.toml) {
      return error(ErrorCode::kInvalidArgument, "this peer's config (hash " + digest_of(as_bytes(*own_spec)).hex() + ") differs from the run's (hash " +
                                                    digest_of(as_bytes(run_spec.toml)).hex() + "): " +
                                                    (resumed ? "the checkpoint belongs to another run" : "drop --config to take the run's, or join another run"));
    }
  }
  const std::string& spec = run_spec.toml;
  if (spec.size() > kMaxSpec) return error(ErrorCode::kInvalidArgument, "the run's config is too large to announce");
  train::RunConfig config;
  if (Status st = train::apply_toml(config, spec, "run spec"); !st.ok()) return st;
  if (Status st = train::validate(config); !st.ok()) return st;
  auto period = round_period(config);
  if (!period.ok()) return period.status();
  auto outer_config = train::outer_config(config);
  if (!outer_config.ok()) return outer_config.status();
  const Digest spec_hash = digest_of(as_bytes(spec));
  spdlog::info("run {} ({} on {} steps, rounds every {} steps)", spec_hash.hex().substr(0, 16), config.outer.method, config.train.steps, *period);
  std::atomic<std::int64_t> current_round{-1};
  SpecAnnouncer announcer(**gossip, run_spec, current_round);
  if (Status st = write_file_atomic(req.out_dir / "config.toml", as_bytes(spec)); !st.ok()) return st;

  // Links: the run id is the spec's hash, so peers of another run are refused at the handshake.
  transport::TcpOptions to;
  const auto colon = req.listen.rfind(':');
  to.listen = (colon == std::string::npos ? req.listen : req.listen.substr(0, colon)) + ":0";
  to.self = go.self;
  std::copy_n(spec_hash.bytes.begin(), to.run.bytes.size(), to.run.bytes.begin());
  to.key = req.key;
  auto transport = transport::make_tcp_transport(to);
  if (!transport.ok()) return transport.status().with_context("starting the links");
  const std::string link_address = (*transport)->address();
  if (Status st = write_file_atomic(req.out_dir / "address", as_bytes(address + "\n" + link_address + "\n")); !st.ok()) return st;
  StateServer server;
  PeerLinks links(**transport, [&server](std::shared_ptr<transport::Link> l) { server.serve(std::move(l)); });
  if (req.shape) {
    links.shape(*req.shape);
    spdlog::info("links shaped like '{}'", req.shape->name);
  }
  CoordinatorOptions co;
  co.min_members = run_spec.wait_for;
  co.straggler_grace = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config.train.round_timeout_s / 2));
  auto coordinator_ptr = Coordinator::make(**gossip, link_address, co);
  Coordinator& coordinator = *coordinator_ptr;

  auto corpus = train::load_corpus(config);
  if (!corpus.ok()) return corpus.status();
  if (config.train.threads > 0) torch::set_num_threads(static_cast<int>(config.train.threads));
  const Nanos round_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config.train.round_timeout_s));

  // A run that is already training is joined through a state transfer; otherwise round 0 says who
  // starts, and so each peer's shard.
  if (!req.join.empty()) {
    std::unique_lock lock(heard->mu);
    heard->cv.wait_for(lock, 1500ms, [&] { return heard->latest_round >= 0; });  // announcers repeat every second
  }
  bool joining = heard->latest_round >= 0;
  std::optional<GroupView> start;
  if (!joining) {
    spdlog::info("waiting for {} peer(s) to start", run_spec.wait_for);
    auto agreed = coordinator.agree(0, 0, Deadline::after(real_clock(), req.start_timeout));
    if (agreed.ok()) {
      start = *agreed;
    } else if (agreed.status().code() == ErrorCode::kUnavailable || agreed.status().code() == ErrorCode::kAborted) {
      joining = true;  // it started without this peer
    } else {
      return agreed.status().with_context("starting the run");
    }
  }

  // Fetches the newest state the members offer (asking for it until one arrives); kTimeout at the deadline.
  std::uint64_t state_received = 0;
  auto fetch_newest = [&](Deadline deadline) -> Result<FetchResult> {
    auto last_ask = std::chrono::steady_clock::time_point{};
    for (;;) {
      if (deadline.expired(real_clock())) return error(ErrorCode::kTimeout, "no member offered the run's state in time");
      if (req.stop != nullptr && req.stop->load()) return error(ErrorCode::kAborted, "stop requested while joining");
      if (std::chrono::steady_clock::now() - last_ask >= 1s) {
        board->ask_to_join();
        last_ask = std::chrono::steady_clock::now();
      }
      if (auto offer = board->newest_offer(50ms)) {
        auto got = fetch_state(**transport, offer->second, offer->first, deadline);
        if (got.ok()) {
          state_received += got->bytes_received;
          spdlog::info("fetched the state of round {} ({:.2f} MB) from {} donor(s){}", offer->first, got->bytes.size() / 1e6, got->donors_used,
                       got->donors_failed > 0 ? fmt::format(", {} failed", got->donors_failed) : std::string());
          return got;
        }
        spdlog::warn("fetching the state of round {} failed: {}; trying a newer one", offer->first, got.status().to_string());
        board->forget(offer->first);
      }
      std::this_thread::sleep_for(50ms);
    }
  };

  int rank = 0, world = 1;
  std::optional<FetchResult> fetched;
  if (joining) {
    spdlog::info("the run is under way: fetching its state to join");
    auto got = fetch_newest(Deadline::after(real_clock(), req.start_timeout));
    if (!got.ok()) return got.status().with_context("joining the run");
    fetched = std::move(*got);
    world = static_cast<int>(fetched->manifest.shards);
    rank = static_cast<int>(go.self.value % static_cast<std::uint64_t>(world));
  } else {
    rank = start->rank_of(go.self);
    world = static_cast<int>(start->members.size());
  }
  spdlog::info("training on shard {} of {}", rank, world);

  train::Worker worker(config, corpus->dataset, rank, world, real_clock());
  optim::Group first_group = solo_group();
  if (start) {
    auto g = links.group(*start, Deadline::after(real_clock(), std::min(round_timeout, kLinkTimeout)));
    if (!g.ok()) return g.status().with_context("linking the starting group");
    first_group = std::move(*g);
  }
  auto setup = optim::make_outer_optimizer(*outer_config, train::param_blocks(worker.model()), std::move(first_group));
  if (!setup.ok()) return setup.status();

  std::int64_t agreed_round = 0;
  std::uint64_t epoch = start ? start->epoch : 0;
  std::size_t start_size = start ? start->members.size() : 0;  // group sizes other than this one are logged
  std::int64_t joins = 0;
  // Takes a fetched state as this peer's own: the step, the parameters and the outer state (its inner
  // optimizer starts afresh), then tells the members it takes part in the next round.
  auto adopt = [&](const FetchResult& f) -> Status {
    train::CheckpointState st = worker.checkpoint_state("");
    st.step = f.manifest.step;
    st.next_batch = f.manifest.step;
    st.tokens_seen = 0;
    if (Status s2 = worker.restore(st); !s2.ok()) return s2;
    if (Status s2 = load_shared_state(f.bytes, worker.model().parameters(), *setup->outer); !s2.ok()) return s2.with_context("loading the run's state");
    agreed_round = f.manifest.round;
    current_round = f.manifest.round;
    ++joins;
    coordinator.intend(f.manifest.round + 1);
    spdlog::info("joined at round {} (step {}); taking part from round {}", f.manifest.round, f.manifest.step, f.manifest.round + 1);
    return Status();
  };
  if (resumed) {
    // Its own checkpoint first (inner optimizer included); a newer state from the members, if any,
    // then replaces the shared part.
    if (Status st = worker.restore(*resumed); !st.ok()) return st.with_context("resuming from " + ckpt_path.string());
    if (Status st = setup->outer->load(resumed->outer_state); !st.ok()) return st.with_context("resuming from " + ckpt_path.string());
    agreed_round = worker.steps_done() / *period;
    spdlog::info("resumed from {} at step {}", ckpt_path.string(), worker.steps_done());
  }
  if (fetched && (!resumed || fetched->manifest.step > worker.steps_done())) {
    if (Status st = adopt(*fetched); !st.ok()) return st;
  } else {
    current_round = agreed_round;
  }

  auto metrics = train::MetricsWriter::open(req.out_dir / "metrics.jsonl", resumed ? std::optional<std::int64_t>(worker.steps_done()) : std::nullopt);
  if (!metrics.ok()) return metrics.status();
  std::int64_t solo_rounds = 0;
  std::int64_t last_checkpoint = worker.steps_done();
  auto save_checkpoint = [&] {
    train::CheckpointState cs = worker.checkpoint_state(spec);
    cs.outer_state = setup->outer->save();
    return train::write_checkpoint(ckpt_path, cs);
  };
  std::optional<double> final_val;  // the loop evaluates at the last step
  train::LoopOptions lo;
  lo.steps = config.train.steps;
  lo.eval_every = config.train.eval_every;
  lo.evaluate = true;
  lo.round_timeout = round_timeout;
  train::LoopHooks hooks;
  bool stopped = false;
  Status failure;
  hooks.keep_going = [&](std::int64_t next) {
    if (!failure.ok()) return false;
    if (req.stop != nullptr && req.stop->load()) {
      spdlog::warn("stop requested: leaving the run before step {}", next);
      stopped = true;
      return false;
    }
    return true;
  };
  // The group of each round, agreed just before the round's last inner step; asked again for the same
  // round, it is a retry after a failed collective. Just after a round, while a newcomer waits,
  // this peer also offers the state it now shares with the other members.
  hooks.regroup = [&](std::int64_t step) -> std::optional<optim::Group> {
    if (step > 1 && (step - 1) % *period == 0) {
      if (const auto newcomers = board->waiting(); !newcomers.empty()) {
        const std::int64_t done = (step - 1) / *period;
        server.offer(Snapshot::make(done, step - 1, static_cast<std::uint32_t>(world), encode_shared_state(worker.model().parameters(), *setup->outer)));
        board->offer(done, link_address);
        // A newcomer that takes this state is due at the next round: the leader waits for it there.
        for (transport::PeerId id : newcomers) coordinator.expect(done + 1, id);
      }
    }
    if (step > 1 && (step - 1) % *period == 0 && config.train.checkpoint_every > 0 &&
        (step - 1) / config.train.checkpoint_every > last_checkpoint / config.train.checkpoint_every) {
      if (Status st = save_checkpoint(); !st.ok() && failure.ok()) failure = st;
      last_checkpoint = step - 1;
    }
    if (step % *period != 0) return std::nullopt;
    const std::int64_t round = step / *period;
    const bool retry = round == agreed_round;
    const Deadline deadline = Deadline::after(real_clock(), round_timeout);
    std::uint64_t failed = retry ? epoch : 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (failed > 0) links.close_through(failed);
      auto view = coordinator.agree(round, failed, deadline);
      if (!view.ok() && view.status().code() == ErrorCode::kAborted) {
        // Left out (too slow): this peer's state is no longer the members'. It catches up as a
        // newcomer would.
        spdlog::warn("round {}: {}; catching up with the members", round, view.status().to_string());
        auto got = fetch_newest(Deadline::after(real_clock(), round_timeout));
        Status st = got.ok() ? adopt(*got) : got.status();
        if (!st.ok()) failure = st.with_context("catching up after being left out");
        return solo_group();
      }
      if (!view.ok()) {
        spdlog::warn("round {}: {}; this peer applies the round on its own", round, view.status().to_string());
        ++solo_rounds;
        agreed_round = round;
        return solo_group();
      }
      auto g = links.group(*view, Deadline::after(real_clock(), std::min(round_timeout, kLinkTimeout)),
                           [&, r = round, e = view->epoch] { return coordinator.superseded(r, e); });
      if (g.ok()) {
        agreed_round = round;
        current_round = round;
        epoch = view->epoch;
        if (start_size == 0) start_size = view->members.size();
        if (retry || view->members.size() != start_size) {
          spdlog::info("round {}: group of {} (epoch {})", round, view->members.size(), view->epoch);
        }
        return std::move(*g);
      }
      spdlog::warn("round {}: linking the group of epoch {} failed: {}", round, view->epoch, g.status().to_string());
      failed = view->epoch;
    }
    return std::nullopt;
  };
  hooks.state_traffic = [&] { return std::make_pair(server.bytes_served(), state_received); };
  hooks.record = [&](const nlohmann::json& rec) {
    nlohmann::json out = rec;
    out["peer"] = go.self.to_string();
    if (Status st = metrics->write(out); !st.ok() && failure.ok()) failure = st;
    if (rec.contains("val_loss")) {
      if (rec["step"].get<std::int64_t>() == config.train.steps) final_val = rec["val_loss"].get<double>();
      spdlog::info("step {}/{}: val loss {:.4f}, rounds {}, sent {:.2f} MB", rec["step"].get<std::int64_t>(), config.train.steps,
                   rec["val_loss"].get<double>(), rec["rounds"].get<std::int64_t>(), rec["bytes_sent"].get<double>() / 1e6);
    }
  };
  auto account = train::run_worker_loop(worker, *setup, real_clock(), lo, hooks);
  if (!account.ok()) return account.status();
  if (!failure.ok()) return failure;
  if (!stopped) {
    // A last agreement as a barrier: nobody tears its links down while a member may still be
    // receiving its share of the last round (a shaped link delivers after send() returned).
    auto done = coordinator.agree(config.train.steps / *period + 1, 0, Deadline::after(real_clock(), round_timeout));
    if (!done.ok()) spdlog::warn("the members did not all finish together: {}", done.status().to_string());
  }

  if (Status st = save_checkpoint(); !st.ok()) return st;

  PeerOutcome out;
  out.steps = worker.steps_done();
  out.rounds = account->rounds;
  out.skipped_rounds = account->skipped_rounds;
  const CoordinatorStats cs = coordinator.stats();
  out.retries = cs.retries;
  out.finished = !stopped && worker.steps_done() >= config.train.steps;
  const at::Tensor flat = optim::flatten(worker.model().parameters());
  out.params_digest = digest_of(ByteView(reinterpret_cast<const std::byte*>(flat.data_ptr<float>()), static_cast<std::size_t>(flat.numel()) * 4)).hex();
  if (out.finished) out.final_val_loss = final_val ? *final_val : worker.evaluate();
  nlohmann::json summary = account->to_json();
  summary["peer"] = go.self.to_string();
  summary["run"] = spec_hash.hex();
  summary["shard"] = rank;
  summary["shards"] = world;
  summary["finished"] = out.finished;
  summary["params_digest"] = out.params_digest;
  summary["retries"] = cs.retries;
  summary["groups_led"] = cs.groups_announced;
  summary["left_out_by_this_leader"] = cs.left_out;
  summary["solo_rounds"] = solo_rounds;
  summary["joins"] = joins;
  summary["dropped_messages"] = cs.dropped + static_cast<std::int64_t>((*gossip)->dropped_messages());
  summary["refused_links"] = links.refused_connections();
  if (out.final_val_loss) summary["final_val_loss"] = *out.final_val_loss;
  const std::string text = summary.dump(2) + "\n";
  if (Status st = write_file_atomic(req.out_dir / "summary.json", as_bytes(text)); !st.ok()) return st;
  setup->outer.reset();
  setup->comm.reset();
  (*gossip)->leave();
  return out;
}

}  // namespace gossamer::run
