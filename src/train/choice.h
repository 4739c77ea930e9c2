// Choices: a config key whose value is one of a few names, held as an enum and parsed once from its
// table, so code compares enums (a misspelt name is a compile error, not a silent false) and the
// names live in one place. Each enum E specializes Choices<E> with `rows`, its values and names in
// order. Header only; plain functions.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gossamer::train {

template <typename E>
struct ChoiceRow {
  E value;
  std::string_view name;
};

template <typename E>
struct Choices;  // specialized next to each enum: static constexpr std::array<ChoiceRow<E>, N> rows

// The name of a value, as the config and the reports write it.
template <typename E>
std::string name_of(E value) {
  for (const auto& row : Choices<E>::rows) {
    if (row.value == value) return std::string(row.name);
  }
  return "?";
}

template <typename E>
std::optional<E> parse_choice(std::string_view name) {
  for (const auto& row : Choices<E>::rows) {
    if (row.name == name) return row.value;
  }
  return std::nullopt;
}

template <typename E>
std::vector<std::string> choice_names() {
  std::vector<std::string> out;
  for (const auto& row : Choices<E>::rows) out.emplace_back(row.name);
  return out;
}

}  // namespace gossamer::train
