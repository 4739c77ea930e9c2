#include <doctest/doctest.h>

#include <vector>

#include "train/speeds.h"
#include "train/step_budget.h"

using namespace gossamer;
using namespace gossamer::train;

namespace {
std::int64_t computed_in(StepBudget& b, std::int64_t first, std::int64_t last) {
  std::int64_t n = 0;
  for (std::int64_t s = first; s <= last; ++s) n += b.take(s) ? 1 : 0;
  return n;
}
}  // namespace

TEST_CASE("StepBudget: off or unmeasured, every slot computes") {
  StepBudget off;
  CHECK_FALSE(off.enabled());
  CHECK(computed_in(off, 1, 100) == 100);
  StepBudget b(10);
  CHECK(computed_in(b, 1, 30) == 30);
  b.observe(0.1, 0.0);  // nobody's pace known yet
  CHECK(computed_in(b, 1, 30) == 30);
}

TEST_CASE("StepBudget: a member at a third of the fastest's pace computes a third of each round, spread evenly") {
  StepBudget b(12);
  b.observe(0.3, 0.1);
  CHECK(b.steps_per_round() == 4);
  for (std::int64_t round = 0; round < 3; ++round) CHECK(computed_in(b, round * 12 + 1, round * 12 + 12) == 4);
  // Spread evenly: never two computed slots in a row at this pace, and the round's last one computes.
  std::vector<bool> pattern;
  for (std::int64_t s = 1; s <= 12; ++s) pattern.push_back(b.take(s));
  for (std::size_t j = 0; j + 1 < pattern.size(); ++j) CHECK_FALSE((pattern[j] && pattern[j + 1]));
  CHECK(pattern.back());
  b.observe(0.1, 0.1);  // as fast as the fastest again
  CHECK(computed_in(b, 1, 12) == 12);
  b.observe(1000.0, 0.1);  // however slow: at least one step a round
  CHECK(b.steps_per_round() == 1);
  CHECK(computed_in(b, 13, 24) == 1);
  b.observe(0.05, 0.1);  // faster than the fastest said: never more than the round's slots
  CHECK(b.steps_per_round() == 12);
}

TEST_CASE("StepBudget: a fractional budget alternates, so rounding costs nobody a step every round") {
  StepBudget b(50);
  b.observe(0.4, 0.1);  // 12.5 steps a round
  std::int64_t total = 0;
  for (std::int64_t round = 0; round < 10; ++round) {
    const std::int64_t n = computed_in(b, round * 50 + 1, round * 50 + 50);
    CHECK((n == 12 || n == 13));
    total += n;
  }
  CHECK(total == 125);
}

TEST_CASE("StepBudget: a round whose budget shrinks after its first steps still computes about the new budget") {
  StepBudget b(12);
  CHECK(b.take(1));
  CHECK(b.take(2));     // the run's second step, timed by every member together
  b.observe(0.4, 0.1);  // a quarter of the fastest's pace: 3 steps a round
  CHECK(computed_in(b, 3, 12) == 1);  // 3 in the round, the first two included
  CHECK(computed_in(b, 13, 24) == 3);
}
