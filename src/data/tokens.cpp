#include "data/tokens.h"

#include <algorithm>

#include "core/check.h"

namespace gossamer::data {

namespace {

std::int64_t read_token(const std::uint8_t* p, int width) {
  switch (width) {
    case 1: return p[0];
    case 2: return static_cast<std::int64_t>(p[0]) | static_cast<std::int64_t>(p[1]) << 8;
    default:
      return static_cast<std::int64_t>(p[0]) | static_cast<std::int64_t>(p[1]) << 8 | static_cast<std::int64_t>(p[2]) << 16 |
             static_cast<std::int64_t>(p[3]) << 24;
  }
}

}  // namespace

Tokens Tokens::of_text(std::string text) {
  auto owner = std::make_shared<const std::string>(std::move(text));
  return of_memory(owner, reinterpret_cast<const std::uint8_t*>(owner->data()), static_cast<std::int64_t>(owner->size()), 1);
}

Tokens Tokens::of_memory(std::shared_ptr<const void> owner, const std::uint8_t* data, std::int64_t count, int width) {
  GOSSAMER_CHECK(width == 1 || width == 2 || width == 4, "Tokens: a token is 1, 2 or 4 bytes");
  GOSSAMER_CHECK(count >= 0, "Tokens: negative count");
  Tokens t;
  t.append(Segment{std::move(owner), data, count, width});
  return t;
}

Tokens Tokens::concat(const Tokens& a, const Tokens& b) {
  Tokens t = a;
  for (const auto& s : b.segments_) t.append(s);
  return t;
}

void Tokens::append(const Segment& s) {
  if (s.count == 0) return;
  starts_.push_back(size_);
  segments_.push_back(s);
  size_ += s.count;
}

std::size_t Tokens::segment_of(std::int64_t i) const {
  return static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
}

std::int64_t Tokens::at(std::int64_t i) const {
  GOSSAMER_CHECK(i >= 0 && i < size_, "Tokens: index out of range");
  const auto k = segment_of(i);
  const auto& s = segments_[k];
  return read_token(s.data + (i - starts_[k]) * s.width, s.width);
}

Tokens Tokens::slice(std::int64_t begin, std::int64_t end) const {
  GOSSAMER_CHECK(begin >= 0 && begin <= end && end <= size_, "Tokens: slice out of range");
  Tokens t;
  if (begin == end) return t;
  for (std::size_t k = segment_of(begin); k < segments_.size() && starts_[k] < end; ++k) {
    const auto& s = segments_[k];
    const std::int64_t from = std::max<std::int64_t>(begin - starts_[k], 0);
    const std::int64_t to = std::min<std::int64_t>(end - starts_[k], s.count);
    t.append(Segment{s.owner, s.data + from * s.width, to - from, s.width});
  }
  return t;
}

void Tokens::copy(std::int64_t begin, std::int64_t n, std::int64_t* out) const {
  GOSSAMER_CHECK(begin >= 0 && n >= 0 && begin + n <= size_, "Tokens: copy out of range");
  if (n == 0) return;
  for (std::size_t k = segment_of(begin); n > 0; ++k) {
    const auto& s = segments_[k];
    const std::int64_t from = begin - starts_[k];
    const std::int64_t take = std::min(n, s.count - from);
    const std::uint8_t* p = s.data + from * s.width;
    if (s.width == 1) {
      for (std::int64_t i = 0; i < take; ++i) out[i] = p[i];
    } else {
      for (std::int64_t i = 0; i < take; ++i) out[i] = read_token(p + i * s.width, s.width);
    }
    out += take;
    begin += take;
    n -= take;
  }
}

}  // namespace gossamer::data
