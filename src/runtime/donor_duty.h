// DonorDuty: a member's part in joins (docs/joining.md). While a newcomer waits it offers a snapshot
// of the state the members share, keeps the updates it applies from then on (in the codec's bytes
// the all-reduce sent where they decode to the update, else in fp32), and answers the newcomers'
// requests for both through its StateServer; once no newcomer has asked for anything for three
// round boundaries it drops them. The Peer (peer_runtime.h) decides when; this part holds what is
// offered and kept, and its statistics.
//
// Threading: the server answers on the links' threads; the rest from the Peer's training thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "core/bytes.h"
#include "core/clock.h"
#include "optim/mean_tap.h"
#include "runtime/state_sync.h"
#include "runtime/update_log.h"

namespace gossamer::runtime {

// A member's donor duty: the updates it kept for newcomers in the codec's bytes (the rest in fp32);
// the update log's and the state server's own figures are theirs.
struct DonorStats {
  std::int64_t updates_kept_encoded = 0;

  // In a record: the log's bytes now, while it holds any.
  void write_record(nlohmann::json& out, const UpdateLog& log) const {
    if (log.peak_bytes() == 0) return;
    out["update_log_bytes"] = log.bytes();
    out["updates_kept_encoded"] = updates_kept_encoded;
  }
  void write_summary(nlohmann::json& out, const UpdateLog& log, const StateServer& server) const {
    out["update_log_peak_bytes"] = log.peak_bytes();
    out["update_log_dropped"] = log.dropped();
    out["updates_kept_encoded"] = updates_kept_encoded;
    out["state_bytes_served"] = server.bytes_served();
    out["state_serve_throttled_s"] = server.throttled_s();
  }
};

class DonorDuty {
 public:
  // Updates are kept for `keep_steps` inner steps after the snapshot, in at most `keep_bytes`;
  // serving takes at most `serve_bytes_per_s` (nothing: as fast as the links go); `progress` says
  // where this member is (its inner steps done, -1 before training).
  DonorDuty(Clock& clock, std::int64_t keep_steps, std::uint64_t keep_bytes, std::optional<double> serve_bytes_per_s,
            std::function<std::int64_t()> progress);

  // Answers the requests on a state link until it closes.
  void serve(std::shared_ptr<transport::Link> link) { server_->serve(std::move(link)); }
  // The all-reduces' means, which the update log keeps while it records (PeerLinks::tap_means).
  const std::shared_ptr<optim::MeanTap>& tap() const { return tap_; }
  // This member's state is no longer the members' (it took another, or went on alone): nothing it
  // offers or keeps serves a newcomer any more.
  void withdraw();
  // An update this member applied at `step` (of `round`, in a group of `world`): kept while it records.
  void record(std::int64_t step, std::int64_t round, std::uint32_t world, const at::Tensor& update);
  // At a round's boundary: after three in a row at which no newcomer waited or asked for anything,
  // it drops what it keeps (`round`: for the message).
  void at_boundary(std::int64_t round, bool newcomers_waiting);
  bool recording() const { return log_->recording(); }
  // Whether the newcomers need a new snapshot: none is offered, or the updates kept no longer reach
  // back to it.
  bool needs_snapshot() const;
  // Offers `state`, the shared state after `step` (of `round`, in a group of `world`), and keeps the
  // updates from there on.
  void offer(std::int64_t round, std::int64_t step, std::uint32_t world, Bytes state);
  std::optional<std::int64_t> snapshot_step() const { return snapshot_step_; }
  // How long the offered snapshot takes to reach a newcomer: at this member's serving rate (a
  // common access link where unknown), or the newcomer's own link where that is slower.
  double transfer_estimate_s(std::optional<double> newcomer_bytes_per_s) const;
  std::uint64_t bytes_served() const { return server_->bytes_served(); }
  // The record's keys (the log's bytes while it holds any) and the summary's (DonorStats).
  void write_record(nlohmann::json& out) const { stats_.write_record(out, *log_); }
  void write_summary(nlohmann::json& out) const { stats_.write_summary(out, *log_, *server_); }

 private:
  std::shared_ptr<optim::MeanTap> tap_ = std::make_shared<optim::MeanTap>();
  std::shared_ptr<UpdateLog> log_;
  std::unique_ptr<StateServer> server_;
  std::optional<std::int64_t> snapshot_step_;  // of the snapshot offered, if any
  std::uint64_t requests_seen_ = 0;            // the server's requests at the last boundary
  int idle_boundaries_ = 0;                    // boundaries since a newcomer last waited or asked
  DonorStats stats_;
};

}  // namespace gossamer::runtime
