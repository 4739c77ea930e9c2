#include "quant/error_feedback.h"

#include <torch/torch.h>

#include "core/check.h"
#include "core/wire.h"

namespace gossamer::quant {

ErrorFeedback::ErrorFeedback(EncodeOptions options) : options_(options) {}

Bytes ErrorFeedback::encode(const at::Tensor& x) {
  const at::Tensor xf = x.detach().to(at::kCPU, at::kFloat);
  if (!residual_.defined()) residual_ = torch::zeros_like(xf);
  GOSSAMER_CHECK(residual_.sizes() == xf.sizes(), "ErrorFeedback: the tensor's shape changed between rounds");
  residual_.add_(xf);
  EncodeOptions o = options_;
  o.seed = options_.seed + rounds_++;  // fresh stochastic draws every round
  Bytes q = quant::encode(residual_, o);
  auto decoded = quant::decode(q);
  GOSSAMER_CHECK(decoded.ok(), "ErrorFeedback: own payload failed to decode: " + decoded.status().to_string());
  residual_.sub_(decoded->to(at::kFloat));
  return q;
}

void ErrorFeedback::reset() {
  residual_ = at::Tensor();
  rounds_ = 0;
}

Bytes ErrorFeedback::save() const {
  Writer w;
  w.u64(rounds_);
  w.u8(residual_.defined() ? 1 : 0);
  if (residual_.defined()) {
    EncodeOptions raw;
    raw.codec = CodecId::kFp32;
    w.raw(quant::encode(residual_, raw));
  }
  return std::move(w).take();
}

Status ErrorFeedback::load(ByteView bytes) {
  Reader r(bytes, "error-feedback state");
  const std::uint64_t rounds = r.u64();
  const std::uint8_t has = r.u8();
  if (!r.ok()) return r.status();
  if (has > 1) return error(ErrorCode::kMalformed, "error-feedback state: bad presence flag");
  at::Tensor residual;
  if (has == 1) {
    auto t = quant::decode(bytes.subspan(r.position()));
    if (!t.ok()) return t.status().with_context("error-feedback state");
    residual = t->to(at::kFloat);
  } else if (r.remaining() != 0) {
    return error(ErrorCode::kMalformed, "error-feedback state: trailing bytes");
  }
  rounds_ = rounds;
  residual_ = residual;
  return Status();
}

}  // namespace gossamer::quant
