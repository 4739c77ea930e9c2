#include "run/peer.h"

#include <torch/torch.h>

#include <condition_variable>
#include <cstring>
#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/file.h"
#include "core/hash.h"
#include "core/wire.h"
#include "optim/flat_params.h"
#include "run/announcements.h"
#include "run/coordinator.h"
#include "run/peer_links.h"
#include "run/state_sync.h"
#include "train/checkpoint.h"
#include "train/memory.h"
#include "train/metrics.h"
#include "train/run_folder.h"
#include "train/outer.h"
#include "train/run.h"
#include "train/worker.h"
#include "transport/endpoint.h"
#include "transport/gossip.h"
#include "transport/tcp_transport.h"

namespace gossamer::run {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr Nanos kLinkTimeout = std::chrono::seconds(30);  // to link up a group's members

std::string zmq_address(const std::string& host_port) {
  return host_port.rfind("tcp://", 0) == 0 ? host_port : "tcp://" + host_port;
}

// When a method's rounds fall. Round r's group is agreed just before step r * period - lead runs
// (the step after which the round's collective launches: Streaming DiLoCo launches a fragment `lead`
// = tau steps before it completes). Once step r * period is done the round is over, with nothing of
// it in flight (CO2's average aside, which is part of its state): there members offer their state to
// newcomers, checkpoint, and ask for the next round's group ahead of time. ddp averages every step;
// its rounds only say when members may change (a lost member is dropped at once, by a retry), and
// its round r is agreed right after step r * period (lead -1): its members hold identical state
// there, so a newcomer given that state takes part in that very round (the members wait for it).
struct RoundSchedule {
  std::int64_t period = 1;
  std::int64_t lead = 0;
  // The round whose group is needed before `step` runs, if any.
  std::optional<std::int64_t> agreed_before(std::int64_t step) const {
    if ((step + lead) % period != 0) return std::nullopt;
    return (step + lead) / period;
  }
  // Rounds over once `step` is done.
  std::int64_t rounds_over(std::int64_t step) const { return step / period; }
  bool ends_round(std::int64_t step) const { return step > 0 && step % period == 0; }
  // The first round whose group is agreed after `step` is done.
  std::int64_t first_round_after(std::int64_t step) const { return (step + lead) / period + 1; }
  // The last round a run of `steps` agrees on.
  std::int64_t last_round(std::int64_t steps) const { return (steps + lead) / period; }
};

Result<RoundSchedule> round_schedule(const train::RunConfig& c, const optim::OuterConfig& outer) {
  switch (outer.method) {
    case optim::Method::kDiLoCo: return RoundSchedule{c.diloco.inner_steps, 0};
    case optim::Method::kNoLoCo: return RoundSchedule{c.noloco.inner_steps, 0};
    case optim::Method::kCO2: return RoundSchedule{c.co2.inner_steps, 0};
    case optim::Method::kDdp: return RoundSchedule{c.ddp.round_steps, -1};
    case optim::Method::kStreamingDiLoCo:
      return RoundSchedule{c.streaming_diloco.inner_steps / optim::fragment_count(outer.fragments), c.streaming_diloco.overlap};
    case optim::Method::kLocal: break;
  }
  return error(ErrorCode::kInvalidArgument, "outer.method = \"" + c.outer.method + "\": independent workers need no peers; use gossamer train");
}

// A group of this peer alone (a round applied on its own).
optim::Group solo_group() {
  optim::Group g;
  g.peers.resize(1);
  return g;
}

// The bytes of a contiguous fp32 tensor (a view: the tensor must outlive it).
ByteView bytes_of(const at::Tensor& flat) {
  return ByteView(reinterpret_cast<const std::byte*>(flat.data_ptr<float>()), static_cast<std::size_t>(flat.numel()) * 4);
}

// The state members share after a round: the parameters (fp32), the outer optimizer's state and,
// for ddp, whose members hold identical inner optimizers, the inner state too (a LibTorch archive of
// model and AdamW; empty otherwise): blob params | blob outer | blob inner.
Bytes encode_shared_state(const std::vector<at::Tensor>& params, const optim::OuterOptimizer& outer, ByteView inner) {
  const at::Tensor flat = optim::flatten(params);
  Writer w;
  w.blob(bytes_of(flat));
  w.blob(outer.save());
  w.blob(inner);
  return std::move(w).take();
}

// Loads the parameters and the outer state; returns the inner state (a view into `bytes`).
Result<ByteView> load_shared_state(ByteView bytes, std::vector<at::Tensor> params, optim::OuterOptimizer& outer) {
  Reader r(bytes, "shared state");
  std::int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  const ByteView flat = r.blob(static_cast<std::size_t>(numel) * 4);
  const ByteView outer_state = r.blob(std::size_t{8} << 30);
  const ByteView inner = r.blob(std::size_t{8} << 30);
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
  return inner;
}

}  // namespace

std::string spec_hash_hex(const train::RunConfig& config) { return digest_of(as_bytes(train::to_toml(config))).hex(); }

namespace {

// --advertise HOST[:PORT]; without a port, the gossip's own port (which must then be fixed).
Result<transport::Endpoint> parse_advertise(const std::string& text, std::uint16_t listen_port) {
  auto ep = transport::parse_endpoint(text, transport::EndpointUse::kDial, "--advertise");
  if (ep.ok()) return ep;
  auto host_only = transport::parse_endpoint(text + ":1", transport::EndpointUse::kDial, "--advertise");
  if (!host_only.ok()) return ep.status();
  if (listen_port == 0) {
    return error(ErrorCode::kInvalidArgument, "--advertise " + text + " names no port and --listen picks a free one: give --advertise HOST:PORT, or a fixed --listen port");
  }
  host_only->port = listen_port;
  return host_only;
}

// The links' port: --link-port, else the gossip port + 1 (ephemeral when the gossip port is).
Result<std::uint16_t> link_port_of(const PeerRequest& req, std::uint16_t listen_port) {
  if (req.link_port) return *req.link_port;
  if (listen_port == 0) return std::uint16_t{0};
  if (listen_port == 65535) return error(ErrorCode::kInvalidArgument, "--listen port 65535 leaves no port for the links (port + 1): pass --link-port");
  return static_cast<std::uint16_t>(listen_port + 1);
}

// ddp on Gloo serves its rendezvous at the host its links listen on: a wildcard cannot be reached.
Status check_gloo_listen(const train::RunConfig& config, const std::string& listen) {
  if (config.outer.method != optim::method_name(optim::Method::kDdp) || config.ddp.engine != "gloo" || !transport::is_wildcard_address(listen)) return Status();
  return error(ErrorCode::kInvalidArgument, "ddp.engine = \"gloo\" serves its rendezvous at the --listen host, which must then be an address the "
                                            "others reach: give --listen <this machine's address>:PORT instead of " + listen);
}

// Every address the user gave, parsed and looked up before anything starts.
Status check_addresses(const PeerRequest& req) {
  if (req.config) {
    if (Status st = check_gloo_listen(*req.config, req.listen); !st.ok()) return st;
  }
  auto listen = transport::parse_endpoint(req.listen, transport::EndpointUse::kListen, "--listen");
  if (!listen.ok()) return listen.status();
  if (Status st = transport::check_can_listen(*listen, "--listen"); !st.ok()) return st;
  auto lp = link_port_of(req, listen->port);
  if (!lp.ok()) return lp.status();
  transport::Endpoint links = *listen;
  links.port = *lp;
  if (Status st = transport::check_can_listen(links, req.link_port ? "--link-port" : "the links' port (--listen port + 1)"); !st.ok()) {
    return req.link_port ? st : st.with_context("pass --link-port to choose another");
  }
  if (req.link_port && *req.link_port != 0 && *req.link_port == listen->port) {
    return error(ErrorCode::kInvalidArgument, "--link-port " + std::to_string(*req.link_port) + " is the gossip port of --listen: the links need a port of their own");
  }
  if (!req.advertise.empty()) {
    auto adv = parse_advertise(req.advertise, listen->port);
    if (!adv.ok()) return adv.status();
    if (listen->port == 0 || *lp == 0) {
      return error(ErrorCode::kInvalidArgument, "--advertise needs fixed ports (a port forward points at them): give --listen HOST:PORT with a port, "
                                                "and no --link-port 0");
    }
  }
  for (const auto& j : req.join) {
    auto seed = transport::parse_endpoint(j, transport::EndpointUse::kDial, "--join");
    if (!seed.ok()) return seed.status();
    if (Status st = transport::check_resolves(*seed, "--join"); !st.ok()) return st;
  }
  return Status();
}

}  // namespace

Result<PeerOutcome> run_peer(const PeerRequest& req) {
  if (Status st = check_addresses(req); !st.ok()) return st;
  std::optional<train::CheckpointState> resumed;
  const fs::path ckpt_path = req.out_dir / train::kCheckpointFile;
  std::optional<train::RunFolder> folder;  // held for the whole run
  if (req.resume) {
    auto opened = train::RunFolder::open_to_resume(req.out_dir, train::RunKind::kPeer);
    if (!opened.ok()) return opened.status();
    folder.emplace(std::move(*opened));
    auto state = train::read_checkpoint(ckpt_path);
    if (!state.ok()) return state.status();
    resumed = std::move(*state);
  } else if (Status st = train::RunFolder::check_new(req.out_dir, train::RunKind::kPeer); !st.ok()) {
    return st;
  }
  if (req.join.empty() && !req.config && !resumed) {
    return error(ErrorCode::kInvalidArgument, "the first peer defines the run: pass --config (or --join the address of a running peer)");
  }
  if (!req.resume) {
    auto created = train::RunFolder::create(req.out_dir, train::RunKind::kPeer);
    if (!created.ok()) return created.status();
    folder.emplace(std::move(*created));
  }

  // Gossip first: joiners learn the run from it.
  const transport::Endpoint listen = *transport::parse_endpoint(req.listen, transport::EndpointUse::kListen, "--listen");
  std::optional<transport::Endpoint> advertised;
  if (!req.advertise.empty()) advertised = *parse_advertise(req.advertise, listen.port);
  transport::GossipOptions go;
  go.bind = zmq_address(req.listen);
  if (advertised) go.advertise = "tcp://" + advertised->to_string();
  for (const auto& j : req.join) go.seeds.push_back(zmq_address(j));
  go.self = transport::random_peer_id();
  go.key = req.key;
  if (req.dead_after < 5 * go.period) {
    return error(ErrorCode::kInvalidArgument, "dead_after must be at least 5 gossip periods (0.5 s): a shorter silence is no sign of death");
  }
  go.dead_after = req.dead_after;
  go.suspect_after = req.dead_after / 2;
  auto gossip = transport::make_gossip(go);
  if (!gossip.ok()) {
    // The address is the user's: one that is not on this machine, or a port in use, is bad input.
    return error(ErrorCode::kInvalidArgument, "--listen " + req.listen + ": cannot listen there (" + gossip.status().message() +
                                                  "); give an address of this machine (or 0.0.0.0) and a free port (0 picks one)");
  }
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
    auto got = receive_spec(*heard, req.spec_timeout, req.stop);
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
  auto outer_config = train::outer_config(config);
  if (!outer_config.ok()) return outer_config.status();
  if (Status st = train::check_memory(config, /*workers=*/1); !st.ok()) return st;
  auto schedule_or = round_schedule(config, *outer_config);
  if (!schedule_or.ok()) return schedule_or.status();
  const RoundSchedule schedule = *schedule_or;
  const bool ddp = outer_config->method == optim::Method::kDdp;
  if (Status st = check_gloo_listen(config, req.listen); !st.ok()) return st;
  const Nanos round_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config.train.round_timeout_s));
  const Digest spec_hash = digest_of(as_bytes(spec));
  spdlog::info("run {} ({} on {} steps, rounds every {} steps)", spec_hash.hex().substr(0, 16), config.outer.method, config.train.steps, schedule.period);
  std::atomic<std::int64_t> current_round{-1};
  SpecAnnouncer announcer(**gossip, run_spec, current_round);
  if (Status st = write_file_atomic(req.out_dir / "config.toml", as_bytes(spec)); !st.ok()) return st;

  // Links: the run id is the spec's hash, so peers of another run are refused at the handshake.
  // Links on a port of their own next to gossip's (PORT + 1 unless --link-port), so that a firewall
  // rule or a port forward for two ports is all a peer needs.
  transport::TcpOptions to;
  const std::uint16_t link_port = *link_port_of(req, listen.port);
  to.listen = (listen.ipv6 ? "[" + listen.host + "]" : listen.host) + ":" + std::to_string(link_port);
  to.self = go.self;
  std::copy_n(spec_hash.bytes.begin(), to.run.bytes.size(), to.run.bytes.begin());
  to.key = req.key;
  auto transport = transport::make_tcp_transport(to);
  if (!transport.ok()) {
    return error(ErrorCode::kInvalidArgument, "cannot listen for links on " + to.listen + " (" + transport.status().message() +
                                                  "): free that port, or choose the links' port with --link-port (0: any free port)");
  }
  const std::string bound_link_address = (*transport)->address();
  std::string link_address = bound_link_address;
  if (advertised) {
    // Announced where the others reach it: the advertised host, the port as far from the advertised
    // gossip port as the links' is from the gossip's.
    const int offset = static_cast<int>(std::stoi(bound_link_address.substr(bound_link_address.rfind(':') + 1))) -
                       static_cast<int>(std::stoi(address.substr(address.rfind(':') + 1)));
    transport::Endpoint at = *advertised;
    at.port = static_cast<std::uint16_t>(std::clamp(static_cast<int>(at.port) + offset, 1, 65535));
    link_address = at.to_string();
  }
  {
    // ddp on Gloo: each group's rank 0 serves the rendezvous where its links listen.
    const auto c = bound_link_address.rfind(':');
    outer_config->gloo.over_group_links = true;
    outer_config->gloo.store_host = outer_config->gloo.interface_host = bound_link_address.substr(0, c);
    outer_config->gloo.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(std::min(round_timeout, kLinkTimeout));
  }
  if (Status st = write_file_atomic(req.out_dir / "address", as_bytes(address + "\n" + bound_link_address + "\n")); !st.ok()) return st;
  StateServer server;
  PeerLinks links(
      **transport, [&server](std::shared_ptr<transport::Link> l) { server.serve(std::move(l)); },
      [g = gossip->get()](transport::PeerId id, const std::string& announced) { return reachable_address(*g, id, announced); });
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
    // Asked from a thread of its own, so that a stop request (Ctrl-C) ends the wait at once.
    auto pending = std::async(std::launch::async, [&coordinator, d = Deadline::after(real_clock(), req.start_timeout)] { return coordinator.agree(0, 0, d); });
    while (pending.wait_for(100ms) != std::future_status::ready) {
      if (req.stop != nullptr && req.stop->load()) coordinator.stop();
    }
    auto agreed = pending.get();
    if (req.stop != nullptr && req.stop->load()) return error(ErrorCode::kAborted, "stop requested while waiting for the peers to start");
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
  // Takes a fetched state as this peer's own: the step, the parameters, the outer state and, for ddp,
  // the inner optimizer (otherwise its own goes on), then tells the members which round it takes
  // part in.
  auto adopt = [&](const FetchResult& f) -> Status {
    auto inner = load_shared_state(f.bytes, worker.model().parameters(), *setup->outer);
    if (!inner.ok()) return inner.status().with_context("loading the run's state");
    train::CheckpointState st = worker.checkpoint_state("");
    st.step = f.manifest.step;
    st.next_batch = f.manifest.step;
    st.tokens_seen = 0;
    if (!inner->empty()) st.tensors.assign(inner->begin(), inner->end());
    if (Status s2 = worker.restore(st); !s2.ok()) return s2.with_context("loading the run's state");
    const std::int64_t first = schedule.first_round_after(f.manifest.step);
    agreed_round = first - 1;
    current_round = f.manifest.round;
    ++joins;
    coordinator.intend(first);
    spdlog::info("joined at round {} (step {}); taking part from round {}", f.manifest.round, f.manifest.step, first);
    return Status();
  };
  if (resumed) {
    // Its own checkpoint first (inner optimizer included); a newer state from the members, if any,
    // then replaces the shared part.
    if (Status st = worker.restore(*resumed); !st.ok()) return st.with_context("resuming from " + ckpt_path.string());
    if (Status st = setup->outer->load(resumed->outer_state); !st.ok()) return st.with_context("resuming from " + ckpt_path.string());
    agreed_round = schedule.first_round_after(worker.steps_done()) - 1;
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
    if (Status st = setup->outer->settle(Deadline::after(real_clock(), round_timeout)); !st.ok()) {
      spdlog::warn("checkpointing without the average in flight: {}", st.to_string());
    }
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
  // The group of each round, agreed just before the step after which its collective launches; asked
  // again for the same step, it is a retry after a failed collective (of the round in effect). Just
  // after a round, while a newcomer waits, this peer also offers the state it now shares with the
  // other members, and checkpoints when due. A tenth of a round before the group is needed it asks
  // for it ahead (not for ddp, whose rounds are agreed right at their boundary), so the agreement
  // is off the critical path.
  std::int64_t last_asked = -1;
  std::vector<MemberInfo> members = start ? start->members : std::vector<MemberInfo>();  // of the group in effect
  std::optional<std::pair<std::int64_t, std::future<Result<GroupView>>>> ahead;
  struct AheadGuard {  // whatever way this returns, a question asked ahead is withdrawn first
    Coordinator& coordinator;
    std::optional<std::pair<std::int64_t, std::future<Result<GroupView>>>>& ahead;
    ~AheadGuard() {
      if (!ahead) return;
      coordinator.stop();
      ahead.reset();
    }
  } ahead_guard{coordinator, ahead};
  const std::int64_t last_round = schedule.last_round(config.train.steps);
  auto boundary = [&](std::int64_t done_step) {
    const std::int64_t done = schedule.rounds_over(done_step);
    const auto newcomers = board->waiting();
    const bool checkpoint_due = config.train.checkpoint_every > 0 && done_step / config.train.checkpoint_every > last_checkpoint / config.train.checkpoint_every;
    if (!newcomers.empty()) {
      // CO2's average in flight is part of what is shared.
      if (Status st = setup->outer->settle(Deadline::after(real_clock(), round_timeout)); !st.ok()) {
        spdlog::warn("round {}: no state offered to newcomers: {}", done, st.to_string());
      } else {
        const Bytes inner = ddp ? worker.checkpoint_state("").tensors : Bytes();
        server.offer(Snapshot::make(done, done_step, static_cast<std::uint32_t>(world),
                                    encode_shared_state(worker.model().parameters(), *setup->outer, ByteView(inner))));
        board->offer(done, link_address);
        // A newcomer that takes this state is due at the next round agreed: the leader waits for it there.
        for (transport::PeerId id : newcomers) coordinator.expect(schedule.first_round_after(done_step), id);
      }
    }
    if (checkpoint_due) {
      if (Status st = save_checkpoint(); !st.ok() && failure.ok()) failure = st;
      last_checkpoint = done_step;
    }
  };
  // Asks for round `next`'s group from a thread of its own, so the agreement runs while this peer
  // trains its last steps before the round.
  auto ask_ahead = [&](std::int64_t next) {
    ahead.emplace(next, std::async(std::launch::async, [c = coordinator_ptr, next, d = Deadline::after(real_clock(), round_timeout)] {
                    return c->agree(next, 0, d);
                  }));
  };
  hooks.regroup = [&](std::int64_t step) -> std::optional<optim::Group> {
    const bool retry = step == last_asked;  // asked again for the same step: its collective failed
    last_asked = step;
    if (!retry && schedule.ends_round(step - 1)) boundary(step - 1);
    if (!retry && !ddp && !ahead) {
      // A tenth of a round before the group is needed (late enough that a peer's READY says how far
      // it got, so the leader's grace can tell a straggler), but after the last round's boundary.
      const std::int64_t next = schedule.first_round_after(step - 1);
      const std::int64_t needed_at = next * schedule.period - schedule.lead;
      const std::int64_t ask_at = std::max(needed_at - std::max<std::int64_t>(1, schedule.period / 10), (next - 1) * schedule.period + 1);
      if (next > agreed_round && next <= last_round && step >= ask_at && step < needed_at) ask_ahead(next);
    }
    std::int64_t round = agreed_round;
    if (!retry) {
      const auto due = schedule.agreed_before(step);
      if (!due || *due <= agreed_round) return std::nullopt;
      round = *due;
    }
    const Deadline deadline = Deadline::after(real_clock(), round_timeout);
    std::uint64_t failed = retry ? epoch : 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (failed > 0) links.close_through(failed);
      Result<GroupView> view = error(ErrorCode::kTimeout, "not asked");
      if (ahead && ahead->first == round && failed == 0) {
        view = ahead->second.get();
        ahead.reset();
        if (view.ok() && view->epoch < epoch) {
          failed = view->epoch;  // overtaken by a retry since: ask again after it
          continue;
        }
        if (!view.ok() && view.status().code() == ErrorCode::kTimeout) view = coordinator.agree(round, 0, deadline);
      } else {
        view = coordinator.agree(round, failed, deadline);
      }
      if (!view.ok() && view.status().code() == ErrorCode::kAborted) {
        if (req.stop != nullptr && req.stop->load()) return std::nullopt;
        // Left out (too slow): this peer's state is no longer the members'. It catches up as a
        // newcomer would.
        spdlog::warn("round {}: {}; catching up with the members", round, view.status().to_string());
        auto got = fetch_newest(Deadline::after(real_clock(), round_timeout));
        Status st = got.ok() ? adopt(*got) : got.status();
        if (!st.ok()) failure = st.with_context("catching up after being left out");
        epoch = 0;
        return solo_group();
      }
      if (!view.ok()) {
        spdlog::warn("round {}: {}; this peer applies the round on its own", round, view.status().to_string());
        ++solo_rounds;
        agreed_round = round;
        epoch = 0;
        return solo_group();
      }
      if (view->epoch == epoch && !retry) {
        if (view->members == members) {  // the same members as before: the same links go on
          agreed_round = round;
          current_round = round;
          return std::nullopt;
        }
        spdlog::warn("round {}: a group of other members under epoch {} (a newer leader's mistake): asking again", round, epoch);
        failed = view->epoch;
        continue;
      }
      if (!retry && failed == 0) {
        // The members change without a failure: what is in flight over the current links (CO2's
        // average) is let finish first, so every member keeps it alike.
        if (Status st = setup->outer->settle(deadline); !st.ok()) spdlog::warn("round {}: {}", round, st.to_string());
      }
      auto g = links.group(*view, Deadline::after(real_clock(), std::min(round_timeout, kLinkTimeout)),
                           [&, r = round, e = view->epoch] { return coordinator.superseded(r, e); });
      if (g.ok()) {
        agreed_round = round;
        current_round = round;
        epoch = view->epoch;
        members = view->members;
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
    auto done = coordinator.agree(last_round + 1, 0, Deadline::after(real_clock(), round_timeout));
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
  out.params_digest = digest_of(bytes_of(flat)).hex();
  if (out.finished) out.final_val_loss = final_val ? *final_val : setup->outer->evaluate_outer([&] { return worker.evaluate(); });
  nlohmann::json summary = account->to_json();
  summary["peer"] = go.self.to_string();
  summary["run"] = spec_hash.hex();
  summary["shard"] = rank;
  summary["shards"] = world;
  summary["finished"] = out.finished;
  summary["params_digest"] = out.params_digest;
  summary["retries"] = cs.retries;
  summary["dead_after_s"] = std::chrono::duration<double>(req.dead_after).count();
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
