// Whole-file I/O with the guarantees checkpoints and run folders need.
// write_file_atomic writes (one buffer, or parts in order) to a temporary file in the same folder,
// fsyncs it, renames it over the target and fsyncs the folder: a crash at any point leaves either the
// old file or the new one, never a torn one. read_file refuses files larger than a cap before
// allocating. digest_file fingerprints a file a run reads, to notice later that it changed. Errors are
// Status values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "core/bytes.h"
#include "core/hash.h"
#include "core/status.h"

namespace gossamer {

[[nodiscard]] Status write_file_atomic(const std::filesystem::path& path, ByteView data);
// The same for a file made of several parts written in order, none copied into one buffer first.
[[nodiscard]] Status write_file_atomic(const std::filesystem::path& path, std::span<const ByteView> parts);
[[nodiscard]] Result<Bytes> read_file(const std::filesystem::path& path, std::size_t max_bytes);
[[nodiscard]] Result<std::string> read_text_file(const std::filesystem::path& path, std::size_t max_bytes);

// A file's size and the BLAKE2b digest of its content. A file larger than kWholeDigestBytes is
// digested by kDigestSamples blocks of 1 MiB spread evenly over it (its first and last included),
// with its size, so that pinning a dataset of many gigabytes takes a fraction of a second; `sampled`
// says so (a change that touches none of those blocks and keeps the size then goes unseen).
inline constexpr std::uint64_t kWholeDigestBytes = std::uint64_t{1} << 30;
inline constexpr std::uint64_t kDigestSamples = 256;
struct FileDigest {
  std::uint64_t size = 0;
  Digest digest;
  bool sampled = false;
};
[[nodiscard]] Result<FileDigest> digest_file(const std::filesystem::path& path);

}  // namespace gossamer
