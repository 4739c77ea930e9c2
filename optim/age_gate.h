// AgeGate: how much a stale contribution weighs, by its age in outer rounds, after Cosine-Gated
// Adam-Decay (CGAD; Shah and Sun 2026, arXiv 2605.09126):
//   sigma(tau) = gamma(tau) e^{-alpha tau},  gamma(tau) = (1 + cos(pi tau / tau_c)) / 2 for tau < tau_c, 0 after
// The exponential models what the state forgot of a contribution's starting point; the cosine gate
// zeroes it smoothly at the cutoff tau_c. sigma(0) = 1: a contribution on time is untouched.
//
// Defaults by a rule, not a tuning (docs/methods.md, "Stale contributions"): with the outer
// momentum beta = 0.9 that DiLoCo's outer step uses, alpha = -ln(beta), so a contribution tau rounds
// late weighs what the momentum buffer would still hold of it had it arrived on time (beta^tau), and
// tau_c = 2 / (1 - beta) = 20 rounds, twice the momentum's memory, where beta^tau is below e^-2.
//
// Used by late contributions carried into a later round (docs/peer.md, "Quorum and grace") and by
// the CGAD outer step (diloco.h). A value type; thread-safe to read.
#pragma once

namespace gossamer::optim {

struct AgeGate {
  double decay = 0.10536051565782628;  // alpha = -ln(0.9)
  double cutoff = 20.0;                // tau_c, in rounds

  // sigma(age): 1 at age 0, falling to 0 at the cutoff; 0 for a negative or non-finite age.
  double weight(double age) const;
};

}  // namespace gossamer::optim
