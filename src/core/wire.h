// Bounded little-endian serialization: the only way Gossamer turns fields into bytes and back.
//
// Writer appends fields to a growing buffer. Reader walks untrusted bytes: every read is bounds
// checked, every length is compared with a caller-given cap *before* anything is allocated, and the
// first failure makes the Reader sticky-failed (later reads return zero values and do nothing), so a
// decoder reads all fields and checks status() once. A Reader never throws and never reads out of
// bounds. Multi-byte values are little-endian regardless of the host; floats travel as IEEE-754 bits.
// Both types are single-threaded values.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer {

class Writer {
 public:
  Writer() = default;
  explicit Writer(std::size_t reserve) { buf_.reserve(reserve); }

  void u8(std::uint8_t v) { put_le(v); }
  void u16(std::uint16_t v) { put_le(v); }
  void u32(std::uint32_t v) { put_le(v); }
  void u64(std::uint64_t v) { put_le(v); }
  void i32(std::int32_t v) { put_le(static_cast<std::uint32_t>(v)); }
  void i64(std::int64_t v) { put_le(static_cast<std::uint64_t>(v)); }
  void f32(float v) { put_le(std::bit_cast<std::uint32_t>(v)); }
  void f64(double v) { put_le(std::bit_cast<std::uint64_t>(v)); }
  // Raw bytes, no length prefix. (Out of line: GCC 12 raises a false -Wstringop-overflow when the
  // vector insert is inlined into a Writer that has not reserved.)
  void raw(ByteView b);
  // An unsigned LEB128 varint: 7 bits a byte, low bits first; 1 byte below 128, 10 at most.
  void uvar(std::uint64_t v);
  // u32 length then bytes.
  void blob(ByteView b);
  void str(std::string_view s) { blob(as_bytes(s)); }
  // Varint length then bytes: for short fields of small messages.
  void vblob(ByteView b) {
    uvar(b.size());
    raw(b);
  }
  void vstr(std::string_view s) { vblob(as_bytes(s)); }

  std::size_t size() const { return buf_.size(); }
  const Bytes& bytes() const& { return buf_; }
  Bytes take() && { return std::move(buf_); }

 private:
  template <typename U>
  void put_le(U v) {
    static_assert(std::is_unsigned_v<U>);
    for (std::size_t i = 0; i < sizeof(U); ++i) buf_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFu));
  }
  Bytes buf_;
};

class Reader {
 public:
  // `what` names the thing being decoded in error messages ("checkpoint header").
  explicit Reader(ByteView data, std::string what = "message") : data_(data), what_(std::move(what)) {}

  std::uint8_t u8() { return get_le<std::uint8_t>(); }
  std::uint16_t u16() { return get_le<std::uint16_t>(); }
  std::uint32_t u32() { return get_le<std::uint32_t>(); }
  std::uint64_t u64() { return get_le<std::uint64_t>(); }
  std::int32_t i32() { return static_cast<std::int32_t>(get_le<std::uint32_t>()); }
  std::int64_t i64() { return static_cast<std::int64_t>(get_le<std::uint64_t>()); }
  float f32() { return std::bit_cast<float>(get_le<std::uint32_t>()); }
  double f64() { return std::bit_cast<double>(get_le<std::uint64_t>()); }

  // An unsigned LEB128 varint (Writer::uvar) of at most `max`: longer than 10 bytes, or larger, fails.
  std::uint64_t uvar(std::uint64_t max = UINT64_MAX);
  // Borrows the next n bytes (empty view on failure).
  ByteView raw(std::size_t n);
  // u32 length (must be <= max_len) then bytes; the view borrows from the input.
  ByteView blob(std::size_t max_len);
  std::string str(std::size_t max_len);
  // Varint length (must be <= max_len) then bytes (Writer::vblob).
  ByteView vblob(std::size_t max_len) { return raw(static_cast<std::size_t>(uvar(max_len))); }
  std::string vstr(std::size_t max_len) { return std::string(as_string_view(vblob(max_len))); }

  // Fails the reader (if not already failed) with a malformed-input error naming `field`.
  void fail(ErrorCode code, const std::string& message);
  // Checks that every byte was consumed.
  void expect_end();

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  std::size_t position() const { return pos_; }
  std::size_t remaining() const { return data_.size() - pos_; }

 private:
  bool need(std::size_t n);
  template <typename U>
  U get_le() {
    if (!need(sizeof(U))) return U{0};
    U v = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(data_[pos_ + i]) << (8 * i));
    pos_ += sizeof(U);
    return v;
  }

  ByteView data_;
  std::size_t pos_ = 0;
  std::string what_;
  Status status_;
};

}  // namespace gossamer
