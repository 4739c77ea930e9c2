#include "quant/codec.h"

#include <torch/torch.h>

#include <bit>
#include <cstring>
#include <limits>

#include <zstd.h>

#include "core/check.h"
#include "core/wire.h"
#include "quant/kernels.h"

namespace gossamer::quant {

static_assert(std::endian::native == std::endian::little, "fp32 payloads are copied as host floats: little-endian hosts only");

namespace {

constexpr char kMagic[4] = {'G', 'Q', 'N', 'T'};
constexpr std::uint8_t kFlagZstd = 1u << 0;
constexpr std::uint8_t kFlagStochastic = 1u << 1;
constexpr std::uint8_t kKnownFlags = kFlagZstd | kFlagStochastic;

SourceDtype source_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return SourceDtype::kFloat32;
    case at::kBFloat16: return SourceDtype::kBFloat16;
    case at::kHalf: return SourceDtype::kFloat16;
    case at::kDouble: return SourceDtype::kFloat64;
    default: break;
  }
  GOSSAMER_CHECK(false, std::string("quant::encode: unsupported dtype ") + std::string(c10::toString(t.scalar_type())) +
                            " (floating-point tensors only)");
  return SourceDtype::kFloat32;
}

at::ScalarType scalar_type(SourceDtype d) {
  switch (d) {
    case SourceDtype::kFloat32: return at::kFloat;
    case SourceDtype::kBFloat16: return at::kBFloat16;
    case SourceDtype::kFloat16: return at::kHalf;
    case SourceDtype::kFloat64: return at::kDouble;
  }
  return at::kFloat;
}

std::size_t body_bytes(const CodecTraits& t, std::size_t n, std::uint32_t block, ScaleFormat sf) {
  if (!t.scaled) return n * static_cast<std::size_t>(t.bits / 8);
  const std::size_t blocks = n == 0 ? 0 : (n + block - 1) / block;
  return blocks * kernels::scale_bytes(sf) + kernels::packed_bytes(t.id, n);
}

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

double bits_per_value(const EncodeOptions& o) {
  const CodecTraits& t = traits(o.codec);
  if (!t.scaled) return t.bits;
  return t.bits + 8.0 * static_cast<double>(kernels::scale_bytes(o.scale_format)) / static_cast<double>(o.block_size);
}

Bytes encode(const at::Tensor& tensor, const EncodeOptions& o) {
  const CodecTraits& t = traits(o.codec);
  const SourceDtype dtype = source_dtype(tensor);
  GOSSAMER_CHECK(tensor.dim() <= kMaxDims, "quant::encode: more than " + std::to_string(kMaxDims) + " dimensions");
  GOSSAMER_CHECK(tensor.numel() <= kMaxElements, "quant::encode: tensor too large");
  if (t.scaled) {
    GOSSAMER_CHECK(o.block_size >= 1 && o.block_size <= kMaxBlockSize, "quant::encode: block_size must be in [1, 2^20]");
    GOSSAMER_CHECK(o.scale_format != ScaleFormat::kNone, "quant::encode: scaled codecs need a scale format");
  }
  GOSSAMER_CHECK(o.zstd_level >= 1 && o.zstd_level <= ZSTD_maxCLevel(), "quant::encode: zstd_level out of range");
  const at::Tensor x = tensor.detach().to(at::kCPU, at::kFloat).contiguous();
  const auto n = static_cast<std::size_t>(x.numel());
  const float* data = x.data_ptr<float>();
  const ScaleFormat sf = t.scaled ? o.scale_format : ScaleFormat::kNone;
  const std::uint32_t block = t.scaled ? o.block_size : 0;

  const std::size_t body_size = body_bytes(t, n, block, sf);
  std::uint8_t flags = 0;
  if (o.rounding == Rounding::kStochastic && t.scaled) flags |= kFlagStochastic;
  if (o.zstd) flags |= kFlagZstd;
  auto header = [&](std::uint64_t body_len) {
    Writer w(48 + 8 * static_cast<std::size_t>(tensor.dim()));
    w.raw(as_bytes(std::string_view(kMagic, sizeof(kMagic))));
    w.u8(kPayloadVersion);
    w.u8(static_cast<std::uint8_t>(o.codec));
    w.u8(static_cast<std::uint8_t>(dtype));
    w.u8(flags);
    w.u8(static_cast<std::uint8_t>(tensor.dim()));
    w.u8(static_cast<std::uint8_t>(sf));
    w.u16(0);
    w.u32(block);
    for (auto d : tensor.sizes()) w.i64(d);
    w.u64(body_len);
    if (o.zstd) w.u64(body_size);
    return std::move(w).take();
  };

  // Without zstd the body is encoded straight into the payload, after its header: no extra copy.
  Bytes out = o.zstd ? Bytes(body_size) : header(body_size);
  const std::size_t body_at = o.zstd ? 0 : out.size();
  out.resize(body_at + body_size);
  auto* body = reinterpret_cast<std::uint8_t*>(out.data() + body_at);
  bool finite = true;
  switch (o.codec) {
    case CodecId::kFp32:
      std::memcpy(body, data, n * 4);
      finite = kernels::check_finite_fp32(body, n);
      break;
    case CodecId::kBf16:
    case CodecId::kFp16:
      // LibTorch's vectorized conversion (round to nearest even), written straight into the payload.
      finite = kernels::check_finite_fp32(reinterpret_cast<const std::uint8_t*>(data), n);
      if (n > 0) {
        at::from_blob(body, {static_cast<std::int64_t>(n)}, o.codec == CodecId::kBf16 ? at::kBFloat16 : at::kHalf).copy_(x.reshape({-1}));
      }
      break;
    default: {
      const std::size_t blocks = n == 0 ? 0 : (n + block - 1) / block;
      finite = kernels::encode_scaled(o.codec, data, n, block, sf, o.rounding, o.seed, body, body + blocks * kernels::scale_bytes(sf));
    }
  }
  GOSSAMER_CHECK(finite, "quant::encode: the tensor holds NaN or Inf");
  if (!o.zstd) return out;

  Bytes compressed(ZSTD_compressBound(body_size));
  const std::size_t c = ZSTD_compress(compressed.data(), compressed.size(), out.data(), out.size(), o.zstd_level);
  GOSSAMER_CHECK(!ZSTD_isError(c), std::string("zstd compression failed: ") + ZSTD_getErrorName(c));
  Bytes payload = header(c);
  payload.insert(payload.end(), compressed.begin(), compressed.begin() + static_cast<std::ptrdiff_t>(c));
  return payload;
}

namespace {

// Reads and validates the header; leaves `r` at the start of the body.
Result<PayloadInfo> read_header(Reader& r, std::uint64_t& body_len, std::uint64_t& raw_len) {
  ByteView magic = r.raw(4);
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kMagic, 4) != 0) return malformed("bad magic (not a Gossamer quantized payload)");
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
  body_len = r.u64();
  raw_len = info.zstd ? r.u64() : body_len;
  if (!r.ok()) return r.status();
  info.header_bytes = r.position();
  const std::uint64_t expected = body_bytes(t, static_cast<std::size_t>(numel), block, info.scale_format);
  if (raw_len != expected) {
    return malformed("body of " + std::to_string(raw_len) + " bytes does not match shape and codec (" + std::to_string(expected) +
                     " expected)");
  }
  if (body_len != r.remaining()) {
    return error(ErrorCode::kDataLoss, "quantized payload: header announces " + std::to_string(body_len) + " body bytes, " +
                                           std::to_string(r.remaining()) + " present");
  }
  return info;
}

}  // namespace

Result<PayloadInfo> inspect(ByteView payload) {
  Reader r(payload, "quantized payload");
  std::uint64_t body_len = 0, raw_len = 0;
  return read_header(r, body_len, raw_len);
}

Result<at::Tensor> decode(ByteView payload) {
  Reader r(payload, "quantized payload");
  std::uint64_t body_len = 0, raw_len = 0;
  auto header = read_header(r, body_len, raw_len);
  if (!header.ok()) return header.status();
  const PayloadInfo& info = *header;
  ByteView body = r.raw(static_cast<std::size_t>(body_len));
  if (!r.ok()) return r.status();

  Bytes decompressed;
  if (info.zstd) {
    const unsigned long long content = ZSTD_getFrameContentSize(body.data(), body.size());
    if (content != raw_len) return malformed("zstd frame does not declare the announced size");
    decompressed.resize(static_cast<std::size_t>(raw_len));
    const std::size_t got = ZSTD_decompress(decompressed.data(), decompressed.size(), body.data(), body.size());
    if (ZSTD_isError(got)) return malformed(std::string("zstd: ") + ZSTD_getErrorName(got));
    if (got != raw_len) return malformed("zstd frame decompressed to the wrong size");
    body = decompressed;
  }

  const auto n = static_cast<std::size_t>(info.numel);
  at::Tensor out;
  try {
    out = at::empty(info.shape, at::TensorOptions().dtype(at::kFloat));
  } catch (const c10::Error&) {
    return error(ErrorCode::kResourceExhausted, "quantized payload: cannot allocate " + std::to_string(n) + " floats");
  }
  float* dst = out.data_ptr<float>();
  const auto* src = reinterpret_cast<const std::uint8_t*>(body.data());
  bool finite = true;
  switch (info.codec) {
    case CodecId::kFp32:
      std::memcpy(dst, src, n * 4);
      finite = kernels::check_finite_fp32(src, n);
      break;
    case CodecId::kBf16:
      // A shift per value, with the finiteness check in the same pass: faster than LibTorch's copy_.
      finite = kernels::decode_bf16(src, n, dst);
      break;
    case CodecId::kFp16:
      // LibTorch's vectorized half-to-float conversion beats our table lookup (measured).
      finite = kernels::check_finite_fp16(src, n);
      // const_cast: from_blob wants a mutable pointer; copy_() only reads the source.
      if (n > 0) out.view({-1}).copy_(at::from_blob(const_cast<std::uint8_t*>(src), {static_cast<std::int64_t>(n)}, at::kHalf));
      break;
    default: {
      const std::size_t blocks = n == 0 ? 0 : (n + info.block_size - 1) / info.block_size;
      finite = kernels::decode_scaled(info.codec, src, src + blocks * kernels::scale_bytes(info.scale_format), n, info.block_size,
                                      info.scale_format, dst);
    }
  }
  if (!finite) return malformed("holds NaN, Inf or a negative scale (dropped: it would poison training)");
  if (info.dtype != SourceDtype::kFloat32) out = out.to(scalar_type(info.dtype));
  return out;
}

}  // namespace gossamer::quant
