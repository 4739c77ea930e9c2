#include "train/speeds.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>

#include "core/check.h"

namespace gossamer::train {

Result<std::vector<double>> parse_speeds(std::string_view text, std::int64_t workers) {
  const std::string whole(text);
  const auto bad = [&whole](const std::string& why) {
    return error(ErrorCode::kInvalidArgument, "sim.speeds = \"" + whole + "\": " + why +
                                                  "; write speeds in worker order as SPEED or SPEEDxCOUNT items separated by commas, e.g. 1x11,0.5x4,0.25");
  };
  std::vector<double> out;
  std::istringstream items(whole);
  std::string item;
  bool any = false;
  while (std::getline(items, item, ',')) {
    any = true;
    std::erase_if(item, [](char ch) { return ch == ' ' || ch == '\t'; });
    const std::size_t x = item.find('x');
    const std::string speed_text = item.substr(0, x);
    char* end = nullptr;
    const double speed = speed_text.empty() ? 0.0 : std::strtod(speed_text.c_str(), &end);
    if (speed_text.empty() || end != speed_text.c_str() + speed_text.size() || !std::isfinite(speed) || speed <= 0 || speed > 1000) {
      return bad("'" + item + "' is not a speed in (0, 1000]");
    }
    std::int64_t count = 1;
    if (x != std::string::npos) {
      const std::string c = item.substr(x + 1);
      const auto [stop, ec] = std::from_chars(c.data(), c.data() + c.size(), count);
      if (c.empty() || ec != std::errc() || stop != c.data() + c.size() || count < 1 || count > std::max<std::int64_t>(workers, 1)) {
        return bad("'" + item + "' has no count in [1, " + std::to_string(workers) + "] after its x");
      }
    }
    out.insert(out.end(), static_cast<std::size_t>(count), speed);
    if (static_cast<std::int64_t>(out.size()) > workers) {
      return bad(std::to_string(out.size()) + " speeds or more for " + std::to_string(workers) + " workers (sim.workers)");
    }
  }
  if (any && whole.back() == ',') return bad("an empty item at the end");
  out.resize(static_cast<std::size_t>(std::max<std::int64_t>(workers, 0)), 1.0);
  return out;
}

std::vector<double> worker_speeds(const RunConfig& c) {
  auto parsed = parse_speeds(c.sim.speeds, c.sim.workers);
  GOSSAMER_CHECK(parsed.ok(), "worker_speeds: " + parsed.status().to_string());
  std::vector<double> out = std::move(*parsed);
  for (std::size_t r = 0; r < out.size(); ++r) {
    if (c.sim.speed_spread > 0) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(c.sim.seed) * 0xD1B54A32D192ED03ull + r * 0x9E3779B97F4A7C15ull + 101);
      std::normal_distribution<double> z(0.0, 1.0);
      out[r] *= std::exp(c.sim.speed_spread * z(rng));
    }
    if (static_cast<std::int64_t>(r) == c.sim.straggler) out[r] /= c.sim.straggler_factor;
  }
  return out;
}

}  // namespace gossamer::train
