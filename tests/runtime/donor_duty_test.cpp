// DonorDuty: a member's part in newcomers' joins (src/runtime/donor_duty.h), on its own.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "runtime/donor_duty.h"

using namespace gossamer;

TEST_CASE("donor duty: a snapshot offered keeps the updates after it, serves at the slower link, and is dropped after three idle boundaries") {
  runtime::DonorDuty duty(real_clock(), /*keep_steps=*/100, /*keep_bytes=*/1 << 20, /*serve_bytes_per_s=*/1e6, [] { return std::int64_t{12}; });
  CHECK(duty.needs_snapshot());  // nothing offered yet
  CHECK_FALSE(duty.recording());
  duty.offer(/*round=*/1, /*step=*/10, /*world=*/2, Bytes(4000, std::byte{3}));
  REQUIRE(duty.snapshot_step().has_value());
  CHECK(*duty.snapshot_step() == 10);
  CHECK(duty.recording());
  CHECK_FALSE(duty.needs_snapshot());
  // 4000 bytes at this donor's 1 MB/s, or at a newcomer's slower link (never under 1 kB/s).
  CHECK(duty.transfer_estimate_s(std::nullopt) == doctest::Approx(4000 / 1e6));
  CHECK(duty.transfer_estimate_s(2e3) == doctest::Approx(2.0));
  CHECK(duty.transfer_estimate_s(10.0) == doctest::Approx(4.0));
  // An update applied after the snapshot is kept (in fp32: no all-reduce's bytes to keep instead).
  duty.record(11, 2, 2, torch::arange(64, torch::kFloat));
  nlohmann::json rec;
  duty.write_record(rec);
  REQUIRE(rec.contains("update_log_bytes"));
  CHECK(rec["update_log_bytes"].get<std::uint64_t>() >= 64 * 4);
  CHECK(rec["updates_kept_encoded"].get<std::int64_t>() == 0);
  // A waiting newcomer keeps it all; then three boundaries with nobody asking drop it.
  duty.at_boundary(2, /*newcomers_waiting=*/true);
  duty.at_boundary(3, false);
  duty.at_boundary(4, false);
  CHECK(duty.recording());
  duty.at_boundary(5, false);
  CHECK_FALSE(duty.recording());
  CHECK_FALSE(duty.snapshot_step().has_value());
  CHECK(duty.needs_snapshot());
  nlohmann::json summary;
  duty.write_summary(summary);
  CHECK(summary["update_log_peak_bytes"].get<std::uint64_t>() >= 64 * 4);
  CHECK(summary["state_bytes_served"].get<std::uint64_t>() == 0);
  // An update while nothing is offered is not kept.
  duty.record(12, 2, 2, torch::ones({8}));
  nlohmann::json after;
  duty.write_record(after);
  CHECK(after.value("update_log_bytes", std::uint64_t{0}) == 0);
}

TEST_CASE("donor duty: withdrawing drops the snapshot and the updates at once") {
  runtime::DonorDuty duty(real_clock(), 100, 1 << 20, std::nullopt, [] { return std::int64_t{-1}; });
  duty.offer(3, 30, 4, Bytes(100, std::byte{1}));
  REQUIRE(duty.recording());
  duty.withdraw();
  CHECK_FALSE(duty.recording());
  CHECK_FALSE(duty.snapshot_step().has_value());
  CHECK(duty.needs_snapshot());
  // Without a rate of its own it assumes a common access link (100 Mbit/s).
  duty.offer(4, 40, 4, Bytes(12'500'000, std::byte{1}));
  CHECK(duty.transfer_estimate_s(std::nullopt) == doctest::Approx(1.0));
}
