#include "optim/age_gate.h"

#include <cmath>
#include <numbers>

namespace gossamer::optim {

double AgeGate::weight(double age) const {
  if (!std::isfinite(age) || age < 0 || !(age < cutoff)) return 0.0;
  const double gate = 0.5 * (1.0 + std::cos(std::numbers::pi * age / cutoff));
  return gate * std::exp(-decay * age);
}

}  // namespace gossamer::optim
