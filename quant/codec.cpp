#include "quant/codec.h"

#include <torch/torch.h>

#include <bit>
#include <cstring>
#include <limits>
#include <optional>

#include <span>

#include <zstd.h>

#include "core/check.h"
#include "core/wire.h"
#include "quant/device_encode.h"
#include "quant/kernels.h"

namespace gossamer::quant {


namespace {

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

// A payload's header (layout in format.h); raw_len only for zstd bodies (their size decompressed).
Bytes payload_header(CodecId codec, SourceDtype dtype, std::uint8_t flags, ScaleFormat sf, std::uint32_t block, at::IntArrayRef sizes,
                     std::uint64_t body_len, std::optional<std::uint64_t> raw_len) {
  Writer w(48 + 8 * sizes.size());
  w.raw(as_bytes(std::string_view(kPayloadMagic, sizeof(kPayloadMagic))));
  w.u8(kPayloadVersion);
  w.u8(static_cast<std::uint8_t>(codec));
  w.u8(static_cast<std::uint8_t>(dtype));
  w.u8(flags);
  w.u8(static_cast<std::uint8_t>(sizes.size()));
  w.u8(static_cast<std::uint8_t>(sf));
  w.u16(0);
  w.u32(block);
  for (auto d : sizes) w.i64(d);
  w.u64(body_len);
  if (raw_len) w.u64(*raw_len);
  return std::move(w).take();
}

// fp32 without zstd, borrowed: the header encode() writes (a test pins the two to the same bytes)
// and the values themselves as the body, checked finite.
EncodedView borrowed_fp32(const float* values, std::size_t n, at::IntArrayRef sizes) {
  GOSSAMER_CHECK(n <= static_cast<std::size_t>(kMaxElements), "quant::encode: tensor too large");
  const auto* data = reinterpret_cast<const std::uint8_t*>(values);
  GOSSAMER_CHECK(kernels::check_finite_fp32(data, n), "quant::encode: the tensor holds NaN or Inf");
  return {payload_header(CodecId::kFp32, SourceDtype::kFloat32, 0, ScaleFormat::kNone, 0, sizes, n * 4, std::nullopt),
          ByteView(reinterpret_cast<const std::byte*>(data), n * 4)};
}

bool borrowable(const EncodeOptions& o, std::size_t n) { return o.codec == CodecId::kFp32 && !o.zstd && n > 0; }

}  // namespace

Bytes encode(const at::Tensor& tensor, const EncodeOptions& o) { return encode(tensor, o, EncodePath::kAuto); }

Bytes encode(const at::Tensor& tensor, const EncodeOptions& o, EncodePath path) {
  const CodecTraits& t = traits(o.codec);
  const SourceDtype dtype = source_dtype(tensor);
  GOSSAMER_CHECK(tensor.dim() <= kMaxDims, "quant::encode: more than " + std::to_string(kMaxDims) + " dimensions");
  GOSSAMER_CHECK(tensor.numel() <= kMaxElements, "quant::encode: tensor too large");
  if (t.scaled) {
    GOSSAMER_CHECK(o.block_size >= 1 && o.block_size <= kMaxBlockSize, "quant::encode: block_size must be in [1, 2^20]");
    GOSSAMER_CHECK(o.scale_format != ScaleFormat::kNone, "quant::encode: scaled codecs need a scale format");
  }
  GOSSAMER_CHECK(o.zstd_level >= 1 && o.zstd_level <= ZSTD_maxCLevel(), "quant::encode: zstd_level out of range");
  const ScaleFormat sf = t.scaled ? o.scale_format : ScaleFormat::kNone;
  const std::uint32_t block = t.scaled ? o.block_size : 0;
  const std::size_t body_size = body_bytes(o.codec, static_cast<std::size_t>(tensor.numel()), block, sf);
  std::uint8_t flags = 0;
  if (o.rounding == Rounding::kStochastic && t.scaled) flags |= kFlagStochastic;
  if (o.zstd) flags |= kFlagZstd;
  auto header = [&](std::uint64_t body_len) {
    return payload_header(o.codec, dtype, flags, sf, block, tensor.sizes(), body_len, o.zstd ? std::optional(body_size) : std::nullopt);
  };
  // With zstd, `raw` is the body alone; without, the whole payload.
  auto finish = [&](Bytes raw) {
    if (!o.zstd) return raw;
    Bytes compressed(ZSTD_compressBound(raw.size()));
    const std::size_t c = ZSTD_compress(compressed.data(), compressed.size(), raw.data(), raw.size(), o.zstd_level);
    GOSSAMER_CHECK(!ZSTD_isError(c), std::string("zstd compression failed: ") + ZSTD_getErrorName(c));
    Bytes payload = header(c);
    payload.insert(payload.end(), compressed.begin(), compressed.begin() + static_cast<std::ptrdiff_t>(c));
    return payload;
  };

  if (path == EncodePath::kTensorOps || (path == EncodePath::kAuto && !tensor.device().is_cpu() && device::covers(o))) {
    GOSSAMER_CHECK(device::covers(o), "quant::encode: LibTorch ops encode scaled codecs with nearest-even rounding, bf16 and fp16 only");
    Bytes out = o.zstd ? Bytes() : header(body_size);
    const std::size_t body_at = out.size();
    GOSSAMER_CHECK(device::append_body(tensor, o, out), "quant::encode: the tensor holds NaN or Inf");
    GOSSAMER_CHECK(out.size() - body_at == body_size, "quant::encode: the device's body has the wrong size");
    return finish(std::move(out));
  }

  const at::Tensor x = tensor.detach().to(at::kCPU, at::kFloat).contiguous();
  const auto n = static_cast<std::size_t>(x.numel());
  const float* data = x.data_ptr<float>();
  // Without zstd the body is encoded straight into the payload, after its header: no extra copy.
  Bytes out = o.zstd ? Bytes(body_size) : header(body_size);
  const std::size_t body_at = o.zstd ? 0 : out.size();
  if (o.codec == CodecId::kFp32 && !o.zstd) {  // appended, so the body is written once (no zero-fill first)
    const auto* src = reinterpret_cast<const std::byte*>(data);
    GOSSAMER_CHECK(kernels::check_finite_fp32(reinterpret_cast<const std::uint8_t*>(data), n), "quant::encode: the tensor holds NaN or Inf");
    out.reserve(body_at + body_size);
    out.insert(out.end(), src, src + n * 4);
    return out;
  }
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
  return finish(std::move(out));
}

EncodedView encode_view(std::span<const float> values, const EncodeOptions& o) {
  const std::size_t n = values.size();
  const auto dim = static_cast<std::int64_t>(n);
  // Anything else is encoded from a tensor over the same memory (no copy).
  if (!borrowable(o, n)) return {encode(at::from_blob(const_cast<float*>(values.data()), {dim}, at::kFloat), o), {}};
  return borrowed_fp32(values.data(), n, at::IntArrayRef(&dim, 1));
}

EncodedView encode_view(const at::Tensor& tensor, const EncodeOptions& o) {
  const auto n = static_cast<std::size_t>(tensor.numel());
  if (!borrowable(o, n) || !tensor.device().is_cpu() || tensor.scalar_type() != at::kFloat || !tensor.is_contiguous()) {
    return {encode(tensor, o), {}};
  }
  GOSSAMER_CHECK(tensor.dim() <= kMaxDims, "quant::encode: more than " + std::to_string(kMaxDims) + " dimensions");
  return borrowed_fp32(tensor.data_ptr<float>(), n, tensor.sizes());
}

Result<at::Tensor> decode(ByteView payload, std::int64_t max_elements) {
  auto info = inspect(payload, max_elements);
  if (!info.ok()) return info.status();
  at::Tensor out;
  try {
    out = at::empty(info->shape, at::TensorOptions().dtype(at::kFloat));
  } catch (const c10::Error&) {
    return error(ErrorCode::kResourceExhausted, "quantized payload: cannot allocate " + std::to_string(info->numel) + " floats");
  }
  if (Status st = decode_into(payload, std::span<float>(out.data_ptr<float>(), static_cast<std::size_t>(out.numel()))); !st.ok()) {
    return st;
  }
  if (info->dtype != SourceDtype::kFloat32) out = out.to(scalar_type(info->dtype));
  return out;
}

}  // namespace gossamer::quant
