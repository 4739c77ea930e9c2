// Sparse payloads: SparseLoCo's top-k of each chunk, its values in 2 bits (arXiv 2508.15706). Free of
// LibTorch, like quant/format.h, so the hostile-input boundary can be fuzzed.
//
// Encoding: the flat values are cut into chunks of `chunk` values (the last may be shorter). In each
// chunk the k = min(topk, chunk length) values of largest magnitude are kept (ties: the lower index),
// and their indices sorted. Their magnitudes are split at t, the mean kept magnitude: those <= t form
// the low bin, the others the high bin, and each bin's level is the mean magnitude in it (the chunk's
// two fp32 levels; an empty bin's level is t). A kept value travels as 2 bits: its sign and its bin,
// and decodes to +-level. Every value not kept decodes to 0.
//
// Payload layout, version 1 (little-endian):
//   magic      4 bytes "GSPR"
//   version    u8   kSparseVersion
//   value_bits u8   2 (the only width there is)
//   reserved   u16  0
//   elements   u64  n, the dense length
//   chunk      u32  values per chunk, in [2, kMaxSparseChunk]
//   topk       u32  values kept per chunk, in [1, chunk]
//   body_len   u64  bytes of body that follow (exactly sparse_body_bytes())
//   body       levels: 2 x f32 (low, high) per chunk, in chunk order
//              indices: one per kept value, ceil(log2(chunk)) bits each (the index within its chunk),
//                chunk after chunk, packed least significant bit first, zero-padded to a byte
//              codes: 2 bits per kept value in the same order (bit 0: high bin, bit 1: negative),
//                packed least significant bit first, zero-padded to a byte
//
// Decoding never throws, never reads out of bounds, never allocates more than the receiver's stated
// maximum implies, and refuses what an encoder cannot produce: levels that are negative, non-finite or
// out of order, indices outside their chunk or not strictly increasing, nonzero padding. Encoding
// values that hold NaN or Inf, or invalid options, is a caller bug and throws ContractError.
// Threading: pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <span>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer::quant {

inline constexpr std::uint8_t kSparseVersion = 1;
inline constexpr char kSparseMagic[4] = {'G', 'S', 'P', 'R'};
inline constexpr std::uint32_t kMaxSparseChunk = 1u << 20;
inline constexpr std::size_t kSparseHeaderBytes = 32;

struct SparseOptions {
  std::uint32_t chunk = 4096;
  std::uint32_t topk = 64;  // 1.56% of a full chunk
};

// Bits of one index within a chunk of `chunk` values: ceil(log2(chunk)).
int sparse_index_bits(std::uint32_t chunk);
// Values kept from n: the sum over chunks of min(topk, chunk length).
std::uint64_t sparse_kept(std::uint64_t n, const SparseOptions& options);
// Body bytes for n values (levels, indices, codes) and the whole payload (header included).
std::uint64_t sparse_body_bytes(std::uint64_t n, const SparseOptions& options);
inline std::uint64_t sparse_payload_bytes(std::uint64_t n, const SparseOptions& options) { return kSparseHeaderBytes + sparse_body_bytes(n, options); }
// Bits one dense value costs on the wire, header excluded (for plans and reports).
double sparse_bits_per_value(const SparseOptions& options);

// Encodes `values`. When `decoded` is not empty (same length), it receives what a receiver decodes
// (the kept values' levels, zeros elsewhere): what error feedback subtracts. `scale` multiplies the
// levels that travel (not `decoded`): a simulated poisoned worker's (-1 flips the signs); 1 otherwise.
Bytes encode_sparse(std::span<const float> values, const SparseOptions& options, std::span<float> decoded = {}, double scale = 1.0);

struct SparseInfo {
  std::int64_t numel = 0;
  SparseOptions options;
};
// Checks the header (and that the body has exactly the size it implies). max_elements: the most
// values this receiver accepts.
[[nodiscard]] Result<SparseInfo> inspect_sparse(ByteView payload, std::int64_t max_elements);
// Adds the payload's values to `acc` (acc.size() must be its numel): the decoded kept values at their
// indices. Validates everything first, so on an error `acc` is unchanged.
[[nodiscard]] Status decode_sparse_add(ByteView payload, std::span<float> acc);
// The squared L2 norm of the payload's decoded values (validated as decode_sparse_add).
[[nodiscard]] Result<double> sparse_norm2(ByteView payload, std::int64_t numel);

}  // namespace gossamer::quant
