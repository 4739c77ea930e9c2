#include "runtime/pipeline_mesh.h"

#include <algorithm>
#include <mutex>

#include <spdlog/spdlog.h>

#include "core/signal.h"
#include "core/wire.h"
#include "transport/shaped_link.h"
#include "transport/tags.h"

namespace gossamer::runtime::pipeline_mesh {

namespace {

constexpr transport::Tag kEpochTag = transport::tags::kPipelineEpoch;
constexpr Nanos kAttempt = std::chrono::seconds(5);  // one connection attempt's longest wait

// One epoch's linking: a thread accepting the nodes above, one dialling each node below.
class Mesh {
 public:
  Mesh(const PipelineProcessRequest& req, transport::Transport& transport, const Want& want)
      : req_(req), clock_(*req.clock), transport_(transport), want_(want), n_(static_cast<int>(req.addresses.size())), links_(static_cast<std::size_t>(n_)), gone_(static_cast<std::size_t>(n_), 0) {}

  Result<Links> run();

 private:
  transport::PeerId id_of(int node) const {
    return req_.ids.empty() ? transport::PeerId{static_cast<std::uint64_t>(node) + 1} : req_.ids[static_cast<std::size_t>(node)];
  }
  int node_of(transport::PeerId id) const {  // -1: no node of this pipeline
    for (int k = 0; k < n_; ++k) {
      if (id_of(k) == id) return k;
    }
    return -1;
  }
  bool stopped() const { return req_.stop != nullptr && req_.stop->load(); }
  bool wanted(int j) const { return want_.nodes[static_cast<std::size_t>(j)]; }
  Deadline soon(Deadline limit, Nanos d) const { return Deadline::at(std::min(limit.time(), clock_.now() + d)); }
  bool dialling() {
    std::lock_guard lock(mu_);
    return dialling_ > 0;
  }
  // A node above whose process answers (or has not been probed yet) may still be inside the failed
  // iteration, not having noticed yet: it is waited for up to alive_deadline.
  bool waiting_for_alive_above() {
    std::lock_guard lock(mu_);
    for (int j = req_.node + 1; j < n_; ++j) {
      if (wanted(j) && !gone_[static_cast<std::size_t>(j)] && !links_[static_cast<std::size_t>(j)]) return true;
    }
    return false;
  }
  Bytes epoch_bytes() const {
    Writer w;
    w.u64(want_.epoch);
    return std::move(w).take();
  }
  // The epoch in a message of the other side: nullopt when it is not one.
  static std::optional<std::uint64_t> epoch_in(const Result<Bytes>& said) {
    if (!said.ok()) return std::nullopt;
    Reader r(*said, "pipeline epoch");
    const std::uint64_t e = r.u64();
    r.expect_end();
    return r.ok() ? std::optional(e) : std::nullopt;
  }
  void accept_above();
  void probe(int j);
  Status dial(int j);
  bool take_from_above(const std::shared_ptr<transport::Link>& link);
  Status shape();

  const PipelineProcessRequest& req_;
  Clock& clock_;
  transport::Transport& transport_;
  const Want& want_;
  const int n_;
  std::mutex mu_;  // links_ above this node and gone_, between the threads
  Links links_;
  std::vector<char> gone_;  // per node: its process failed the last two probes in a row
  bool accepting_over_ = false;  // the acceptor is done: the probes end
  int dialling_ = 0;             // dialers still at work
  Status accepted_;
};

// Takes a connection from a node above: it must be one expected, say this epoch first, and hear
// this node's answer. Each on a thread of its own: one slow or silent connection holds up no other.
bool Mesh::take_from_above(const std::shared_ptr<transport::Link>& link) {
  const int self = req_.node;
  const int from = node_of(link->peer());
  auto free_slot = [&] {
    std::lock_guard lock(mu_);
    return from > self && wanted(from) && !links_[static_cast<std::size_t>(from)];
  };
  auto said = free_slot() ? link->recv(kEpochTag, Deadline::after(clock_, std::chrono::seconds(5))) : Result<Bytes>(error(ErrorCode::kMalformed, "unexpected"));
  const auto their = epoch_in(said);
  if (!their || *their != want_.epoch) {
    link->close();
    // Another node's probe of this one (Mesh::probe: from a node below, closed without a word).
    if ((from >= 0 && from < self) || said.status().code() == ErrorCode::kPeerLost) return false;
    spdlog::warn("pipeline node {}: closed a link from peer {}: not a node above this one expected in epoch {}", self, link->peer().to_string(), want_.epoch);
    return false;
  }
  // The dialler keeps the link only once this node said it takes part.
  if (!free_slot() || !link->send(kEpochTag, epoch_bytes(), Deadline::after(clock_, std::chrono::seconds(5))).ok()) {
    link->close();
    return false;
  }
  {
    // Two handshakes from one node (a dialler's retry) may both have found the slot free: the first keeps it.
    std::lock_guard lock(mu_);
    if (!links_[static_cast<std::size_t>(from)]) {
      links_[static_cast<std::size_t>(from)] = link;
      return true;
    }
  }
  link->close();
  return false;
}

void Mesh::accept_above() {
  int above = 0;
  for (int j = req_.node + 1; j < n_; ++j) above += wanted(j) ? 1 : 0;
  std::vector<std::unique_ptr<ClockThread>> handshakes;
  auto all_linked = [&] {
    std::lock_guard lock(mu_);
    int linked = 0;
    for (int j = req_.node + 1; j < n_; ++j) linked += links_[static_cast<std::size_t>(j)] ? 1 : 0;
    return linked >= above;
  };
  std::vector<std::unique_ptr<ClockThread>> probes;
  for (int j = req_.node + 1; j < n_ && want_.tolerate; ++j) {
    if (wanted(j)) probes.push_back(clock_.start_thread([this, j] { probe(j); }));
  }
  auto keep_waiting = [&] {
    if (stopped()) return false;
    if (!want_.deadline.expired(clock_)) return true;
    // While this node still dials, a node above that dials it now is taken too: a node that sees it
    // as linked must not be left out here.
    return want_.tolerate && !want_.alive_deadline.expired(clock_) && (waiting_for_alive_above() || dialling());
  };
  while (!all_linked()) {
    // In short waits, so that a stop (and the handshakes' end) is seen at once.
    auto link = transport_.accept(soon(want_.tolerate ? want_.alive_deadline : want_.deadline, std::chrono::milliseconds(250)));
    if (!link.ok() && link.status().code() == ErrorCode::kTimeout && keep_waiting()) continue;
    if (!link.ok()) {
      if (!want_.tolerate || stopped()) {
        accepted_ = link.status().with_context("waiting for the nodes above " + std::to_string(req_.node) + " to connect (start them, with the same --addresses)");
      }
      break;
    }
    handshakes.push_back(clock_.start_thread([this, l = std::move(*link)] { (void)take_from_above(l); }));
  }
  for (auto& h : handshakes) h->join();
  {
    std::lock_guard lock(mu_);
    accepting_over_ = true;
  }
  for (auto& p : probes) p->join();
  if (accepted_.ok() && !want_.tolerate && !all_linked()) accepted_ = error(ErrorCode::kUnavailable, "not every node above " + std::to_string(req_.node) + " linked");
}

// Once the deadline has passed without node j: whether its process answers (a connection through
// the transport's handshake, closed at once), again and again until it linked or the longest wait
// is over. A process that has ended stops answering, and is no longer waited for. (Not before the
// deadline: until then every node is waited for anyway, and probes would only crowd the handshakes.)
void Mesh::probe(int j) {
  const std::string& at = req_.addresses[static_cast<std::size_t>(j)];
  Nanos pause = std::chrono::seconds(1);
  Nanos next = want_.deadline.time();
  int failures = 0;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (links_[static_cast<std::size_t>(j)] || accepting_over_) return;
    }
    if (stopped() || want_.alive_deadline.expired(clock_)) return;
    if (clock_.now() >= next) {
      // A whole attempt each time, even past a deadline: a handshake cut short says nothing.
      auto link = transport_.connect(at, Deadline::after(clock_, kAttempt));
      failures = link.ok() ? 0 : failures + 1;
      {
        // Gone after two attempts in a row that failed (one may fail under load).
        std::lock_guard lock(mu_);
        if (link.ok()) gone_[static_cast<std::size_t>(j)] = 0;
        if (failures >= 2) gone_[static_cast<std::size_t>(j)] = 1;
      }
      if (link.ok()) (*link)->close();
      next = clock_.now() + (failures == 1 ? std::chrono::milliseconds(200) : pause);
      if (link.ok()) pause = std::min<Nanos>(2 * pause, std::chrono::seconds(30));  // (each probe waits in its accept queue)
    }
    clock_.sleep_until(std::min({want_.alive_deadline.time(), next, clock_.now() + std::chrono::milliseconds(250)}));
  }
}

// Dials node j until it answers, the deadline passes or a stop: the epoch, and the node's answer (a
// process that still listens but no longer takes part, because it stopped, does not answer, and is
// left out like one that is gone).
Status Mesh::dial(int j) {
  const std::string& at = req_.addresses[static_cast<std::size_t>(j)];
  for (;;) {
    // A whole attempt each time, even one that ends past the deadline: a handshake cut short by it
    // would leave out a node that is there, while it waits for this one.
    auto link = transport_.connect(at, Deadline::after(clock_, kAttempt));
    if (link.ok()) {
      if ((*link)->peer() != id_of(j)) {
        (*link)->close();
        return error(ErrorCode::kInvalidArgument, "the process at " + at + " is not pipeline node " + std::to_string(j) +
                                                      ": check --addresses (the same list, in node order, on every node)");
      }
      const Deadline answer_by = want_.tolerate ? want_.alive_deadline : want_.deadline;
      Status st = (*link)->send(kEpochTag, epoch_bytes(), answer_by);
      auto ack = st.ok() ? (*link)->recv(kEpochTag, answer_by) : Result<Bytes>(st);
      const auto their = epoch_in(ack);
      if (!their || *their != want_.epoch) {
        (*link)->close();
        if (want_.tolerate) return Status();
        const Status why = ack.ok() ? error(ErrorCode::kMalformed, "pipeline node " + std::to_string(j) + " answered another epoch") : ack.status();
        return why.with_context("linking with pipeline node " + std::to_string(j));
      }
      links_[static_cast<std::size_t>(j)] = std::move(*link);
      return Status();
    }
    if (link.status().code() == ErrorCode::kVersionMismatch || link.status().code() == ErrorCode::kUnauthenticated) {
      return link.status().with_context("pipeline node " + std::to_string(j) + " at " + at + " (another config? every node must be given the same one)");
    }
    if (stopped()) return error(ErrorCode::kAborted, "stopped while linking");
    if (want_.deadline.expired(clock_)) {
      if (want_.tolerate) return Status();
      return error(ErrorCode::kUnavailable,
                   "pipeline node " + std::to_string(j) + " at " + at + " did not answer: start it, or check the address (" + link.status().message() + ")");
    }
    clock_.sleep_for(std::chrono::milliseconds(200));  // not up yet: try again
  }
}

Status Mesh::shape() {
  if (!req_.shape) return Status();
  for (std::size_t j = 0; j < links_.size(); ++j) {
    if (!links_[j]) continue;
    auto shaped = transport::make_shaped_link(links_[j], *req_.shape, want_.epoch * 1'000'003 + static_cast<std::uint64_t>(req_.node) * 1000 + j + 1);
    if (!shaped.ok()) return shaped.status();
    links_[j] = std::move(*shaped);
  }
  return Status();
}

Result<Links> Mesh::run() {
  auto acceptor = clock_.start_thread([this] { accept_above(); });
  // Every node below at once: one that does not answer must not hold up the others.
  std::vector<Status> dialled(static_cast<std::size_t>(std::max(req_.node, 0)));
  std::vector<std::unique_ptr<ClockThread>> dialers;
  for (int j = 0; j < req_.node; ++j) {
    if (!wanted(j)) continue;
    {
      std::lock_guard lock(mu_);
      ++dialling_;
    }
    dialers.push_back(clock_.start_thread([this, j, &dialled] {
      dialled[static_cast<std::size_t>(j)] = dial(j);
      std::lock_guard lock(mu_);
      --dialling_;
    }));
  }
  for (auto& d : dialers) d->join();
  Status st;
  for (const auto& s : dialled) {
    if (st.ok() && !s.ok()) st = s;
  }
  acceptor->join();  // (it waits for nodes that may never come until its deadline or a stop)
  if (st.ok()) st = accepted_;
  if (st.ok()) st = shape();
  if (!st.ok()) {
    close_all(links_);
    return st;
  }
  return std::move(links_);
}

}  // namespace

void close_all(const Links& links) {
  for (const auto& l : links) {
    if (l) l->close();
  }
}

Result<Links> connect(const PipelineProcessRequest& request, transport::Transport& transport, const Want& want) {
  GOSSAMER_CHECK(request.clock != nullptr, "pipeline_mesh::connect: the request names no clock");
  GOSSAMER_CHECK(want.nodes.size() == request.addresses.size(), "pipeline_mesh::connect: one wanted flag per node");
  Mesh mesh(request, transport, want);
  return mesh.run();
}

Result<std::vector<Bytes>> exchange(const Links& links, int self, transport::Tag tag, ByteView payload, Deadline deadline, const std::string& what) {
  // To every node, even past one that is gone: the others must hear this node all the same (a node
  // that heard everyone's confirmation applies the iteration, whoever died after sending it).
  std::vector<Status> sent(links.size());
  for (std::size_t j = 0; j < links.size(); ++j) {
    if (links[j] && static_cast<int>(j) != self) sent[j] = links[j]->send(tag, payload, deadline);
  }
  // A node's message that arrived before its link closed counts; the link's failure only when not.
  std::vector<Bytes> out(links.size());
  for (std::size_t j = 0; j < links.size(); ++j) {
    if (!links[j] || static_cast<int>(j) == self) continue;
    auto got = links[j]->recv(tag, deadline);
    if (!got.ok()) {
      const bool send_failed = !sent[j].ok();
      return (send_failed ? sent[j] : got.status()).with_context(what + ": " + (send_failed ? "sending to" : "waiting for") + " node " + std::to_string(j));
    }
    out[j] = std::move(*got);
  }
  return out;
}

std::string node_list(const std::vector<bool>& v) {
  std::string out;
  for (std::size_t k = 0; k < v.size(); ++k) {
    if (!v[k]) continue;
    if (!out.empty()) out += ',';
    out += std::to_string(k);
  }
  return out;
}

}  // namespace gossamer::runtime::pipeline_mesh
