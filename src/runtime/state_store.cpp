#include "runtime/state_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>

#include <spdlog/spdlog.h>

#include "core/file.h"
#include "core/hash.h"
#include "core/mapped_file.h"
#include "train/run_folder.h"

namespace gossamer::runtime {

namespace fs = std::filesystem;

namespace {

// The chunks of `manifest` that `data` (a copy of the snapshot kept from before) already holds.
std::vector<bool> chunks_held(const StateManifest& manifest, const MappedFile* file, ByteView data) {
  std::vector<bool> held(manifest.chunks.size(), false);
  for (std::size_t i = 0; i < manifest.chunks.size(); ++i) {
    const auto [at, n] = manifest.range(i);
    if (at + n > data.size()) break;
    held[i] = digest_of(ByteView(data.data() + at, n)) == manifest.chunks[i];
    if (file) file->release(at, n);  // a scan of a large file keeps no more of it resident than a chunk
  }
  return held;
}

class MemoryStore final : public SnapshotStore {
 public:
  explicit MemoryStore(std::uint64_t max_bytes) : max_(max_bytes) {}

  Result<std::vector<bool>> prepare(const StateManifest& manifest) override {
    if (manifest.total > max_) {
      return error(ErrorCode::kResourceExhausted, "the state is " + std::to_string(manifest.total) + " bytes, more than the " +
                                                      std::to_string(max_) + " this newcomer keeps in memory");
    }
    std::vector<bool> held(manifest.chunks.size(), false);
    if (manifest_ && manifest_->total == manifest.total && manifest_->chunk_bytes == manifest.chunk_bytes) {
      held = chunks_held(manifest, nullptr, bytes_);
    } else {
      bytes_.assign(manifest.total, std::byte{0});
    }
    manifest_ = manifest;
    return held;
  }

  Status write(std::uint64_t offset, ByteView bytes) override {
    if (!manifest_ || offset + bytes.size() > bytes_.size()) throw std::logic_error("SnapshotStore::write out of the snapshot's range");
    if (!bytes.empty()) std::memcpy(bytes_.data() + offset, bytes.data(), bytes.size());
    return Status();
  }

  Result<ByteView> contents() override {
    if (!manifest_) return error(ErrorCode::kNotFound, "no snapshot stored");
    return ByteView(bytes_.data(), bytes_.size());
  }

  void clear() override {
    manifest_.reset();
    Bytes().swap(bytes_);
  }

 private:
  const std::uint64_t max_;
  std::optional<StateManifest> manifest_;
  Bytes bytes_;
};

class FileStore final : public SnapshotStore {
 public:
  explicit FileStore(fs::path dir) : data_path_(dir / train::kJoinStateFile), manifest_path_(dir / train::kJoinManifestFile), dir_(std::move(dir)) {}
  ~FileStore() override { close(); }

  Result<std::vector<bool>> prepare(const StateManifest& manifest) override {
    close();
    std::vector<bool> held(manifest.chunks.size(), false);
    // What it kept from before (a transfer cut short): reused chunk by chunk where the layout is the
    // same and the hashes match the new manifest.
    std::error_code ec;
    const auto kept_size = fs::file_size(data_path_, ec);
    bool reuse = false;
    if (!ec && kept_size == manifest.total) {
      if (auto old = read_file(manifest_path_, std::size_t{16} << 20); old.ok()) {
        auto m = StateManifest::decode(*old);
        reuse = m.ok() && m->total == manifest.total && m->chunk_bytes == manifest.chunk_bytes;
      }
    }
    if (reuse) {
      auto mapped = MappedFile::open(data_path_);
      if (mapped.ok()) {
        (*mapped)->advise(MappedFile::Access::kSequential);
        held = chunks_held(manifest, mapped->get(), ByteView(reinterpret_cast<const std::byte*>((*mapped)->data()), (*mapped)->size()));
      }
    } else {
      fs::remove(data_path_, ec);
      // Room on the disk for the whole state, known before the first byte is fetched.
      const auto space = fs::space(dir_, ec);
      constexpr std::uint64_t kMargin = std::uint64_t{64} << 20;
      if (!ec && space.available < manifest.total + kMargin) {
        return error(ErrorCode::kResourceExhausted,
                     "the run's state is " + std::to_string(manifest.total / 1000000) + " MB and " + dir_.string() + " has " +
                         std::to_string(space.available / 1000000) + " MB free: free some space there or give the peer another --out");
      }
    }
    // The manifest first: the state file is then always read against the snapshot it belongs to.
    if (Status st = write_file_atomic(manifest_path_, manifest.encode()); !st.ok()) return st.with_context("keeping the state's manifest");
    fd_ = ::open(data_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return io_error("cannot open " + data_path_.string());
    if (::ftruncate(fd_, static_cast<off_t>(manifest.total)) != 0) return io_error("cannot size " + data_path_.string());
    // The blocks themselves, reserved now (a file of that size may be sparse): the disk filling up
    // later cannot cut the transfer short.
    if (manifest.total > 0) {
      const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(manifest.total));
      if (rc == ENOSPC) {
        return error(ErrorCode::kResourceExhausted, "no room for the run's state (" + std::to_string(manifest.total / 1000000) + " MB) in " +
                                                        dir_.string() + ": free some space there or give the peer another --out");
      }
      if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
        errno = rc;
        return io_error("cannot reserve room in " + data_path_.string());
      }
    }
    total_ = manifest.total;
    return held;
  }

  Status write(std::uint64_t offset, ByteView bytes) override {
    if (fd_ < 0 || offset + bytes.size() > total_) throw std::logic_error("SnapshotStore::write out of the snapshot's range");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return io_error("cannot write " + data_path_.string());
      done += static_cast<std::size_t>(n);
    }
    return Status();
  }

  Result<ByteView> contents() override {
    if (fd_ < 0) return error(ErrorCode::kNotFound, "no snapshot stored");
    if (!mapped_) {
      auto m = MappedFile::open(data_path_);
      if (!m.ok()) return m.status();
      mapped_ = std::move(*m);
    }
    return ByteView(reinterpret_cast<const std::byte*>(mapped_->data()), mapped_->size());
  }

  void clear() override {
    close();
    std::error_code ec;
    fs::remove(data_path_, ec);
    fs::remove(manifest_path_, ec);
  }

 private:
  void close() {
    mapped_.reset();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    total_ = 0;
  }
  static Status io_error(const std::string& what) { return error(ErrorCode::kIoError, what + ": " + std::strerror(errno)); }

  const fs::path data_path_, manifest_path_, dir_;
  int fd_ = -1;
  std::uint64_t total_ = 0;
  std::shared_ptr<const MappedFile> mapped_;
};

}  // namespace

std::shared_ptr<SnapshotStore> make_memory_store(std::uint64_t max_bytes) { return std::make_shared<MemoryStore>(max_bytes); }

std::shared_ptr<SnapshotStore> make_file_store(fs::path dir) { return std::make_shared<FileStore>(std::move(dir)); }

}  // namespace gossamer::runtime
