#include "optim/outer_optimizer.h"

#include <torch/torch.h>

#include "optim/data_parallel.h"
#include "optim/flat_params.h"
#include "optim/gloo_sync.h"
#include "optim/state_io.h"

namespace gossamer::optim {

namespace {

std::vector<at::Tensor> all_tensors(const std::vector<ParamBlock>& blocks) {
  std::vector<at::Tensor> out;
  for (const auto& b : blocks) {
    for (const auto& t : b.tensors) out.push_back(t);
  }
  return out;
}

std::vector<std::int64_t> block_sizes(const std::vector<ParamBlock>& blocks) {
  std::vector<std::int64_t> out;
  for (const auto& b : blocks) {
    std::int64_t n = 0;
    for (const auto& t : b.tensors) n += t.numel();
    out.push_back(n);
  }
  return out;
}

// No communication at all: independent workers.
class Local final : public OuterOptimizer {
 public:
  std::string_view name() const override { return "local"; }
  Result<bool> step(std::int64_t, Deadline) override { return false; }
  void skip_round() override {}
  Status regroup(Group) override { return Status(); }
  std::int64_t rounds() const override { return 0; }
  std::int64_t skipped_rounds() const override { return 0; }
  CommStats comm() const override { return {}; }
  Bytes save() const override { return save_state("local", {}, {}); }
  Status load(ByteView state) override {
    std::vector<std::int64_t> c;
    std::vector<at::Tensor> t;
    return load_state(state, "local", c, t);
  }
  void record_updates(UpdateSink) override {}
  Status replay(std::int64_t step, const at::Tensor&) override {
    return error(ErrorCode::kMalformed, "independent workers share no state: nothing to replay at step " + std::to_string(step));
  }
  void take_shared_weights() override {}
};

template <typename Impl>
class Adapter final : public OuterOptimizer {
 public:
  template <typename... Args>
  explicit Adapter(std::string_view name, Args&&... args) : name_(name), impl_(std::forward<Args>(args)...) {}
  std::string_view name() const override { return name_; }
  Result<bool> step(std::int64_t s, Deadline d) override {
    auto r = impl_.step(s, d);
    if (!r.ok()) return r.status();
    return static_cast<bool>(*r);
  }
  void skip_round() override { impl_.skip_round(); }
  void count_step(double seconds) override {
    if constexpr (requires { impl_.count_step(seconds); }) impl_.count_step(seconds);
  }
  double fastest_step_seconds() const override {
    if constexpr (requires { impl_.fastest_step_seconds(); }) {
      return impl_.fastest_step_seconds();
    } else {
      return 0.0;
    }
  }
  std::vector<std::int64_t> round_steps() const override {
    if constexpr (requires { impl_.round_steps(); }) {
      return impl_.round_steps();
    } else {
      return {};
    }
  }
  void keep_work(double fraction) override {
    if constexpr (requires { impl_.keep_work(fraction); }) impl_.keep_work(fraction);
  }
  Status regroup(Group group) override { return impl_.regroup(std::move(group)); }
  std::int64_t rounds() const override { return impl_.rounds(); }
  std::int64_t skipped_rounds() const override { return impl_.skipped_rounds(); }
  CommStats comm() const override { return impl_.comm(); }
  Bytes save() const override { return impl_.save(); }
  Bytes save_shared() const override {
    if constexpr (requires { impl_.save_shared(); }) {
      return impl_.save_shared();
    } else {
      return impl_.save();
    }
  }
  Status load(ByteView state) override { return impl_.load(state); }
  void drop_replica_state() override {
    if constexpr (requires { impl_.drop_replica_state(); }) impl_.drop_replica_state();
  }
  Status finish(Deadline d) override {
    if constexpr (requires { impl_.finish(d); }) {
      return impl_.finish(d);
    } else {
      return Status();
    }
  }
  Status settle(Deadline d) override {
    if constexpr (requires { impl_.settle(d); }) {
      return impl_.settle(d);
    } else {
      return Status();
    }
  }
  void record_updates(UpdateSink sink) override { impl_.record_updates(std::move(sink)); }
  Status replay(std::int64_t step, const at::Tensor& update) override { return impl_.replay(step, update); }
  void take_shared_weights() override { impl_.take_shared_weights(); }
  double evaluate_outer(const std::function<double()>& evaluate) override {
    if constexpr (requires { impl_.evaluation_weights(); }) {
      // Each (model tensors, flat outer weights) pair: the model's own saved, the outer written in,
      // and the model's own written back whichever way `evaluate` returns.
      auto pairs = impl_.evaluation_weights();
      std::vector<at::Tensor> saved;
      for (auto& [tensors, outer] : pairs) saved.push_back(flatten(tensors));
      struct Restore {
        decltype(pairs)& p;
        std::vector<at::Tensor>& s;
        ~Restore() {
          for (std::size_t i = 0; i < s.size(); ++i) write_flat(p[i].first, s[i]);
        }
      } restore{pairs, saved};
      for (auto& [tensors, outer] : pairs) write_flat(tensors, outer);
      return evaluate();
    } else {
      return evaluate();
    }
  }

 private:
  std::string_view name_;
  Impl impl_;
};

}  // namespace

std::vector<std::string> outer_methods() { return method_names(); }

Result<OuterSetup> make_outer_optimizer(const OuterConfig& c, const std::vector<ParamBlock>& blocks, Group group) {
  OuterSetup setup;
  switch (c.method) {
    case Method::kLocal:
      setup.outer = std::make_unique<Local>();
      break;
    case Method::kDdp:
      if (c.ddp_engine != OuterConfig::DdpEngine::kLinks) {
        auto gloo = c.ddp_engine == OuterConfig::DdpEngine::kNccl ? make_nccl_data_parallel(c.gloo, group) : make_gloo_data_parallel(c.gloo, group);
        if (!gloo.ok()) return gloo.status();
        setup.gradient_sync = gloo->gradient_sync;
        setup.outer = std::move(gloo->outer);
      } else {
        auto ddp = make_links_data_parallel(std::move(group), c.ddp_codec, c.ddp_aggregation);
        setup.gradient_sync = ddp.get();
        setup.outer = std::move(ddp);
      }
      break;
    case Method::kDiLoCo:
      setup.outer = std::make_unique<Adapter<DiLoCo>>("diloco", all_tensors(blocks), std::move(group), c.diloco);
      break;
    case Method::kMuLoCo:
      setup.outer = std::make_unique<Adapter<DiLoCo>>("muloco", all_tensors(blocks), std::move(group), c.muloco);
      break;
    case Method::kSparseLoCo:
      setup.outer = std::make_unique<Adapter<SparseLoCo>>("sparseloco", all_tensors(blocks), std::move(group), c.sparseloco);
      break;
    case Method::kNoLoCo:
      setup.outer = std::make_unique<Adapter<NoLoCo>>("noloco", all_tensors(blocks), std::move(group), c.noloco);
      break;
    case Method::kCO2:
      setup.comm = std::make_unique<AsyncCollectives>(std::move(group));
      setup.outer = std::make_unique<Adapter<CO2>>("co2", all_tensors(blocks), *setup.comm, c.co2, c.co2_penalty, block_sizes(blocks));
      break;
    case Method::kStreamingDiLoCo:
      setup.comm = std::make_unique<AsyncCollectives>(std::move(group));
      setup.outer = std::make_unique<Adapter<StreamingDiLoCo>>("streaming_diloco", make_fragments(blocks, c.fragments), *setup.comm, c.streaming);
      break;
  }
  if (!setup.outer) return error(ErrorCode::kInvalidArgument, "unknown outer method id " + std::to_string(static_cast<int>(c.method)));
  return setup;
}

}  // namespace gossamer::optim
