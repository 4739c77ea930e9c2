// Logging through spdlog. init_logging() configures the process-wide default logger once, from the
// application's main(); library code just calls spdlog::info/warn/error. spdlog's default logger is
// thread-safe.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

#include "core/status.h"

namespace gossamer {

// level: trace, debug, info, warn, error, off.
[[nodiscard]] Status init_logging(std::string_view level);

}  // namespace gossamer
