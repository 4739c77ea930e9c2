#include "runtime/pipeline_agreement.h"

#include "core/wire.h"

namespace gossamer::runtime::pipeline_agreement {

namespace {

Status check_version(Reader& r, const std::string& what) {
  const std::uint8_t version = r.u8();
  if (!r.ok()) return r.status();
  if (version != kVersion) {
    return error(ErrorCode::kMalformed, what + " of version " + std::to_string(version) + ", this node reads " + std::to_string(kVersion) +
                                            ": run the same gossamer version on every node");
  }
  return Status();
}

}  // namespace

Bytes encode_commit(std::uint64_t iteration) {
  Writer w;
  w.u8(kVersion);
  w.u64(iteration);
  return std::move(w).take();
}

Result<std::uint64_t> decode_commit(ByteView bytes, const std::string& from) {
  Reader r(bytes, "pipeline commit from " + from);
  if (Status st = check_version(r, "a pipeline commit from " + from); !st.ok()) return st;
  const std::uint64_t iteration = r.u64();
  r.expect_end();
  if (!r.ok()) return r.status();
  return iteration;
}

Bytes encode_view(const View& view) {
  Writer w;
  w.u8(kVersion);
  w.u64(view.done);
  for (bool b : view.reaches) w.u8(b ? 1 : 0);
  return std::move(w).take();
}

Result<View> decode_view(ByteView bytes, int nodes, const std::string& from) {
  Reader r(bytes, "pipeline view from " + from);
  if (Status st = check_version(r, "a pipeline view from " + from); !st.ok()) return st;
  View v;
  v.done = r.u64();
  v.reaches.resize(static_cast<std::size_t>(nodes));
  for (int k = 0; k < nodes && r.ok(); ++k) {
    const std::uint8_t flag = r.u8();
    if (r.ok() && flag > 1) return error(ErrorCode::kMalformed, "a pipeline view from " + from + " with flag " + std::to_string(flag) + " for node " + std::to_string(k));
    v.reaches[static_cast<std::size_t>(k)] = flag == 1;
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  return v;
}

}  // namespace gossamer::runtime::pipeline_agreement
