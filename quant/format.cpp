#include "quant/format.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <zstd.h>

#include "core/check.h"
#include "core/wire.h"
#include "quant/kernels.h"

namespace gossamer::quant {

static_assert(std::endian::native == std::endian::little, "payload bodies are host floats: little-endian hosts only");

namespace {

constexpr std::uint8_t kKnownFlags = kFlagZstd | kFlagStochastic;


Status malformed(const std::string& m) { return error(ErrorCode::kMalformed, "quantized payload: " + m); }

}  // namespace

const std::array<CodecTraits, kNumCodecs>& codec_table() {
  static const std::array<CodecTraits, kNumCodecs> table = {{
      {CodecId::kFp32, "fp32", 32, false, 0.0f},
      {CodecId::kBf16, "bf16", 16, false, 0.0f},
      {CodecId::kInt8, "int8", 8, true, 127.0f},
      {CodecId::kFp8E4M3, "fp8_e4m3", 8, true, 448.0f, 3, 7},
      {CodecId::kFp8E5M2, "fp8_e5m2", 8, true, 57344.0f, 2, 15},
      {CodecId::kFp16, "fp16", 16, false, 0.0f},
      {CodecId::kInt4, "int4", 4, true, 7.0f},
      {CodecId::kFp4E3M0, "fp4_e3m0", 4, true, 1.0f, 0, 7},
      {CodecId::kFp4E2M1, "fp4_e2m1", 4, true, 6.0f, 1, 1},
      {CodecId::kInt2, "int2", 2, true, 1.5f},
  }};
  return table;
}

const CodecTraits& traits(CodecId id) {
  const auto i = static_cast<std::size_t>(id);
  GOSSAMER_CHECK(i < codec_table().size(), "unknown CodecId " + std::to_string(i));
  return codec_table()[i];
}

Result<CodecId> codec_from_name(std::string_view name) {
  std::string names;
  for (const auto& t : codec_table()) {
    if (t.name == name) return t.id;
    names += std::string(names.empty() ? "" : ", ") + std::string(t.name);
  }
  return error(ErrorCode::kInvalidArgument, "unknown codec '" + std::string(name) + "': use one of " + names);
}

std::size_t body_bytes(CodecId codec, std::size_t n, std::uint32_t block, ScaleFormat scale_format) {
  const CodecTraits& t = traits(codec);
  if (!t.scaled) return n * static_cast<std::size_t>(t.bits / 8);
  const std::size_t blocks = n == 0 ? 0 : (n + block - 1) / block;
  return blocks * kernels::scale_bytes(scale_format) + kernels::packed_bytes(codec, n);
}

double bits_per_value(const EncodeOptions& o) {
  const CodecTraits& t = traits(o.codec);
  if (!t.scaled) return t.bits;
  return t.bits + 8.0 * static_cast<double>(kernels::scale_bytes(o.scale_format)) / static_cast<double>(o.block_size);
}

namespace {

// Reads and validates the header; leaves `r` at the start of the body.
Result<PayloadInfo> read_header(Reader& r, std::uint64_t& body_len, std::uint64_t& raw_len, std::int64_t max_elements) {
  ByteView magic = r.raw(4);
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kPayloadMagic, 4) != 0) return malformed("bad magic (not a Gossamer quantized payload)");
  const std::uint8_t version = r.u8();
  if (r.ok() && version != kPayloadVersion) {
    return error(ErrorCode::kVersionMismatch, "quantized payload has format version " + std::to_string(version) +
                                                  ", this build reads version " + std::to_string(kPayloadVersion) +
                                                  (version > kPayloadVersion ? ": upgrade this node" : ""));
  }
  const std::uint8_t codec = r.u8(), dtype = r.u8(), flags = r.u8(), ndim = r.u8(), sf = r.u8();
  const std::uint16_t reserved = r.u16();
  const std::uint32_t block = r.u32();
  if (!r.ok()) return r.status();
  if (codec >= kNumCodecs) return malformed("unknown codec id " + std::to_string(codec) + " (sent by a newer node?)");
  if (dtype > static_cast<std::uint8_t>(SourceDtype::kFloat64)) return malformed("unknown dtype " + std::to_string(dtype));
  if ((flags & ~kKnownFlags) != 0) return malformed("unknown flags " + std::to_string(flags));
  if (ndim > kMaxDims) return malformed(std::to_string(ndim) + " dimensions (at most " + std::to_string(kMaxDims) + ")");
  if (sf > static_cast<std::uint8_t>(ScaleFormat::kBf16)) return malformed("unknown scale format " + std::to_string(sf));
  if (reserved != 0) return malformed("reserved field is not zero");
  const CodecTraits& t = traits(static_cast<CodecId>(codec));
  if (t.scaled) {
    if (block == 0 || block > kMaxBlockSize) return malformed("block size " + std::to_string(block) + " out of range [1, 2^20]");
    if (sf == static_cast<std::uint8_t>(ScaleFormat::kNone)) return malformed("scaled codec without a scale format");
  } else if (block != 0 || sf != 0) {
    return malformed("unscaled codec with a block size or scale format");
  }
  PayloadInfo info;
  info.codec = t.id;
  info.dtype = static_cast<SourceDtype>(dtype);
  info.scale_format = static_cast<ScaleFormat>(sf);
  info.block_size = block;
  info.zstd = (flags & kFlagZstd) != 0;
  info.stochastic = (flags & kFlagStochastic) != 0;
  std::int64_t numel = 1;
  for (int i = 0; i < ndim; ++i) {
    const std::int64_t d = r.i64();
    if (!r.ok()) return r.status();
    if (d < 0 || d > kMaxElements) return malformed("dimension " + std::to_string(i) + " = " + std::to_string(d) + " out of range");
    numel = d == 0 ? 0 : numel;
    if (numel != 0 && d > kMaxElements / numel) return malformed("shape holds more than 2^34 elements");
    numel *= d;
    info.shape.push_back(d);
  }
  info.numel = numel;
  if (numel > max_elements) {
    return error(ErrorCode::kOutOfRange, "quantized payload holds " + std::to_string(numel) + " values, more than the " +
                                             std::to_string(max_elements) + " this receiver accepts");
  }
  body_len = r.u64();
  raw_len = info.zstd ? r.u64() : body_len;
  if (!r.ok()) return r.status();
  info.header_bytes = r.position();
  const std::uint64_t expected = body_bytes(t.id, static_cast<std::size_t>(numel), block, info.scale_format);
  if (raw_len != expected) {
    return malformed("body of " + std::to_string(raw_len) + " bytes does not match shape and codec (" + std::to_string(expected) +
                     " expected)");
  }
  if (body_len != r.remaining()) {
    return error(ErrorCode::kDataLoss, "quantized payload: header announces " + std::to_string(body_len) + " body bytes, " +
                                           std::to_string(r.remaining()) + " present");
  }
  if (info.zstd) {
    // Checked here, before anyone allocates for the decompressed body.
    const ByteView body = r.raw(static_cast<std::size_t>(body_len));
    if (ZSTD_getFrameContentSize(body.data(), body.size()) != raw_len) return malformed("zstd frame does not declare the announced size");
    if (ZSTD_findFrameCompressedSize(body.data(), body.size()) != body.size()) return malformed("zstd body is not exactly one frame");
  }
  return info;
}

}  // namespace

Result<PayloadInfo> inspect(ByteView payload, std::int64_t max_elements) {
  Reader r(payload, "quantized payload");
  std::uint64_t body_len = 0, raw_len = 0;
  return read_header(r, body_len, raw_len, max_elements);
}

namespace {

// The payload's body (decompressed when zstd), checked against `n` output values.
struct Body {
  PayloadInfo info;
  ByteView bytes;
  Bytes decompressed;  // owns `bytes` when the payload was zstd-compressed
};

Status open_body(ByteView payload, std::size_t n, Body& body) {
  Reader r(payload, "quantized payload");
  std::uint64_t body_len = 0, raw_len = 0;
  auto header = read_header(r, body_len, raw_len, static_cast<std::int64_t>(n));
  if (!header.ok()) return header.status();
  body.info = *header;
  Reader body_reader(payload, "quantized payload");
  (void)body_reader.raw(body.info.header_bytes);  // read_header consumed the body when checking zstd: re-position
  GOSSAMER_CHECK(n == static_cast<std::size_t>(body.info.numel), "decode: output span does not hold the payload's elements");
  body.bytes = body_reader.raw(static_cast<std::size_t>(body_len));
  if (!body_reader.ok()) return body_reader.status();
  if (body.info.zstd) {
    body.decompressed.resize(static_cast<std::size_t>(raw_len));
    const std::size_t got = ZSTD_decompress(body.decompressed.data(), body.decompressed.size(), body.bytes.data(), body.bytes.size());
    if (ZSTD_isError(got)) return malformed(std::string("zstd: ") + ZSTD_getErrorName(got));
    if (got != raw_len) return malformed("zstd frame decompressed to the wrong size");
    body.bytes = body.decompressed;
  }
  return Status();
}

// Decodes values [first, first + count) of a body of n values into dst. `first` is a multiple of the
// block size and starts a byte of codes (4-bit codecs pack two values per byte, int2 four). False on NaN, Inf or a bad scale.
bool decode_range(const PayloadInfo& info, const std::uint8_t* src, std::size_t n, std::size_t first, std::size_t count, float* dst) {
  switch (info.codec) {
    case CodecId::kFp32: return kernels::copy_finite_fp32(src + 4 * first, count, dst);
    case CodecId::kBf16: return kernels::decode_bf16(src + 2 * first, count, dst);
    case CodecId::kFp16: return kernels::decode_fp16(src + 2 * first, count, dst);
    default: {
      const std::size_t blocks = n == 0 ? 0 : (n + info.block_size - 1) / info.block_size;
      const std::size_t sb = kernels::scale_bytes(info.scale_format);
      return kernels::decode_scaled(info.codec, src + (first / info.block_size) * sb,
                                    src + blocks * sb + kernels::packed_bytes(info.codec, first), count, info.block_size,
                                    info.scale_format, dst);
    }
  }
}

Status non_finite() { return malformed("holds NaN, Inf or a negative scale (dropped: it would poison training)"); }

}  // namespace

Status decode_into(ByteView payload, std::span<float> out) {
  Body body;
  if (Status st = open_body(payload, out.size(), body); !st.ok()) return st;
  const auto* src = reinterpret_cast<const std::uint8_t*>(body.bytes.data());
  if (!decode_range(body.info, src, out.size(), 0, out.size(), out.data())) return non_finite();
  return Status();
}

namespace {

// Adds a body's values to `acc` (acc[i] += value[i]); false on NaN, Inf or a bad scale. Codecs other
// than fp32 are decoded a cache-sized piece at a time: no buffer of the payload's size.
bool add_body(const Body& body, std::span<float> acc) {
  const auto* src = reinterpret_cast<const std::uint8_t*>(body.bytes.data());
  const std::size_t n = acc.size();
  if (body.info.codec == CodecId::kFp32) return kernels::add_fp32(src, n, acc.data());
  constexpr std::size_t kPiece = 8192;
  std::size_t step = kPiece;
  if (body.info.block_size > 0) {  // scaled codecs: pieces of whole blocks (unscaled ones carry block 0)
    // Whole bytes of codes too: a multiple of the values per byte (2 for 4-bit codecs, 4 for int2).
    const std::size_t per_byte = static_cast<std::size_t>(8 / std::min(8, traits(body.info.codec).bits));
    const std::size_t unit = std::lcm(std::size_t{body.info.block_size}, per_byte);
    step = std::max<std::size_t>(unit, kPiece / unit * unit);
  }
  std::vector<float> piece(std::min(step, n));
  for (std::size_t first = 0; first < n; first += step) {
    const std::size_t count = std::min(step, n - first);
    if (!decode_range(body.info, src, n, first, count, piece.data())) return false;
    float* a = acc.data() + first;
    for (std::size_t i = 0; i < count; ++i) a[i] += piece[i];
  }
  return true;
}

}  // namespace

Status decode_add(ByteView payload, std::span<float> acc) {
  Body body;
  if (Status st = open_body(payload, acc.size(), body); !st.ok()) return st;
  if (!add_body(body, acc)) return non_finite();
  return Status();
}

Status mean_into(std::span<const MeanTerm> terms, float divisor, std::span<float> out, std::ptrdiff_t& failed) {
  GOSSAMER_CHECK(!terms.empty(), "mean_into: no terms");
  const std::size_t n = out.size();
  std::vector<Body> bodies(terms.size());
  bool all_fp32 = true;  // every term is fp32 in memory: the one-pass path
  for (std::size_t t = 0; t < terms.size(); ++t) {
    failed = static_cast<std::ptrdiff_t>(t);
    if (terms[t].payload.empty()) {
      GOSSAMER_CHECK(terms[t].values.size() == n, "mean_into: own values of the wrong size");
      continue;
    }
    if (Status st = open_body(terms[t].payload, n, bodies[t]); !st.ok()) return st;
    all_fp32 = all_fp32 && bodies[t].info.codec == CodecId::kFp32;
  }
  // A block at a time (in L1), term after term, then the division: each input is read once and the
  // output written once, with the same operations in the same order as term by term. With a term
  // of another codec, the block is the whole span (its decoder works in whole scale blocks).
  constexpr std::size_t kBlock = 2048;
  const std::size_t step = all_fp32 ? kBlock : std::max<std::size_t>(n, 1);
  for (std::size_t first = 0; first < n; first += step) {
    const std::size_t count = std::min(step, n - first);
    float* o = out.data() + first;
    for (std::size_t t = 0; t < terms.size(); ++t) {
      failed = static_cast<std::ptrdiff_t>(t);
      const bool own = terms[t].payload.empty();
      const auto* src = reinterpret_cast<const std::uint8_t*>(own ? static_cast<const void*>(terms[t].values.data()) : bodies[t].bytes.data());
      bool finite;
      if (own || bodies[t].info.codec == CodecId::kFp32) {
        finite = t == 0 ? kernels::copy_finite_fp32(src + 4 * first, count, o) : kernels::add_fp32(src + 4 * first, count, o);
      } else {  // first == 0 and count == n here
        finite = t == 0 ? decode_range(bodies[t].info, src, n, 0, n, o) : add_body(bodies[t], std::span<float>(o, count));
      }
      if (!finite) return non_finite();
    }
    if (!kernels::divide_finite_fp32(o, count, divisor)) {
      failed = -1;
      return error(ErrorCode::kOutOfRange, "the mean overflowed float32 (values too large to average)");
    }
  }
  failed = -1;
  return Status();
}

}  // namespace gossamer::quant
