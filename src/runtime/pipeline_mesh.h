// The links between a pipeline's processes (runtime/pipeline_process.h), one set per epoch: node k
// dials every wanted node below it and accepts every wanted node above it, each link's peer checked
// and the epoch said and answered first (a late connection of an older epoch is closed). Every wait
// and thread is on the request's clock, so simulated nodes (on the simulator's transport and clock)
// link exactly as processes do.
// Threading: connect() blocks the calling thread of that clock until every wanted node is linked,
// the deadline passes or the request's stop is set. Errors: see connect().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "runtime/pipeline_process.h"
#include "transport/transport.h"

namespace gossamer::runtime::pipeline_mesh {

using Links = std::vector<std::shared_ptr<transport::Link>>;

void close_all(const Links& links);

struct Want {
  std::vector<bool> nodes;  // which nodes to link with (this node's own slot is ignored)
  std::uint64_t epoch = 0;
  Deadline deadline = Deadline::never();
  // A node not linked by the deadline is left out (its slot stays null); otherwise that is an error
  // (kUnavailable naming it, kInvalidArgument for a process that is another node).
  bool tolerate = false;
  // With tolerate: a node whose process answers (the transport's handshake goes through: it is
  // alive, and may still be inside the failed iteration, not having noticed yet) is waited for until
  // this later deadline. A node that noticed the failure first must not leave out the ones that
  // notice it an iteration later.
  Deadline alive_deadline = Deadline::never();
};

// One link per wanted node (null in this node's slot and for nodes left out), shaped as the
// request says.
[[nodiscard]] Result<Links> connect(const PipelineProcessRequest& request, transport::Transport& transport, const Want& want);

// Sends `payload` to every linked node (to each even when sending to another failed), then takes
// one message of the tag from each (empty slots for this node and unlinked ones). A node's message
// that arrived counts even when sending to it failed; the exchange fails on the first node whose
// message did not come.
[[nodiscard]] Result<std::vector<Bytes>> exchange(const Links& links, int self, transport::Tag tag, ByteView payload, Deadline deadline,
                                                  const std::string& what);

// "0,2,3": the nodes set in `v`.
std::string node_list(const std::vector<bool>& v);

}  // namespace gossamer::runtime::pipeline_mesh
