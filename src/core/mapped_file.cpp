#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gossamer {

namespace {
// The few bytes an empty file maps to: mmap refuses a length of 0.
const std::uint8_t kEmpty[1] = {0};
}  // namespace

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const auto code = errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError;
    return error(code, "cannot open " + path.string() + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return error(ErrorCode::kIoError, "cannot stat " + path.string() + ": " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return error(ErrorCode::kInvalidArgument, path.string() + " is not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  const std::uint8_t* data = kEmpty;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return error(ErrorCode::kIoError, "cannot map " + path.string() + ": " + why);
    }
    data = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size));
}

MappedFile::MappedFile(std::filesystem::path path, const std::uint8_t* data, std::size_t size)
    : path_(std::move(path)), data_(data), size_(size) {}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

void MappedFile::advise(Access access) const {
  if (size_ == 0) return;
  ::madvise(const_cast<std::uint8_t*>(data_), size_, access == Access::kRandom ? MADV_RANDOM : MADV_SEQUENTIAL);
}

void MappedFile::release(std::size_t offset, std::size_t length) const {
  if (size_ == 0 || offset >= size_) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t begin = (offset + page - 1) / page * page;
  const std::size_t end = std::min(size_, offset + length) / page * page;
  if (end > begin) ::madvise(const_cast<std::uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace gossamer
