#include "core/log.h"

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

}  // namespace gossamer
