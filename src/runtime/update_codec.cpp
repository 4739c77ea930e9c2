#include "runtime/update_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "core/wire.h"
#include "quant/format.h"

namespace gossamer::runtime {

static_assert(std::endian::native == std::endian::little, "fp32 updates are the host's floats: little-endian hosts only");

namespace {

struct Header {
  UpdateKind kind = UpdateKind::kFp32;
  std::uint64_t numel = 0;
};

// Reads and checks the header; `r` is left at the body.
Result<Header> read_header(Reader& r, std::uint64_t max_values) {
  const ByteView magic = r.raw(4);
  const std::uint8_t version = r.u8();
  const std::uint8_t kind = r.u8();
  const std::uint16_t reserved = r.u16();
  const std::uint64_t numel = r.u64();
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kUpdateMagic, 4) != 0) return error(ErrorCode::kMalformed, "update: bad magic (not an update)");
  if (version != kUpdateVersion) {
    return error(ErrorCode::kVersionMismatch, "update: version " + std::to_string(version) + ", this peer reads " + std::to_string(kUpdateVersion) +
                                                  ": run one version of gossamer across the run");
  }
  if (reserved != 0) return error(ErrorCode::kMalformed, "update: reserved field is not zero");
  if (kind > static_cast<std::uint8_t>(UpdateKind::kPayloads)) return error(ErrorCode::kMalformed, "update: unknown kind " + std::to_string(kind));
  if (numel > max_values) {
    return error(ErrorCode::kOutOfRange, "update: " + std::to_string(numel) + " values, more than the " + std::to_string(max_values) + " expected");
  }
  if (kind == static_cast<std::uint8_t>(UpdateKind::kFp32) && r.remaining() != numel * sizeof(float)) {
    return error(ErrorCode::kMalformed, "update: " + std::to_string(r.remaining()) + " bytes of values for " + std::to_string(numel) + " fp32 values");
  }
  return Header{static_cast<UpdateKind>(kind), numel};
}

}  // namespace

Bytes encode_update(std::span<const float> values, const std::optional<std::vector<Bytes>>& payloads) {
  std::size_t body = 0;
  if (payloads) {
    body = 4;
    for (const Bytes& p : *payloads) body += 4 + p.size();
  } else {
    body = values.size() * sizeof(float);
  }
  Writer w(kUpdateHeaderBytes + body);
  w.raw(as_bytes(std::string_view(kUpdateMagic, 4)));
  w.u8(kUpdateVersion);
  w.u8(static_cast<std::uint8_t>(payloads ? UpdateKind::kPayloads : UpdateKind::kFp32));
  w.u16(0);
  w.u64(values.size());
  if (payloads) {
    w.u32(static_cast<std::uint32_t>(payloads->size()));
    for (const Bytes& p : *payloads) w.blob(p);
  } else {
    w.raw(ByteView(reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(float)));
  }
  return std::move(w).take();
}

Result<std::int64_t> update_values(ByteView bytes, std::int64_t max_values) {
  Reader r(bytes, "update");
  auto h = read_header(r, static_cast<std::uint64_t>(std::max<std::int64_t>(max_values, 0)));
  if (!h.ok()) return h.status();
  return static_cast<std::int64_t>(h->numel);
}

Status decode_update(ByteView bytes, std::span<float> out) {
  Reader r(bytes, "update");
  auto h = read_header(r, out.size());
  if (!h.ok()) return h.status();
  if (h->numel != out.size()) {
    return error(ErrorCode::kMalformed, "update: " + std::to_string(h->numel) + " values where " + std::to_string(out.size()) + " are expected");
  }
  if (h->kind == UpdateKind::kFp32) {
    const ByteView v = r.raw(r.remaining());
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (!std::isfinite(out[i])) return error(ErrorCode::kMalformed, "update: value " + std::to_string(i) + " is not finite");
    }
    return Status();
  }
  const std::uint32_t count = r.u32();
  if (!r.ok()) return r.status();
  // Every payload takes more than its length field (a chunk's segment may hold no value: an
  // all-reduce of fewer values than segments leaves some empty).
  if (count > r.remaining() / 4) return error(ErrorCode::kMalformed, "update: " + std::to_string(count) + " payloads do not fit");
  std::size_t at = 0;
  for (std::uint32_t k = 0; k < count; ++k) {
    const ByteView p = r.blob(r.remaining());
    if (!r.ok()) return r.status();
    const auto left = static_cast<std::int64_t>(out.size() - at);
    auto info = quant::inspect(p, left);
    if (!info.ok()) return info.status().with_context("update: payload " + std::to_string(k));
    if (info->numel < 0 || info->numel > left) {
      return error(ErrorCode::kMalformed, "update: payload " + std::to_string(k) + " holds " + std::to_string(info->numel) + " values, " +
                                              std::to_string(left) + " remain");
    }
    const auto n = static_cast<std::size_t>(info->numel);
    if (n == 0) continue;
    if (Status st = quant::decode_into(p, out.subspan(at, n)); !st.ok()) return st.with_context("update: payload " + std::to_string(k));
    at += n;
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  if (at != out.size()) return error(ErrorCode::kMalformed, "update: its payloads hold " + std::to_string(at) + " of its " + std::to_string(out.size()) + " values");
  return Status();
}

}  // namespace gossamer::runtime
