#include <doctest/doctest.h>

#include "core/text.h"

namespace gossamer {

TEST_CASE("text: edit distance and the closest match for did-you-mean") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("train", "trian") == 2);
  CHECK(edit_distance("kitten", "sitting") == 3);
  const std::vector<std::string> commands = {"train", "peer", "sim", "compare", "plan"};
  CHECK(closest_match("trian", commands) == std::optional<std::string>("train"));
  CHECK(closest_match("comapre", commands) == std::optional<std::string>("compare"));
  CHECK_FALSE(closest_match("frobnicate", commands).has_value());
  CHECK(closest_match("pear", commands, 1) == std::optional<std::string>("peer"));
  CHECK_FALSE(closest_match("xxxx", {}).has_value());
}

}  // namespace gossamer
