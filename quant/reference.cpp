#include "quant/reference.h"

#include <torch/torch.h>

#include <cmath>

#include "core/check.h"
#include "quant/kernels.h"

namespace gossamer::quant::reference {

namespace {

// Every code's value as a tensor on `device` (NaN where a code is not allowed).
at::Tensor value_table(CodecId c, const c10::Device& device) {
  const int n = 1 << traits(c).bits;
  return torch::from_blob(const_cast<float*>(kernels::code_values(c)), {n}, torch::kFloat).to(device, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

Encoded encode(const at::Tensor& x_in, CodecId codec, std::uint32_t block) {
  const CodecTraits& t = traits(codec);
  const at::Tensor x = x_in.detach().to(torch::kFloat).flatten();
  if (codec == CodecId::kFp32) return {at::Tensor(), x.clone()};
  if (codec == CodecId::kBf16) return {at::Tensor(), x.to(torch::kBFloat16)};
  if (codec == CodecId::kFp16) return {at::Tensor(), x.to(torch::kHalf)};

  const std::int64_t n = x.numel(), b = block, nb = (n + b - 1) / b;
  const at::Tensor blocks = torch::constant_pad_nd(x, {0, nb * b - n}).view({nb, b});
  if (codec == CodecId::kInt2) {  // the block's RMS (over its own values: the last block may be short)
    at::Tensor counts = torch::full({nb, 1}, static_cast<double>(b), torch::TensorOptions().dtype(torch::kDouble).device(x.device()));
    if (nb > 0) counts.index_put_({nb - 1, 0}, static_cast<double>(n - (nb - 1) * b));
    const at::Tensor scale = (blocks.to(torch::kDouble).square().sum(1, /*keepdim=*/true) / counts).sqrt().to(torch::kFloat);
    const at::Tensor inv = torch::where(scale > 0, 1.0f / scale, torch::zeros_like(scale));
    const at::Tensor codes = (torch::floor(blocks * inv) + 2).clamp(0, 3).to(torch::kUInt8);
    return {scale.flatten(), codes.flatten().slice(0, 0, n)};
  }
  const at::Tensor absmax = blocks.abs().amax(1, /*keepdim=*/true);
  const at::Tensor scale = absmax / t.max_magnitude;
  const at::Tensor inv = torch::where(scale > 0, 1.0f / scale, torch::zeros_like(scale));
  at::Tensor codes;
  if (codec == CodecId::kInt8 || codec == CodecId::kInt4) {
    const at::Tensor q = torch::round(blocks * inv).clamp(-t.max_magnitude, t.max_magnitude);
    const std::int64_t modulo = codec == CodecId::kInt8 ? 256 : 16;
    codes = torch::remainder(q.to(torch::kLong), modulo).to(torch::kUInt8);
  } else {
    const struct {
      int mbits, bias;
    } f{t.mantissa_bits, t.exponent_bias};
    const at::Tensor y = blocks.abs() * inv;
    const double emin = 1 - f.bias;
    // Binade exponent, with everything below the smallest normal on the subnormal grid.
    const at::Tensor e = torch::floor(torch::log2(y.clamp_min(1e-30))).clamp_min(emin);
    const at::Tensor step = torch::pow(2.0, e - f.mbits);
    at::Tensor q = torch::round(y / step);
    if (f.mbits == 0) {  // one value per binade: a tie lies between two, and goes to the even exponent field
      const at::Tensor low = torch::floor(y / step), odd_field = torch::remainder(e + f.bias, 2) == 1;
      q = torch::where((y >= std::ldexp(1.0, static_cast<int>(emin))).logical_and(y / step - low == 0.5), low + odd_field.to(torch::kFloat), q);
    }
    const at::Tensor v = (q * step).clamp_max(t.max_magnitude);
    // The magnitude's code: its index among the format's non-negative values (which are sorted).
    const int half = (t.bits == 4 ? 16 : 256) / 2;
    const at::Tensor mags = value_table(codec, x.device()).slice(0, 0, half);
    const at::Tensor finite = mags.isfinite();
    const at::Tensor sorted = mags.masked_select(finite);
    const at::Tensor mag_code = torch::searchsorted(sorted, v.contiguous());
    const at::Tensor sign = (blocks < 0).logical_or(blocks.signbit()).to(torch::kLong);
    codes = (mag_code + sign * half).to(torch::kUInt8);
  }
  return {scale.flatten(), codes.flatten().slice(0, 0, n)};
}

at::Tensor decode(const Encoded& e, CodecId codec, std::uint32_t block, at::IntArrayRef shape) {
  if (!traits(codec).scaled) return e.codes.to(torch::kFloat).view(shape);
  const at::Tensor values = value_table(codec, e.codes.device()).index({e.codes.to(torch::kLong)});
  const std::int64_t n = e.codes.numel(), b = block, nb = (n + b - 1) / b;
  const at::Tensor padded = torch::constant_pad_nd(values, {0, nb * b - n}).view({nb, b});
  return (padded * e.scales.view({nb, 1})).flatten().slice(0, 0, n).view(shape);
}

}  // namespace gossamer::quant::reference
