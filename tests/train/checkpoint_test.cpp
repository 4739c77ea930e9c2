#include <doctest/doctest.h>

#include <filesystem>
#include <random>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/file.h"
#include "core/hash.h"
#include "core/wire.h"
#include "train/checkpoint.h"

using namespace gossamer;
using namespace gossamer::train;

namespace {
CheckpointState sample() {
  CheckpointState s;
  s.config_toml = "[model]\nlayers = 2\n";
  s.step = 12;
  s.next_batch = 13;
  s.tokens_seen = 4096;
  s.rng_state = Bytes(40, std::byte{7});
  s.outer_state = Bytes(24, std::byte{9});
  s.shard = 3;
  s.shards = 4;
  for (int i = 0; i < 1000; ++i) s.tensors.push_back(static_cast<std::byte>(i * 31));
  return s;
}
}  // namespace

TEST_CASE("checkpoint container round-trips and pins its header") {
  const Bytes file = encode_checkpoint(sample());
  CHECK(std::string(reinterpret_cast<const char*>(file.data()), 8) == "GSMRCKPT");
  CHECK(static_cast<int>(file[8]) == 3);  // version 3, little-endian
  auto back = decode_checkpoint(file, "x");
  REQUIRE(back.ok());
  CHECK(back->config_toml == sample().config_toml);
  CHECK(back->step == 12);
  CHECK(back->next_batch == 13);
  CHECK(back->tokens_seen == 4096);
  CHECK((back->rng_state == sample().rng_state));
  CHECK((back->outer_state == sample().outer_state));
  CHECK((back->tensors == sample().tensors));
  CHECK(back->shard == 3);
  CHECK(back->shards == 4);
}

namespace {
// A checkpoint file of an older version, or of the current one with a payload of our making.
Bytes file_of(std::uint32_t version, const Bytes& payload) {
  const Digest digest = digest_of(payload);
  Writer file;
  file.raw(as_bytes(std::string_view(kCheckpointMagic, sizeof(kCheckpointMagic))));
  file.u32(version);
  file.u64(payload.size());
  file.raw(ByteView(reinterpret_cast<const std::byte*>(digest.bytes.data()), digest.bytes.size()));
  file.raw(payload);
  return std::move(file).take();
}
// The payload up to the shard fields of `version` (1: no outer state, 2: no shard).
Writer payload_of(const CheckpointState& s, std::uint32_t version) {
  Writer payload;
  payload.str(s.config_toml);
  payload.i64(s.step);
  payload.i64(s.next_batch);
  payload.i64(s.tokens_seen);
  payload.blob(s.rng_state);
  if (version >= 2) {
    payload.u64(s.outer_state.size());
    payload.raw(s.outer_state);
  }
  return payload;
}
}  // namespace

TEST_CASE("version 1 and 2 checkpoints (no outer state, no shard) are still read") {
  const CheckpointState s = sample();
  for (std::uint32_t version : {1u, 2u}) {
    CAPTURE(version);
    Writer payload = payload_of(s, version);
    payload.u64(s.tensors.size());
    payload.raw(s.tensors);
    auto back = decode_checkpoint(file_of(version, payload.bytes()), "old");
    REQUIRE(back.ok());
    CHECK(back->step == 12);
    CHECK(back->outer_state.empty() == (version == 1));
    CHECK(back->shard == -1);
    CHECK(back->shards == 0);
    CHECK((back->tensors == s.tensors));
  }
}

TEST_CASE("a checkpoint naming a shard outside its count is rejected") {
  const CheckpointState s = sample();
  for (auto [shard, shards] : {std::pair{4, 4}, std::pair{-2, 4}, std::pair{0, -1}}) {
    CAPTURE(shard);
    Writer payload = payload_of(s, 3);
    payload.i32(shard);
    payload.i32(shards);
    payload.u64(s.tensors.size());
    payload.raw(s.tensors);
    auto back = decode_checkpoint(file_of(3, payload.bytes()), "bad shard");
    REQUIRE_FALSE(back.ok());
    CHECK(back.status().code() == ErrorCode::kMalformed);
  }
}

TEST_CASE("a corrupted, truncated or foreign file is rejected with a clear error") {
  const Bytes good = encode_checkpoint(sample());
  SUBCASE("every truncation") {
    for (std::size_t n = 0; n < good.size(); n += 37) {
      auto r = decode_checkpoint(ByteView(good).first(n), "ckpt");
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == ErrorCode::kDataLoss);
      CHECK(r.status().message().find("truncated") != std::string::npos);
    }
  }
  SUBCASE("a flipped bit anywhere in the payload") {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 200; ++trial) {
      Bytes bad = good;
      const std::size_t pos = kCheckpointHeaderBytes + rng() % (bad.size() - kCheckpointHeaderBytes);
      bad[pos] ^= static_cast<std::byte>(1u << (rng() % 8));
      auto r = decode_checkpoint(bad, "ckpt");
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().message().find("corrupted") != std::string::npos);
    }
  }
  SUBCASE("bad magic") {
    Bytes bad = good;
    bad[0] = std::byte{'X'};
    CHECK(decode_checkpoint(bad, "ckpt").status().code() == ErrorCode::kMalformed);
  }
  SUBCASE("a newer format version") {
    Bytes bad = good;
    bad[8] = std::byte{kCheckpointVersion + 1};
    auto r = decode_checkpoint(bad, "ckpt");
    CHECK(r.status().code() == ErrorCode::kVersionMismatch);
    CHECK(r.status().message().find("upgrade") != std::string::npos);
  }
  SUBCASE("appended bytes") {
    Bytes bad = good;
    bad.push_back(std::byte{0});
    CHECK(decode_checkpoint(bad, "ckpt").status().code() == ErrorCode::kDataLoss);
  }
}

TEST_CASE("a process killed while writing checkpoints never leaves a torn file") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("gossamer_ckpt_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  const fs::path path = dir / "checkpoint.bin";
  CheckpointState big = sample();
  big.tensors.assign(std::size_t{32} << 20, std::byte{1});
  REQUIRE(write_checkpoint(path, big).ok());
  for (int kill_after_ms : {5, 20, 60}) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      for (std::int64_t step = 100;; ++step) {
        big.step = step;
        (void)write_checkpoint(path, big);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    auto back = read_checkpoint(path);
    REQUIRE(back.ok());  // the old or a newer checkpoint, whole either way
    CHECK(back->tensors.size() == big.tensors.size());
  }
  fs::remove_all(dir);
}
