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
  GOSSAMER_CHECK(blocks.size() >= 3, "make_fragments: needs an embedding, at least one transformer block and a final block");
  const int layers = static_cast<int>(blocks.size()) - 2;
  const int p = o.fragments;
  GOSSAMER_CHECK(p >= 1 && p <= layers, "make_fragments: fragments must be in [1, " + std::to_string(layers) + "] for this model");
  std::vector<Fragment> frags(static_cast<std::size_t>(p));
  auto home = [&](int layer) {
    return o.pattern == FragmentPattern::kStrided ? layer % p : static_cast<int>(static_cast<std::int64_t>(layer) * p / layers);
  };
  std::vector<std::vector<int>> members(static_cast<std::size_t>(p));
  for (int l = 0; l < layers; ++l) members[static_cast<std::size_t>(home(l))].push_back(l);
  const int first_home = home(0), last_home = home(layers - 1);
  for (int f = 0; f < p; ++f) {
    // In model order: the embedding before block 0, the final block after the last one.
    if (o.edges == EdgePlacement::kWithNeighbors && f == first_home) add(frags[static_cast<std::size_t>(f)], blocks.front());
    for (int l : members[static_cast<std::size_t>(f)]) add(frags[static_cast<std::size_t>(f)], blocks[static_cast<std::size_t>(l + 1)]);
    if (o.edges == EdgePlacement::kWithNeighbors && f == last_home) add(frags[static_cast<std::size_t>(f)], blocks.back());
  }
  if (o.edges == EdgePlacement::kOwnFragments) {
    Fragment embed, final_block;
    add(embed, blocks.front());
    add(final_block, blocks.back());
    frags.insert(frags.begin(), std::move(embed));
    frags.push_back(std::move(final_block));
  }
  return frags;
}

}  // namespace gossamer::optim
