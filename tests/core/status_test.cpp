#include <doctest/doctest.h>

#include "core/status.h"

using namespace gossamer;

TEST_CASE("Status carries code, message and context") {
  Status ok;
  CHECK(ok.ok());
  CHECK(ok.to_string() == "ok");
  Status st = error(ErrorCode::kPeerLost, "peer 7 went away");
  CHECK_FALSE(st.ok());
  CHECK(st.code() == ErrorCode::kPeerLost);
  CHECK(st.to_string() == "peer_lost: peer 7 went away");
  CHECK(st.with_context("round 3").message() == "round 3: peer 7 went away");
  CHECK(ok.with_context("x").ok());
}

TEST_CASE("Result holds a value or a failed status") {
  Result<int> good(5);
  REQUIRE(good.ok());
  CHECK(*good == 5);
  CHECK(good.status().ok());
  Result<int> bad(error(ErrorCode::kTimeout, "too slow"));
  CHECK_FALSE(bad.ok());
  CHECK(bad.status().code() == ErrorCode::kTimeout);
  CHECK(bad.value_or(9) == 9);
  // Reading the value of a failed Result is a caller bug: it throws, it does not crash.
  CHECK_THROWS_AS((void)bad.value(), ContractError);
  // An ok Status is not a valid error.
  CHECK_THROWS_AS((void)Result<int>{Status()}, ContractError);
}

TEST_CASE("error codes are pinned") {
  CHECK(static_cast<int>(ErrorCode::kOk) == 0);
  CHECK(static_cast<int>(ErrorCode::kDataLoss) == 4);
  CHECK(static_cast<int>(ErrorCode::kPeerLost) == 9);
  CHECK(to_string(ErrorCode::kVersionMismatch) == "version_mismatch");
}
