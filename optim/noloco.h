// NoLoCo (Kolehmainen et al. 2025; ALGORITHMS.md section 3): no all-reduce. Every `inner_steps`, the
// live replicas are paired at random, with a permutation every replica computes alike from the round
// number (no coordination), and each replica averages with its partner only, through the coded update
// of the reference implementation (heavy-ball shaped; NoLoCo's sign: Delta = local - outer):
//   delta_i <- alpha delta_i + beta mean_G(theta_j - phi_j) + gamma (mean_G(phi_j) - phi_i)
//   phi_i <- phi_i + delta_i;  theta_i <- phi_i
// With beta == gamma this is delta_i <- alpha delta_i + beta (mean_G(theta_j) - phi_i), and only the
// fast weights travel (P values); otherwise both theta and phi do (2P).
// Pairing: perm = a seeded permutation of the N live ranks for round t; groups are
// {perm[g], perm[g + N/2]}; with N odd, perm[N-1] sits the round out alone.
//
// Ownership, threading and errors as DiLoCo (diloco.h): a failed exchange changes nothing.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "optim/state_io.h"
#include "optim/updates.h"
#include "optim/flat_params.h"
#include "quant/format.h"

namespace gossamer::optim {

struct NoLoCoOptions {
  std::int64_t inner_steps = 50;  // H
  double outer_lr = 0.7;          // beta
  double outer_lr_gamma = 0.7;    // gamma (the reference configs use gamma = beta)
  double outer_momentum = 0.5;    // alpha
  std::uint64_t seed = 0;         // shared by every replica
  quant::EncodeOptions codec;
  at::Device state_device = at::kCPU;  // where the outer state lives (the parameters may be elsewhere)
};

// partner[r] for every rank of an n-rank group in round `round` (partner[r] == r: alone this round).
std::vector<int> noloco_pairing(int n, std::int64_t round, std::uint64_t seed);

class NoLoCo {
 public:
  NoLoCo(std::vector<at::Tensor> params, Group group, NoLoCoOptions options);

  [[nodiscard]] Result<bool> step(std::int64_t inner_steps_done, Deadline deadline);
  void skip_round() { ++state_.skipped; }
  [[nodiscard]] Status regroup(Group group) {
    group_ = std::move(group);
    return Status();
  }

  const at::Tensor& outer_weights() const { return state_.outer; }
  const at::Tensor& momentum() const { return state_.momentum; }
  std::int64_t rounds() const { return state_.rounds; }
  std::int64_t skipped_rounds() const { return state_.skipped; }
  const CommStats& comm() const { return comm_; }

  Bytes save() const { return state_.save("noloco"); }
  [[nodiscard]] Status load(ByteView bytes) { return state_.load(bytes, "noloco"); }

  // Catch-up (updates.h): a round's update is the pair's mean of the fast weights (with beta !=
  // gamma, followed by the mean of the outer weights: twice the size). Members differ, so an update
  // replays one member's rounds: a newcomer's state is exactly that of the member it came from.
  void record_updates(UpdateSink sink) { sink_ = std::move(sink); }
  [[nodiscard]] Status replay(std::int64_t step, const at::Tensor& means);
  void take_shared_weights() { write_flat(params_, state_.outer); }

 private:
  // delta <- alpha delta + beta (mean_theta - mean_phi) + gamma (mean_phi - phi); phi <- phi + delta.
  void apply(const at::Tensor& mean_theta, const at::Tensor& mean_phi);
  UpdateSink sink_;
  std::vector<at::Tensor> params_;
  Group group_;
  NoLoCoOptions options_;
  OuterState state_;
  CommStats comm_;
};

}  // namespace gossamer::optim
