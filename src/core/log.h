// Logging through spdlog. init_logging() configures the process-wide default logger once, from the
// application's main(); library code just calls spdlog::info/warn/error. spdlog's default logger is
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "core/status.h"

namespace gossamer {

// level: trace, debug, info, warn, error, off.
[[nodiscard]] Status init_logging(std::string_view level);

// Bounds the log lines one kind of event may write, for events that someone on the network can cause
// at will (refused connections, dropped messages): at most `burst` lines per `period`; the events
// past that are counted, and the count is logged in one line when the next period begins (or when
// the limiter goes away), so no flood can fill a disk with log lines. Thread-safe.
class LogLimiter {
 public:
  explicit LogLimiter(std::string what, int burst = 5, std::chrono::seconds period = std::chrono::seconds(10));
  ~LogLimiter();
  LogLimiter(const LogLimiter&) = delete;
  LogLimiter& operator=(const LogLimiter&) = delete;

  // True when this event may be logged line by line; false when it was only counted.
  bool allow();
  std::uint64_t suppressed_total() const;

 private:
  void summarize_locked();

  const std::string what_;
  const int burst_;
  const std::chrono::seconds period_;
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point window_start_;
  int logged_in_window_ = 0;
  std::uint64_t suppressed_in_window_ = 0;
  std::uint64_t suppressed_total_ = 0;
};

}  // namespace gossamer
