#include "optim/diloco.h"

#include <torch/torch.h>

#include "core/check.h"
#include "core/wire.h"
#include "quant/codec.h"

namespace gossamer::optim {

namespace {
constexpr char kStateMagic[4] = {'G', 'D', 'L', 'C'};
constexpr std::uint32_t kStateVersion = 1;
constexpr transport::Tag kDiLoCoTag = 0x0D100001u;  // the tag of DiLoCo rounds on every link
}  // namespace

DiLoCo::DiLoCo(std::vector<at::Tensor> params, Group group, DiLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  GOSSAMER_CHECK(options_.inner_steps >= 1, "DiLoCo: inner_steps must be >= 1");
  GOSSAMER_CHECK(options_.outer_lr > 0 && options_.outer_momentum >= 0 && options_.outer_momentum < 1,
                 "DiLoCo: outer_lr must be > 0 and outer_momentum in [0, 1)");
  outer_ = flatten_params();
  momentum_ = torch::zeros_like(outer_);
}

at::Tensor DiLoCo::flatten_params() const {
  std::vector<at::Tensor> flat;
  for (const auto& p : params_) flat.push_back(p.detach().to(at::kCPU, at::kFloat).reshape({-1}));
  return torch::cat(flat);
}

void DiLoCo::write_params(const at::Tensor& flat) {
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (auto& p : params_) {
    const std::int64_t n = p.numel();
    p.copy_(flat.slice(0, offset, offset + n).view(p.sizes()));
    offset += n;
  }
}

Result<bool> DiLoCo::step(std::int64_t inner_steps_done, Deadline deadline) {
  if (inner_steps_done <= 0 || inner_steps_done % options_.inner_steps != 0) return false;
  at::Tensor delta = outer_ - flatten_params();  // pseudo-gradient: outer - local
  CommStats stats;
  if (Status st = allreduce_mean(group_, delta, options_.codec, kDiLoCoTag, deadline, &stats); !st.ok()) {
    comm_ += stats;
    return st.with_context("DiLoCo round " + std::to_string(rounds_ + 1));
  }
  comm_ += stats;
  const double mu = options_.outer_momentum, lr = options_.outer_lr;
  momentum_.mul_(mu).add_(delta);  // v <- mu v + Delta
  if (options_.nesterov) {
    outer_.sub_((delta + mu * momentum_) * lr);  // Nesterov look-ahead
  } else {
    outer_.sub_(momentum_ * lr);
  }
  write_params(outer_);
  ++rounds_;
  return true;
}

Bytes DiLoCo::save() const {
  Writer w(16 + static_cast<std::size_t>(outer_.numel()) * 8);
  w.raw(as_bytes(std::string_view(kStateMagic, 4)));
  w.u32(kStateVersion);
  w.i64(rounds_);
  w.i64(skipped_rounds_);
  w.u64(static_cast<std::uint64_t>(outer_.numel()));
  quant::EncodeOptions raw;
  w.blob(quant::encode(outer_, raw));
  w.blob(quant::encode(momentum_, raw));
  return std::move(w).take();
}

Status DiLoCo::load(ByteView bytes) {
  Reader r(bytes, "DiLoCo state");
  ByteView magic = r.raw(4);
  const std::uint32_t version = r.u32();
  const std::int64_t rounds = r.i64(), skipped = r.i64();
  const std::uint64_t n = r.u64();
  ByteView outer = r.blob(bytes.size()), momentum = r.blob(bytes.size());
  r.expect_end();
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kStateMagic, 4) != 0) return error(ErrorCode::kMalformed, "not a DiLoCo state");
  if (version != kStateVersion) return error(ErrorCode::kVersionMismatch, "DiLoCo state version " + std::to_string(version));
  if (n != static_cast<std::uint64_t>(outer_.numel())) {
    return error(ErrorCode::kMalformed, "DiLoCo state holds " + std::to_string(n) + " values, the model has " + std::to_string(outer_.numel()));
  }
  auto o = quant::decode(outer, outer_.numel());
  if (!o.ok()) return o.status().with_context("DiLoCo outer weights");
  auto m = quant::decode(momentum, outer_.numel());
  if (!m.ok()) return m.status().with_context("DiLoCo momentum");
  if (o->numel() != outer_.numel() || m->numel() != outer_.numel()) return error(ErrorCode::kMalformed, "DiLoCo state of the wrong size");
  outer_ = o->to(at::kFloat).reshape({-1});
  momentum_ = m->to(at::kFloat).reshape({-1});
  rounds_ = rounds;
  skipped_rounds_ = skipped;
  return Status();
}

}  // namespace gossamer::optim
