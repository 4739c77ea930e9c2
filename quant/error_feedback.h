// ErrorFeedback: a stateful codec wrapper for one fragment, so a lossy codec does not drift.
//   e <- e + x;  q = Q(e);  e <- e - D(q);  send q
// What quantization drops in one round is carried into the next, so the sum of everything decoded
// over many rounds tracks the sum of the inputs to within one round's quantization error.
// Ownership: owns its residual. Threading: one thread per instance. Misuse (a shape change between
// calls) throws ContractError; load() of bytes is untrusted and returns a Status.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "quant/codec.h"

namespace gossamer::quant {

class ErrorFeedback {
 public:
  explicit ErrorFeedback(EncodeOptions options);

  Bytes encode(const at::Tensor& x);
  // The carried error e (fp32; undefined before the first encode or after reset()).
  const at::Tensor& residual() const { return residual_; }
  void reset();

  // The residual as an fp32 payload, and back (for checkpoints).
  Bytes save() const;
  [[nodiscard]] Status load(ByteView bytes);

 private:
  EncodeOptions options_;
  at::Tensor residual_;
  std::uint64_t rounds_ = 0;
};

}  // namespace gossamer::quant
