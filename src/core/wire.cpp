#include "core/wire.h"

#include <limits>

namespace gossamer {

void Writer::raw(ByteView b) { buf_.insert(buf_.end(), b.begin(), b.end()); }

void Writer::uvar(std::uint64_t v) {
  while (v >= 0x80) {
    buf_.push_back(static_cast<std::byte>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  buf_.push_back(static_cast<std::byte>(v));
}

void Writer::blob(ByteView b) {
  GOSSAMER_CHECK(b.size() <= std::numeric_limits<std::uint32_t>::max(), "blob larger than 4 GiB");
  u32(static_cast<std::uint32_t>(b.size()));
  raw(b);
}

bool Reader::need(std::size_t n) {
  if (!ok()) return false;
  if (remaining() < n) {
    fail(ErrorCode::kDataLoss, "truncated: needs " + std::to_string(n) + " more byte(s) at offset " +
                                   std::to_string(pos_) + ", only " + std::to_string(remaining()) + " left");
    return false;
  }
  return true;
}

ByteView Reader::raw(std::size_t n) {
  if (!need(n)) return {};
  ByteView out = data_.subspan(pos_, n);
  pos_ += n;
  return out;
}

std::uint64_t Reader::uvar(std::uint64_t max) {
  const std::size_t at = pos_;
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (!need(1)) return 0;
    const auto b = static_cast<std::uint64_t>(data_[pos_++]);
    // The tenth byte holds the top bit alone.
    if (shift == 63 && (b & 0x7E) != 0) break;
    v |= (b & 0x7F) << shift;
    if ((b & 0x80) == 0) {
      if (v > max) {
        fail(ErrorCode::kOutOfRange, "varint " + std::to_string(v) + " at offset " + std::to_string(at) + " exceeds the cap of " + std::to_string(max));
        return 0;
      }
      return v;
    }
  }
  fail(ErrorCode::kMalformed, "varint at offset " + std::to_string(at) + " runs past 64 bits");
  return 0;
}

ByteView Reader::blob(std::size_t max_len) {
  const std::uint32_t len = u32();
  if (!ok()) return {};
  if (len > max_len) {
    fail(ErrorCode::kOutOfRange, "length field " + std::to_string(len) + " at offset " + std::to_string(pos_ - 4) +
                                     " exceeds the cap of " + std::to_string(max_len));
    return {};
  }
  return raw(len);
}

std::string Reader::str(std::size_t max_len) {
  ByteView b = blob(max_len);
  return std::string(as_string_view(b));
}

void Reader::fail(ErrorCode code, const std::string& message) {
  if (!ok()) return;
  status_ = Status(code, what_ + ": " + message);
}

void Reader::expect_end() {
  if (ok() && remaining() != 0) {
    fail(ErrorCode::kMalformed, std::to_string(remaining()) + " unexpected trailing byte(s) at offset " + std::to_string(pos_));
  }
}

}  // namespace gossamer
