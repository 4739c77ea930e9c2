#include "runtime/donor_duty.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "runtime/update_codec.h"

namespace gossamer::runtime {

namespace {
// The link speed a donor assumes where it does not know its own (no --shape): 100 Mbit/s, a common
// access link; it only decides whether a newcomer is awaited at the next round.
constexpr double kAssumedLinkBytesPerS = 12.5e6;
}  // namespace

DonorDuty::DonorDuty(Clock& clock, std::int64_t keep_steps, std::uint64_t keep_bytes, std::optional<double> serve_bytes_per_s,
                     std::function<std::int64_t()> progress)
    : log_(std::make_shared<UpdateLog>(keep_steps, keep_bytes, tap_)), server_(std::make_unique<StateServer>(clock, log_)) {
  server_->set_progress(std::move(progress));
  if (serve_bytes_per_s) server_->set_rate(*serve_bytes_per_s);
}

void DonorDuty::withdraw() {
  log_->stop();
  server_->withdraw();
  snapshot_step_.reset();
}

void DonorDuty::record(std::int64_t step, std::int64_t round, std::uint32_t world, const at::Tensor& update) {
  if (!log_->recording()) return;
  const at::Tensor flat = update.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  const std::span<const float> values(flat.data_ptr<float>(), static_cast<std::size_t>(flat.numel()));
  // In the codec's bytes the all-reduce sent when they decode to exactly this update, else in fp32.
  auto payloads = tap_->take(values);
  if (payloads) ++stats_.updates_kept_encoded;
  log_->add(step, round, world, encode_update(values, payloads));
}

void DonorDuty::at_boundary(std::int64_t round, bool newcomers_waiting) {
  const std::uint64_t requests = server_->requests();
  idle_boundaries_ = newcomers_waiting || requests != requests_seen_ ? 0 : idle_boundaries_ + 1;
  requests_seen_ = requests;
  if (log_->recording() && idle_boundaries_ >= 3) {
    spdlog::info("round {}: no newcomer asked for the state for 3 rounds; the snapshot and the updates kept ({:.2f} MB at most) are dropped", round,
                 log_->peak_bytes() / 1e6);
    withdraw();
  }
}

bool DonorDuty::needs_snapshot() const { return !(snapshot_step_ && log_->recording() && log_->complete_after() <= *snapshot_step_); }

void DonorDuty::offer(std::int64_t round, std::int64_t step, std::uint32_t world, Bytes state) {
  // Chunks of 64 KiB to 1 MiB, at least 16 where the state allows, so that even a small state is
  // spread over the donors (every donor cuts the same size alike: it depends on the size only).
  const std::uint32_t chunk = snapshot_chunk_bytes(state.size());
  server_->offer(Snapshot::make(round, step, world, std::move(state), chunk));
  log_->start(step);  // (one recording already goes on, reaching back further)
  snapshot_step_ = step;
}

double DonorDuty::transfer_estimate_s(std::optional<double> newcomer_bytes_per_s) const {
  double rate = server_->rate() > 0 ? server_->rate() : kAssumedLinkBytesPerS;
  if (newcomer_bytes_per_s) rate = std::min(rate, std::max(*newcomer_bytes_per_s, 1e3));
  return static_cast<double>(server_->offered_bytes()) / rate;
}

}  // namespace gossamer::runtime
