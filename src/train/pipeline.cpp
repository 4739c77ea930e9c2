#include "train/pipeline.h"

#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "core/check.h"
#include "core/signal.h"
#include "train/pipeline_wire.h"
#include "transport/tags.h"

namespace gossamer::train {

namespace {

struct Route {
  int agent = 0;
  std::vector<int> path;  // origin, then the hops
};

// Every micro-batch's path, in the schedule's order (agents in order, each one's in turn).
std::vector<Route> routes(const skippipe::Schedule& s) {
  std::vector<Route> out;
  for (std::size_t a = 0; a < s.agents.size(); ++a) {
    std::vector<int> path{s.agents[a].origin};
    path.insert(path.end(), s.agents[a].hops.begin(), s.agents[a].hops.end());
    for (int k = 0; k < s.agents[a].microbatches; ++k) out.push_back(Route{static_cast<int>(a), path});
  }
  return out;
}

// The sender and receiver of a micro-batch's message at `hop` in each direction.
std::pair<int, int> ends(const Route& r, bool backward, int hop) {
  const int last = static_cast<int>(r.path.size()) - 1;
  auto at = [&](int h) { return r.path[static_cast<std::size_t>(h)]; };
  if (!backward) return {at(hop - 1), hop == last + 1 ? at(0) : at(hop)};
  return {hop == last ? at(0) : at(hop + 1), at(hop)};
}

transport::Tag pipeline_tag(std::uint64_t iteration) { return transport::tags::kPipeline | static_cast<transport::Tag>(iteration & 0xFFFFu); }

}  // namespace

std::vector<int> node_visits(const skippipe::Schedule& s) {
  std::vector<int> v(static_cast<std::size_t>(s.nodes()), 0);
  for (const auto& r : routes(s)) {
    std::vector<int> seen = r.path;
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int node : seen) {
      if (node >= 0 && node < s.nodes()) ++v[static_cast<std::size_t>(node)];
    }
  }
  return v;
}

std::pair<std::int64_t, std::int64_t> stage_blocks(std::int64_t stage, std::int64_t stages, std::int64_t layers) {
  GOSSAMER_CHECK(stages >= 1 && layers % stages == 0, "a pipeline of " + std::to_string(stages) + " stages needs model.layers divisible by it (it is " +
                                                          std::to_string(layers) + ")");
  GOSSAMER_CHECK(stage >= 0 && stage < stages, "no stage " + std::to_string(stage));
  const std::int64_t per = layers / stages;
  return {stage * per, (stage + 1) * per};
}

PipelineNode::PipelineNode(int node, skippipe::Schedule schedule, model::Gpt model, std::vector<std::shared_ptr<transport::Link>> links,
                           PipelineNodeOptions options)
    : node_(node), schedule_(std::move(schedule)), model_(std::move(model)), links_(std::move(links)), options_(options) {
  GOSSAMER_CHECK(options_.clock != nullptr, "PipelineNode: no clock");
  GOSSAMER_CHECK(node >= 0 && node < schedule_.nodes(), "PipelineNode: node outside the schedule");
  GOSSAMER_CHECK(static_cast<int>(links_.size()) == schedule_.nodes(), "PipelineNode: one link slot per node");
  stage_ = schedule_.stage_of[static_cast<std::size_t>(node)];
  blocks_ = stage_blocks(stage_, schedule_.options.stages, model_.config().layers);
  for (const auto& block : model_.blocks()) {
    bool mine = false;
    if (block.name == "embed" || block.name == "final") {
      mine = stage_ == 0;
    } else {
      const std::int64_t i = std::stoll(block.name.substr(6));  // "block.i"
      mine = i >= blocks_.first && i < blocks_.second;
    }
    if (mine) {
      optim::ParamBlock pb{block.name, {}};
      for (const auto& p : block.parameters) {
        params_.push_back(p.tensor);
        pb.tensors.push_back(p.tensor);
      }
      param_blocks_.push_back(std::move(pb));
    }
  }
  plan_work();
}

void PipelineNode::reschedule(skippipe::Schedule schedule, std::vector<std::shared_ptr<transport::Link>> links) {
  GOSSAMER_CHECK(schedule.nodes() == schedule_.nodes() && static_cast<int>(links.size()) == schedule.nodes(), "PipelineNode::reschedule: another number of nodes");
  GOSSAMER_CHECK(schedule.stage_of[static_cast<std::size_t>(node_)] == stage_, "PipelineNode::reschedule: a node keeps its stage");
  schedule_ = std::move(schedule);
  links_ = std::move(links);
  plan_work();
}

void PipelineNode::plan_work() {
  order_.clear();
  visits_ = 0;
  stage_visits_ = 0;
  if (!schedule_.timetable.empty()) {
    // This node's work from the timetable, by start time (ties, which a timetable of positive costs
    // does not have, by micro-batch).
    std::vector<std::uint32_t> first(schedule_.agents.size(), 0);  // each agent's first micro-batch
    for (std::size_t a = 1; a < schedule_.agents.size(); ++a) first[a] = first[a - 1] + static_cast<std::uint32_t>(schedule_.agents[a - 1].microbatches);
    std::vector<std::pair<double, OrderItem>> items;
    for (const auto& e : schedule_.timetable) {
      GOSSAMER_CHECK(e.agent >= 0 && static_cast<std::size_t>(e.agent) < schedule_.agents.size(), "PipelineNode: a timetable entry of no agent");
      const auto& agent = schedule_.agents[static_cast<std::size_t>(e.agent)];
      GOSSAMER_CHECK(e.hop >= 0 && e.hop <= static_cast<int>(agent.hops.size()) && e.microbatch >= 0 && e.microbatch < agent.microbatches,
                     "PipelineNode: a timetable entry off its agent's path");
      const int at = e.hop == 0 ? agent.origin : agent.hops[static_cast<std::size_t>(e.hop - 1)];
      if (at != node_) continue;
      const std::uint32_t mb = first[static_cast<std::size_t>(e.agent)] + static_cast<std::uint32_t>(e.microbatch);
      if (e.hop == 0) {
        items.push_back({e.forward_start, OrderItem{mb, Step::kLaunch, 0}});
        items.push_back({e.head_start, OrderItem{mb, Step::kHead, 0}});
      } else {
        items.push_back({e.forward_start, OrderItem{mb, Step::kForward, e.hop}});
      }
      items.push_back({e.backward_start, OrderItem{mb, Step::kBackward, e.hop}});
    }
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second.microbatch < b.second.microbatch;
    });
    for (const auto& [t, item] : items) order_.push_back(item);
  }
  for (const auto& r : routes(schedule_)) {
    const bool here = std::find(r.path.begin(), r.path.end(), node_) != r.path.end();
    bool stage_here = stage_ == 0;
    for (int v : r.path) stage_here = stage_here || schedule_.stage_of[static_cast<std::size_t>(v)] == stage_;
    visits_ += here ? 1 : 0;
    stage_visits_ += stage_here ? 1 : 0;
  }
}

Result<IterationStats> PipelineNode::run_iteration(std::uint64_t iteration, const std::vector<MicroBatchData>& data, Deadline deadline) {
  const auto all = routes(schedule_);
  const int memory = schedule_.options.memory;
  const transport::Tag tag = pipeline_tag(iteration);
  const ActivationLimits limits{options_.max_batch, model_.config().context, model_.config().width};
  // What this node launches, and how many messages each other node sends it this iteration.
  std::vector<std::uint32_t> own;
  std::vector<int> expected(static_cast<std::size_t>(schedule_.nodes()), 0);
  std::vector<int> outgoing(expected.size(), 0);
  Clock& clock = *options_.clock;
  const Nanos t0 = clock.now();
  auto since = [&] { return std::chrono::duration<double>(clock.now() - t0).count(); };
  for (std::size_t m = 0; m < all.size(); ++m) {
    const Route& r = all[m];
    const int last = static_cast<int>(r.path.size()) - 1;
    if (r.path[0] == node_) own.push_back(static_cast<std::uint32_t>(m));
    for (int hop = 1; hop <= last + 1; ++hop) {
      const auto [from, to] = ends(r, false, hop);
      if (to == node_) ++expected[static_cast<std::size_t>(from)];
      if (from == node_) ++outgoing[static_cast<std::size_t>(to)];
    }
    for (int hop = last; hop >= 0; --hop) {
      const auto [from, to] = ends(r, true, hop);
      if (to == node_) ++expected[static_cast<std::size_t>(from)];
      if (from == node_) ++outgoing[static_cast<std::size_t>(to)];
    }
  }
  if (data.size() != own.size()) {
    for (auto& l : links_) {
      if (l) l->close();  // the others learn at once instead of at their deadline
    }
    return error(ErrorCode::kInvalidArgument, "node " + std::to_string(node_) + " launches " + std::to_string(own.size()) + " micro-batches but was given " +
                                                  std::to_string(data.size()));
  }
  for (std::size_t j = 0; j < expected.size(); ++j) {
    GOSSAMER_CHECK(expected[j] == 0 || links_[j], "PipelineNode: no link to node " + std::to_string(j) + ", which sends to this one");
    GOSSAMER_CHECK(outgoing[j] == 0 || links_[j], "PipelineNode: no link to node " + std::to_string(j) + ", which this one sends to");
  }

  // Receiving threads, one per link with something to come; what they read waits in `inbox`.
  // Sending threads, one per link with something to go, take what waits in its outbox in order.
  struct Inbound {
    int from;
    Bytes bytes;
  };
  std::mutex mu;
  const std::unique_ptr<Signal> signal = clock.make_signal();
  std::deque<Inbound> inbox;
  std::vector<std::deque<Bytes>> outbox(expected.size());
  bool stopping = false;
  Status failed;
  std::vector<std::unique_ptr<ClockThread>> threads;
  auto fail = [&](Status st) {  // with mu held
    if (failed.ok()) failed = std::move(st);
    signal->notify_all();
  };
  for (std::size_t j = 0; j < expected.size(); ++j) {
    if (expected[j] == 0) continue;
    threads.push_back(clock.start_thread([&, j] {
      for (int k = 0; k < expected[j]; ++k) {
        auto got = links_[j]->recv(tag, deadline);
        std::lock_guard lock(mu);
        if (!got.ok()) {
          fail(got.status().with_context("pipeline: receiving from node " + std::to_string(j)));
          return;
        }
        inbox.push_back(Inbound{static_cast<int>(j), std::move(*got)});
        signal->notify_all();
      }
    }));
  }
  for (std::size_t j = 0; j < outgoing.size(); ++j) {
    if (outgoing[j] == 0) continue;
    threads.push_back(clock.start_thread([&, j] {
      for (int k = 0; k < outgoing[j]; ++k) {
        Bytes b;
        {
          std::unique_lock lock(mu);
          signal->wait(lock, Deadline::never(), [&] { return !outbox[j].empty() || stopping; });
          if (outbox[j].empty()) return;
          b = std::move(outbox[j].front());
          outbox[j].pop_front();
        }
        const Status st = links_[j]->send(tag, b, deadline);
        if (!st.ok()) {
          std::lock_guard lock(mu);
          fail(st.with_context("pipeline: sending to node " + std::to_string(j)));
          return;
        }
      }
    }));
  }
  // However the iteration ends (an error, an exception from a tensor a peer shaped), the threads
  // are joined before what they use goes away; on a failure every link is closed first, so the
  // others learn at once instead of at their deadline, and the threads return.
  bool finished_ok = false;
  struct Finally {
    std::function<void()> f;
    ~Finally() { f(); }
  } finally{[&] {
    if (!finished_ok) {
      {
        std::lock_guard lock(mu);
        stopping = true;
        signal->notify_all();
      }
      for (auto& l : links_) {
        if (l) l->close();
      }
    }
    for (auto& t : threads) t->join();
    threads.clear();
  }};

  IterationStats stats;
  // A message goes to its link's sending thread: the node computes on while it is on the wire.
  auto send = [&](int to, ActivationHeader h, const at::Tensor& x) -> Status {
    h.iteration = iteration;
    Bytes b = encode_activation(h, x, options_.codec);
    stats.messages_sent += 1;
    stats.bytes_sent += b.size();
    std::lock_guard lock(mu);
    if (!failed.ok()) return failed;
    outbox[static_cast<std::size_t>(to)].push_back(std::move(b));
    signal->notify_all();
    return Status();
  };
  // The compute just done (real compute takes no virtual time): charged to the clock, and logged.
  const StageCompute& cost = options_.compute;
  auto charge = [&](std::uint32_t mb, WorkKind kind, double start) {
    const double factor = kind == WorkKind::kForward ? 1.0 : kind == WorkKind::kBackward ? cost.backward_factor : cost.head_factor;
    if (cost.forward_s > 0) clock.sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(cost.forward_s * factor)));
    const double end = since();
    stats.work.push_back(WorkSpan{mb, kind, start, end});
    stats.busy_s += end - start;
  };
  auto run_blocks = [&](at::Tensor x) {
    for (std::int64_t b = blocks_.first; b < blocks_.second; ++b) x = model_.block(b, x);
    return x;
  };
  struct Held {
    at::Tensor in;   // the activations that came in (a leaf whose gradient goes back), undefined at the origin
    at::Tensor out;  // this stage's output, with its graph
  };
  std::map<std::uint32_t, Held> held;  // hop nodes: activations held; origins: their micro-batches in flight
  std::map<std::uint32_t, double> loss_of;
  std::size_t launched = 0, finished = 0;
  int processed = 0, total_expected = 0;
  for (int e : expected) total_expected += e;
  std::vector<std::pair<int, std::pair<ActivationHeader, at::Tensor>>> waiting;  // decoded forwards waiting for memory

  // Whether a message belongs here: this iteration, a micro-batch and hop of the schedule, from the
  // node the schedule routes it from.
  auto check = [&](int from, const ActivationHeader& h) -> Status {
    if (h.iteration != iteration || h.microbatch >= all.size()) return error(ErrorCode::kMalformed, "a message of another iteration or micro-batch");
    const Route& r = all[h.microbatch];
    const int last = static_cast<int>(r.path.size()) - 1;
    const int hop = h.hop;
    if ((h.backward && hop > last) || (!h.backward && (hop < 1 || hop > last + 1))) return error(ErrorCode::kMalformed, "a message for a hop the path has not");
    const auto [want_from, want_to] = ends(r, h.backward, hop);
    if (want_from != from || want_to != node_) {
      return error(ErrorCode::kMalformed, "micro-batch " + std::to_string(h.microbatch) + " hop " + std::to_string(hop) + " came from node " + std::to_string(from) +
                                              " to node " + std::to_string(node_) + ", not as the schedule routes it");
    }
    return Status();
  };
  // The work a checked message calls for.
  auto compute = [&](ActivationHeader h, at::Tensor x) -> Status {
    const Route& r = all[h.microbatch];
    const int last = static_cast<int>(r.path.size()) - 1;
    const int hop = h.hop;
    const double start = since();
    if (!h.backward && hop <= last) {  // a forward through this stage
      at::Tensor in = x.requires_grad_(true);
      at::Tensor out = run_blocks(in);
      charge(h.microbatch, WorkKind::kForward, start);
      ++stats.forwards;
      held[h.microbatch] = Held{in, out};
      stats.peak_inflight = std::max(stats.peak_inflight, static_cast<int>(held.size()));
      ActivationHeader next{false, 0, h.microbatch, static_cast<std::uint8_t>(hop + 1), 0, 0, 0};
      return send(r.path[static_cast<std::size_t>(hop == last ? 0 : hop + 1)], next, out);
    }
    if (!h.backward) {  // back at its origin: head, loss, and the backward starts
      const auto it = std::find(own.begin(), own.end(), h.microbatch);
      const MicroBatchData& d = data[static_cast<std::size_t>(it - own.begin())];
      if (x.size(0) != d.targets.size(0) || x.size(1) != d.targets.size(1)) {
        return error(ErrorCode::kMalformed, "micro-batch " + std::to_string(h.microbatch) + " came back in another shape than it left");
      }
      at::Tensor in = x.requires_grad_(true);
      const at::Tensor logits = model_.head(in);
      const at::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), d.targets.reshape({-1}));
      loss.backward();
      loss_of[h.microbatch] = loss.item<double>();
      charge(h.microbatch, WorkKind::kHead, start);
      ActivationHeader next{true, 0, h.microbatch, static_cast<std::uint8_t>(last), 0, 0, 0};
      return send(r.path[static_cast<std::size_t>(last)], next, in.grad());
    }
    auto it = held.find(h.microbatch);
    if (it == held.end()) return error(ErrorCode::kMalformed, "a gradient for micro-batch " + std::to_string(h.microbatch) + ", which this node does not hold");
    if (x.sizes() != it->second.out.sizes()) return error(ErrorCode::kMalformed, "a gradient for micro-batch " + std::to_string(h.microbatch) + " of another shape");
    it->second.out.backward(x);
    charge(h.microbatch, WorkKind::kBackward, start);
    ++stats.backwards;
    if (hop == 0) {  // back at its origin: done
      held.erase(it);
      ++finished;
      return Status();
    }
    ActivationHeader next{true, 0, h.microbatch, static_cast<std::uint8_t>(hop - 1), 0, 0, 0};
    const at::Tensor g = it->second.in.grad();
    held.erase(it);
    return send(r.path[static_cast<std::size_t>(hop - 1)], next, g);  // hop 0 is the origin
  };
  auto process = [&](int from, ActivationHeader h, at::Tensor x) -> Status {
    if (Status c = check(from, h); !c.ok()) return c;
    return compute(h, std::move(x));
  };
  auto launch = [&](std::size_t k) -> Status {  // own[k], the k-th micro-batch this origin starts
    const std::uint32_t m = own[k];
    const double start = since();
    at::Tensor out = run_blocks(model_.embed(data[k].tokens));
    charge(m, WorkKind::kForward, start);
    ++stats.forwards;
    held[m] = Held{at::Tensor(), out};
    stats.peak_inflight = std::max(stats.peak_inflight, static_cast<int>(held.size()));
    return send(all[m].path[1], ActivationHeader{false, 0, m, 1, 0, 0, 0}, out);
  };
  // The next message off the links, decoded; an error when a link failed or the deadline passed.
  auto receive = [&]() -> Result<std::pair<int, std::pair<ActivationHeader, at::Tensor>>> {
    Inbound next;
    {
      std::unique_lock lock(mu);
      const bool got = signal->wait(lock, deadline, [&] { return !inbox.empty() || !failed.ok(); });
      if (!failed.ok()) return failed;
      if (!got) return error(ErrorCode::kTimeout, "pipeline iteration " + std::to_string(iteration) + ": node " + std::to_string(node_) + " waited past its deadline");
      next = std::move(inbox.front());
      inbox.pop_front();
    }
    ++processed;
    auto decoded = decode_activation(next.bytes, limits);
    if (!decoded.ok()) return decoded.status().with_context("from node " + std::to_string(next.from));
    return std::make_pair(next.from, std::move(*decoded));
  };

  Status st;
  // A forward that needs room waits behind those already waiting, in arrival order.
  auto drain = [&]() -> Status {
    while (!waiting.empty() && static_cast<int>(held.size()) < memory) {
      auto w = std::move(waiting.front());
      waiting.erase(waiting.begin());
      if (Status s2 = process(w.first, w.second.first, w.second.second); !s2.ok()) return s2;
    }
    return Status();
  };
  try {
  if (!order_.empty()) {
    // The timetable's order: each piece of work when its turn comes, its message taken from those
    // that arrived (one that came early waits here).
    std::map<std::tuple<std::uint32_t, bool, int>, std::pair<ActivationHeader, at::Tensor>> arrived;  // by (micro-batch, backward, hop)
    std::set<std::tuple<std::uint32_t, bool, int>> consumed;  // messages whose work is done
    std::size_t k = 0;
    while (st.ok() && k < order_.size()) {
      const OrderItem& w = order_[k];
      if (w.step == Step::kLaunch) {
        const auto it = std::find(own.begin(), own.end(), w.microbatch);
        GOSSAMER_CHECK(it != own.end(), "PipelineNode: the timetable launches a micro-batch of another origin");
        st = launch(static_cast<std::size_t>(it - own.begin()));
        ++launched;
        ++k;
        continue;
      }
      const int last = static_cast<int>(all[w.microbatch].path.size()) - 1;
      const auto key = std::make_tuple(w.microbatch, w.step == Step::kBackward, w.step == Step::kHead ? last + 1 : w.hop);
      if (auto it = arrived.find(key); it != arrived.end()) {
        st = compute(it->second.first, it->second.second);
        arrived.erase(it);
        consumed.insert(key);
        ++k;
        continue;
      }
      if (processed == total_expected) {  // every message is in, and not the one due: a peer sent another
        st = error(ErrorCode::kMalformed, "node " + std::to_string(node_) + " got every message it expects but not micro-batch " + std::to_string(w.microbatch) +
                                              "'s, which its timetable does next");
        break;
      }
      auto got = receive();
      if (!got.ok()) {
        st = got.status();
        break;
      }
      auto& [from, msg] = *got;
      st = check(from, msg.first);
      const auto at = std::make_tuple(msg.first.microbatch, msg.first.backward, static_cast<int>(msg.first.hop));
      if (st.ok() && (arrived.count(at) > 0 || consumed.count(at) > 0)) {
        st = error(ErrorCode::kMalformed, "micro-batch " + std::to_string(msg.first.microbatch) + "'s message came twice");
      }
      if (st.ok()) arrived.emplace(at, std::move(msg));
    }
    if (st.ok() && (!arrived.empty() || processed != total_expected)) {
      st = error(ErrorCode::kMalformed, "node " + std::to_string(node_) + " got messages its timetable has no work for");
    }
  }
  while (st.ok() && order_.empty()) {
    // An origin launches while it has room, in the schedule's order.
    while (st.ok() && launched < own.size() && static_cast<int>(held.size()) < memory) {
      st = launch(launched);
      ++launched;
    }
    if (!st.ok() || (processed == total_expected && waiting.empty() && finished == own.size() && launched == own.size())) break;
    // The next message (waiting forwards were given what room there is after the last one).
    auto got = receive();
    if (!got.ok()) {
      st = got.status();
      break;
    }
    auto& [from, decoded] = *got;
    const ActivationHeader& h = decoded.first;
    const Route* r = h.microbatch < all.size() ? &all[h.microbatch] : nullptr;
    const bool takes_memory = !h.backward && r != nullptr && h.hop <= static_cast<int>(r->path.size()) - 1;
    if (takes_memory && (static_cast<int>(held.size()) >= memory || !waiting.empty())) {
      waiting.emplace_back(from, std::move(decoded));
    } else {
      st = process(from, h, decoded.second);
    }
    if (st.ok()) st = drain();
  }
  } catch (const std::exception& e) {
    // A tensor of a shape the stage cannot take (a peer's message passed its header's checks).
    st = error(ErrorCode::kMalformed, std::string("pipeline iteration ") + std::to_string(iteration) + ": node " + std::to_string(node_) + ": " + e.what());
  }
  if (!st.ok()) return st;  // (Finally closes the links and joins the threads)
  // Done once the last message has left: the sending threads end after their last.
  for (auto& t : threads) t->join();
  threads.clear();
  {
    std::lock_guard lock(mu);
    if (!failed.ok()) return failed;
  }
  finished_ok = true;
  stats.finished_s = since();
  for (std::uint32_t m : own) stats.losses.push_back(loss_of[m]);
  return stats;
}

Status PipelineNode::sync_stage(const optim::Group& group, std::uint64_t iteration, Deadline deadline, optim::CommStats* stats) {
  // Each replica's sum scaled by replicas / visits, then the replicas' mean: the sum over every
  // micro-batch of the stage, over its visits.
  std::vector<at::Tensor> grads;
  for (const auto& p : params_) grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  at::Tensor flat = torch::cat([&] {
    std::vector<at::Tensor> v;
    for (const auto& g : grads) v.push_back(g.detach().reshape({-1}).to(at::kFloat));
    return v;
  }());
  if (stage_visits_ > 0) flat.mul_(static_cast<double>(group.size) / static_cast<double>(stage_visits_));
  quant::EncodeOptions fp32;
  if (Status st = optim::allreduce_mean(group, flat, fp32, transport::tags::kPipelineSync | static_cast<transport::Tag>(iteration & 0xFFFFu), deadline, stats);
      !st.ok()) {
    return st.with_context("stage " + std::to_string(stage_) + " sync");
  }
  std::int64_t at = 0;
  for (auto& p : params_) {
    const std::int64_t n = p.numel();
    at::Tensor g = flat.slice(0, at, at + n).view(p.sizes());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(g);
    } else {
      p.mutable_grad() = g.clone();
    }
    at += n;
  }
  return Status();
}

}  // namespace gossamer::train
