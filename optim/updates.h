// Catch-up: what a member applies to the state it shares with the others at each round, handed out
// as it is applied, so that a newcomer holding the state of an earlier round can replay the rounds
// since and end bit-identical to the members (runtime/update_log.h keeps them; docs/joining.md).
//
// An update is keyed by the inner step whose round it completes (DiLoCo: every H-th step; Streaming
// DiLoCo: the step a fragment completes; CO2: the step whose round launched the average it is; ddp:
// every step). Replaying the updates after step S, in order, on the state of step S gives the state
// the members shared after the last of them. What an update holds is the method's (docs/joining.md
// has the table): DiLoCo the averaged pseudo-gradient, ddp the averaged gradients, and so on.
//
// Threading: the sink is called on the training thread (CO2: also from settle(), on the caller's),
// inside step(); it must copy what it keeps (the tensor is the method's own) and return quickly.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include <ATen/core/Tensor.h>

#include "core/status.h"

namespace gossamer::optim {

using UpdateSink = std::function<void(std::int64_t step, const at::Tensor& update)>;

// A replayed update must be a flat fp32 vector of `numel` finite values: kMalformed otherwise,
// naming the method and the step.
[[nodiscard]] Status check_update(const at::Tensor& update, std::int64_t numel, std::string_view method, std::int64_t step);

}  // namespace gossamer::optim
