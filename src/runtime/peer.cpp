#include "runtime/peer.h"

#include <algorithm>
#include <cstdlib>

#include <sys/resource.h>

#include <spdlog/spdlog.h>

#include "core/file.h"
#include "core/hash.h"
#include "optim/gloo_sync.h"
#include "runtime/peer_runtime.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/inputs.h"
#include "train/memory.h"
#include "train/run_folder.h"
#include "transport/endpoint.h"
#include "transport/gossip.h"
#include "transport/tcp_transport.h"

namespace gossamer::runtime {

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

// This machine as a peer's host: ZeroMQ gossip (started first: joiners learn the run from it), TCP
// links on a port of their own next to gossip's (PORT + 1 unless --link-port, so that a firewall rule
// or a port forward for two ports is all a peer needs), the real clock, --throttle's pace. Where it
// listens goes to the run's store.
class MachineHost final : public Host {
 public:
  static Result<std::unique_ptr<MachineHost>> start(const PeerRequest& req, RunStore& store) {
    auto host = std::unique_ptr<MachineHost>(new MachineHost(req, store));
    if (!req.advertise.empty()) host->advertised_ = *parse_advertise(req.advertise, host->listen_.port);
    transport::GossipOptions go;
    go.bind = zmq_address(req.listen);
    if (host->advertised_) go.advertise = "tcp://" + host->advertised_->to_string();
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
    host->gossip_ = std::move(*gossip);
    host->address_ = gossip_address(*host->gossip_);
    if (Status st = store.keep_addresses({host->address_}); !st.ok()) return st;
    spdlog::info("peer {}: gossip on {}", go.self.to_string(), host->address_);
    return host;
  }

  Clock& clock() override { return real_clock(); }
  transport::Gossip& gossip() override { return *gossip_; }
  std::string gossip_announced() const override { return advertised_ ? advertised_->to_string() : address_; }

  Result<OpenedLinks> open_links(const Digest& spec_hash) override {
    transport::TcpOptions to;
    to.listen = (listen_.ipv6 ? "[" + listen_.host + "]" : listen_.host) + ":" + std::to_string(*link_port_of(req_, listen_.port));
    to.self = gossip_->self();
    std::copy_n(spec_hash.bytes.begin(), to.run.bytes.size(), to.run.bytes.begin());
    to.key = req_.key;
    auto transport = transport::make_tcp_transport(to);
    if (!transport.ok()) {
      return error(ErrorCode::kInvalidArgument, "cannot listen for links on " + to.listen + " (" + transport.status().message() +
                                                    "): free that port, or choose the links' port with --link-port (0: any free port)");
    }
    OpenedLinks out;
    out.bound = (*transport)->address();
    out.announced = out.bound;
    if (advertised_) {
      // Announced where the others reach it: the advertised host, the port as far from the advertised
      // gossip port as the links' is from the gossip's.
      const int offset = static_cast<int>(std::stoi(out.bound.substr(out.bound.rfind(':') + 1))) -
                         static_cast<int>(std::stoi(address_.substr(address_.rfind(':') + 1)));
      transport::Endpoint at = *advertised_;
      at.port = static_cast<std::uint16_t>(std::clamp(static_cast<int>(at.port) + offset, 1, 65535));
      out.announced = at.to_string();
    }
    out.transport = std::move(*transport);
    if (Status st = store_.keep_addresses({address_, out.bound}); !st.ok()) return st;
    return out;
  }

  // The dial-back check: can a member open connections to this peer's gossip and links, at the
  // addresses it announces?
  std::optional<Result<transport::Reachability>> check_reachable(const std::vector<std::string>& addresses, const std::atomic<bool>* stop) override {
    return gossip_->check_reachable(addresses, Deadline::after(real_clock(), std::chrono::seconds(30)), stop);
  }

  // --throttle: each step waits out (factor - 1) times its measured length.
  double pace(double measured_s) override {
    if (req_.throttle <= 1.0) return measured_s;
    real_clock().sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>((req_.throttle - 1.0) * measured_s)));
    return req_.throttle * measured_s;
  }

 private:
  MachineHost(const PeerRequest& req, RunStore& store)
      : req_(req), store_(store), listen_(*transport::parse_endpoint(req.listen, transport::EndpointUse::kListen, "--listen")) {}

  const PeerRequest& req_;
  RunStore& store_;
  const transport::Endpoint listen_;
  std::optional<transport::Endpoint> advertised_;
  std::unique_ptr<transport::Gossip> gossip_;
  std::string address_;  // gossip's HOST:PORT as bound
};

// The run's config against this machine and request, once it is known: the model the caller brings
// or not, the files it reads (pinned in the run folder; a resume on other files is refused before
// they load), memory, the ddp engine.
Status check_run_here(const PeerRequest& req, const train::RunConfig& config) {
  if ((config.model.kind == train::ModelKind::kExternal) != (req.external != nullptr)) {
    return error(ErrorCode::kInvalidArgument, req.external ? "this peer trains a model of its caller's, and the run's config is model.kind = " + train::name_of(config.model.kind)
                                                           : "the run trains a model its peers compute themselves (model.kind = external): join it from Python with the gossamer package");
  }
  if (req.external) return train::resolve_device(config.train.device).status();  // (the caller reads its own data; its memory is its own)
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
}

// The fault drills of `gossamer peer` (--crash-at-step, --crash-mid-round): the process ends as if
// killed (no farewell, no summary, sockets reset by the kernel).
void add_fault_drills(const PeerRequest& req, PeerEnvironment& env) {
  if (req.crash_at_step > 0) {
    env.alive = [at = req.crash_at_step](std::int64_t next) {
      if (next < at) return true;
      spdlog::warn("--crash-at-step {}: dying now, as if killed", at);
      spdlog::default_logger()->flush();
      std::_Exit(137);
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
}

}  // namespace

Result<PeerOutcome> run_peer(const PeerRequest& req) {
  if (Status st = check_addresses(req); !st.ok()) return st;
  raise_open_files_limit();
  std::optional<train::RunFolder> folder;  // held for the whole run
  auto plan = plan_of(req, folder);
  if (!plan.ok()) return plan.status();
  const std::shared_ptr<RunStore> store = make_folder_store(req.out_dir);
  auto host = MachineHost::start(req, *store);
  if (!host.ok()) return host.status();

  PeerEnvironment env;
  env.host = host->get();
  env.store = store;
  env.name = (*host)->gossip().self().to_string();
  env.check_run = [&req](const train::RunConfig& config) { return check_run_here(req, config); };
  env.corpus = [](const train::RunConfig& config) -> Result<std::shared_ptr<const train::Corpus>> {
    auto corpus = train::load_corpus(config);
    if (!corpus.ok()) return corpus.status();
    return std::shared_ptr<const train::Corpus>(std::make_shared<train::Corpus>(std::move(*corpus)));
  };
  env.external = req.external;
  if (req.external) env.evaluate = static_cast<bool>(req.external->evaluate);
  add_fault_drills(req, env);
  Peer peer(std::move(*plan), std::move(env));
  return peer.run();
}

}  // namespace gossamer::runtime
