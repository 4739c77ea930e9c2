#include "run/peer.h"

#include <torch/torch.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/file.h"
#include "core/hash.h"
#include "core/wire.h"
#include "optim/flat_params.h"
#include "run/coordinator.h"
#include "run/peer_links.h"
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
// for at the start u32.
struct Spec {
  std::string toml;
  std::uint32_t wait_for = 1;
};

Bytes encode_spec(const Spec& spec) {
  Writer w;
  w.u8(kSpecVersion);
  const Digest d = digest_of(as_bytes(spec.toml));
  w.raw(ByteView(reinterpret_cast<const std::byte*>(d.bytes.data()), d.bytes.size()));
  w.str(spec.toml);
  w.u32(spec.wait_for);
  return std::move(w).take();
}

// The run spec as peers repeat it: every second, from a thread of its own, once this peer holds it.
class SpecAnnouncer {
 public:
  SpecAnnouncer(transport::Gossip& gossip, Bytes message) : gossip_(gossip), message_(std::move(message)) {
    thread_ = std::thread([this] {
      std::unique_lock lock(mu_);
      while (!stop_) {
        lock.unlock();
        (void)gossip_.broadcast(kSpecTopic, message_);
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
  const Bytes message_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Waits for the run spec on gossip and checks its hash (kTimeout when nobody announces one).
Result<Spec> receive_spec(transport::Gossip& gossip, Nanos timeout) {
  // Shared with the handler, which stays subscribed after this returns (the gossip thread may still
  // call it).
  struct Heard {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Spec> spec;
    std::string last_problem;
  };
  auto heard = std::make_shared<Heard>();
  gossip.subscribe(kSpecTopic, [heard](transport::PeerId origin, const Bytes& payload) {
    Reader r(payload, "run spec from peer " + origin.to_string());
    const std::uint8_t version = r.u8();
    const ByteView hash = r.raw(32);
    std::string toml = r.str(kMaxSpec);
    const std::uint32_t wait_for = r.u32();
    r.expect_end();
    std::lock_guard lock(heard->mu);
    if (heard->spec) return;
    std::string problem;
    if (!r.ok()) {
      problem = r.status().to_string();
    } else if (version != kSpecVersion) {
      problem = "peer " + origin.to_string() + " announces a run spec of version " + std::to_string(version) + ", this peer reads " +
                std::to_string(kSpecVersion) + ": run the same gossamer version on every peer";
    } else if (std::memcmp(hash.data(), digest_of(as_bytes(toml)).bytes.data(), 32) != 0) {
      problem = "the run spec from peer " + origin.to_string() + " does not match its hash";
    } else {
      heard->spec = Spec{std::move(toml), wait_for};
      heard->cv.notify_all();
      return;
    }
    spdlog::warn("ignored a run spec: {}", problem);
    heard->last_problem = std::move(problem);
  });
  std::unique_lock lock(heard->mu);
  if (!heard->cv.wait_for(lock, timeout, [&] { return heard->spec.has_value(); })) {
    return error(ErrorCode::kTimeout, "no run spec heard from the peers joined within " + std::to_string(timeout.count() / 1000000000) + " s" +
                                          (heard->last_problem.empty() ? std::string(": check the --join addresses") : ": " + heard->last_problem));
  }
  return *heard->spec;
}

}  // namespace

std::string spec_hash_hex(const train::RunConfig& config) { return digest_of(as_bytes(train::to_toml(config))).hex(); }

Result<PeerOutcome> run_peer(const PeerRequest& req) {
  if (req.join.empty() && !req.config) {
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

  Spec run_spec;
  if (req.join.empty()) {
    run_spec = Spec{train::to_toml(*req.config), static_cast<std::uint32_t>(req.wait_for)};
  } else {
    auto heard = receive_spec(**gossip, req.spec_timeout);
    if (!heard.ok()) return heard.status();
    run_spec = std::move(*heard);
  }
  const std::string& spec = run_spec.toml;
  if (!req.join.empty()) {
    if (req.config && train::to_toml(*req.config) != spec) {
      return error(ErrorCode::kInvalidArgument, "this peer's config (hash " + spec_hash_hex(*req.config) + ") differs from the run's (hash " +
                                                    digest_of(as_bytes(spec)).hex() + "): drop --config to take the run's, or join another run");
    }
  }
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
  SpecAnnouncer announcer(**gossip, encode_spec(run_spec));
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
  if (Status st = write_file_atomic(req.out_dir / "address", as_bytes(address + "\n" + (*transport)->address() + "\n")); !st.ok()) return st;
  PeerLinks links(**transport);
  CoordinatorOptions co;
  co.min_members = run_spec.wait_for;
  co.straggler_grace = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config.train.round_timeout_s / 2));
  auto coordinator_ptr = Coordinator::make(**gossip, (*transport)->address(), co);
  Coordinator& coordinator = *coordinator_ptr;

  auto corpus = train::load_corpus(config);
  if (!corpus.ok()) return corpus.status();
  if (config.train.threads > 0) torch::set_num_threads(static_cast<int>(config.train.threads));

  // Round 0: who starts, and so each peer's shard.
  spdlog::info("waiting for {} peer(s) to start", run_spec.wait_for);
  auto start = coordinator.agree(0, 0, Deadline::after(real_clock(), req.start_timeout));
  if (!start.ok()) return start.status().with_context("starting the run");
  const int rank = start->rank_of(go.self), world = static_cast<int>(start->members.size());
  spdlog::info("training as shard {} of {} (leader {})", rank, world, start->leader.to_string());
  const Deadline link_deadline_start = Deadline::after(real_clock(), std::chrono::seconds(60));
  auto group = links.group(*start, link_deadline_start);
  if (!group.ok()) return group.status().with_context("linking the starting group");

  train::Worker worker(config, corpus->dataset, rank, world, real_clock());
  auto setup = optim::make_outer_optimizer(*outer_config, train::param_blocks(worker.model()), std::move(*group));
  if (!setup.ok()) return setup.status();
  auto metrics = train::MetricsWriter::open(req.out_dir / "metrics.jsonl", std::nullopt);
  if (!metrics.ok()) return metrics.status();

  const Nanos round_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config.train.round_timeout_s));
  std::int64_t agreed_round = 0;
  std::uint64_t epoch = start->epoch;
  std::int64_t solo_rounds = 0;
  train::LoopOptions lo;
  lo.steps = config.train.steps;
  lo.eval_every = config.train.eval_every;
  lo.evaluate = true;
  lo.round_timeout = round_timeout;
  train::LoopHooks hooks;
  bool stopped = false;
  hooks.keep_going = [&](std::int64_t next) {
    if (req.stop != nullptr && req.stop->load()) {
      spdlog::warn("stop requested: leaving the run before step {}", next);
      stopped = true;
      return false;
    }
    return true;
  };
  // The group of each round, agreed just before the round's last inner step; asked again for the same
  // round, it is a retry after a failed collective.
  hooks.regroup = [&](std::int64_t step) -> std::optional<optim::Group> {
    if (step % *period != 0) return std::nullopt;
    const std::int64_t round = step / *period;
    const bool retry = round == agreed_round;
    const Deadline deadline = Deadline::after(real_clock(), round_timeout);
    std::uint64_t failed = retry ? epoch : 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (failed > 0) links.close_through(failed);
      auto view = coordinator.agree(round, failed, deadline);
      if (!view.ok()) {
        spdlog::warn("round {}: {}; this peer applies the round on its own", round, view.status().to_string());
        ++solo_rounds;
        agreed_round = round;
        optim::Group solo;
        solo.peers.resize(1);
        return solo;
      }
      auto g = links.group(*view, Deadline::after(real_clock(), std::min(round_timeout, kLinkTimeout)),
                           [&, r = round, e = view->epoch] { return coordinator.superseded(r, e); });
      if (g.ok()) {
        agreed_round = round;
        epoch = view->epoch;
        if (retry || view->members.size() != static_cast<std::size_t>(world)) {
          spdlog::info("round {}: group of {} (epoch {})", round, view->members.size(), view->epoch);
        }
        return std::move(*g);
      }
      spdlog::warn("round {}: linking the group of epoch {} failed: {}", round, view->epoch, g.status().to_string());
      failed = view->epoch;
    }
    return std::nullopt;
  };
  Status write_failure;
  hooks.record = [&](const nlohmann::json& rec) {
    nlohmann::json out = rec;
    out["peer"] = go.self.to_string();
    if (Status st = metrics->write(out); !st.ok() && write_failure.ok()) write_failure = st;
    if (rec.contains("val_loss")) {
      spdlog::info("step {}/{}: val loss {:.4f}, rounds {}, sent {:.2f} MB", rec["step"].get<std::int64_t>(), config.train.steps,
                   rec["val_loss"].get<double>(), rec["rounds"].get<std::int64_t>(), rec["bytes_sent"].get<double>() / 1e6);
    }
  };
  auto account = train::run_worker_loop(worker, *setup, real_clock(), lo, hooks);
  if (!account.ok()) return account.status();
  if (!write_failure.ok()) return write_failure;

  train::CheckpointState state = worker.checkpoint_state(spec);
  state.outer_state = setup->outer->save();
  if (Status st = train::write_checkpoint(req.out_dir / train::kCheckpointFile, state); !st.ok()) return st;

  PeerOutcome out;
  out.steps = worker.steps_done();
  out.rounds = account->rounds;
  out.skipped_rounds = account->skipped_rounds;
  out.retries = coordinator.stats().retries;
  out.finished = !stopped && worker.steps_done() >= config.train.steps;
  const at::Tensor flat = optim::flatten(worker.model().parameters());
  out.params_digest = digest_of(ByteView(reinterpret_cast<const std::byte*>(flat.data_ptr<float>()), static_cast<std::size_t>(flat.numel()) * 4)).hex();
  if (out.finished) out.final_val_loss = worker.evaluate();
  const CoordinatorStats cs = coordinator.stats();
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
