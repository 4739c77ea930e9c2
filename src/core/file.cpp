#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

namespace gossamer {

namespace {

Status os_error(const std::string& what, const std::filesystem::path& path) {
  return error(ErrorCode::kIoError, what + " " + path.string() + ": " + std::strerror(errno));
}

Status fsync_path(const std::filesystem::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return os_error("cannot fsync", path);
  return Status();
}

}  // namespace

Status write_file_atomic(const std::filesystem::path& path, ByteView data) { return write_file_atomic(path, std::span<const ByteView>(&data, 1)); }

Status write_file_atomic(const std::filesystem::path& path, std::span<const ByteView> parts) {
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return os_error("cannot create", path);
  for (const ByteView data : parts) {
    std::size_t written = 0;
    while (written < data.size()) {
      const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
      if (n < 0) {
        if (errno == EINTR) continue;
        Status st = os_error("cannot write", path);
        ::close(fd);
        ::unlink(tmp.c_str());
        return st;
      }
      written += static_cast<std::size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    Status st = os_error("cannot fsync", path);
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status st = os_error("cannot rename onto", path);
    ::unlink(tmp.c_str());
    return st;
  }
  return fsync_path(dir, O_RDONLY | O_DIRECTORY);
}

Result<Bytes> read_file(const std::filesystem::path& path, std::size_t max_bytes) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return error(ErrorCode::kNotFound, "no such file: " + path.string());
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return error(ErrorCode::kIoError, "cannot stat " + path.string() + ": " + ec.message());
  if (size > max_bytes) {
    return error(ErrorCode::kOutOfRange, path.string() + " is " + std::to_string(size) + " bytes, more than the limit of " +
                                             std::to_string(max_bytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return os_error("cannot open", path);
  Bytes out(size);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(size));
  if (static_cast<std::size_t>(in.gcount()) != size) return error(ErrorCode::kIoError, "short read of " + path.string());
  return out;
}

Result<std::string> read_text_file(const std::filesystem::path& path, std::size_t max_bytes) {
  auto bytes = read_file(path, max_bytes);
  if (!bytes.ok()) return bytes.status();
  return std::string(as_string_view(*bytes));
}

Result<FileDigest> digest_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const Status failed = os_error("cannot stat", path);
    ::close(fd);
    return failed;
  }
  constexpr std::uint64_t kBlock = 1 << 20;
  FileDigest out;
  out.size = static_cast<std::uint64_t>(st.st_size);
  out.sampled = out.size > kWholeDigestBytes;
  Hasher hasher;
  std::vector<std::byte> block(kBlock);
  // Reads [offset, offset + length) into the digest; false on a read error.
  auto take = [&](std::uint64_t offset, std::uint64_t length) {
    while (length > 0) {
      const ssize_t n = ::pread(fd, block.data(), static_cast<std::size_t>(std::min(length, kBlock)), static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return n == 0;  // a file that shrank while read: digested as it was read
      hasher.update(ByteView(block.data(), static_cast<std::size_t>(n)));
      offset += static_cast<std::uint64_t>(n);
      length -= static_cast<std::uint64_t>(n);
    }
    return true;
  };
  bool ok = true;
  if (!out.sampled) {
    ok = take(0, out.size);
  } else {
    const std::uint64_t size_le = out.size;  // the size is part of what is digested
    hasher.update(ByteView(reinterpret_cast<const std::byte*>(&size_le), sizeof size_le));
    const std::uint64_t span = out.size - kBlock;
    const std::uint64_t gaps = kDigestSamples - 1;  // offset span * i / gaps, without overflow
    for (std::uint64_t i = 0; i < kDigestSamples && ok; ++i) ok = take(span / gaps * i + span % gaps * i / gaps, kBlock);
  }
  const Status failed = ok ? Status() : os_error("cannot read", path);
  ::close(fd);
  if (!failed.ok()) return failed;
  out.digest = hasher.finish();
  return out;
}

}  // namespace gossamer
