#include "run/peer.h"

#include <algorithm>
#include <cstdlib>

#include <sys/resource.h>

#include <spdlog/spdlog.h>

#include "core/file.h"
#include "core/hash.h"
#include "optim/gloo_sync.h"
#include "run/peer_runtime.h"
#include "run/state_store.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/inputs.h"
#include "train/memory.h"
#include "train/metrics.h"
#include "train/run_folder.h"
#include "transport/endpoint.h"
#include "transport/gossip.h"
#include "transport/tcp_transport.h"

namespace gossamer::run {

namespace fs = std::filesystem;

namespace {

std::string zmq_address(const std::string& host_port) {
  return host_port.rfind("tcp://", 0) == 0 ? host_port : "tcp://" + host_port;
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

// ddp on Gloo or NCCL needs the engine in this build, and serves its rendezvous at the host its links
// listen on: a wildcard cannot be reached.
Status check_c10d_engine(const train::RunConfig& config, const std::string& listen) {
  if (config.pipeline.enabled || config.outer.method != optim::Method::kDdp || !train::on_c10d(config.ddp.engine)) return Status();
  if (Status built = config.ddp.engine == train::DdpEngine::kNccl ? optim::nccl_built() : optim::gloo_built(); !built.ok()) {
    return error(ErrorCode::kInvalidArgument, built.message());
  }
  if (!transport::is_wildcard_address(listen)) return Status();
  return error(ErrorCode::kInvalidArgument, "ddp.engine = \"" + train::name_of(config.ddp.engine) + "\" serves its rendezvous at the --listen host, which must then be an address the "
                                            "others reach: give --listen <this machine's address>:PORT instead of " + listen);
}

// Every address the user gave, parsed and looked up before anything starts.
Status check_addresses(const PeerRequest& req) {
  if (req.config) {
    if (Status st = check_c10d_engine(*req.config, req.listen); !st.ok()) return st;
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

namespace {

// The run folder (created, or opened to resume, and held for the whole run) and what the runtime is
// told before it starts.
Result<PeerPlan> plan_of(const PeerRequest& req, std::optional<train::RunFolder>& folder) {
  PeerPlan plan;
  const fs::path ckpt_path = req.out_dir / train::kCheckpointFile;
  if (req.resume) {
    auto opened = train::RunFolder::open_to_resume(req.out_dir, train::RunKind::kPeer);
    if (!opened.ok()) return opened.status();
    folder.emplace(std::move(*opened));
    Stopwatch watch(real_clock());
    auto state = train::read_checkpoint(ckpt_path);
    if (!state.ok()) return state.status();
    spdlog::info("checkpoint of step {} read in {:.2f} s", state->step, watch.elapsed_seconds());
    train::RunConfig stored;
    if (train::apply_toml(stored, state->config_toml, ckpt_path.string()).ok() && stored.pipeline.enabled) {
      return error(ErrorCode::kInvalidArgument, req.out_dir.string() + " holds a pipeline's trained model, which a pipeline cannot resume from (its "
                                                                       "nodes' optimizer states went with them): start a new run with another --out; "
                                                                       "the model is for gossamer sample --from and gossamer export --from");
    }
    plan.resumed = std::move(*state);
    plan.resumed_from = ckpt_path.string();
  } else if (Status st = train::RunFolder::check_new(req.out_dir, train::RunKind::kPeer); !st.ok()) {
    return st;
  } else if (req.resume_state) {
    plan.resumed = *req.resume_state;
    plan.resumed_from = "the state given";
  }
  if (req.join.empty() && !req.config && !plan.resumed) {
    return error(ErrorCode::kInvalidArgument, "the first peer defines the run: pass --config (or --join the address of a running peer)");
  }
  if (!req.resume) {
    auto created = train::RunFolder::create(req.out_dir, train::RunKind::kPeer);
    if (!created.ok()) return created.status();
    folder.emplace(std::move(*created));
  }
  if (plan.resumed) {
    plan.own_spec = plan.resumed->config_toml;
  } else if (req.config) {
    plan.own_spec = train::to_toml(*req.config);
  }
  plan.first = req.join.empty();
  plan.wait_for = static_cast<std::uint32_t>(req.wait_for);
  plan.shape = req.shape;
  plan.dead_after = req.dead_after;
  plan.spec_timeout = req.spec_timeout;
  plan.device = req.device;
  plan.start_timeout = req.start_timeout;
  plan.stop = req.stop;
  plan.outbound_only = req.outbound_only;
  plan.keyed = req.key.has_value();
  plan.crash_mid_round = req.crash_mid_round;
  return plan;
}

// Where gossip listens, as HOST:PORT.
std::string gossip_address(const transport::Gossip& gossip) {
  std::string address = gossip.address();
  if (address.rfind("tcp://", 0) == 0) address = address.substr(6);
  return address;
}

// Gossip, started first (joiners learn the run from it), its address written to the run folder.
Result<std::unique_ptr<transport::Gossip>> start_gossip(const PeerRequest& req, const std::optional<transport::Endpoint>& advertised) {
  transport::GossipOptions go;
  go.bind = zmq_address(req.listen);
  if (advertised) go.advertise = "tcp://" + advertised->to_string();
  for (const auto& j : req.join) go.seeds.push_back(zmq_address(j));
  go.self = transport::random_peer_id();
  go.key = req.key;
  go.shape = req.shape;  // gossip crosses the emulated distance too
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
  if (Status st = write_file_atomic(req.out_dir / "address", as_bytes(gossip_address(**gossip) + "\n")); !st.ok()) return st;
  spdlog::info("peer {}: gossip on {}", go.self.to_string(), gossip_address(**gossip));
  return gossip;
}

}  // namespace

namespace {

// Every connection takes a file descriptor, junk ones held open by someone on the internet too: the
// soft limit (often 1024) is raised to the hard one, so a flood runs into the transport's bounds
// before it runs out of descriptors for real links and files.
void raise_open_files_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  const rlim_t before = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) spdlog::debug("open files limit raised from {} to {}", before, lim.rlim_cur);
}

}  // namespace

Result<PeerOutcome> run_peer(const PeerRequest& req) {
  if (Status st = check_addresses(req); !st.ok()) return st;
  raise_open_files_limit();
  std::optional<train::RunFolder> folder;  // held for the whole run
  auto plan = plan_of(req, folder);
  if (!plan.ok()) return plan.status();
  const fs::path ckpt_path = req.out_dir / train::kCheckpointFile;
  const transport::Endpoint listen = *transport::parse_endpoint(req.listen, transport::EndpointUse::kListen, "--listen");
  std::optional<transport::Endpoint> advertised;
  if (!req.advertise.empty()) advertised = *parse_advertise(req.advertise, listen.port);
  auto gossip = start_gossip(req, advertised);
  if (!gossip.ok()) return gossip.status();
  const std::string address = gossip_address(**gossip);

  PeerEnvironment env;
  env.gossip = gossip->get();
  env.name = (*gossip)->self().to_string();
  env.check_run = [&](const train::RunConfig& config) -> Status {
    if ((config.model.kind == train::ModelKind::kExternal) != (req.external != nullptr)) {
      return error(ErrorCode::kInvalidArgument, req.external ? "this peer trains a model of its caller's, and the run's config is model.kind = " + train::name_of(config.model.kind)
                                                             : "the run trains a model its peers compute themselves (model.kind = external): join it from Python with the gossamer package");
    }
    if (req.external) return train::resolve_device(config.train.device).status();  // (the caller reads its own data; its memory is its own)
    // The files it reads, pinned (train/inputs.h): a resume on other files is refused before they load.
    Result<std::string> inputs = req.resume ? train::check_inputs(req.out_dir, config) : Result<std::string>(std::string());
    if (!inputs.ok()) return inputs.status();
    if (Status st = train::check_resources(config, /*workers=*/1); !st.ok()) return st;
    if (!req.resume) {
      auto pinned = train::pin_inputs(config);
      if (!pinned.ok()) return pinned.status();
      *inputs = train::inputs_json(*pinned);
    }
    if (Status st = write_file_atomic(req.out_dir / train::kInputsFile, as_bytes(*inputs)); !st.ok()) return st;
    return check_c10d_engine(config, req.listen);
  };
  env.keep_spec = [&](const std::string& spec) { return write_file_atomic(req.out_dir / "config.toml", as_bytes(spec)); };
  // Links: the run id is the spec's hash, so peers of another run are refused at the handshake.
  // Links on a port of their own next to gossip's (PORT + 1 unless --link-port), so that a firewall
  // rule or a port forward for two ports is all a peer needs.
  env.open_links = [&](const Digest& spec_hash) -> Result<OpenedLinks> {
    transport::TcpOptions to;
    const std::uint16_t link_port = *link_port_of(req, listen.port);
    to.listen = (listen.ipv6 ? "[" + listen.host + "]" : listen.host) + ":" + std::to_string(link_port);
    to.self = (*gossip)->self();
    std::copy_n(spec_hash.bytes.begin(), to.run.bytes.size(), to.run.bytes.begin());
    to.key = req.key;
    auto transport = transport::make_tcp_transport(to);
    if (!transport.ok()) {
      return error(ErrorCode::kInvalidArgument, "cannot listen for links on " + to.listen + " (" + transport.status().message() +
                                                    "): free that port, or choose the links' port with --link-port (0: any free port)");
    }
    OpenedLinks out;
    out.bound = (*transport)->address();
    out.announced = out.bound;
    if (advertised) {
      // Announced where the others reach it: the advertised host, the port as far from the advertised
      // gossip port as the links' is from the gossip's.
      const int offset = static_cast<int>(std::stoi(out.bound.substr(out.bound.rfind(':') + 1))) -
                         static_cast<int>(std::stoi(address.substr(address.rfind(':') + 1)));
      transport::Endpoint at = *advertised;
      at.port = static_cast<std::uint16_t>(std::clamp(static_cast<int>(at.port) + offset, 1, 65535));
      out.announced = at.to_string();
    }
    out.transport = std::move(*transport);
    if (Status st = write_file_atomic(req.out_dir / "address", as_bytes(address + "\n" + out.bound + "\n")); !st.ok()) return st;
    return out;
  };
  // The dial-back check: can a member open connections to this peer's gossip and links, at the
  // addresses it announces?
  env.check_reachable = [&](const std::vector<std::string>& addresses, const std::atomic<bool>* stop) -> Result<transport::Reachability> {
    return (*gossip)->check_reachable(addresses, Deadline::after(real_clock(), std::chrono::seconds(30)), stop);
  };
  env.gossip_announced = advertised ? advertised->to_string() : address;  // as bound (a port 0 resolved)
  env.corpus = [](const train::RunConfig& config) -> Result<std::shared_ptr<const train::Corpus>> {
    auto corpus = train::load_corpus(config);
    if (!corpus.ok()) return corpus.status();
    return std::shared_ptr<const train::Corpus>(std::make_shared<train::Corpus>(std::move(*corpus)));
  };
  std::optional<train::MetricsWriter> metrics;
  env.open_records = [&](std::optional<std::int64_t> resumed_at) -> Status {
    auto opened = train::MetricsWriter::open(req.out_dir / "metrics.jsonl", resumed_at);
    if (!opened.ok()) return opened.status();
    metrics.emplace(std::move(*opened));
    return Status();
  };
  env.record = [&](const nlohmann::json& rec) { return metrics->write(rec); };
  env.save_checkpoint = [&](const train::CheckpointState& cs) {
    Stopwatch watch(real_clock());
    Status st = train::write_checkpoint(ckpt_path, cs);
    std::error_code ec;
    const auto size = std::filesystem::file_size(ckpt_path, ec);
    if (st.ok() && !ec) spdlog::info("checkpoint at step {}: {} written in {:.2f} s", cs.step, train::format_bytes(static_cast<double>(size)), watch.elapsed_seconds());
    return st;
  };
  env.write_summary = [&](const nlohmann::json& summary) {
    return write_file_atomic(req.out_dir / "summary.json", as_bytes(summary.dump(2) + "\n"));
  };
  // A newcomer's state goes to the run folder as it arrives: bounded by the disk, and resumed by the
  // same command started again after a kill.
  env.snapshot_store = make_file_store(req.out_dir);
  env.external = req.external;
  if (req.external) env.evaluate = static_cast<bool>(req.external->evaluate);
  if (req.throttle > 1.0) {
    env.pace = [factor = req.throttle](double measured) {
      real_clock().sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>((factor - 1.0) * measured)));
      return factor * measured;
    };
  }
  if (req.crash_at_step > 0) {
    env.alive = [at = req.crash_at_step](std::int64_t next) {
      if (next < at) return true;
      spdlog::warn("--crash-at-step {}: dying now, as if killed", at);
      spdlog::default_logger()->flush();
      std::_Exit(137);  // what a kill -9 leaves: no farewell, no summary, sockets reset by the kernel
    };
  }
  if (req.crash_mid_round > 0) {
    env.crash = [] {
      // A moment for what it sent to reach the members it went to, as it would before a power cut.
      real_clock().sleep_for(std::chrono::seconds(1));
      spdlog::warn("--crash-mid-round: dying now, as if killed");
      spdlog::default_logger()->flush();
      std::_Exit(137);
    };
  }
  Peer peer(std::move(*plan), std::move(env));
  return peer.run();
}

}  // namespace gossamer::run
