#include "optim/data_parallel.h"

#include <torch/torch.h>

#include "optim/flat_params.h"
#include "optim/state_io.h"
#include "transport/tags.h"

namespace gossamer::optim {

namespace {

constexpr transport::Tag kDdpTag = transport::tags::kDdp;  // + step (round_tag)

class LinksDataParallel final : public DataParallel {
 public:
  LinksDataParallel(Group group, quant::EncodeOptions codec, Aggregation aggregation)
      : group_(std::move(group)), codec_(codec), aggregation_(aggregation) {}
  Status regroup(Group group) override {
    group_ = std::move(group);
    return Status();
  }

 protected:
  Status average(at::Tensor& flat, std::int64_t step, Deadline deadline, CommStats& stats) override {
    return allreduce_mean(group_, flat, codec_, round_tag(kDdpTag, step), deadline, &stats, kAllreduceSegmentValues, aggregation_);
  }

 private:
  Group group_;
  quant::EncodeOptions codec_;
  Aggregation aggregation_;
};

}  // namespace

Bytes DataParallel::save() const { return save_state("ddp", {rounds_, skipped_}, {}); }

Status DataParallel::load(ByteView state) {
  std::vector<std::int64_t> c(2);
  std::vector<at::Tensor> t;
  if (Status st = load_state(state, "ddp", c, t); !st.ok()) return st;
  rounds_ = c[0];
  skipped_ = c[1];
  return Status();
}

Status DataParallel::sync_gradients(const std::vector<at::Tensor>& params, std::int64_t step, Deadline deadline) {
  std::vector<at::Tensor> grads;  // each parameter's own gradient, or zeros where it has none
  for (const auto& p : params) grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  flatten_into(grads, flat_);
  CommStats stats;
  Status st = average(flat_, step, deadline, stats);
  comm_ += stats;
  if (!st.ok()) return st.with_context("ddp step " + std::to_string(step));
  if (sink_) sink_(step, flat_);
  write_flat(grads, flat_);
  ++rounds_;
  return Status();
}

std::unique_ptr<DataParallel> make_links_data_parallel(Group group, quant::EncodeOptions codec, Aggregation aggregation) {
  return std::make_unique<LinksDataParallel>(std::move(group), codec, aggregation);
}

}  // namespace gossamer::optim
