// The wire registry's rows (src/runtime/wire_formats.h): each sample decodes, its bytes are pinned, a
// cut-short or mutated copy is refused or decoded without a crash, and docs/wire.md names the row.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "core/hash.h"
#include "runtime/wire_formats.h"

using namespace gossamer;

namespace {

// BLAKE2b-256 of each row's sample, first 16 hex digits. A format whose bytes change must change its
// version (and docs/wire.md), then its line here.
const std::map<std::string, std::string>& golden() {
  static const std::map<std::string, std::string> g = {
      {"HELLO", "4f5c00cf9a262572"},
      {"Frames", "9fac1cc2e0a80ed9"},
      {"Dial-back requests", "5895e72b47abe612"},
      {"Dial-back answers", "0fa60319c0dd7e5b"},
      {"Relay requests", "a030db14e70d5458"},
      {"Relay answers", "e83ae5a22a2e3664"},
      {"Quantized tensors", "23eab1823d22e60a"},
      {"Sparse tensors", "d7ca9cef2aa8034b"},
      {"Kept updates", "c1f1acce2f955825"},
      {"Activations", "19ba3829b82dbe81"},
      {"Checkpoints", "8f19aa97534c780e"},
      {"safetensors", "a853e51acf90455a"},
      {"State requests", "4b9d886158109241"},
      {"State answers", "34b6933826a08451"},
      {"Link probe rows", "20d39298993bbf78"},
      {"Gossip messages", "e5b10cea8420dc32"},
      {"Run spec", "17057387d36fd603"},
      {"Join board", "70985f141bfdf400"},
      {"Pipeline commits", "0c211b6848133b0f"},
      {"Pipeline views", "f8edf6ca604780d5"},
      {"Outer optimizer state", "e2aab73688963b19"},
      {"The inner optimizer's state", "95d6c664551e1535"},
      {"Round agreement", "9a4c6c5073500ad7"},
      {"Round agreement, GROUP", "316c3666b43ec2e2"},
  };
  return g;
}

}  // namespace

TEST_CASE("every wire format's sample decodes, its bytes are pinned, and its size is within its cap") {
  const auto rows = runtime::wire_formats();
  REQUIRE(rows.size() == golden().size());
  std::set<std::string> names;
  for (const auto& row : rows) {
    CAPTURE(row.name);
    CHECK(names.insert(row.name).second);
    CHECK(!row.owner.empty());
    CHECK(!row.carrier.empty());
    const Bytes sample = row.sample();
    const bool same = row.sample() == sample;
    CHECK(same);  // the same bytes every time
    CHECK(sample.size() <= row.max_bytes);
    const Status st = row.decode(sample);
    CHECK_MESSAGE(st.ok(), st.to_string());
    const std::string digest = digest_of(sample).hex().substr(0, 16);
    REQUIRE(golden().count(row.name) == 1);
    CHECK_MESSAGE(digest == golden().at(row.name), row.name << "'s bytes changed (" << digest
                                                            << "): bump its version, update docs/wire.md, then its line in golden()");
  }
}

TEST_CASE("every wire format refuses its sample cut short at any length") {
  for (const auto& row : runtime::wire_formats()) {
    CAPTURE(row.name);
    const Bytes sample = row.sample();
    const std::size_t step = std::max<std::size_t>(1, sample.size() / 400);
    int accepted = 0;
    for (std::size_t n = 0; n < sample.size(); n += step) {
      if (row.decode(ByteView(sample.data(), n)).ok()) {
        ++accepted;
        MESSAGE(row.name << " accepted its first " << n << " of " << sample.size() << " bytes");
      }
    }
    CHECK(accepted == 0);
  }
}

TEST_CASE("every wire format refuses trailing bytes after its sample") {
  for (const auto& row : runtime::wire_formats()) {
    CAPTURE(row.name);
    Bytes longer = row.sample();
    longer.push_back(std::byte{0});
    CHECK(!row.decode(longer).ok());
  }
}

TEST_CASE("seeded mutations of every wire format are refused or decoded, never a crash") {
  std::mt19937_64 rng(40);
  for (const auto& row : runtime::wire_formats()) {
    CAPTURE(row.name);
    const Bytes sample = row.sample();
    int refused = 0;
    for (int k = 0; k < 600; ++k) {
      Bytes m = sample;
      const int flips = 1 + static_cast<int>(rng() % 3);
      for (int f = 0; f < flips; ++f) m[rng() % m.size()] ^= static_cast<std::byte>(1u + rng() % 255);
      refused += row.decode(m).ok() ? 0 : 1;
    }
    CHECK(refused > 0);  // the decoder looks at what it reads
  }
}

TEST_CASE("docs/wire.md names every row of the wire registry") {
  std::ifstream in(std::string(GOSSAMER_SOURCE_DIR) + "/docs/wire.md");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  for (const auto& row : runtime::wire_formats()) {
    CAPTURE(row.name);
    CHECK(text.str().find("| " + row.name) != std::string::npos);
  }
}
