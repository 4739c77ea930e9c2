#include "optim/noloco.h"

#include <torch/torch.h>

#include <numeric>

#include "core/check.h"
#include "optim/flat_params.h"
#include "optim/state_io.h"
#include "transport/tags.h"

namespace gossamer::optim {

namespace {

constexpr transport::Tag kNoLoCoTag = transport::tags::kNoLoCo;  // + round (round_tag)

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<int> noloco_pairing(int n, std::int64_t round, std::uint64_t seed) {
  GOSSAMER_CHECK(n >= 1, "noloco_pairing: n must be >= 1");
  // Fisher-Yates with a counter-seeded generator: every replica computes the same permutation.
  std::vector<int> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::uint64_t state = seed ^ (static_cast<std::uint64_t>(round) * 0xD1B54A32D192ED03ull);
  for (int i = n - 1; i > 0; --i) {
    const auto j = static_cast<int>(splitmix64(state) % static_cast<std::uint64_t>(i + 1));
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
  }
  std::vector<int> partner(static_cast<std::size_t>(n));
  std::iota(partner.begin(), partner.end(), 0);  // alone unless paired below
  const int half = n / 2;
  for (int g = 0; g < half; ++g) {
    const int a = perm[static_cast<std::size_t>(g)], b = perm[static_cast<std::size_t>(g + half)];
    partner[static_cast<std::size_t>(a)] = b;
    partner[static_cast<std::size_t>(b)] = a;
  }
  return partner;
}

NoLoCo::NoLoCo(std::vector<at::Tensor> params, Group group, NoLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  GOSSAMER_CHECK(options_.inner_steps >= 1, "NoLoCo: inner_steps must be >= 1");
  GOSSAMER_CHECK(options_.outer_momentum >= 0 && options_.outer_momentum < 1, "NoLoCo: outer_momentum must be in [0, 1)");
  state_.outer = flatten(params_, options_.state_device);
  state_.momentum = torch::zeros_like(state_.outer);
}

Result<bool> NoLoCo::step(std::int64_t inner_steps_done, Deadline deadline) {
  if (inner_steps_done <= 0 || inner_steps_done % options_.inner_steps != 0) return false;
  const std::int64_t round = inner_steps_done / options_.inner_steps;
  const int partner = noloco_pairing(group_.size, round, options_.seed)[static_cast<std::size_t>(group_.rank)];
  const at::Tensor theta = flatten(params_, options_.state_device);
  const bool same = options_.outer_lr == options_.outer_lr_gamma;

  at::Tensor mean_theta = theta, mean_phi = state_.outer;
  if (partner != group_.rank) {
    GOSSAMER_CHECK(group_.peers[static_cast<std::size_t>(partner)] != nullptr, "NoLoCo: no link to rank " + std::to_string(partner));
    // beta == gamma: only the fast weights are needed; otherwise fast and outer weights, side by side.
    const at::Tensor mine = same ? theta : torch::cat({theta, state_.outer});
    CommStats stats;
    auto theirs = pair_exchange(*group_.peers[static_cast<std::size_t>(partner)], mine, options_.codec, round_tag(kNoLoCoTag, round), deadline, *group_.clock, &stats);
    comm_ += stats;
    if (!theirs.ok()) return theirs.status().with_context("NoLoCo round " + std::to_string(round) + " with rank " + std::to_string(partner));
    const std::int64_t n = theta.numel();
    // Average in rank order so both partners compute the same bits.
    const at::Tensor all_theirs = theirs->to(theta.device());  // received into host memory
    const at::Tensor their_theta = same ? all_theirs : all_theirs.slice(0, 0, n);
    mean_theta = group_.rank < partner ? (theta + their_theta) / 2 : (their_theta + theta) / 2;
    if (!same) {
      const at::Tensor their_phi = all_theirs.slice(0, n, 2 * n);
      mean_phi = group_.rank < partner ? (state_.outer + their_phi) / 2 : (their_phi + state_.outer) / 2;
    }
  }
  if (sink_) sink_(inner_steps_done, same ? mean_theta : torch::cat({mean_theta, mean_phi}));
  apply(mean_theta, mean_phi);
  return true;
}

void NoLoCo::apply(const at::Tensor& mean_theta, const at::Tensor& mean_phi) {
  const double alpha = options_.outer_momentum, beta = options_.outer_lr, gamma = options_.outer_lr_gamma;
  // delta <- alpha delta + beta mean(theta - phi) + gamma (mean(phi) - phi_i)
  if (beta == gamma) {
    state_.momentum.mul_(alpha).add_((mean_theta - state_.outer) * beta);
  } else {
    state_.momentum.mul_(alpha).add_((mean_theta - mean_phi) * beta).add_((mean_phi - state_.outer) * gamma);
  }
  state_.outer.add_(state_.momentum);
  write_flat(params_, state_.outer);
  ++state_.rounds;
}

Status NoLoCo::replay(std::int64_t step, const at::Tensor& means) {
  const bool same = options_.outer_lr == options_.outer_lr_gamma;
  const std::int64_t n = state_.outer.numel();
  if (Status st = check_update(means, same ? n : 2 * n, "NoLoCo", step); !st.ok()) return st;
  if (step <= 0 || step % options_.inner_steps != 0) return error(ErrorCode::kMalformed, "NoLoCo has no round at step " + std::to_string(step));
  const at::Tensor m = means.to(options_.state_device);
  apply(m.slice(0, 0, n), same ? state_.outer : m.slice(0, n, 2 * n));
  return Status();
}

}  // namespace gossamer::optim
