#include "app/args.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <string_view>

#include "train/memory.h"
#include "train/run_folder.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gossamer::app {

namespace {

std::string range_text(double min, double max, bool min_exclusive) {
  const bool open_top = std::isinf(max);
  if (min == 0 && min_exclusive && open_top) return "a number > 0";
  if (min == 0 && !min_exclusive && open_top) return "a number >= 0";
  if (open_top) return fmt::format("a number {} {:g}", min_exclusive ? ">" : ">=", min);
  return fmt::format("a number in {}{:g}, {:g}]", min_exclusive ? "(" : "[", min, max);
}

std::string integer_range_text(std::int64_t min, std::int64_t max) {
  if (max == std::numeric_limits<std::int64_t>::max()) return fmt::format("an integer >= {}", min);
  return fmt::format("an integer in [{}, {}]", min, max);
}

}  // namespace

CLI::Validator number_in(double min, double max, bool min_exclusive) {
  const std::string allowed = range_text(min, max, min_exclusive);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number; expected " + allowed;
        if (!std::isfinite(v) || errno == ERANGE) return "'" + text + "' is not a finite number; expected " + allowed;
        const bool below = min_exclusive ? !(v > min) : !(v >= min);
        if (below || v > max) return "'" + text + "' is out of range; expected " + allowed;
        return std::string();
      },
      allowed);
}

CLI::Validator not_empty() {
  return CLI::Validator([](std::string& text) { return text.find_first_not_of(" \t") == std::string::npos ? std::string("is empty: name one") : std::string(); },
                        "TEXT");
}

CLI::Validator positive_number() { return number_in(0.0, kNoLimit, /*min_exclusive=*/true); }

CLI::Validator integer_in(std::int64_t min, std::int64_t max) {
  const std::string allowed = integer_range_text(min, max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not an integer; expected " + allowed;
        if (errno == ERANGE || v < min || v > max) return "'" + text + "' is out of range; expected " + allowed;
        return std::string();
      },
      allowed);
}

CLI::Validator host_port(transport::EndpointUse use) {
  return CLI::Validator(
      [use](std::string& text) -> std::string {
        auto ep = transport::parse_endpoint(text, use, "");
        if (ep.ok()) return std::string();
        std::string msg = ep.status().message();
        if (!msg.empty() && msg.front() == ' ') msg.erase(0, 1);  // the option's name comes from CLI11
        return msg;
      },
      "HOST:PORT");
}

// A preset name, or "MBIT,MS".
Result<transport::LinkProfile> parse_shape(const std::string& text) {
  if (auto preset = transport::link_profile_preset(text); preset.ok()) return *preset;
  const auto comma = text.find(',');
  transport::LinkProfile p;
  try {
    if (comma == std::string::npos) throw std::invalid_argument("no comma");
    const double mbit = std::stod(text.substr(0, comma)), ms = std::stod(text.substr(comma + 1));
    p.name = text;
    p.bandwidth_bytes_per_s = mbit * 1e6 / 8;
    p.latency = std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(ms));
  } catch (const std::exception&) {
    return error(ErrorCode::kInvalidArgument, "--shape " + text + ": not a preset (" + fmt::format("{}", fmt::join(transport::link_profile_names(), ", ")) +
                                                  ") nor MBIT,MS such as 100,25");
  }
  if (Status st = p.validate(); !st.ok()) return error(ErrorCode::kInvalidArgument, "--shape " + text + ": " + st.message());
  return p;
}


Status check_output_file(const std::string& out, bool force) {
  namespace fs = std::filesystem;
  if (out.empty()) return error(ErrorCode::kInvalidArgument, "--out is empty: name the file to write");
  const fs::path path(out);
  const fs::path parent = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::error_code ec;
  const bool run_folder = fs::exists(parent / train::kRunMarkerFile, ec) || fs::exists(parent / train::kCheckpointFile, ec);
  const std::string name = path.filename().string();
  if (run_folder && std::find(train::kRunFiles.begin(), train::kRunFiles.end(), name) != train::kRunFiles.end()) {
    return error(ErrorCode::kInvalidArgument, "--out " + out + " is a file of the run in " + parent.string() +
                                                  ", which no other command replaces (not even with --force): choose another name, for example " +
                                                  (parent / "model.out").string());
  }
  if (!fs::is_directory(parent, ec)) {
    return error(ErrorCode::kInvalidArgument, "--out " + out + ": folder " + parent.string() + " does not exist (create it first)");
  }
  if (fs::is_directory(path, ec)) return error(ErrorCode::kInvalidArgument, "--out " + out + " is a folder: name a file");
  if (name.find_first_not_of(" \t") == std::string::npos) return error(ErrorCode::kInvalidArgument, "--out '" + out + "' names no file: give it a name");
  // A device, a FIFO or a socket is never replaced by a file, not even with --force.
  if (const auto st = fs::status(path, ec); fs::exists(st) && !fs::is_regular_file(st)) {
    return error(ErrorCode::kInvalidArgument, "--out " + out + " is not a regular file (a device, a FIFO or a socket): name a file");
  }
  if (!force && fs::exists(path, ec)) return error(ErrorCode::kInvalidArgument, out + " already exists: pass --force to replace it");
  if (::access(parent.c_str(), W_OK) != 0) {
    return error(ErrorCode::kInvalidArgument, "--out " + out + ": folder " + parent.string() + " cannot be written to (" + std::strerror(errno) + ")");
  }
  return Status();
}

Status check_bench_memory(double bytes, const std::string& options) {
  const auto avail = train::available_memory_bytes();
  if (!avail || 0.9 * bytes <= *avail) return Status();
  return error(ErrorCode::kInvalidArgument, options + " ask for about " + train::format_bytes(bytes) + " of buffers and this machine has " +
                                                train::format_bytes(*avail) + " available: lower them");
}

void OptionScopes::add(const CLI::Option* option, std::vector<std::string> modes) { scoped_.emplace_back(option, std::move(modes)); }

Status OptionScopes::check(const std::string& mode) const {
  auto name = [&](const std::string& m) {
    auto it = names_.find(m);
    return it == names_.end() ? m : it->second;
  };
  for (const auto& [option, modes] : scoped_) {
    if (option->count() == 0 || std::find(modes.begin(), modes.end(), mode) != modes.end()) continue;
    std::string where;
    for (std::size_t i = 0; i < modes.size(); ++i) where += (i == 0 ? "" : i + 1 == modes.size() ? " and " : ", ") + ("`" + name(modes[i]) + "`");
    return error(ErrorCode::kInvalidArgument, option->get_name() + " applies to " + where + " only; it would do nothing for `" + name(mode) + "`: drop it");
  }
  return Status();
}

}  // namespace gossamer::app
