#include "run/pipeline_mesh.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "core/signal.h"
#include "core/wire.h"
#include "transport/shaped_link.h"
#include "transport/tags.h"

namespace gossamer::run::pipeline_mesh {

namespace {

constexpr transport::Tag kEpochTag = transport::tags::kPipelineEpoch;

// One epoch's linking: a thread accepting the nodes above, one dialling each node below.
class Mesh {
 public:
  Mesh(const PipelineProcessRequest& req, transport::Transport& transport, const Want& want)
      : req_(req), clock_(*req.clock), transport_(transport), want_(want), n_(static_cast<int>(req.addresses.size())), links_(static_cast<std::size_t>(n_)) {}

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
  Deadline soon(Nanos d) const { return Deadline::at(std::min(want_.deadline.time(), clock_.now() + d)); }
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
  Status dial(int j);
  bool take_from_above(const std::shared_ptr<transport::Link>& link);
  Status shape();

  const PipelineProcessRequest& req_;
  Clock& clock_;
  transport::Transport& transport_;
  const Want& want_;
  const int n_;
  Links links_;
  Status accepted_;
};

// Takes a connection from a node above: it must be one expected, say this epoch first, and hear
// this node's answer.
bool Mesh::take_from_above(const std::shared_ptr<transport::Link>& link) {
  const int self = req_.node;
  const int from = node_of(link->peer());
  const bool known = from > self && wanted(from) && !links_[static_cast<std::size_t>(from)];
  const auto their = known ? epoch_in(link->recv(kEpochTag, Deadline::after(clock_, std::chrono::seconds(5)))) : std::nullopt;
  if (!their || *their != want_.epoch) {
    link->close();
    spdlog::warn("pipeline node {}: closed a link from peer {}: not a node above this one expected in epoch {}", self, link->peer().to_string(), want_.epoch);
    return false;
  }
  // The dialler keeps the link only once this node said it takes part.
  if (!link->send(kEpochTag, epoch_bytes(), Deadline::after(clock_, std::chrono::seconds(5))).ok()) {
    link->close();
    return false;
  }
  links_[static_cast<std::size_t>(from)] = link;
  return true;
}

void Mesh::accept_above() {
  int above = 0;
  for (int j = req_.node + 1; j < n_; ++j) above += wanted(j) ? 1 : 0;
  for (int k = 0; k < above;) {
    // In short waits, so that a stop is seen at once.
    auto link = transport_.accept(soon(std::chrono::milliseconds(250)));
    if (!link.ok() && link.status().code() == ErrorCode::kTimeout && !want_.deadline.expired(clock_) && !stopped()) continue;
    if (!link.ok()) {
      if (!want_.tolerate || stopped()) {
        accepted_ = link.status().with_context("waiting for the nodes above " + std::to_string(req_.node) + " to connect (start them, with the same --addresses)");
      }
      return;
    }
    if (take_from_above(*link)) ++k;
  }
}

// Dials node j until it answers, the deadline passes or a stop: the epoch, and the node's answer (a
// process that still listens but no longer takes part, because it stopped, does not answer, and is
// left out like one that is gone).
Status Mesh::dial(int j) {
  const std::string& at = req_.addresses[static_cast<std::size_t>(j)];
  for (;;) {
    auto link = transport_.connect(at, soon(std::chrono::seconds(5)));
    if (link.ok()) {
      if ((*link)->peer() != id_of(j)) {
        (*link)->close();
        return error(ErrorCode::kInvalidArgument, "the process at " + at + " is not pipeline node " + std::to_string(j) +
                                                      ": check --addresses (the same list, in node order, on every node)");
      }
      Status st = (*link)->send(kEpochTag, epoch_bytes(), want_.deadline);
      auto ack = st.ok() ? (*link)->recv(kEpochTag, want_.deadline) : Result<Bytes>(st);
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
    if (wanted(j)) dialers.push_back(clock_.start_thread([this, j, &dialled] { dialled[static_cast<std::size_t>(j)] = dial(j); }));
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
  for (std::size_t j = 0; j < links.size(); ++j) {
    if (!links[j] || static_cast<int>(j) == self) continue;
    if (Status st = links[j]->send(tag, payload, deadline); !st.ok()) return st.with_context(what + ": sending to node " + std::to_string(j));
  }
  std::vector<Bytes> out(links.size());
  for (std::size_t j = 0; j < links.size(); ++j) {
    if (!links[j] || static_cast<int>(j) == self) continue;
    auto got = links[j]->recv(tag, deadline);
    if (!got.ok()) return got.status().with_context(what + ": waiting for node " + std::to_string(j));
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

}  // namespace gossamer::run::pipeline_mesh
