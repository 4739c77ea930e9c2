// The wire registry: every format Gossamer puts on a link or in a file another machine reads, one row
// each, with its owner, where it travels (a tag and sub-tag, a gossip topic, a connection's first
// bytes, a file), its version, its size cap, and an encoder of a pinned sample and a decoder for
// untrusted bytes. The tests run over the rows (golden bytes, truncations, mutations, and that
// docs/wire.md names every row), so a new format is one row here and nothing else to remember.
//
// The run layer holds the table because it sees every layer below it; the formats stay where they are
// defined. Threading: wire_formats() builds a new table on each call; rows are plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer::runtime {

struct WireFormat {
  std::string name;     // as docs/wire.md's table names it
  std::string owner;    // the header that defines it
  std::string carrier;  // where it travels: "tag 0x...", "gossip topic ...", "first bytes of a connection", "file"
  std::uint32_t version = 0;
  std::size_t max_bytes = 0;                  // the most a decoder accepts (or an encoder makes) of it
  std::function<Bytes()> sample;              // a representative message, always the same bytes
  std::function<Status(ByteView)> decode;     // untrusted input: ok for the sample, a clear error otherwise
};

std::vector<WireFormat> wire_formats();

}  // namespace gossamer::runtime
