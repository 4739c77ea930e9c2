// PipelineTrainer's state, shared by the files that implement it: pipeline_trainer.cpp (making it,
// an iteration, losing nodes) and pipeline_assembly.cpp (the stages' weights assembled into one
// model, evaluated with stages left out). Internal header of the train layer.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "optim/outer_optimizer.h"
#include "train/pipeline.h"
#include "train/pipeline_trainer.h"
#include "train/worker.h"

namespace gossamer::train {

// Per stage: the micro-batches of one iteration of `s` that visit it (stage 0: every one).
inline std::vector<double> schedule_stage_visits(const skippipe::Schedule& s) {
  std::vector<double> visits(static_cast<std::size_t>(s.options.stages), 0.0);
  for (const auto& agent : s.agents) {
    visits[0] += agent.microbatches;
    for (int node : agent.hops) visits[static_cast<std::size_t>(s.stage_of[static_cast<std::size_t>(node)])] += agent.microbatches;
  }
  return visits;
}

struct PipelineTrainer::Impl {
  RunConfig config;
  PipelineEnvironment env;
  const data::Dataset* data = nullptr;
  skippipe::Plan plan;
  std::string plan_key;  // what the plan was made of, for the environment's PlanMemo (empty: none)
  // What the plan is made of, kept for rescheduling around lost nodes.
  skippipe::Options options;
  skippipe::Mode mode = skippipe::Mode::kSkipPipe;
  skippipe::Network net;
  skippipe::Costs costs;
  PipelineNodeOptions node_options;
  std::optional<optim::OuterConfig> outer_config;
  std::vector<bool> alive;     // per node
  int epoch = 0;               // links of epoch e are channels 2e (activations) and 2e + 1 (stage sync)
  std::int64_t lost = 0;       // nodes the pipeline went on without
  std::vector<std::unique_ptr<PipelineNode>> nodes;         // per node; null for those another process hosts
  std::vector<std::unique_ptr<torch::optim::AdamW>> adam;   // the same
  std::vector<int> local;                                   // the nodes hosted here, in order
  std::map<int, std::vector<int>> replicas;   // stage -> its nodes that take part (a micro-batch visits them)
  std::vector<optim::OuterSetup> outer;       // per node, with stage_sync = diloco (empty for idle nodes)
  bool ddp = true;
  std::map<int, std::vector<optim::Group>> groups;  // stage -> a group per replica
  std::vector<int> origins;                   // stage-0 nodes in order
  std::vector<std::unique_ptr<data::ShardSampler>> samplers;  // per origin
  std::vector<data::Batch> eval_set;
  std::int64_t done = 0;
  std::int64_t samples = 0;
  // Per stage: micro-batches of the iterations done that visited it (stage 0: all of them).
  std::vector<double> stage_visits;
  // An iteration whose commit failed: its record so far (losses, learning rate) and when it began.
  struct Pending {
    PipelineRecord rec;
    std::chrono::steady_clock::time_point start;
    Nanos t0{0};
  };
  std::optional<Pending> pending;
  // What one hosted node's part of an iteration came to.
  struct NodeOutcome {
    Result<IterationStats> result = error(ErrorCode::kInternal, "not run");
    Status synced;                // its stage's sync (ddp) or outer step
    std::uint64_t sync_bytes = 0;
    std::int64_t rounds = 0;      // outer rounds it took part in
  };

  // An iteration's parts (pipeline_trainer.cpp): each hosted origin's micro-batches; one node's
  // micro-batches through the pipeline, then its stage's sync or its own step and outer round (on
  // its own thread); the outcomes as one record (its learning rate still to set).
  std::map<int, std::vector<MicroBatchData>> draw_microbatches() const;
  void run_node(std::size_t v, std::uint64_t iteration, const std::vector<MicroBatchData>& batches, Deadline deadline, Deadline sync_deadline,
                double lr, NodeOutcome& out);
  Result<PipelineRecord> record_of(std::vector<NodeOutcome>& outcomes) const;

  // The node hosted here whose weights stand for `stage`: its first replica that takes part, or (a
  // stage no micro-batch visits) any node hosting it, which holds the initial weights; -1: none here.
  int representative(int stage) const {
    if (const auto it = replicas.find(stage); it != replicas.end()) {
      for (int v : it->second) {
        if (nodes[static_cast<std::size_t>(v)]) return v;
      }
    }
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      if (nodes[v] && nodes[v]->stage() == stage) return static_cast<int>(v);
    }
    return -1;
  }

  // Nodes, links, stage groups and outer optimizers for plan.schedule and the current epoch: made
  // the first time, rearranged after a reschedule (weights and AdamW state kept).
  Status arrange() {
    const skippipe::Schedule& s = plan.schedule;
    const int n = static_cast<int>(s.stage_of.size());
    replicas.clear();
    groups.clear();
    const std::vector<int> visits = node_visits(s);
    for (int v = 0; v < n; ++v) {
      if (alive[static_cast<std::size_t>(v)] && visits[static_cast<std::size_t>(v)] > 0) replicas[s.stage_of[static_cast<std::size_t>(v)]].push_back(v);
    }
    for (int v : local) {
      std::vector<std::shared_ptr<transport::Link>> links(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) {
        if (j != v && alive[static_cast<std::size_t>(j)]) links[static_cast<std::size_t>(j)] = env.link(v, j, 2 * epoch);
      }
      auto& node = nodes[static_cast<std::size_t>(v)];
      if (node) {
        node->reschedule(s, std::move(links));
        continue;
      }
      node = std::make_unique<PipelineNode>(v, s, model::Gpt(gpt_config(config, 0)), std::move(links), node_options);
      auto opts = torch::optim::AdamWOptions(config.train.lr)
                      .betas(std::make_tuple(config.train.beta1, config.train.beta2))
                      .eps(config.train.eps)
                      .weight_decay(config.train.weight_decay);
      adam[static_cast<std::size_t>(v)] = std::make_unique<torch::optim::AdamW>(node->stage_parameters(), opts);
    }
    for (const auto& [stage, members] : replicas) {
      groups[stage].resize(members.size());
      for (std::size_t r = 0; r < members.size(); ++r) {
        if (!nodes[static_cast<std::size_t>(members[r])]) continue;  // another process's
        optim::Group grp;
        grp.rank = static_cast<int>(r);
        grp.size = static_cast<int>(members.size());
        grp.clock = env.clock;
        grp.peers.resize(members.size());
        for (std::size_t k = 0; k < members.size(); ++k) {
          if (k != r) grp.peers[k] = env.link(members[r], members[k], 2 * epoch + 1);
        }
        groups[stage][r] = std::move(grp);
      }
    }
    if (!ddp) {
      // A new group is a new outer optimizer: after a reschedule its outer state starts afresh.
      outer.clear();
      outer.resize(static_cast<std::size_t>(n));
      for (const auto& [stage, members] : replicas) {
        for (std::size_t r = 0; r < members.size(); ++r) {
          const int v = members[r];
          if (!nodes[static_cast<std::size_t>(v)]) continue;
          auto setup = optim::make_outer_optimizer(*outer_config, nodes[static_cast<std::size_t>(v)]->stage_param_blocks(), groups[stage][r]);
          if (!setup.ok()) return setup.status().with_context("stage " + std::to_string(stage) + "'s " + name_of(config.pipeline.stage_sync));
          outer[static_cast<std::size_t>(v)] = std::move(*setup);
        }
      }
    }
    return Status();
  }
};

}  // namespace gossamer::train
