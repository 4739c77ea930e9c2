// Simulated workers of unequal speed (sim.speeds, sim.speed_spread): the factor each worker's compute
// runs at, 1 for the speed sim.compute describes, 0.5 for steps that take twice as long.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "train/config.h"

namespace gossamer::train {

// "1x11,0.5x4,0.25": items SPEED or SPEEDxCOUNT separated by commas (spaces allowed), in worker order;
// the workers not listed run at 1. kInvalidArgument, saying what to write, for anything else: a
// speed outside (0, 1000], a count outside [1, workers], or more speeds than workers.
[[nodiscard]] Result<std::vector<double>> parse_speeds(std::string_view text, std::int64_t workers);

// Every worker's speed: sim.speeds times a log-normal factor exp(sigma z) per worker (sim.speed_spread
// = sigma; z drawn from sim.seed and the worker alone), times sim.straggler_factor's slowdown for
// sim.straggler. The config must be valid.
std::vector<double> worker_speeds(const RunConfig& config);

}  // namespace gossamer::train
