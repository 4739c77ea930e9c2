// libFuzzer target: StateManifest::decode (src/runtime/state_sync.h) on arbitrary bytes. An accepted
// manifest must be within the documented limits, hold one digest per chunk of its size, and re-encode
// to exactly its bytes (nothing ignored, nothing read twice).
#include <cstddef>
#include <cstdint>

#include "records.h"
#include "runtime/state_sync.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace gossamer;
  if (fuzz::seeds_wanted()) {
    Bytes state(5000);
    for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<std::byte>(i * 7);
    fuzz::write_seed("manifest", runtime::Snapshot::make(3, 30, 4, state, 1024)->manifest.encode());
    fuzz::write_seed("empty-state", runtime::Snapshot::make(0, 0, 1, Bytes{}, 64)->manifest.encode());
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gossamer;
  const ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  auto m = runtime::StateManifest::decode(bytes);
  if (!m.ok()) return 0;
  if (m->round < 0 || m->step < 0 || m->shards == 0 || m->chunk_bytes == 0 || m->chunk_bytes > (16u << 20) || m->total > (std::uint64_t{8} << 30)) {
    __builtin_trap();
  }
  if (m->chunks.size() != (m->total + m->chunk_bytes - 1) / m->chunk_bytes) __builtin_trap();
  const Bytes again = m->encode();
  if (again.size() != size || !std::equal(again.begin(), again.end(), bytes.begin())) __builtin_trap();
  return 0;
}
