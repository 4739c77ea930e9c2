#include <doctest/doctest.h>

#include "train/schedule.h"

using namespace gossamer::train;

TEST_CASE("warm-up is linear, then cosine decays to lr * min_lr_ratio at the last step") {
  ScheduleOptions o{1.0, 0.1, 10, 110};
  CHECK(learning_rate(o, 0) == doctest::Approx(0.1));
  CHECK(learning_rate(o, 4) == doctest::Approx(0.5));
  CHECK(learning_rate(o, 9) == doctest::Approx(1.0));
  CHECK(learning_rate(o, 10) == doctest::Approx(1.0));
  CHECK(learning_rate(o, 109) == doctest::Approx(0.1));
  // Halfway through the decay: the midpoint of peak and floor.
  CHECK(learning_rate(o, 10 + 99 / 2) == doctest::Approx(0.55).epsilon(0.02));
  double prev = 2.0;
  for (int s = 10; s < 110; ++s) {
    CHECK(learning_rate(o, s) <= prev);
    prev = learning_rate(o, s);
  }
  ScheduleOptions no_warmup{2.0, 0.0, 0, 1};
  CHECK(learning_rate(no_warmup, 0) == doctest::Approx(2.0));
}
