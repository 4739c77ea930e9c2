// Fragments: the model's parameters cut into P groups of transformer blocks, the unit that is encoded
// and sent (Streaming DiLoCo, ALGORITHMS.md section 2.2). Blocks are given in model order: an
// embedding first, the transformer blocks, a final block (norm, head) last.
// Patterns: strided (block l goes to fragment l mod P; the paper's mild preference) or sequential
// (consecutive blocks share a fragment). The embedding and the final block either join the fragment
// of their neighbouring transformer block or form two fragments of their own (P + 2 in all).
// Pure functions; misuse (more fragments than blocks) throws ContractError.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace gossamer::optim {

struct ParamBlock {
  std::string name;
  std::vector<at::Tensor> tensors;
};

enum class FragmentPattern { kStrided, kSequential };
enum class EdgePlacement { kWithNeighbors, kOwnFragments };

struct FragmentOptions {
  int fragments = 1;
  FragmentPattern pattern = FragmentPattern::kStrided;
  EdgePlacement edges = EdgePlacement::kWithNeighbors;
};

struct Fragment {
  std::vector<std::string> blocks;  // names, in model order
  std::vector<at::Tensor> tensors;
  std::int64_t numel = 0;
};

// How many fragments make_fragments cuts from a whole model: `fragments`, plus the edges' two of their own.
inline int fragment_count(const FragmentOptions& o) { return o.fragments + (o.edges == EdgePlacement::kOwnFragments ? 2 : 0); }

// blocks: [embedding, transformer blocks..., final]; at least one transformer block. A pipeline
// stage's blocks may lack the embedding (named "embed") or the final block (named "final"), or both:
// then only the transformer blocks are cut, and no edge fragment of its own is made for what is absent.
std::vector<Fragment> make_fragments(const std::vector<ParamBlock>& blocks, const FragmentOptions& options);

}  // namespace gossamer::optim
