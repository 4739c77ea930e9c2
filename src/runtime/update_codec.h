// The bytes of one kept update (optim/updates.h): what a donor serves a newcomer that catches up
// and what the newcomer replays. An update the all-reduce sent in a quantized codec is kept in the
// codec's own bytes, the mean's payloads as every member decoded them (optim/mean_tap.h), so it
// costs what the round cost on the wire (int8: a quarter of fp32, fp4: an eighth) and replays bit
// for bit; any other update is kept in fp32.
//
// Layout, version 1 (little-endian, field by field):
//   magic    4 bytes "GUPD"
//   version  u8   kUpdateVersion
//   kind     u8   UpdateKind: 0 fp32 values, 1 quantized payloads
//   reserved u16  0
//   numel    u64  values of the update
//   kFp32:   numel x f32
//   kPayloads: count u32, then count x (u32 length, quantized tensor: quant/codec.h), whose values
//            follow one another and add up to numel (a payload may hold none: an all-reduce's
//            empty segment)
//
// Decoding is a hostile-input boundary (the bytes come from a donor): never throws, refuses more
// than the caller's `max_values` before allocating, and refuses non-finite values.
// Threading: pure functions. No LibTorch here (fuzzed with clang).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer::runtime {

inline constexpr char kUpdateMagic[4] = {'G', 'U', 'P', 'D'};
inline constexpr std::uint8_t kUpdateVersion = 1;
inline constexpr std::size_t kUpdateHeaderBytes = 16;
enum class UpdateKind : std::uint8_t { kFp32 = 0, kPayloads = 1 };
static_assert(static_cast<int>(UpdateKind::kPayloads) == 1, "UpdateKind values travel on the wire");

// The update's bytes: `payloads` when given (they must decode to `values`; the caller checked it,
// optim::MeanTap::take does), else `values` in fp32.
Bytes encode_update(std::span<const float> values, const std::optional<std::vector<Bytes>>& payloads = std::nullopt);
// The number of values the update holds (its header checked, and that it holds at most
// `max_values`): what to set aside for decode_update.
[[nodiscard]] Result<std::int64_t> update_values(ByteView bytes, std::int64_t max_values);
// Its values into `out`, which holds exactly update_values() of them. On an error `out` holds a part.
[[nodiscard]] Status decode_update(ByteView bytes, std::span<float> out);

}  // namespace gossamer::runtime
