// MappedFile: a file mapped read-only into memory, so that a corpus of many gigabytes costs address
// space and page cache instead of heap. Pages are read on first touch and may be dropped by the
// kernel under memory pressure; nothing is copied.
//
// Ownership: a MappedFile owns the mapping and unmaps it on destruction; share it with shared_ptr.
// Threading: the bytes are immutable; any number of threads may read them. Errors: open() returns a
// Status naming the file (missing, unreadable, not a regular file); it never throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

#include "core/status.h"

namespace gossamer {

class MappedFile {
 public:
  // How the pages will be read: kRandom turns off read-ahead (windows drawn at random), kSequential
  // reads ahead (a scan).
  enum class Access { kRandom, kSequential };

  [[nodiscard]] static Result<std::shared_ptr<const MappedFile>> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  // A hint to the kernel; harmless when ignored.
  void advise(Access access) const;
  // Drops this process's pages of bytes [offset, offset + length) (whole pages inside it): they stay
  // in the page cache and are read again on the next touch. Keeps a scan of a large file from
  // growing the resident set.
  void release(std::size_t offset, std::size_t length) const;

 private:
  MappedFile(std::filesystem::path path, const std::uint8_t* data, std::size_t size);
  std::filesystem::path path_;
  const std::uint8_t* data_;
  std::size_t size_;
};

}  // namespace gossamer
