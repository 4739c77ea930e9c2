#include "core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

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

Status write_file_atomic(const std::filesystem::path& path, ByteView data) {
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return os_error("cannot create", tmp);
  std::size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status st = os_error("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return st;
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    Status st = os_error("cannot fsync", tmp);
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

}  // namespace gossamer
