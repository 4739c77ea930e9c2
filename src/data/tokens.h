// Tokens: a read-only sequence of token ids, the input every dataset is cut from. It is either the
// bytes of a text (one byte per token, vocabulary 256) or the contents of token files mapped into
// memory (uint16 or uint32 ids), possibly several files one after another, so a corpus of many
// gigabytes costs no heap.
//
// Ownership: a Tokens is a cheap value; copies and slices share the underlying text or mappings,
// which live as long as any Tokens refers to them. Threading: immutable; safe to share between
// threads. Errors: indices out of range are caller bugs (ContractError).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gossamer::data {

class Tokens {
 public:
  Tokens() = default;
  // The bytes of `text`, one token each.
  static Tokens of_text(std::string text);
  // `count` tokens of `width` bytes (1, 2 or 4, little-endian) at `data`, kept alive by `owner`.
  static Tokens of_memory(std::shared_ptr<const void> owner, const std::uint8_t* data, std::int64_t count, int width);
  // `a` followed by `b`.
  static Tokens concat(const Tokens& a, const Tokens& b);

  std::int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::int64_t at(std::int64_t i) const;
  // Tokens [begin, end).
  Tokens slice(std::int64_t begin, std::int64_t end) const;
  // Copies tokens [begin, begin + n) into out, as int64.
  void copy(std::int64_t begin, std::int64_t n, std::int64_t* out) const;

 private:
  struct Segment {
    std::shared_ptr<const void> owner;
    const std::uint8_t* data = nullptr;
    std::int64_t count = 0;
    int width = 1;
  };
  std::vector<Segment> segments_;
  std::vector<std::int64_t> starts_;  // index of each segment's first token
  std::int64_t size_ = 0;

  void append(const Segment& s);
  std::size_t segment_of(std::int64_t i) const;
};

}  // namespace gossamer::data
