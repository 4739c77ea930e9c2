// SnapshotStore: where a newcomer's snapshot of the run's state goes as its chunks arrive, so that a
// state is bounded by the disk and not by one buffer, and a newcomer killed mid-transfer resumes from
// the chunks it already verified (docs/joining.md).
//
// A real peer keeps it in its run folder (two files: the manifest, written first, and the state,
// written chunk by chunk where it belongs); a simulated worker in memory that outlives its crash.
// Nothing in it is trusted on the way back: prepare() hashes what it holds against the manifest of
// the snapshot about to be fetched and keeps only the chunks that match, so a torn write, a file
// edited by hand, or the state of another round costs only a fetch again.
//
// Threading: write() may be called from several threads at once for distinct ranges; the other calls
// from one thread, not during writes. Errors: kResourceExhausted when the state does not fit (the
// disk's free space, or a memory store's bound), kIoError when the file system refuses.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/bytes.h"
#include "core/status.h"
#include "runtime/state_sync.h"

namespace gossamer::runtime {

class SnapshotStore {
 public:
  virtual ~SnapshotStore() = default;
  // Makes room for the snapshot `manifest` describes and says which of its chunks it already holds,
  // verified against the manifest's hashes (a resumed transfer); whatever else it held is dropped.
  [[nodiscard]] virtual Result<std::vector<bool>> prepare(const StateManifest& manifest) = 0;
  // Writes bytes of the snapshot being fetched at `offset` (within the manifest's total).
  [[nodiscard]] virtual Status write(std::uint64_t offset, ByteView bytes) = 0;
  // The snapshot as stored, once every chunk is in; valid until prepare() or clear().
  [[nodiscard]] virtual Result<ByteView> contents() = 0;
  // Forgets the snapshot (it was taken): nothing is kept for a later resume.
  virtual void clear() = 0;
};

// In memory, up to `max_bytes` (a larger state is refused before anything is allocated).
std::shared_ptr<SnapshotStore> make_memory_store(std::uint64_t max_bytes = std::uint64_t{8} << 30);

// In the folder `dir` (a run folder): the files train::kJoinStateFile and train::kJoinManifestFile.
std::shared_ptr<SnapshotStore> make_file_store(std::filesystem::path dir);

}  // namespace gossamer::runtime
