// The age gate (optim/age_gate.h, CGAD's sigma) and a late contribution's work carried at its weight
// (WorkMeter::keep).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "optim/age_gate.h"
#include "optim/token_weights.h"

using namespace gossamer::optim;

TEST_CASE("the age gate: 1 on time, the momentum's decay per round of age, nothing from the cutoff on") {
  const AgeGate gate;  // the defaults: beta = 0.9's decay, cutoff 2 / (1 - beta) = 20 rounds
  CHECK(gate.weight(0) == doctest::Approx(1.0));
  // gamma(1) = (1 + cos(pi / 20)) / 2, times 0.9.
  CHECK(gate.weight(1) == doctest::Approx(0.9 * (1 + std::cos(std::numbers::pi / 20)) / 2).epsilon(1e-12));
  CHECK(gate.weight(10) == doctest::Approx(std::pow(0.9, 10) * 0.5).epsilon(1e-12));  // halfway: gamma = 1/2
  CHECK(gate.weight(20) == 0.0);
  CHECK(gate.weight(25) == 0.0);
  CHECK(gate.weight(-1) == 0.0);
  CHECK(gate.weight(std::numeric_limits<double>::quiet_NaN()) == 0.0);
  for (int age = 0; age < 20; ++age) {
    CAPTURE(age);
    CHECK(gate.weight(age + 1) < gate.weight(age));  // strictly falling to the cutoff
    CHECK(gate.weight(age) <= std::pow(0.9, age) + 1e-12);  // never above the momentum's own decay
  }
  // Other settings: no decay leaves the cosine alone; a short cutoff zeroes early.
  CHECK(AgeGate{0.0, 8.0}.weight(4) == doctest::Approx(0.5));
  CHECK(AgeGate{0.0, 2.0}.weight(2) == 0.0);
}

TEST_CASE("a late contribution's work rides on at its weight: the steps scale, the pace stays") {
  WorkMeter m;
  for (int i = 0; i < 10; ++i) m.add(0.2);
  m.keep(0.5);
  CHECK(m.contribution().steps == 5);
  CHECK(m.contribution().step_seconds == doctest::Approx(0.2));
  for (int i = 0; i < 5; ++i) m.add(0.4);
  CHECK(m.contribution().steps == 10);
  CHECK(m.contribution().step_seconds == doctest::Approx(0.3));  // (5 x 0.2 + 5 x 0.4) / 10
  m.keep(0.0);  // dropped
  CHECK(m.contribution().steps == 0);
  CHECK(m.contribution().step_seconds == doctest::Approx(0.3));  // the pace is remembered
  m.keep(7.0);  // clamped to 1: nothing grows
  CHECK(m.contribution().steps == 0);
}
