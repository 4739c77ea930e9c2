// Fuzz inputs read as a sequence of records, so that one input drives a stateful decoder through
// several messages: each record is a selector byte (whom the message comes from, or what to do
// after it), a u16 little-endian length, and that many bytes (the last record takes what is left).
// Seeds: a target writes valid inputs, made with the real encoders where they are public, into the
// folder named by GOSSAMER_FUZZ_SEED_DIR when that is set (scripts/fuzz.sh sets it to the corpus), so
// that the fuzzer starts past the headers and the hashes it cannot forge.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/bytes.h"

namespace gossamer::fuzz {

struct Record {
  std::uint8_t selector = 0;
  ByteView payload;
};

inline constexpr std::size_t kMaxRecords = 64;  // keeps one input fast

inline std::vector<Record> split_records(const std::uint8_t* data, std::size_t size) {
  std::vector<Record> out;
  std::size_t at = 0;
  while (at + 3 <= size && out.size() < kMaxRecords) {
    const std::size_t claimed = std::size_t{data[at + 1]} | (std::size_t{data[at + 2]} << 8);
    const std::size_t n = std::min(claimed, size - at - 3);
    out.push_back(Record{data[at], ByteView(reinterpret_cast<const std::byte*>(data + at + 3), n)});
    at += 3 + n;
  }
  return out;
}

// The inverse of split_records, after `prefix` (a mode byte, for targets that take one).
inline Bytes join_records(const std::vector<std::pair<std::uint8_t, Bytes>>& records, Bytes prefix = {}) {
  Bytes out = std::move(prefix);
  for (const auto& [selector, payload] : records) {
    out.push_back(static_cast<std::byte>(selector));
    out.push_back(static_cast<std::byte>(payload.size() & 0xFF));
    out.push_back(static_cast<std::byte>((payload.size() >> 8) & 0xFF));
    out.insert(out.end(), payload.begin(), payload.end());
  }
  return out;
}

inline bool seeds_wanted() { return std::getenv("GOSSAMER_FUZZ_SEED_DIR") != nullptr; }

// Writes `input` as seed `name` into GOSSAMER_FUZZ_SEED_DIR, unless a seed of that name is there.
inline void write_seed(const std::string& name, const Bytes& input) {
  const char* dir = std::getenv("GOSSAMER_FUZZ_SEED_DIR");
  if (dir == nullptr) return;
  const std::filesystem::path path = std::filesystem::path(dir) / ("seed-" + name);
  if (std::filesystem::exists(path)) return;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(input.data()), static_cast<std::streamsize>(input.size()));
}

}  // namespace gossamer::fuzz
