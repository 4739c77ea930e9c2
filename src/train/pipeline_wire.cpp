#include "train/pipeline_wire.h"

#include <torch/torch.h>

#include <cstring>
#include <string>

#include "core/check.h"
#include "core/wire.h"
#include "quant/codec.h"

namespace gossamer::train {

namespace {
constexpr char kMagic[4] = {'G', 'S', 'P', 'A'};
}  // namespace

Bytes encode_activation(ActivationHeader h, const at::Tensor& x, const quant::EncodeOptions& codec) {
  GOSSAMER_CHECK(x.dim() == 3, "encode_activation: activations are (B, T, C)");
  h.batch = static_cast<std::uint32_t>(x.size(0));
  h.tokens = static_cast<std::uint32_t>(x.size(1));
  h.width = static_cast<std::uint32_t>(x.size(2));
  const Bytes payload = quant::encode(x.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1}), codec);
  Writer w(kActivationHeaderBytes + payload.size());
  w.raw(ByteView(reinterpret_cast<const std::byte*>(kMagic), 4));
  w.u8(kActivationVersion);
  w.u8(h.backward ? 1 : 0);
  w.u16(0);
  w.u64(h.iteration);
  w.u32(h.microbatch);
  w.u8(h.hop);
  w.u32(h.batch);
  w.u32(h.tokens);
  w.u32(h.width);
  w.raw(payload);
  return std::move(w).take();
}

Result<std::pair<ActivationHeader, at::Tensor>> decode_activation(ByteView bytes, const ActivationLimits& limits) {
  Reader r(bytes, "pipeline message");
  const ByteView magic = r.raw(4);
  const std::uint8_t version = r.u8();
  const std::uint8_t direction = r.u8();
  const std::uint16_t reserved = r.u16();
  ActivationHeader h;
  h.iteration = r.u64();
  h.microbatch = r.u32();
  h.hop = r.u8();
  h.batch = r.u32();
  h.tokens = r.u32();
  h.width = r.u32();
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kMagic, 4) != 0) return error(ErrorCode::kMalformed, "pipeline message: bad magic");
  if (version != kActivationVersion) {
    return error(ErrorCode::kVersionMismatch, "pipeline message: version " + std::to_string(version) + ", this node reads " + std::to_string(kActivationVersion) +
                                                  ": run one version of gossamer across the pipeline");
  }
  if (direction > 1 || reserved != 0) return error(ErrorCode::kMalformed, "pipeline message: bad direction or reserved field");
  h.backward = direction == 1;
  if (h.batch == 0 || h.batch > limits.max_batch || h.tokens == 0 || h.tokens > limits.context || h.width != limits.width) {
    return error(ErrorCode::kOutOfRange, "pipeline message: activations of " + std::to_string(h.batch) + " x " + std::to_string(h.tokens) + " x " +
                                             std::to_string(h.width) + ", where at most " + std::to_string(limits.max_batch) + " x " +
                                             std::to_string(limits.context) + " x " + std::to_string(limits.width) + " fit");
  }
  const std::int64_t n = static_cast<std::int64_t>(h.batch) * h.tokens * h.width;
  const ByteView payload = r.raw(r.remaining());
  auto info = quant::inspect(payload, n);
  if (!info.ok()) return info.status().with_context("pipeline message");
  if (info->numel != n) return error(ErrorCode::kMalformed, "pipeline message: " + std::to_string(info->numel) + " values for " + std::to_string(n));
  at::Tensor x = torch::empty({n}, torch::kFloat);
  if (Status st = quant::decode_into(payload, std::span<float>(x.data_ptr<float>(), static_cast<std::size_t>(n))); !st.ok()) {
    return st.with_context("pipeline message");
  }
  return std::make_pair(h, x.view({h.batch, h.tokens, h.width}));
}

}  // namespace gossamer::train
