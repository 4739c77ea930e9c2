#include "optim/fragments.h"

#include "core/check.h"

namespace gossamer::optim {

namespace {
void add(Fragment& f, const ParamBlock& b) {
  f.blocks.push_back(b.name);
  for (const auto& t : b.tensors) {
    f.tensors.push_back(t);
    f.numel += t.numel();
  }
}
}  // namespace

std::vector<Fragment> make_fragments(const std::vector<ParamBlock>& blocks, const FragmentOptions& o) {
  // The edges are there when the blocks are a whole model's; a pipeline stage's may have neither.
  const bool embed = !blocks.empty() && blocks.front().name == "embed";
  const bool final = blocks.size() > (embed ? 1u : 0u) && blocks.back().name == "final";
  const int first = embed ? 1 : 0;
  const int layers = static_cast<int>(blocks.size()) - first - (final ? 1 : 0);
  GOSSAMER_CHECK(layers >= 1, "make_fragments: needs at least one transformer block");
  const int p = o.fragments;
  GOSSAMER_CHECK(p >= 1 && p <= layers, "make_fragments: fragments must be in [1, " + std::to_string(layers) + "] for these blocks");
  std::vector<Fragment> frags(static_cast<std::size_t>(p));
  auto home = [&](int layer) {
    return o.pattern == FragmentPattern::kStrided ? layer % p : static_cast<int>(static_cast<std::int64_t>(layer) * p / layers);
  };
  std::vector<std::vector<int>> members(static_cast<std::size_t>(p));
  for (int l = 0; l < layers; ++l) members[static_cast<std::size_t>(home(l))].push_back(l);
  const int first_home = home(0), last_home = home(layers - 1);
  const bool with_neighbors = o.edges == EdgePlacement::kWithNeighbors;
  for (int f = 0; f < p; ++f) {
    // In model order: the embedding before block 0, the final block after the last one.
    if (embed && with_neighbors && f == first_home) add(frags[static_cast<std::size_t>(f)], blocks.front());
    for (int l : members[static_cast<std::size_t>(f)]) add(frags[static_cast<std::size_t>(f)], blocks[static_cast<std::size_t>(l + first)]);
    if (final && with_neighbors && f == last_home) add(frags[static_cast<std::size_t>(f)], blocks.back());
  }
  if (!with_neighbors) {
    if (embed) {
      Fragment e;
      add(e, blocks.front());
      frags.insert(frags.begin(), std::move(e));
    }
    if (final) {
      Fragment f;
      add(f, blocks.back());
      frags.push_back(std::move(f));
    }
  }
  return frags;
}

}  // namespace gossamer::optim
