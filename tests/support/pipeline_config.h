// The pipeline runs the tests of several layers share: small enough for a test, large enough to
// skip stages and to have replicas in every stage.
#pragma once

#include "train/config.h"

namespace gossamer::testing {

// A 6-block GPT of width 16 cut into 3 stages over 8 nodes (4 origins, 2 nodes in each other stage),
// each micro-batch visiting stage 0 and one other; planned on a uniform network. 12 iterations.
inline train::RunConfig small_pipeline_run() {
  train::RunConfig c;
  c.model.layers = 6;
  c.model.width = 16;
  c.model.heads = 2;
  c.model.context = 16;
  c.train.batch_size = 2;
  c.train.steps = 12;
  c.train.warmup_steps = 2;
  c.train.lr = 1e-2;
  c.train.eval_batches = 2;
  c.pipeline.nodes = 8;
  c.pipeline.stages = 3;
  c.pipeline.path_length = 2;
  c.pipeline.mbs_per_origin = 2;
  c.pipeline.mbs_per_agent = 1;
  c.pipeline.network = train::PipelineNetwork::kUniform;
  c.pipeline.gcma_trials = 50;
  return c;
}

// The same as separate processes run it (runtime/pipeline_process.h, and the simulator's processes):
// a small corpus, an evaluation every 2 iterations, rounds that may take a minute.
inline train::RunConfig small_pipeline_processes(std::int64_t steps) {
  train::RunConfig c = small_pipeline_run();
  c.data.synthetic.bytes = 60'000;
  c.train.steps = steps;
  c.train.warmup_steps = 1;
  c.train.eval_every = 2;
  c.train.round_timeout_s = 60;
  return c;
}

}  // namespace gossamer::testing
