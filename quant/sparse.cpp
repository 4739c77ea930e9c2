#include "quant/sparse.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/wire.h"

namespace gossamer::quant {

namespace {

Status malformed(const std::string& m) { return error(ErrorCode::kMalformed, "sparse payload: " + m); }

std::uint64_t chunks_of(std::uint64_t n, std::uint32_t chunk) { return (n + chunk - 1) / chunk; }
std::uint64_t chunk_len(std::uint64_t n, std::uint32_t chunk, std::uint64_t c) { return std::min<std::uint64_t>(chunk, n - c * chunk); }

// Appends `bits`-wide fields to a byte buffer, least significant bit first.
class BitWriter {
 public:
  explicit BitWriter(std::byte* out) : out_(out) {}
  void put(std::uint32_t v, int bits) {
    acc_ |= static_cast<std::uint64_t>(v) << fill_;
    fill_ += bits;
    while (fill_ >= 8) {
      *out_++ = static_cast<std::byte>(acc_ & 0xFFu);
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  void flush() {
    if (fill_ > 0) *out_++ = static_cast<std::byte>(acc_ & 0xFFu);
    acc_ = 0;
    fill_ = 0;
  }

 private:
  std::byte* out_;
  std::uint64_t acc_ = 0;
  int fill_ = 0;
};

// Reads what BitWriter wrote from a span whose size the caller has already checked.
class BitReader {
 public:
  explicit BitReader(ByteView in) : in_(in) {}
  std::uint32_t get(int bits) {
    while (fill_ < bits) {
      acc_ |= static_cast<std::uint64_t>(in_[pos_++]) << fill_;
      fill_ += 8;
    }
    const auto v = static_cast<std::uint32_t>(acc_ & ((std::uint64_t{1} << bits) - 1));
    acc_ >>= bits;
    fill_ -= bits;
    return v;
  }
  // The bits left in the last byte read must be zero padding.
  bool padding_clear() const { return acc_ == 0; }

 private:
  ByteView in_;
  std::size_t pos_ = 0;
  std::uint64_t acc_ = 0;
  int fill_ = 0;
};

struct Layout {
  std::uint64_t chunks, kept, levels_bytes, index_bytes, code_bytes;
};

Layout layout(std::uint64_t n, const SparseOptions& o) {
  const std::uint64_t kept = sparse_kept(n, o);
  const std::uint64_t chunks = chunks_of(n, o.chunk);
  return {chunks, kept, chunks * 8, (kept * static_cast<std::uint64_t>(sparse_index_bits(o.chunk)) + 7) / 8, (kept * 2 + 7) / 8};
}

struct Header {
  SparseInfo info;
  ByteView body;
};

Result<Header> read_header(ByteView payload, std::int64_t max_elements) {
  Reader r(payload, "sparse payload");
  const ByteView magic = r.raw(4);
  const std::uint8_t version = r.u8(), value_bits = r.u8();
  const std::uint16_t reserved = r.u16();
  const std::uint64_t n = r.u64();
  const std::uint32_t chunk = r.u32(), topk = r.u32();
  const std::uint64_t body_len = r.u64();
  if (!r.ok()) return malformed("shorter than its " + std::to_string(kSparseHeaderBytes) + "-byte header");
  if (std::memcmp(magic.data(), kSparseMagic, 4) != 0) return malformed("bad magic (not a sparse payload)");
  if (version != kSparseVersion) {
    return error(ErrorCode::kVersionMismatch, "sparse payload: version " + std::to_string(version) + ", this build reads version " +
                                                  std::to_string(kSparseVersion));
  }
  if (value_bits != 2) return malformed("values of " + std::to_string(value_bits) + " bits (only 2 exist)");
  if (reserved != 0) return malformed("reserved field is not zero");
  if (n > static_cast<std::uint64_t>(std::max<std::int64_t>(max_elements, 0))) {
    return error(ErrorCode::kOutOfRange, "sparse payload: " + std::to_string(n) + " values, more than the " + std::to_string(max_elements) + " expected");
  }
  if (chunk < 2 || chunk > kMaxSparseChunk) return malformed("chunk of " + std::to_string(chunk) + " values");
  if (topk < 1 || topk > chunk) return malformed("top-k of " + std::to_string(topk) + " in a chunk of " + std::to_string(chunk));
  const SparseOptions o{chunk, topk};
  if (body_len != sparse_body_bytes(n, o)) {
    return malformed("body of " + std::to_string(body_len) + " bytes where its header implies " + std::to_string(sparse_body_bytes(n, o)));
  }
  const ByteView body = r.raw(static_cast<std::size_t>(body_len));
  r.expect_end();
  if (!r.ok()) return malformed("body of " + std::to_string(payload.size() - kSparseHeaderBytes) + " bytes, header says " + std::to_string(body_len));
  return Header{SparseInfo{static_cast<std::int64_t>(n), o}, body};
}

// Walks every kept value of a payload whose header is checked, validating levels, indices, codes and
// padding; calls visit(global index, value) for each. Stops at the first error.
template <typename Visit>
Status walk(const Header& h, Visit&& visit) {
  const auto n = static_cast<std::uint64_t>(h.info.numel);
  const SparseOptions& o = h.info.options;
  const Layout l = layout(n, o);
  const ByteView levels = h.body.subspan(0, static_cast<std::size_t>(l.levels_bytes));
  BitReader idx(h.body.subspan(static_cast<std::size_t>(l.levels_bytes), static_cast<std::size_t>(l.index_bytes)));
  BitReader code(h.body.subspan(static_cast<std::size_t>(l.levels_bytes + l.index_bytes), static_cast<std::size_t>(l.code_bytes)));
  const int bits = sparse_index_bits(o.chunk);
  for (std::uint64_t c = 0; c < l.chunks; ++c) {
    float lv[2];
    std::memcpy(lv, levels.data() + c * 8, 8);
    if (!std::isfinite(lv[0]) || !std::isfinite(lv[1]) || !(lv[0] >= 0.0f) || lv[1] < lv[0]) {
      return malformed("chunk " + std::to_string(c) + " has levels " + std::to_string(lv[0]) + ", " + std::to_string(lv[1]));
    }
    const std::uint64_t len = chunk_len(n, o.chunk, c), k = std::min<std::uint64_t>(o.topk, len);
    std::int64_t last = -1;
    for (std::uint64_t i = 0; i < k; ++i) {
      const std::uint32_t at = idx.get(bits), q = code.get(2);
      if (at >= len || static_cast<std::int64_t>(at) <= last) {
        return malformed("chunk " + std::to_string(c) + ": index " + std::to_string(at) + " out of order or outside its " + std::to_string(len) + " values");
      }
      last = at;
      const float v = lv[q & 1u];
      visit(c * o.chunk + at, (q & 2u) != 0 ? -v : v);
    }
  }
  if (!idx.padding_clear() || !code.padding_clear()) return malformed("nonzero padding bits");
  return Status();
}

}  // namespace

int sparse_index_bits(std::uint32_t chunk) { return std::max(1, static_cast<int>(std::bit_width(chunk - 1))); }

std::uint64_t sparse_kept(std::uint64_t n, const SparseOptions& o) {
  const std::uint64_t full = n / o.chunk, tail = n % o.chunk;
  return full * o.topk + std::min<std::uint64_t>(o.topk, tail);
}

std::uint64_t sparse_body_bytes(std::uint64_t n, const SparseOptions& o) {
  const Layout l = layout(n, o);
  return l.levels_bytes + l.index_bytes + l.code_bytes;
}

double sparse_bits_per_value(const SparseOptions& o) {
  return (64.0 + o.topk * static_cast<double>(sparse_index_bits(o.chunk) + 2)) / o.chunk;
}

Bytes encode_sparse(std::span<const float> values, const SparseOptions& o, std::span<float> decoded, double scale) {
  GOSSAMER_CHECK(o.chunk >= 2 && o.chunk <= kMaxSparseChunk && o.topk >= 1 && o.topk <= o.chunk,
                 "encode_sparse: chunk must be in [2, 2^20] and topk in [1, chunk]");
  GOSSAMER_CHECK(decoded.empty() || decoded.size() == values.size(), "encode_sparse: `decoded` must be empty or as long as the values");
  GOSSAMER_CHECK(std::isfinite(scale), "encode_sparse: scale must be finite");
  const std::uint64_t n = values.size();
  const Layout l = layout(n, o);
  Writer w(static_cast<std::size_t>(kSparseHeaderBytes + sparse_body_bytes(n, o)));
  w.raw(as_bytes(std::string_view(kSparseMagic, 4)));
  w.u8(kSparseVersion);
  w.u8(2);
  w.u16(0);
  w.u64(n);
  w.u32(o.chunk);
  w.u32(o.topk);
  w.u64(sparse_body_bytes(n, o));
  Bytes out = std::move(w).take();
  const std::size_t head = out.size();
  out.resize(head + static_cast<std::size_t>(sparse_body_bytes(n, o)));
  std::byte* const levels = out.data() + head;
  BitWriter idx(levels + l.levels_bytes), code(levels + l.levels_bytes + l.index_bytes);
  const int bits = sparse_index_bits(o.chunk);
  if (!decoded.empty()) std::fill(decoded.begin(), decoded.end(), 0.0f);
  std::vector<std::uint32_t> order;
  for (std::uint64_t c = 0; c < l.chunks; ++c) {
    const std::uint64_t len = chunk_len(n, o.chunk, c), k = std::min<std::uint64_t>(o.topk, len);
    const float* v = values.data() + c * o.chunk;
    for (std::uint64_t i = 0; i < len; ++i) GOSSAMER_CHECK(std::isfinite(v[i]), "encode_sparse: the values hold NaN or Inf");
    order.resize(static_cast<std::size_t>(len));
    std::iota(order.begin(), order.end(), 0u);
    auto larger = [v](std::uint32_t a, std::uint32_t b) {
      const float x = std::abs(v[a]), y = std::abs(v[b]);
      return x > y || (x == y && a < b);
    };
    if (k < len) std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), larger);
    order.resize(static_cast<std::size_t>(k));
    std::sort(order.begin(), order.end());
    double total = 0.0;
    for (std::uint32_t i : order) total += std::abs(static_cast<double>(v[i]));
    const double t = total / static_cast<double>(k);
    double sum[2] = {0.0, 0.0};
    std::uint64_t count[2] = {0, 0};
    for (std::uint32_t i : order) {
      const double a = std::abs(static_cast<double>(v[i]));
      const int bin = a > t ? 1 : 0;
      sum[bin] += a;
      ++count[bin];
    }
    float lv[2];
    for (int b = 0; b < 2; ++b) lv[b] = static_cast<float>(count[b] > 0 ? sum[b] / static_cast<double>(count[b]) : t);
    lv[1] = std::max(lv[1], lv[0]);  // rounding to float must not reorder them
    const float sent[2] = {static_cast<float>(lv[0] * std::abs(scale)), static_cast<float>(lv[1] * std::abs(scale))};
    GOSSAMER_CHECK(std::isfinite(sent[1]), "encode_sparse: scaled levels overflow float32");
    std::memcpy(levels + c * 8, sent, 8);
    for (std::uint32_t i : order) {
      const bool negative = (v[i] < 0.0f) != (scale < 0.0);
      const int bin = std::abs(static_cast<double>(v[i])) > t ? 1 : 0;
      idx.put(i, bits);
      code.put(static_cast<std::uint32_t>(bin) | (negative ? 2u : 0u), 2);
      if (!decoded.empty()) decoded[c * o.chunk + i] = v[i] < 0.0f ? -lv[bin] : lv[bin];
    }
  }
  idx.flush();
  code.flush();
  return out;
}

Result<SparseInfo> inspect_sparse(ByteView payload, std::int64_t max_elements) {
  auto h = read_header(payload, max_elements);
  if (!h.ok()) return h.status();
  return h->info;
}

Status decode_sparse_add(ByteView payload, std::span<float> acc) {
  auto h = read_header(payload, static_cast<std::int64_t>(acc.size()));
  if (!h.ok()) return h.status();
  if (static_cast<std::size_t>(h->info.numel) != acc.size()) {
    return malformed(std::to_string(h->info.numel) + " values where " + std::to_string(acc.size()) + " were expected");
  }
  if (Status st = walk(*h, [](std::uint64_t, float) {}); !st.ok()) return st;
  return walk(*h, [&](std::uint64_t i, float v) { acc[static_cast<std::size_t>(i)] += v; });
}

Result<double> sparse_norm2(ByteView payload, std::int64_t numel) {
  auto h = read_header(payload, numel);
  if (!h.ok()) return h.status();
  if (h->info.numel != numel) return malformed(std::to_string(h->info.numel) + " values where " + std::to_string(numel) + " were expected");
  double s = 0.0;
  if (Status st = walk(*h, [&](std::uint64_t, float v) { s += static_cast<double>(v) * v; }); !st.ok()) return st;
  return s;
}

}  // namespace gossamer::quant
