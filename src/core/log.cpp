#include "core/log.h"

#include <algorithm>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace gossamer {

Status init_logging(std::string_view level) {
  const auto lvl = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to off; accept "off" only when asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return error(ErrorCode::kInvalidArgument,
                 "unknown log level '" + std::string(level) + "': use trace, debug, info, warn, error or off");
  }
  auto logger = spdlog::stderr_color_mt("gossamer");
  logger->set_pattern("%^[%H:%M:%S.%e %L]%$ %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return Status();
}

LogLimiter::LogLimiter(std::string what, int burst, std::chrono::seconds period)
    : what_(std::move(what)), burst_(burst), period_(period), window_start_(std::chrono::steady_clock::now()) {}

LogLimiter::~LogLimiter() {
  std::lock_guard lock(mu_);
  summarize_locked();
}

void LogLimiter::summarize_locked() {
  if (suppressed_in_window_ == 0) return;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - window_start_).count();
  spdlog::warn("{}: {} more in the last {} s, not logged one by one", what_, suppressed_in_window_, std::max<long long>(1, seconds));
  suppressed_in_window_ = 0;
}

bool LogLimiter::allow() {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - window_start_ >= period_) {
    summarize_locked();
    window_start_ = now;
    logged_in_window_ = 0;
  }
  if (logged_in_window_ < burst_) {
    ++logged_in_window_;
    return true;
  }
  ++suppressed_in_window_;
  ++suppressed_total_;
  return false;
}

std::uint64_t LogLimiter::suppressed_total() const {
  std::lock_guard lock(mu_);
  return suppressed_total_;
}

}  // namespace gossamer
