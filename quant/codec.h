// Codecs: a tensor becomes self-describing, versioned bytes and back. This layer never sees a peer.
//
// Codecs are rows of a traits table keyed by CodecId, whose numbers travel on the wire and are never
// renumbered. Scaled codecs cut the flattened tensor into blocks of `block_size` elements, each with
// one scale (absmax / the format's largest magnitude), so the block's largest element is exact.
//
// Payload layout, version 1 (little-endian, field by field):
//   magic      4 bytes "GQNT"
//   version    u8   kPayloadVersion
//   codec      u8   CodecId
//   dtype      u8   SourceDtype: the tensor's dtype, restored by decode()
//   flags      u8   bit 0: body is zstd-compressed; bit 1: encoded with stochastic rounding
//   ndim       u8   <= kMaxDims
//   scale_fmt  u8   ScaleFormat (kNone for unscaled codecs)
//   reserved   u16  0
//   block      u32  elements per scale block (0 for unscaled codecs)
//   dims       i64 x ndim
//   body_len   u64  bytes of body that follow
//   raw_len    u64  only with the zstd flag: body bytes after decompression
//   body       scales (one per block, scale_fmt) then packed values (4-bit codes: two per byte, the
//              element with the lower index in the low nibble)
//
// Decoding is a hostile-input boundary: decode() never throws, never reads out of bounds and never
// allocates more than the header's (capped, cross-checked) sizes imply; it rejects non-finite values
// and scales, so a peer cannot inject NaN or Inf into training. Encoding a tensor that holds NaN or
// Inf, or with invalid options, is a caller bug and throws ContractError.
// Threading: the functions are pure and thread-safe.
#pragma once

#include <span>

#include <ATen/core/Tensor.h>

#include "quant/format.h"

namespace gossamer::quant {

Bytes encode(const at::Tensor& tensor, const EncodeOptions& options);

// Where encode() computes the body. kAuto: a tensor on a GPU is encoded there with LibTorch ops
// (device_encode.h) where the options allow it, and only its payload is copied to the host; anything
// else is copied to the host and encoded by the CPU kernels. The bytes are the same either way; tests
// check that by forcing kTensorOps on CPU tensors.
enum class EncodePath : std::uint8_t { kAuto, kHostKernels, kTensorOps };
Bytes encode(const at::Tensor& tensor, const EncodeOptions& options, EncodePath path);

// The same payload in two pieces, for a gathered send: `head` then `body`. For fp32 without zstd of
// a contiguous CPU float tensor, head is the header alone and body borrows the tensor's own bytes
// (checked finite; no copy), so the tensor must stay alive and unchanged until the bytes are sent.
// Otherwise head is the whole payload and body is empty.
struct EncodedView {
  Bytes head;
  ByteView body;
  std::size_t size() const { return head.size() + body.size(); }
};
EncodedView encode_view(const at::Tensor& tensor, const EncodeOptions& options);
// The same for a flat run of fp32 values (encoded as a 1-D tensor), without making a tensor of them
// when the body is borrowed: what a collective sends many times per step.
EncodedView encode_view(std::span<const float> values, const EncodeOptions& options);
// max_elements: see inspect() in quant/format.h.
[[nodiscard]] Result<at::Tensor> decode(ByteView payload, std::int64_t max_elements = kMaxElements);

}  // namespace gossamer::quant
