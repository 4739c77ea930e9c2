// Whole-file I/O with the guarantees checkpoints and run folders need.
// write_file_atomic writes to a temporary file in the same folder, fsyncs it, renames it over the
// target and fsyncs the folder: a crash at any point leaves either the old file or the new one, never
// a torn one. read_file refuses files larger than a cap before allocating. Errors are Status values.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer {

[[nodiscard]] Status write_file_atomic(const std::filesystem::path& path, ByteView data);
[[nodiscard]] Result<Bytes> read_file(const std::filesystem::path& path, std::size_t max_bytes);
[[nodiscard]] Result<std::string> read_text_file(const std::filesystem::path& path, std::size_t max_bytes);

}  // namespace gossamer
