// Small text helpers for messages to users: the closest of a set of names, for "did you mean".
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gossamer {

// Levenshtein distance (insertions, deletions, substitutions).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `typed` when it is within `max_distance` edits (ties: the first), else none.
std::optional<std::string> closest_match(std::string_view typed, const std::vector<std::string>& candidates, std::size_t max_distance = 3);

}  // namespace gossamer
