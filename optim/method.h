// The outer methods, as one table: the id every layer switches on, and the name configs, reports and
// the command line use. A method name is parsed once (train/outer.cpp builds optim::OuterConfig) and
// the config schema's allowed values for outer.method come from this table.
// Header only; constants and pure functions, thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gossamer::optim {

enum class Method : std::uint8_t {
  kDdp = 0,              // data-parallel all-reduce of gradients every step
  kDiLoCo = 1,           // outer Nesterov on the averaged pseudo-gradient every H steps
  kStreamingDiLoCo = 2,  // DiLoCo by fragments that take turns, overlapped, quantized
  kNoLoCo = 3,           // random-pair partial averaging, no all-reduce
  kCO2 = 4,              // one-step-stale asynchronous averaging
  kLocal = 5,            // independent workers, no synchronization
  kSparseLoCo = 6,       // top-k + 2-bit pseudo-gradients with error feedback, all-gathered
  kMuLoCo = 7,           // Muon inner steps, DiLoCo's outer step on error-fed low-bit pseudo-gradients
};

struct MethodInfo {
  Method id;
  std::string_view name;
};

inline constexpr std::array<MethodInfo, 8> kMethods = {{
    {Method::kDdp, "ddp"},
    {Method::kDiLoCo, "diloco"},
    {Method::kStreamingDiLoCo, "streaming_diloco"},
    {Method::kNoLoCo, "noloco"},
    {Method::kCO2, "co2"},
    {Method::kLocal, "local"},
    {Method::kSparseLoCo, "sparseloco"},
    {Method::kMuLoCo, "muloco"},
}};

constexpr bool methods_in_id_order() {
  for (std::size_t i = 0; i < kMethods.size(); ++i) {
    if (static_cast<std::size_t>(kMethods[i].id) != i) return false;
  }
  return true;
}
static_assert(methods_in_id_order(), "kMethods is indexed by Method: keep its rows in id order");

constexpr std::string_view method_name(Method m) { return kMethods[static_cast<std::size_t>(m)].name; }

inline std::vector<std::string> method_names() {
  std::vector<std::string> out;
  for (const auto& m : kMethods) out.emplace_back(m.name);
  return out;
}

// kInvalidArgument naming the methods there are.
[[nodiscard]] inline Result<Method> parse_method(std::string_view name) {
  for (const auto& m : kMethods) {
    if (m.name == name) return m.id;
  }
  std::string names;
  for (const auto& m : kMethods) names += (names.empty() ? "" : ", ") + std::string(m.name);
  return error(ErrorCode::kInvalidArgument, "unknown outer method '" + std::string(name) + "': use one of " + names);
}

}  // namespace gossamer::optim
