// Codec formats: the CodecId table, options and the payload header, plus decoding into a float
// buffer. Everything here is free of LibTorch, so the hostile-input boundary (inspect, decode_into)
// can be fuzzed and reused by collectives that decode straight into their own buffers.
// See quant/codec.h for the byte layout. Threading: pure functions, thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer::quant {

enum class CodecId : std::uint8_t {
  kFp32 = 0,
  kBf16 = 1,
  kInt8 = 2,
  kFp8E4M3 = 3,
  kFp8E5M2 = 4,
  kFp16 = 5,
  kInt4 = 6,
  kFp4E3M0 = 7,
  kFp4E2M1 = 8,
  // 2 bits per value, four levels (code - 1.5) x the block's scale, which is the block's RMS (not its
  // absmax): about the best 4-level uniform quantizer of a bell-shaped block. Values beyond 2 RMS
  // clip to 1.5 RMS; meant for error-fed updates (MuLoCo), which carry what is clipped to the next.
  kInt2 = 9,
};
inline constexpr int kNumCodecs = 10;
static_assert(static_cast<int>(CodecId::kFp8E4M3) == 3 && static_cast<int>(CodecId::kInt2) == 9,
              "CodecId values travel on the wire: never renumber, only append");

enum class ScaleFormat : std::uint8_t { kNone = 0, kFp32 = 1, kBf16 = 2 };
static_assert(static_cast<int>(ScaleFormat::kBf16) == 2, "ScaleFormat values travel on the wire");

enum class SourceDtype : std::uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kFloat64 = 3 };
static_assert(static_cast<int>(SourceDtype::kFloat64) == 3, "SourceDtype values travel on the wire");

enum class Rounding : std::uint8_t { kNearestEven = 0, kStochastic = 1 };

inline constexpr std::uint8_t kPayloadVersion = 1;
inline constexpr char kPayloadMagic[4] = {'G', 'Q', 'N', 'T'};
inline constexpr std::uint8_t kFlagZstd = 1u << 0;
inline constexpr std::uint8_t kFlagStochastic = 1u << 1;
inline constexpr int kMaxDims = 8;
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 34;  // 64 GiB of fp32: refuse more
inline constexpr std::uint32_t kMaxBlockSize = 1u << 20;

struct CodecTraits {
  CodecId id;
  std::string_view name;  // "fp4_e2m1": what configs and reports call it
  int bits;               // per value
  bool scaled;            // blockwise scales
  float max_magnitude;    // largest finite magnitude of the element format (scaled codecs)
  int mantissa_bits = 0;  // minifloats (fp8, fp4): the element format's mantissa bits and exponent bias
  int exponent_bias = 0;
};

// The table, indexed by CodecId.
const std::array<CodecTraits, kNumCodecs>& codec_table();
const CodecTraits& traits(CodecId id);
[[nodiscard]] Result<CodecId> codec_from_name(std::string_view name);

struct EncodeOptions {
  CodecId codec = CodecId::kFp32;
  std::uint32_t block_size = 128;
  ScaleFormat scale_format = ScaleFormat::kFp32;  // for scaled codecs
  Rounding rounding = Rounding::kNearestEven;
  std::uint64_t seed = 0;  // stochastic rounding: element i's draw depends only on (seed, i)
  bool zstd = false;
  int zstd_level = 3;
};

// Bits each value really costs on the wire: value bits plus the scale's share (headers excluded).
double bits_per_value(const EncodeOptions& options);

// Bytes of a payload's body (scales and packed values, before zstd) for n elements.
std::size_t body_bytes(CodecId codec, std::size_t n, std::uint32_t block, ScaleFormat scale_format);

// The header alone (for accounting and routing without decoding the body).
struct PayloadInfo {
  CodecId codec;
  SourceDtype dtype;
  ScaleFormat scale_format;
  std::uint32_t block_size;
  bool zstd;
  bool stochastic;
  std::vector<std::int64_t> shape;
  std::int64_t numel;
  std::size_t header_bytes;
};
// max_elements: the most values this receiver will accept. A receiver that knows what it expects (a
// fragment's size) should say so: a zstd body can legitimately expand a thousandfold, so only the
// caller can bound what a small payload may make it allocate.
[[nodiscard]] Result<PayloadInfo> inspect(ByteView payload, std::int64_t max_elements = kMaxElements);

// Decodes the payload's values as float32 into `out`, which must hold exactly info.numel values
// (info from inspect() of the same payload). Errors as decode().
[[nodiscard]] Status decode_into(ByteView payload, std::span<float> out);
// Decodes the payload and adds its values to `acc` (acc[i] += value[i]), without a buffer of the
// payload's size: the reduction step of the quantized all-reduce. Errors as decode(); on an error
// `acc` may hold a partial sum (the caller discards it).
[[nodiscard]] Status decode_add(ByteView payload, std::span<float> acc);

// One term of mean_into: a payload (untrusted, any codec), or, when `payload` is empty, the caller's
// own fp32 values.
struct MeanTerm {
  ByteView payload;
  std::span<const float> values;
};
// The mean of the terms, each of out.size() values: summed in fp32 in the order given, then divided
// by `divisor`, into `out` (the owner's step of the quantized all-reduce; bit for bit what
// decode_into of the first, decode_add of the others and a division give). When every term is fp32
// it is one pass, a cache-sized block at a time, so each input is read once. Errors: a payload as
// decode_into, or non-finite own values (kMalformed), with `failed` its index; a mean that overflows
// float32 although every term is finite is kOutOfRange with `failed` -1. On an error `out` holds
// partial sums.
[[nodiscard]] Status mean_into(std::span<const MeanTerm> terms, float divisor, std::span<float> out, std::ptrdiff_t& failed);

}  // namespace gossamer::quant
