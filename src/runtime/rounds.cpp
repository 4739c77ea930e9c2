#include "runtime/rounds.h"

#include <cstring>

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/wire.h"
#include "optim/flat_params.h"

namespace gossamer::runtime {

Result<RoundSchedule> round_schedule(const train::RunConfig& c, const optim::OuterConfig& outer) {
  switch (outer.method) {
    case optim::Method::kDiLoCo: return RoundSchedule{c.diloco.inner_steps, 0};
    case optim::Method::kNoLoCo: return RoundSchedule{c.noloco.inner_steps, 0};
    case optim::Method::kCO2: return RoundSchedule{c.co2.inner_steps, 0};
    case optim::Method::kSparseLoCo: return RoundSchedule{train::sparseloco_period(c), 0};
    case optim::Method::kMuLoCo: return RoundSchedule{c.muloco.inner_steps, 0};
    case optim::Method::kDdp: return RoundSchedule{c.ddp.round_steps, -1};
    case optim::Method::kStreamingDiLoCo:
      return RoundSchedule{c.streaming_diloco.inner_steps / optim::fragment_count(outer.fragments), c.streaming_diloco.overlap};
    case optim::Method::kLocal: break;
  }
  return error(ErrorCode::kInvalidArgument, "outer.method = \"" + train::name_of(c.outer.method) + "\": independent workers need no peers; use gossamer train");
}

Status check_round_drill(const train::RunConfig& c, std::int64_t round, const std::string& option) {
  if (round <= 0) return Status();
  const std::string what = option + " " + std::to_string(round);
  if (c.pipeline.enabled) return error(ErrorCode::kInvalidArgument, what + ": a pipeline has no outer rounds to crash in; use --crash-at-step");
  auto outer = train::outer_config(c);
  if (!outer.ok()) return outer.status();
  if (outer->method == optim::Method::kNoLoCo || outer->method == optim::Method::kLocal || (outer->method == optim::Method::kDdp && train::on_c10d(c.ddp.engine))) {
    return error(ErrorCode::kInvalidArgument, what + " needs a method whose round is Gossamer's all-reduce or all-gather (diloco, streaming_diloco, "
                                              "sparseloco, muloco, co2, or ddp with ddp.engine = links), not outer.method = " + train::name_of(c.outer.method) +
                                              (outer->method == optim::Method::kDdp ? " on " + train::name_of(c.ddp.engine) : ""));
  }
  auto schedule = round_schedule(c, *outer);
  if (!schedule.ok()) return schedule.status();
  const std::int64_t last = schedule->rounds_over(c.train.steps);
  if (round <= last) return Status();
  return error(ErrorCode::kInvalidArgument, fmt::format("{} is past the run's last round ({}: a round every {} steps, train.steps = {}): the drill "
                                                        "would never fire", what, last, schedule->period, c.train.steps));
}

optim::Group solo_group(Clock& clock) {
  optim::Group g;
  g.peers.resize(1);
  g.clock = &clock;
  return g;
}

ByteView bytes_of(const at::Tensor& flat) {
  return ByteView(reinterpret_cast<const std::byte*>(flat.data_ptr<float>()), static_cast<std::size_t>(flat.numel()) * 4);
}

Bytes encode_shared_state(const std::vector<at::Tensor>& params, const optim::OuterOptimizer& outer, ByteView inner, bool with_params) {
  const at::Tensor flat = with_params ? optim::flatten(params) : torch::empty({0}, torch::kFloat);
  // Lengths as u64: a model's parameters alone pass 4 GiB at a billion of them.
  const ByteView params_bytes = bytes_of(flat);
  const Bytes outer_bytes = outer.save_shared();
  Writer w(params_bytes.size() + outer_bytes.size() + inner.size() + 24);
  for (const ByteView part : {params_bytes, ByteView(outer_bytes), inner}) {
    w.u64(part.size());
    w.raw(part);
  }
  return std::move(w).take();
}

Result<ByteView> load_shared_state(ByteView bytes, std::vector<at::Tensor> params, optim::OuterOptimizer& outer) {
  Reader r(bytes, "shared state");
  std::int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  const auto part = [&r](std::uint64_t max) -> ByteView {
    const std::uint64_t n = r.u64();
    if (r.ok() && (n > max || n > r.remaining())) {
      r.fail(ErrorCode::kMalformed, "a part of " + std::to_string(n) + " bytes, more than " + (n > max ? "allowed" : "what follows"));
    }
    return r.ok() ? r.raw(static_cast<std::size_t>(n)) : ByteView();
  };
  const ByteView flat = part(static_cast<std::uint64_t>(numel) * 4);
  const ByteView outer_state = part(bytes.size());
  const ByteView inner = part(bytes.size());
  r.expect_end();
  if (!r.ok()) return r.status();
  if (flat.empty()) {  // the outer weights stand for the parameters
    if (Status st = outer.load(outer_state); !st.ok()) return st;
    outer.drop_replica_state();
    outer.take_shared_weights();
    return inner;
  }
  if (flat.size() != static_cast<std::size_t>(numel) * 4) {
    return error(ErrorCode::kMalformed, "the shared state holds " + std::to_string(flat.size() / 4) + " parameters, this model has " +
                                            std::to_string(numel));
  }
  at::Tensor values = torch::empty({numel}, torch::kFloat);
  std::memcpy(values.data_ptr<float>(), flat.data(), flat.size());
  if (!torch::isfinite(values).all().item<bool>()) return error(ErrorCode::kMalformed, "the shared state holds non-finite parameters");
  if (Status st = outer.load(outer_state); !st.ok()) return st;
  outer.drop_replica_state();
  optim::write_flat(params, values);
  return inner;
}

}  // namespace gossamer::runtime
