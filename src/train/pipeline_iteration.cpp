#include "train/pipeline_iteration.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "core/check.h"
#include "transport/tags.h"

namespace gossamer::train::pipeline_detail {

std::vector<Route> routes(const skippipe::Schedule& s) {
  std::vector<Route> out;
  for (std::size_t a = 0; a < s.agents.size(); ++a) {
    std::vector<int> path{s.agents[a].origin};
    path.insert(path.end(), s.agents[a].hops.begin(), s.agents[a].hops.end());
    for (int k = 0; k < s.agents[a].microbatches; ++k) out.push_back(Route{static_cast<int>(a), path});
  }
  return out;
}

std::pair<int, int> ends(const Route& r, bool backward, int hop) {
  const int last = static_cast<int>(r.path.size()) - 1;
  auto at = [&](int h) { return r.path[static_cast<std::size_t>(h)]; };
  if (!backward) return {at(hop - 1), hop == last + 1 ? at(0) : at(hop)};
  return {hop == last ? at(0) : at(hop + 1), at(hop)};
}

PipelineIteration::PipelineIteration(PipelineNode& node, std::uint64_t iteration, const std::vector<MicroBatchData>& data, Deadline deadline)
    : node_(node),
      iteration_(iteration),
      data_(data),
      deadline_(deadline),
      all_(routes(node.schedule_)),
      memory_(node.schedule_.options.memory),
      tag_(transport::tags::kPipeline | static_cast<transport::Tag>(iteration & 0xFFFFu)),
      limits_{node.options_.max_batch, node.model_.config().context, node.model_.config().width},
      clock_(*node.options_.clock),
      t0_(clock_.now()),
      signal_(clock_.make_signal()) {
  count_messages();
}

PipelineIteration::~PipelineIteration() {
  if (!finished_ok_) {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      signal_->notify_all();
    }
    for (auto& l : node_.links_) {
      if (l) l->close();
    }
  }
  for (auto& t : threads_) t->join();
  threads_.clear();
}

double PipelineIteration::since() const { return std::chrono::duration<double>(clock_.now() - t0_).count(); }

void PipelineIteration::count_messages() {
  expected_.assign(static_cast<std::size_t>(node_.schedule_.nodes()), 0);
  outgoing_.assign(expected_.size(), 0);
  const int self = node_.node_;
  for (std::size_t m = 0; m < all_.size(); ++m) {
    const Route& r = all_[m];
    const int last = static_cast<int>(r.path.size()) - 1;
    if (r.path[0] == self) own_.push_back(static_cast<std::uint32_t>(m));
    for (int hop = 1; hop <= last + 1; ++hop) {
      const auto [from, to] = ends(r, false, hop);
      if (to == self) ++expected_[static_cast<std::size_t>(from)];
      if (from == self) ++outgoing_[static_cast<std::size_t>(to)];
    }
    for (int hop = last; hop >= 0; --hop) {
      const auto [from, to] = ends(r, true, hop);
      if (to == self) ++expected_[static_cast<std::size_t>(from)];
      if (from == self) ++outgoing_[static_cast<std::size_t>(to)];
    }
  }
  for (int e : expected_) total_expected_ += e;
}

void PipelineIteration::fail(Status st) {
  if (failed_.ok()) failed_ = std::move(st);
  signal_->notify_all();
}

// Receiving threads, one per link with something to come; what they read waits in inbox_. Sending
// threads, one per link with something to go, take what waits in its outbox in order.
void PipelineIteration::start_threads() {
  outbox_.resize(expected_.size());
  for (std::size_t j = 0; j < expected_.size(); ++j) {
    if (expected_[j] > 0) threads_.push_back(clock_.start_thread([this, j] { receive_from(j); }));
  }
  for (std::size_t j = 0; j < outgoing_.size(); ++j) {
    if (outgoing_[j] > 0) threads_.push_back(clock_.start_thread([this, j] { send_to(j); }));
  }
}

void PipelineIteration::receive_from(std::size_t j) {
  for (int k = 0; k < expected_[j]; ++k) {
    auto got = node_.links_[j]->recv(tag_, deadline_);
    std::lock_guard lock(mu_);
    if (!got.ok()) {
      fail(got.status().with_context("pipeline: receiving from node " + std::to_string(j)));
      return;
    }
    inbox_.push_back(Inbound{static_cast<int>(j), std::move(*got)});
    signal_->notify_all();
  }
}

void PipelineIteration::send_to(std::size_t j) {
  for (int k = 0; k < outgoing_[j]; ++k) {
    Bytes b;
    {
      std::unique_lock lock(mu_);
      signal_->wait(lock, Deadline::never(), [&] { return !outbox_[j].empty() || stopping_; });
      if (outbox_[j].empty()) return;
      b = std::move(outbox_[j].front());
      outbox_[j].pop_front();
    }
    const Status st = node_.links_[j]->send(tag_, b, deadline_);
    if (!st.ok()) {
      std::lock_guard lock(mu_);
      fail(st.with_context("pipeline: sending to node " + std::to_string(j)));
      return;
    }
  }
}

// A message goes to its link's sending thread: the node computes on while it is on the wire.
Status PipelineIteration::send(int to, ActivationHeader h, const at::Tensor& x) {
  h.iteration = iteration_;
  Bytes b = encode_activation(h, x, node_.options_.codec);
  stats_.messages_sent += 1;
  stats_.bytes_sent += b.size();
  std::lock_guard lock(mu_);
  if (!failed_.ok()) return failed_;
  outbox_[static_cast<std::size_t>(to)].push_back(std::move(b));
  signal_->notify_all();
  return Status();
}

// The compute just done (real compute takes no virtual time): charged to the clock, and logged.
void PipelineIteration::charge(std::uint32_t mb, WorkKind kind, double start) {
  const StageCompute& cost = node_.options_.compute;
  const double factor = kind == WorkKind::kForward ? 1.0 : kind == WorkKind::kBackward ? cost.backward_factor : cost.head_factor;
  if (cost.forward_s > 0) clock_.sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(cost.forward_s * factor)));
  const double end = since();
  stats_.work.push_back(WorkSpan{mb, kind, start, end});
  stats_.busy_s += end - start;
}

at::Tensor PipelineIteration::run_blocks(at::Tensor x) {
  for (std::int64_t b = node_.blocks_.first; b < node_.blocks_.second; ++b) x = node_.model_.block(b, x);
  return x;
}

// Whether a message belongs here: this iteration, a micro-batch and hop of the schedule, from the node
// the schedule routes it from.
Status PipelineIteration::check(int from, const ActivationHeader& h) const {
  if (h.iteration != iteration_ || h.microbatch >= all_.size()) return error(ErrorCode::kMalformed, "a message of another iteration or micro-batch");
  const Route& r = all_[h.microbatch];
  const int last = static_cast<int>(r.path.size()) - 1;
  const int hop = h.hop;
  if ((h.backward && hop > last) || (!h.backward && (hop < 1 || hop > last + 1))) return error(ErrorCode::kMalformed, "a message for a hop the path has not");
  const auto [want_from, want_to] = ends(r, h.backward, hop);
  if (want_from != from || want_to != node_.node_) {
    return error(ErrorCode::kMalformed, "micro-batch " + std::to_string(h.microbatch) + " hop " + std::to_string(hop) + " came from node " + std::to_string(from) +
                                            " to node " + std::to_string(node_.node_) + ", not as the schedule routes it");
  }
  return Status();
}

// The work a checked message calls for.
Status PipelineIteration::compute(const ActivationHeader& h, at::Tensor x) {
  const int last = static_cast<int>(all_[h.microbatch].path.size()) - 1;
  if (!h.backward && h.hop <= last) return forward(h, std::move(x));
  if (!h.backward) return head(h, std::move(x));
  return backward(h, x);
}

// A forward through this stage.
Status PipelineIteration::forward(const ActivationHeader& h, at::Tensor x) {
  const Route& r = all_[h.microbatch];
  const int last = static_cast<int>(r.path.size()) - 1;
  const int hop = h.hop;
  const double start = since();
  at::Tensor in = x.requires_grad_(true);
  at::Tensor out = run_blocks(in);
  charge(h.microbatch, WorkKind::kForward, start);
  ++stats_.forwards;
  held_[h.microbatch] = Held{in, out};
  stats_.peak_inflight = std::max(stats_.peak_inflight, static_cast<int>(held_.size()));
  ActivationHeader next{false, 0, h.microbatch, static_cast<std::uint8_t>(hop + 1), 0, 0, 0};
  return send(r.path[static_cast<std::size_t>(hop == last ? 0 : hop + 1)], next, out);
}

// Back at its origin: head, loss, and the backward starts.
Status PipelineIteration::head(const ActivationHeader& h, at::Tensor x) {
  const Route& r = all_[h.microbatch];
  const int last = static_cast<int>(r.path.size()) - 1;
  const double start = since();
  const auto it = std::find(own_.begin(), own_.end(), h.microbatch);
  const MicroBatchData& d = data_[static_cast<std::size_t>(it - own_.begin())];
  if (x.size(0) != d.targets.size(0) || x.size(1) != d.targets.size(1)) {
    return error(ErrorCode::kMalformed, "micro-batch " + std::to_string(h.microbatch) + " came back in another shape than it left");
  }
  at::Tensor in = x.requires_grad_(true);
  const at::Tensor logits = node_.model_.head(in);
  const at::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), d.targets.reshape({-1}));
  loss.backward();
  loss_of_[h.microbatch] = loss.item<double>();
  charge(h.microbatch, WorkKind::kHead, start);
  ActivationHeader next{true, 0, h.microbatch, static_cast<std::uint8_t>(last), 0, 0, 0};
  return send(r.path[static_cast<std::size_t>(last)], next, in.grad());
}

Status PipelineIteration::backward(const ActivationHeader& h, const at::Tensor& x) {
  const Route& r = all_[h.microbatch];
  const int hop = h.hop;
  const double start = since();
  auto it = held_.find(h.microbatch);
  if (it == held_.end()) return error(ErrorCode::kMalformed, "a gradient for micro-batch " + std::to_string(h.microbatch) + ", which this node does not hold");
  if (x.sizes() != it->second.out.sizes()) return error(ErrorCode::kMalformed, "a gradient for micro-batch " + std::to_string(h.microbatch) + " of another shape");
  it->second.out.backward(x);
  charge(h.microbatch, WorkKind::kBackward, start);
  ++stats_.backwards;
  if (hop == 0) {  // back at its origin: done
    held_.erase(it);
    ++finished_;
    return Status();
  }
  ActivationHeader next{true, 0, h.microbatch, static_cast<std::uint8_t>(hop - 1), 0, 0, 0};
  const at::Tensor g = it->second.in.grad();
  held_.erase(it);
  return send(r.path[static_cast<std::size_t>(hop - 1)], next, g);  // hop 0 is the origin
}

Status PipelineIteration::process(int from, const ActivationHeader& h, at::Tensor x) {
  if (Status c = check(from, h); !c.ok()) return c;
  return compute(h, std::move(x));
}

// own_[k], the k-th micro-batch this origin starts.
Status PipelineIteration::launch(std::size_t k) {
  const std::uint32_t m = own_[k];
  const double start = since();
  at::Tensor out = run_blocks(node_.model_.embed(data_[k].tokens));
  charge(m, WorkKind::kForward, start);
  ++stats_.forwards;
  held_[m] = Held{at::Tensor(), out};
  stats_.peak_inflight = std::max(stats_.peak_inflight, static_cast<int>(held_.size()));
  return send(all_[m].path[1], ActivationHeader{false, 0, m, 1, 0, 0, 0}, out);
}

// The next message off the links, decoded; an error when a link failed or the deadline passed.
Result<std::pair<int, PipelineIteration::Decoded>> PipelineIteration::receive() {
  Inbound next;
  {
    std::unique_lock lock(mu_);
    const bool got = signal_->wait(lock, deadline_, [&] { return !inbox_.empty() || !failed_.ok(); });
    if (!failed_.ok()) return failed_;
    if (!got) return error(ErrorCode::kTimeout, "pipeline iteration " + std::to_string(iteration_) + ": node " + std::to_string(node_.node_) + " waited past its deadline");
    next = std::move(inbox_.front());
    inbox_.pop_front();
  }
  ++processed_;
  auto decoded = decode_activation(next.bytes, limits_);
  if (!decoded.ok()) return decoded.status().with_context("from node " + std::to_string(next.from));
  return std::make_pair(next.from, std::move(*decoded));
}

// A forward that needs room waits behind those already waiting, in arrival order.
Status PipelineIteration::drain() {
  while (!waiting_.empty() && static_cast<int>(held_.size()) < memory_) {
    auto w = std::move(waiting_.front());
    waiting_.erase(waiting_.begin());
    if (Status st = process(w.first, w.second.first, w.second.second); !st.ok()) return st;
  }
  return Status();
}

// The timetable's order: each piece of work when its turn comes, its message taken from those that
// arrived (one that came early waits here).
Status PipelineIteration::in_timetable_order() {
  using Key = std::tuple<std::uint32_t, bool, int>;  // (micro-batch, backward, hop)
  std::map<Key, Decoded> arrived;
  std::set<Key> consumed;  // messages whose work is done
  const auto& order = node_.order_;
  std::size_t k = 0;
  Status st;
  while (st.ok() && k < order.size()) {
    const PipelineNode::OrderItem& w = order[k];
    if (w.step == PipelineNode::Step::kLaunch) {
      const auto it = std::find(own_.begin(), own_.end(), w.microbatch);
      GOSSAMER_CHECK(it != own_.end(), "PipelineNode: the timetable launches a micro-batch of another origin");
      st = launch(static_cast<std::size_t>(it - own_.begin()));
      ++launched_;
      ++k;
      continue;
    }
    const int last = static_cast<int>(all_[w.microbatch].path.size()) - 1;
    const Key key = std::make_tuple(w.microbatch, w.step == PipelineNode::Step::kBackward, w.step == PipelineNode::Step::kHead ? last + 1 : w.hop);
    if (auto it = arrived.find(key); it != arrived.end()) {
      st = compute(it->second.first, it->second.second);
      arrived.erase(it);
      consumed.insert(key);
      ++k;
      continue;
    }
    if (processed_ == total_expected_) {  // every message is in, and not the one due: a peer sent another
      return error(ErrorCode::kMalformed, "node " + std::to_string(node_.node_) + " got every message it expects but not micro-batch " +
                                              std::to_string(w.microbatch) + "'s, which its timetable does next");
    }
    auto got = receive();
    if (!got.ok()) return got.status();
    auto& [from, msg] = *got;
    st = check(from, msg.first);
    const Key at = std::make_tuple(msg.first.microbatch, msg.first.backward, static_cast<int>(msg.first.hop));
    if (st.ok() && (arrived.count(at) > 0 || consumed.count(at) > 0)) {
      st = error(ErrorCode::kMalformed, "micro-batch " + std::to_string(msg.first.microbatch) + "'s message came twice");
    }
    if (st.ok()) arrived.emplace(at, std::move(msg));
  }
  if (st.ok() && (!arrived.empty() || processed_ != total_expected_)) {
    st = error(ErrorCode::kMalformed, "node " + std::to_string(node_.node_) + " got messages its timetable has no work for");
  }
  return st;
}

// Arrival order: an origin launches while it has room, in the schedule's order; a forward that finds
// no room waits (backwards first).
Status PipelineIteration::in_arrival_order() {
  Status st;
  while (st.ok()) {
    while (st.ok() && launched_ < own_.size() && static_cast<int>(held_.size()) < memory_) {
      st = launch(launched_);
      ++launched_;
    }
    if (!st.ok() || (processed_ == total_expected_ && waiting_.empty() && finished_ == own_.size() && launched_ == own_.size())) break;
    // The next message (waiting forwards were given what room there is after the last one).
    auto got = receive();
    if (!got.ok()) return got.status();
    auto& [from, decoded] = *got;
    const ActivationHeader& h = decoded.first;
    const Route* r = h.microbatch < all_.size() ? &all_[h.microbatch] : nullptr;
    const bool takes_memory = !h.backward && r != nullptr && h.hop <= static_cast<int>(r->path.size()) - 1;
    if (takes_memory && (static_cast<int>(held_.size()) >= memory_ || !waiting_.empty())) {
      waiting_.emplace_back(from, std::move(decoded));
    } else {
      st = process(from, h, decoded.second);
    }
    if (st.ok()) st = drain();
  }
  return st;
}

Result<IterationStats> PipelineIteration::run() {
  if (data_.size() != own_.size()) {
    // The others learn at once instead of at their deadline (the destructor closes the links).
    return error(ErrorCode::kInvalidArgument, "node " + std::to_string(node_.node_) + " launches " + std::to_string(own_.size()) +
                                                  " micro-batches but was given " + std::to_string(data_.size()));
  }
  for (std::size_t j = 0; j < expected_.size(); ++j) {
    GOSSAMER_CHECK(expected_[j] == 0 || node_.links_[j], "PipelineNode: no link to node " + std::to_string(j) + ", which sends to this one");
    GOSSAMER_CHECK(outgoing_[j] == 0 || node_.links_[j], "PipelineNode: no link to node " + std::to_string(j) + ", which this one sends to");
  }
  start_threads();
  Status st;
  try {
    st = node_.order_.empty() ? in_arrival_order() : in_timetable_order();
  } catch (const std::exception& e) {
    // A tensor of a shape the stage cannot take (a peer's message passed its header's checks).
    st = error(ErrorCode::kMalformed, std::string("pipeline iteration ") + std::to_string(iteration_) + ": node " + std::to_string(node_.node_) + ": " + e.what());
  }
  if (!st.ok()) return st;  // (the destructor closes the links and joins the threads)
  // Done once the last message has left: the sending threads end after their last.
  for (auto& t : threads_) t->join();
  threads_.clear();
  {
    std::lock_guard lock(mu_);
    if (!failed_.ok()) return failed_;
  }
  finished_ok_ = true;
  stats_.finished_s = since();
  for (std::uint32_t m : own_) stats_.losses.push_back(loss_of_[m]);
  return stats_;
}

}  // namespace gossamer::train::pipeline_detail
