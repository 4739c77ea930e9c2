// What planner.cpp and gcma.cpp share. Internal to src/skippipe; pure functions.
#pragma once

#include <cstddef>
#include <vector>

namespace gossamer::skippipe::planner_parts {

// The nodes of each stage, in node order.
inline std::vector<std::vector<int>> nodes_by_stage(const std::vector<int>& stage_of, int stages) {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(stages));
  for (std::size_t n = 0; n < stage_of.size(); ++n) out[static_cast<std::size_t>(stage_of[n])].push_back(static_cast<int>(n));
  return out;
}

}  // namespace gossamer::skippipe::planner_parts
