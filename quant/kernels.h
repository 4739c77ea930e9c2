// Hot loops of the codecs on contiguous float spans: no tensor ops, no allocation, written so GCC
// vectorizes them. codec.cpp wraps them with the payload format; tests compare them with the plain
// LibTorch-ops reference in reference.h.
// Threading: pure functions. Preconditions (sizes, finite input) are the caller's (codec.cpp checks).
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/format.h"

namespace gossamer::quant::kernels {

// bf16 / fp16 (2 bytes per value, little-endian) to float; false if any value is NaN or Inf. (Encoding
// to bf16 and fp16 uses LibTorch's vectorized conversions.)
bool decode_bf16(const std::uint8_t* in, std::size_t n, float* out);
bool decode_fp16(const std::uint8_t* in, std::size_t n, float* out);
// fp32 (little-endian) copied into `out` / added to `acc`, in one pass; false if any value is NaN or Inf.
bool copy_finite_fp32(const std::uint8_t* in, std::size_t n, float* out);
bool add_fp32(const std::uint8_t* in, std::size_t n, float* acc);
// x[i] /= divisor; false if any result is NaN or Inf.
bool divide_finite_fp32(float* x, std::size_t n, float divisor);
// False if any value is NaN or Inf.
bool check_finite_fp32(const std::uint8_t* in, std::size_t n);
bool check_finite_bf16(const std::uint8_t* in, std::size_t n);
bool check_finite_fp16(const std::uint8_t* in, std::size_t n);

// Scaled codecs. `scales` receives one scale per block (4 bytes fp32 or 2 bytes bf16), `codes` the
// packed values (1 byte each, 2 per byte for 4-bit codecs, 4 per byte for int2). `first_index` is the global index of
// x[0], so stochastic draws depend only on (seed, element index). Returns false if x holds NaN/Inf.
bool encode_scaled(CodecId codec, const float* x, std::size_t n, std::uint32_t block, ScaleFormat scale_format,
                   Rounding rounding, std::uint64_t seed, std::uint8_t* scales, std::uint8_t* codes);
// Returns false if a scale is negative or not finite, or a code decodes to NaN/Inf.
bool decode_scaled(CodecId codec, const std::uint8_t* scales, const std::uint8_t* codes, std::size_t n, std::uint32_t block,
                   ScaleFormat scale_format, float* out);

// The value of every code of a scaled codec's element format, before scaling (NaN for codes that
// must not appear). 256 entries for 8-bit formats, 16 for 4-bit ones, 4 for int2.
const float* code_values(CodecId codec);

std::size_t scale_bytes(ScaleFormat f);
std::size_t packed_bytes(CodecId codec, std::size_t n);

// Scalar conversions, exposed for tests.
std::uint16_t float_to_bf16(float x);
float bf16_to_float(std::uint16_t b);
std::uint16_t float_to_fp16(float x);
float fp16_to_float(std::uint16_t h);

}  // namespace gossamer::quant::kernels
