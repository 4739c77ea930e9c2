// Byte buffers shared by every layer: Bytes owns, ByteView borrows.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

namespace gossamer {

using Bytes = std::vector<std::byte>;
using ByteView = std::span<const std::byte>;

inline ByteView as_bytes(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }
inline std::string_view as_string_view(ByteView b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

}  // namespace gossamer
