#include "optim/state_io.h"

#include <torch/torch.h>

#include <cstring>

#include "core/wire.h"
#include "quant/codec.h"

namespace gossamer::optim {

namespace {
constexpr char kMagic[4] = {'G', 'O', 'S', 'T'};
constexpr std::uint32_t kVersion = kStateFormatVersion;
}  // namespace

Bytes save_state(std::string_view kind, const std::vector<std::int64_t>& counters, const std::vector<at::Tensor>& tensors) {
  // Reserved for the fp32 values and each payload's header: a model-sized state grown by doubling
  // would hold two large buffers at once (pages not written cost no memory).
  std::size_t reserve = 256 + kind.size() + 8 * counters.size();
  for (const auto& t : tensors) reserve += (t.defined() ? static_cast<std::size_t>(t.numel()) * 4 : 0) + 4096;
  Writer w(reserve);
  w.raw(as_bytes(std::string_view(kMagic, 4)));
  w.u32(kVersion);
  w.str(kind);
  w.u32(static_cast<std::uint32_t>(counters.size()));
  for (auto c : counters) w.i64(c);
  w.u32(static_cast<std::uint32_t>(tensors.size()));
  quant::EncodeOptions raw;  // fp32: exact
  for (const auto& t : tensors) w.blob(quant::encode(t.defined() ? t : torch::empty({0}), raw));
  return std::move(w).take();
}

Status load_state(ByteView bytes, std::string_view kind, std::vector<std::int64_t>& counters, std::vector<at::Tensor>& tensors) {
  Reader r(bytes, std::string(kind) + " state");
  ByteView magic = r.raw(4);
  const std::uint32_t version = r.u32();
  const std::string got_kind = r.str(64);
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kMagic, 4) != 0) return error(ErrorCode::kMalformed, "not an outer-optimizer state");
  if (version != kVersion) return error(ErrorCode::kVersionMismatch, "outer-optimizer state version " + std::to_string(version));
  if (got_kind != kind) return error(ErrorCode::kMalformed, "state of a '" + got_kind + "' optimizer given to '" + std::string(kind) + "'");
  const std::uint32_t nc = r.u32();
  if (r.ok() && nc != counters.size()) return error(ErrorCode::kMalformed, std::string(kind) + " state: wrong number of counters");
  std::vector<std::int64_t> c(nc);
  for (auto& x : c) x = r.i64();
  const std::uint32_t nt = r.u32();
  if (r.ok() && nt != tensors.size()) return error(ErrorCode::kMalformed, std::string(kind) + " state: wrong number of tensors");
  std::vector<at::Tensor> loaded;
  for (std::uint32_t i = 0; i < nt && r.ok(); ++i) {
    ByteView b = r.blob(bytes.size());
    if (!r.ok()) break;
    const std::int64_t want = tensors[i].defined() ? tensors[i].numel() : 0;
    auto t = quant::decode(b, want);
    if (!t.ok()) return t.status().with_context(std::string(kind) + " state tensor " + std::to_string(i));
    if (t->numel() != want) {
      return error(ErrorCode::kMalformed, std::string(kind) + " state tensor " + std::to_string(i) + " holds " + std::to_string(t->numel()) +
                                              " values, this model needs " + std::to_string(want));
    }
    loaded.push_back(t->to(at::kFloat));
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  counters = c;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    // On the device the optimizer keeps that tensor on (host memory or the training device).
    if (tensors[i].defined()) tensors[i] = loaded[i].reshape(tensors[i].sizes()).to(tensors[i].device(), /*non_blocking=*/false, /*copy=*/true);
  }
  return Status();
}

Bytes OuterState::save(std::string_view kind) const { return save_state(kind, {rounds, skipped}, {outer, momentum}); }

Status OuterState::load(ByteView bytes, std::string_view kind) {
  std::vector<std::int64_t> counters(2);
  std::vector<at::Tensor> tensors = {outer, momentum};
  if (Status st = load_state(bytes, kind, counters, tensors); !st.ok()) return st;
  rounds = counters[0];
  skipped = counters[1];
  outer = tensors[0];
  momentum = tensors[1];
  return Status();
}

}  // namespace gossamer::optim
