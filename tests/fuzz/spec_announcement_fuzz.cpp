// libFuzzer target: run-spec messages (BEACON, still read; SPEC; WANT; src/runtime/announcements.h) from
// arbitrary bytes, delivered on topic "gossamer.spec" to a listener (listen_for_spec) and to a
// SpecAnnouncer (which answers a WANT with a direct message). The input is a sequence of records (records.h): the selector picks the origin (peers
// 1 to 4), the payload is the message.
// After each message: a spec is taken only from a well-formed SPEC whose hash is its TOML's, and once
// taken it never changes; the furthest round heard moves only up, and only to the round a well-formed
// BEACON or SPEC names. At the end receive_spec answers at once with the spec heard, if any.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/wire.h"
#include "fake_gossip.h"
#include "records.h"
#include "runtime/announcements.h"

namespace {

using namespace gossamer;

std::uint64_t le_at(ByteView b, std::size_t at, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(b[at + i]) << (8 * i);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // every ignored announcement is logged
  if (fuzz::seeds_wanted()) {
    // A BEACON, a WANT and a SPEC, by the announcements' own encoders.
    const runtime::Spec spec{"[run]\nmethod = \"diloco\"\npeers = 4\n", 4};
    namespace wire = runtime::announcement_wire;
    fuzz::write_seed("spec", fuzz::join_records({{1, wire::encode_spec(spec, 17, false)}, {2, wire::encode_want()}, {1, wire::encode_spec(spec, 17, true)}}));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // An announcer runs for the whole process; its state is bounded by the origins.
  static fuzz::FakeGossip announcer_gossip(transport::PeerId{9});
  static runtime::SpecAnnouncer announcer(announcer_gossip, runtime::Spec{"[run]\nmethod = \"diloco\"\n", 2}, [] { return std::int64_t{3}; }, real_clock());

  fuzz::FakeGossip gossip(transport::PeerId{8});
  auto heard = runtime::listen_for_spec(gossip, real_clock());
  std::optional<runtime::Spec> taken;
  std::int64_t furthest = -1;
  for (const auto& record : fuzz::split_records(data, size)) {
    const transport::PeerId origin{1u + record.selector % 4u};
    const ByteView m = record.payload;
    announcer_gossip.deliver(origin, "gossamer.spec", m);
    gossip.deliver(origin, "gossamer.spec", m);
    std::lock_guard lock(heard->mu);
    const bool announcement = m.size() >= 2 && m[0] == std::byte{2} && (m[1] == std::byte{1} || m[1] == std::byte{2});
    if (heard->spec && !taken) {
      // Newly taken: a SPEC, exactly as long as its fields, with the hash of its TOML.
      const std::string& toml = heard->spec->toml;
      if (!announcement || m[1] != std::byte{2} || toml.size() > runtime::kMaxSpec || m.size() != 2 + 32 + 4 + toml.size() + 4 + 8) __builtin_trap();
      if (le_at(m, 34, 4) != toml.size() || std::memcmp(m.data() + 38, toml.data(), toml.size()) != 0) __builtin_trap();
      if (std::memcmp(m.data() + 2, digest_of(as_bytes(toml)).bytes.data(), 32) != 0) __builtin_trap();
      if (heard->spec->wait_for != le_at(m, 38 + toml.size(), 4)) __builtin_trap();
      taken = heard->spec;
    }
    if (taken && (!heard->spec || heard->spec->toml != taken->toml || heard->spec->wait_for != taken->wait_for)) __builtin_trap();
    if (heard->latest_round != furthest) {
      if (heard->latest_round < furthest || !announcement || m.size() < 8 + 2 + 32 + 4) __builtin_trap();
      if (heard->latest_round != static_cast<std::int64_t>(le_at(m, m.size() - 8, 8))) __builtin_trap();
      furthest = heard->latest_round;
    }
  }
  auto spec = runtime::receive_spec(*heard, Nanos{0});
  if (spec.ok() != taken.has_value()) __builtin_trap();
  if (spec.ok() && spec->toml != taken->toml) __builtin_trap();
  return 0;
}
