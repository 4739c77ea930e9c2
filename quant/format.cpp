#include "quant/format.h"

#include <bit>
#include <cstring>
#include <string>

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
      {CodecId::kFp8E4M3, "fp8_e4m3", 8, true, 448.0f},
      {CodecId::kFp8E5M2, "fp8_e5m2", 8, true, 57344.0f},
      {CodecId::kFp16, "fp16", 16, false, 0.0f},
      {CodecId::kInt4, "int4", 4, true, 7.0f},
      {CodecId::kFp4E3M0, "fp4_e3m0", 4, true, 1.0f},
      {CodecId::kFp4E2M1, "fp4_e2m1", 4, true, 6.0f},
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

Status decode_into(ByteView payload, std::span<float> out) {
  Reader r(payload, "quantized payload");
  std::uint64_t body_len = 0, raw_len = 0;
  auto header = read_header(r, body_len, raw_len, static_cast<std::int64_t>(out.size()));
  if (!header.ok()) return header.status();
  const PayloadInfo& info = *header;
  Reader body_reader(payload, "quantized payload");
  (void)body_reader.raw(info.header_bytes);  // read_header consumed the body when checking zstd: re-position
  r = std::move(body_reader);
  GOSSAMER_CHECK(out.size() == static_cast<std::size_t>(info.numel), "decode_into: output span does not hold the payload's elements");
  ByteView body = r.raw(static_cast<std::size_t>(body_len));
  if (!r.ok()) return r.status();

  Bytes decompressed;
  if (info.zstd) {
    decompressed.resize(static_cast<std::size_t>(raw_len));
    const std::size_t got = ZSTD_decompress(decompressed.data(), decompressed.size(), body.data(), body.size());
    if (ZSTD_isError(got)) return malformed(std::string("zstd: ") + ZSTD_getErrorName(got));
    if (got != raw_len) return malformed("zstd frame decompressed to the wrong size");
    body = decompressed;
  }

  const std::size_t n = out.size();
  float* dst = out.data();
  const auto* src = reinterpret_cast<const std::uint8_t*>(body.data());
  bool finite = true;
  switch (info.codec) {
    case CodecId::kFp32:
      if (n > 0) std::memcpy(dst, src, n * 4);
      finite = kernels::check_finite_fp32(src, n);
      break;
    case CodecId::kBf16: finite = kernels::decode_bf16(src, n, dst); break;
    case CodecId::kFp16: finite = kernels::decode_fp16(src, n, dst); break;
    default: {
      const std::size_t blocks = n == 0 ? 0 : (n + info.block_size - 1) / info.block_size;
      finite = kernels::decode_scaled(info.codec, src, src + blocks * kernels::scale_bytes(info.scale_format), n, info.block_size,
                                      info.scale_format, dst);
    }
  }
  if (!finite) return malformed("holds NaN, Inf or a negative scale (dropped: it would poison training)");
  return Status();
}

}  // namespace gossamer::quant
