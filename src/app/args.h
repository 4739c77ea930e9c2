// Checks for what users type on the command line, attached to CLI11 options: numbers that must be
// finite and in range, and host:port addresses. Each failure message names the value typed and what
// is allowed (CLI11 puts the option's name in front), and prints no limit the user did not set (no
// 1.79769e+308). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "transport/endpoint.h"
#include "transport/link_profile.h"

namespace gossamer::app {

inline constexpr double kNoLimit = std::numeric_limits<double>::infinity();

// A finite number in [min, max] (or (min, max] when min_exclusive). NaN and infinity are refused.
CLI::Validator number_in(double min, double max, bool min_exclusive = false);
// A finite number > 0.
CLI::Validator positive_number();
// An integer in [min, max], written in decimal.
CLI::Validator integer_in(std::int64_t min, std::int64_t max);
// A name that is not empty or blank (a file or folder to read).
CLI::Validator not_empty();
// host:port for the given use (transport/endpoint.h).
CLI::Validator host_port(transport::EndpointUse use);

// A file a command is about to write (--out of export, schedule): refused when it is one of a run's
// own files (run.json, summary.json, metrics.jsonl, checkpoint.bin, report.html, config.toml, inputs.json
// or address in a folder holding run.json or checkpoint.bin), even with `force`: a result is never
// replaced by another command. Refused too when it exists and `force` is off, or its folder does not
// exist. kInvalidArgument with what to do.
[[nodiscard]] Status check_output_file(const std::string& out, bool force);

// Options that apply to some of a command's modes only (bench's benchmark, schedule's --network,
// plan's report): one given in a mode it does not apply to would do nothing, silently, so it is
// refused with where it applies. `names` maps each mode to how the user asks for it ("bench quant").
class OptionScopes {
 public:
  explicit OptionScopes(std::map<std::string, std::string> names = {}) : names_(std::move(names)) {}
  // `option` does something in `modes` only.
  void add(const CLI::Option* option, std::vector<std::string> modes);
  // kInvalidArgument for the first option given on the command line that does not apply to `mode`.
  [[nodiscard]] Status check(const std::string& mode) const;

 private:
  std::map<std::string, std::string> names_;
  std::vector<std::pair<const CLI::Option*, std::vector<std::string>>> scoped_;
};

// A benchmark's buffers against the memory available (train/memory.h): kInvalidArgument naming
// `options`, what they ask for and what there is, when `bytes` would not fit.
[[nodiscard]] Status check_bench_memory(double bytes, const std::string& options);

// --shape: a link profile preset, or "MBIT,MS" (bandwidth in Mbit/s, one-way latency in ms).
[[nodiscard]] Result<transport::LinkProfile> parse_shape(const std::string& text);

}  // namespace gossamer::app
