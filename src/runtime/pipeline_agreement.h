// The pipeline agreement's messages with a body (tags in transport/tags.h, the protocol in
// pipeline_process.h), as the nodes and the wire registry write and read them:
//   commit (kPipelineCommit): version u8 | the iteration confirmed u64
//   view (kPipelineView):     version u8 | iterations done u64 | per node u8, 1 if this node reaches
//                             it (itself included), else 0
// Untrusted: another version, a flag other than 0 or 1, a node count other than the run's, or
// bytes left over are errors that say which.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer::runtime::pipeline_agreement {

inline constexpr std::uint8_t kVersion = 1;

Bytes encode_commit(std::uint64_t iteration);
[[nodiscard]] Result<std::uint64_t> decode_commit(ByteView bytes, const std::string& from);

struct View {
  std::uint64_t done = 0;
  std::vector<bool> reaches;  // one flag per node of the run
};
Bytes encode_view(const View& view);
[[nodiscard]] Result<View> decode_view(ByteView bytes, int nodes, const std::string& from);

}  // namespace gossamer::runtime::pipeline_agreement
