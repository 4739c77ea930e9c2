// What a run configuration needs in memory, computed from its shapes before anything is allocated,
// and what this machine has, so that a configuration that cannot fit is one clear error instead of
// an allocator failure deep inside LibTorch.
//
// The estimate is of the built-in GPT trained in fp32 with AdamW (src/model/gpt.cpp): parameters,
// gradients and AdamW's two moments; the outer optimizer's state and its step's temporaries; the
// causal masks (one T x T byte matrix per block); the activations autograd keeps for one batch (see
// memory.cpp for the terms); the corpus. Its coefficients are measured peaks (`gossamer bench
// memory`), within 10% of them on GPT-2-small shapes (docs/benchmarks.md). check_resources refuses
// a run only when 90% of the estimate's host part exceeds what is available, so as not to refuse
// one that would just fit; a GPU's part is reported, not checked (LibTorch's CPU build has no query
// of a GPU's free memory). For a TorchScript model the parameters are counted in the module and the activations are the logits'
// share only (its architecture is not known).
// Pure functions except available_memory_bytes, which reads /proc and the cgroup; thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "train/config.h"

namespace gossamer::train {

struct MemoryEstimate {
  double parameters = 0;  // count
  double state_bytes = 0;        // per worker: weights, gradients, AdamW, outer state, masks
  double activation_bytes = 0;   // one batch's forward and backward, and the outer step's temporaries (one worker at a time)
  // A checkpoint's buffer in host memory (weights, AdamW's moments and the outer state, serialized),
  // built once the step's activations are handed back: a worker's peak is its state plus the larger
  // of the two (measured with real peers of GPT-2 small, docs/benchmarks.md).
  double checkpoint_bytes = 0;
  double corpus_bytes = 0;       // shared by the workers of one process
  double total_bytes = 0;        // for `workers` workers in one process
  double peak_bytes() const { return state_bytes + std::max(activation_bytes, checkpoint_bytes); }  // one worker
  // Where total_bytes lie. Training on the CPU, all of it is host memory. On a GPU, the device
  // holds weights, gradients, AdamW, masks and activations, and the outer optimizer's state and
  // step temporaries unless outer.state_device keeps them in host memory (the default), which also
  // holds the corpus.
  double outer_bytes = 0;        // per worker: the outer optimizer's state (part of state_bytes)
  double host_bytes = 0;
  double device_bytes = 0;
  bool on_gpu = false;           // train.device names a GPU (or auto finds one)
};

// `workers`: how many workers this process holds (1 for train and peer, sim.workers for sim).
// `parameters`: the model's count where it is not the built-in GPT of model.* (a TorchScript module).
MemoryEstimate estimate_memory(const RunConfig& config, std::int64_t workers, std::optional<double> parameters = std::nullopt);

// MemAvailable, lowered to the cgroup's limit less its usage where one is set; nullopt if unknown.
std::optional<double> available_memory_bytes();

// What a run needs before it starts, checked at once so that a command fails in its first second:
// the device train.device names exists (device.h); a TorchScript model loads and fits the run (it is
// loaded to count its parameters); and the memory estimate fits what is available (else
// kInvalidArgument with the figures and what to lower). `workers_key`: the key that sets `workers`,
// named in the advice (empty: none sets it, as for a benchmark's models side by side).
[[nodiscard]] Status check_resources(const RunConfig& config, std::int64_t workers, const std::string& workers_key = "sim.workers");

std::string format_bytes(double bytes);

}  // namespace gossamer::train
