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
  for (int i = 0; i < 1000; ++i) s.tensors.push_back(static_cast<std::byte>(i * 31));
  return s;
}
}  // namespace

TEST_CASE("checkpoint container round-trips and pins its header") {
  const Bytes file = encode_checkpoint(sample());
  CHECK(std::string(reinterpret_cast<const char*>(file.data()), 8) == "GSMRCKPT");
  CHECK(static_cast<int>(file[8]) == 2);  // version 2, little-endian
  auto back = decode_checkpoint(file, "x");
  REQUIRE(back.ok());
  CHECK(back->config_toml == sample().config_toml);
  CHECK(back->step == 12);
  CHECK(back->next_batch == 13);
  CHECK(back->tokens_seen == 4096);
  CHECK((back->rng_state == sample().rng_state));
  CHECK((back->outer_state == sample().outer_state));
  CHECK((back->tensors == sample().tensors));
}

TEST_CASE("a version 1 checkpoint (no outer state) is still read") {
  const CheckpointState s = sample();
  Writer payload;
  payload.str(s.config_toml);
  payload.i64(s.step);
  payload.i64(s.next_batch);
  payload.i64(s.tokens_seen);
  payload.blob(s.rng_state);
  payload.u64(s.tensors.size());
  payload.raw(s.tensors);
  const Digest digest = digest_of(payload.bytes());
  Writer file;
  file.raw(as_bytes(std::string_view(kCheckpointMagic, sizeof(kCheckpointMagic))));
  file.u32(1);
  file.u64(payload.size());
  file.raw(ByteView(reinterpret_cast<const std::byte*>(digest.bytes.data()), digest.bytes.size()));
  file.raw(payload.bytes());
  auto back = decode_checkpoint(file.bytes(), "v1");
  REQUIRE(back.ok());
  CHECK(back->step == 12);
  CHECK(back->outer_state.empty());
  CHECK((back->tensors == s.tensors));
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
    bad[8] = std::byte{3};
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
