#include "quant/device_encode.h"

#include <torch/torch.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "quant/kernels.h"

namespace gossamer::quant::device {

namespace {

// bf16 scales as the kernels store them: rounded to nearest even, then up by one step where that
// fell below the fp32 scale (so that no value of the block overflows the format).
at::Tensor bf16_scale_rounded_up(const at::Tensor& s) {
  const at::Tensor r = s.to(at::kBFloat16);
  const at::Tensor up = (r.view(at::kShort) + 1).view(at::kBFloat16);
  return torch::where((s > 0).logical_and(r.to(at::kFloat) < s), up, r).to(at::kFloat);
}

// q = y / step rounded to the nearest integer, ties to the even code as the kernels round (on the
// value's bits). With mantissa bits that is the even integer; without (e3m0: one value per binade)
// a tie lies between two binades, and the even code is the one whose exponent field is even.
at::Tensor ties_to_even_code(const at::Tensor& q, const at::Tensor& e, const at::Tensor& normal, int mbits) {
  if (mbits > 0) return torch::round(q);
  const at::Tensor low = torch::floor(q);
  const at::Tensor odd_field = torch::remainder(e + 127, 2) == 1;  // fp32's field; same parity as the format's (odd biases)
  return torch::where(normal.logical_and(q - low == 0.5), low + odd_field.to(at::kFloat), torch::round(q));
}

// Codes (one byte each, sign in the top bit of the format) of the blocks' values times inv.
at::Tensor minifloat_codes(CodecId codec, const at::Tensor& blocks, const at::Tensor& inv) {
  const CodecTraits& t = traits(codec);
  const int mbits = t.mantissa_bits;
  const at::Tensor y = blocks.abs() * inv;
  // floor(log2 y) exactly: y = m 2^E with m in [0.5, 1); below the smallest normal, the subnormal grid.
  const auto [mantissa, exponent] = torch::frexp(y);
  const double emin = 1 - t.exponent_bias;
  const at::Tensor e = torch::where(y > 0, exponent.to(at::kFloat) - 1, torch::full_like(y, emin)).clamp_min(emin);
  const at::Tensor step = torch::pow(2.0, e - mbits);
  const at::Tensor v = (ties_to_even_code(y / step, e, y >= std::ldexp(1.0, static_cast<int>(emin)), mbits) * step).clamp_max(t.max_magnitude);
  const int half = (t.bits == 4 ? 16 : 256) / 2;
  const at::Tensor table = torch::from_blob(const_cast<float*>(kernels::code_values(codec)), {half}, at::kFloat);
  const at::Tensor sorted = table.masked_select(table.isfinite()).to(blocks.device());
  const at::Tensor magnitude = torch::searchsorted(sorted, v.contiguous());
  const at::Tensor sign = blocks.signbit().to(at::kLong);
  return (magnitude + sign * half).to(at::kByte);
}

// n codes of `bits` each packed little-end first: 8 / bits codes per byte, the lower index in the low bits.
at::Tensor pack(const at::Tensor& codes, int bits) {
  if (bits == 8) return codes;
  const std::int64_t per = 8 / bits, n = codes.numel(), bytes = (n + per - 1) / per;
  const at::Tensor grouped = torch::constant_pad_nd(codes, {0, bytes * per - n}).view({bytes, per}).to(at::kInt);
  at::Tensor out = torch::zeros({bytes}, grouped.options());
  for (std::int64_t j = 0; j < per; ++j) out += grouped.select(1, j) * (1 << (bits * j));
  return out.to(at::kByte);
}

void append_host_bytes(const at::Tensor& t, Bytes& out) {
  const at::Tensor host = t.contiguous().to(at::kCPU);
  const auto* p = static_cast<const std::byte*>(host.data_ptr());
  out.insert(out.end(), p, p + host.numel() * static_cast<std::int64_t>(host.element_size()));
}

}  // namespace

bool covers(const EncodeOptions& o) {
  if (o.codec == CodecId::kBf16 || o.codec == CodecId::kFp16) return true;
  return traits(o.codec).scaled && o.rounding == Rounding::kNearestEven && o.scale_format != ScaleFormat::kNone;
}

bool append_body(const at::Tensor& x_in, const EncodeOptions& o, Bytes& out) {
  GOSSAMER_CHECK(covers(o), "device encode: options it does not cover");
  static_assert(std::endian::native == std::endian::little, "payloads are little-endian: the host copies its values as they are");
  const at::Tensor x = x_in.detach().to(at::kFloat).flatten();
  if (!x.isfinite().all().item<bool>()) return false;
  out.reserve(out.size() + body_bytes(o.codec, static_cast<std::size_t>(x.numel()), traits(o.codec).scaled ? o.block_size : 0, o.scale_format));
  if (!traits(o.codec).scaled) {
    append_host_bytes(x.to(o.codec == CodecId::kBf16 ? at::kBFloat16 : at::kHalf), out);
    return true;
  }
  const CodecTraits& t = traits(o.codec);
  const std::int64_t n = x.numel(), b = o.block_size, nb = (n + b - 1) / b;
  const at::Tensor blocks = torch::constant_pad_nd(x, {0, nb * b - n}).view({nb, b});
  at::Tensor scale;
  if (o.codec == CodecId::kInt2) {  // the block's RMS over its own values (the last may be short), summed in double
    at::Tensor counts = torch::full({nb}, static_cast<double>(b), x.options().dtype(at::kDouble));
    if (nb > 0) counts.index_put_({nb - 1}, static_cast<double>(n - (nb - 1) * b));
    scale = (blocks.to(at::kDouble).square().sum(1) / counts).sqrt().to(at::kFloat);
    if (o.scale_format == ScaleFormat::kBf16) scale = scale.to(at::kBFloat16).to(at::kFloat);
  } else {
    scale = blocks.abs().amax(1) / t.max_magnitude;
    if (o.scale_format == ScaleFormat::kBf16) scale = bf16_scale_rounded_up(scale);
  }
  const at::Tensor inv = torch::where(scale > 0, 1.0f / scale, torch::zeros_like(scale)).unsqueeze(1);
  at::Tensor codes;
  if (o.codec == CodecId::kInt2) {
    codes = (torch::floor(blocks * inv) + 2).clamp(0, 3);
  } else if (o.codec == CodecId::kInt8 || o.codec == CodecId::kInt4) {
    const at::Tensor q = torch::round(blocks * inv).clamp(-t.max_magnitude, t.max_magnitude).to(at::kInt);
    codes = torch::remainder(q, 1 << t.bits);
  } else {
    codes = minifloat_codes(o.codec, blocks, inv);
  }
  append_host_bytes(o.scale_format == ScaleFormat::kBf16 ? scale.to(at::kBFloat16) : scale, out);
  append_host_bytes(pack(codes.to(at::kByte).flatten().slice(0, 0, n), t.bits), out);
  return true;
}

}  // namespace gossamer::quant::device
