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

#include <array>
#include <cstdint>
#include <string_view>

#include <ATen/core/Tensor.h>

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
};
inline constexpr int kNumCodecs = 9;
static_assert(static_cast<int>(CodecId::kFp8E4M3) == 3 && static_cast<int>(CodecId::kFp4E2M1) == 8,
              "CodecId values travel on the wire: never renumber, only append");

enum class ScaleFormat : std::uint8_t { kNone = 0, kFp32 = 1, kBf16 = 2 };
static_assert(static_cast<int>(ScaleFormat::kBf16) == 2, "ScaleFormat values travel on the wire");

enum class SourceDtype : std::uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kFloat64 = 3 };
static_assert(static_cast<int>(SourceDtype::kFloat64) == 3, "SourceDtype values travel on the wire");

enum class Rounding : std::uint8_t { kNearestEven = 0, kStochastic = 1 };

inline constexpr std::uint8_t kPayloadVersion = 1;
inline constexpr int kMaxDims = 8;
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 34;  // 64 GiB of fp32: refuse more
inline constexpr std::uint32_t kMaxBlockSize = 1u << 20;

struct CodecTraits {
  CodecId id;
  std::string_view name;  // "fp4_e2m1": what configs and reports call it
  int bits;               // per value
  bool scaled;            // blockwise scales
  float max_magnitude;    // largest finite magnitude of the element format (scaled codecs)
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

Bytes encode(const at::Tensor& tensor, const EncodeOptions& options);
[[nodiscard]] Result<at::Tensor> decode(ByteView payload);

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
[[nodiscard]] Result<PayloadInfo> inspect(ByteView payload);

}  // namespace gossamer::quant
