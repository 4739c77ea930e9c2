// A run small enough for the simulator's tests: a 2-block GPT of width 32 on a small synthetic
// corpus, fixed compute of 0.05 s per step. Tests set their own steps, methods and networks.
#pragma once

#include <string>

#include "train/config.h"

namespace gossamer::sim::testing {

inline train::RunConfig tiny_run(const std::string& method, int workers, int steps) {
  train::RunConfig c;
  c.model.layers = 2;
  c.model.width = 32;
  c.model.heads = 2;
  c.model.context = 16;
  c.data.synthetic.bytes = 60'000;
  c.train.batch_size = 4;
  c.train.steps = steps;
  c.train.warmup_steps = steps / 6;
  c.train.eval_every = steps / 2;
  c.train.eval_batches = 2;
  c.outer.method = method;
  c.sim.workers = workers;
  c.sim.compute = "fixed";
  c.sim.step_time_s = 0.05;
  return c;
}

}  // namespace gossamer::sim::testing
