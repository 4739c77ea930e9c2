// What a pipeline is planned from and checked against before it starts (pipeline_trainer.h): its
// mode, the cost of a hop and of a stage's forward, the network the scheduler assumes, and the
// checks of its shape and of where its network may be measured.
#include "train/pipeline_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "quant/format.h"
#include "train/pipeline_wire.h"
#include "train/worker.h"

namespace gossamer::train {

skippipe::Mode pipeline_mode(PipelineMode mode) {
  switch (mode) {
    case PipelineMode::kFull:
      return skippipe::Mode::kFull;
    case PipelineMode::kRandom:
      return skippipe::Mode::kCostBlind;
    case PipelineMode::kNoca:
      return skippipe::Mode::kNoCollision;
    case PipelineMode::kSkipPipe:
      break;
  }
  return skippipe::Mode::kSkipPipe;
}

std::size_t hop_bytes(const RunConfig& c) {
  quant::EncodeOptions codec;
  codec.codec = c.pipeline.activation_codec;
  codec.block_size = static_cast<std::uint32_t>(c.outer.codec_block);
  return encode_activation(ActivationHeader{}, torch::zeros({c.train.batch_size, c.model.context, c.model.width}), codec).size();
}

double measure_stage_forward_s(const RunConfig& c, int runs) {
  model::Gpt model(gpt_config(c, 0));
  model.train(false);
  torch::NoGradGuard no_grad;
  const std::int64_t per = std::max<std::int64_t>(1, c.model.layers / std::max<std::int64_t>(1, c.pipeline.stages));
  const auto x = torch::randn({c.train.batch_size, c.model.context, c.model.width});
  std::vector<double> times;
  for (int k = 0; k <= runs; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    auto y = x;
    for (std::int64_t i = 0; i < per; ++i) y = model.block(i, y);
    (void)y.sum().item<float>();
    if (k > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());  // the first warms up
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

Status check_pipeline_shape(const RunConfig& c) {
  const auto& p = c.pipeline;
  if (c.model.kind != ModelKind::kGpt) return error(ErrorCode::kInvalidArgument, "pipelines cut the built-in GPT into stages: set model.kind = gpt");
  if (muon_inner(c)) {
    return error(ErrorCode::kInvalidArgument, "a pipeline's stages train with AdamW: " +
                                                  std::string(c.train.optimizer == InnerOptimizer::kMuon ? "train.optimizer = muon" : "outer.method = muloco (Muon's inner steps)") +
                                                  " is for data-parallel runs; drop it");
  }
  if (c.model.layers % p.stages != 0) {
    return error(ErrorCode::kInvalidArgument,
                 fmt::format("model.layers ({}) must be divisible by pipeline.stages ({}), each stage holding as many layers: set model.layers to a "
                             "multiple of {} (--set model.layers={}) or pipeline.stages to a divisor of {}",
                             c.model.layers, p.stages, p.stages, p.stages * ((c.model.layers + p.stages - 1) / p.stages), c.model.layers));
  }
  if (p.path_length > p.stages) {
    return error(ErrorCode::kInvalidArgument, fmt::format("pipeline.path_length ({}) must be at most pipeline.stages ({})", p.path_length, p.stages));
  }
  return Status();
}

Status check_network_in_one_process(const RunConfig& c) {
  if (c.pipeline.network != PipelineNetwork::kMeasured) return Status();
  return error(ErrorCode::kInvalidArgument, "pipeline.network = measured plans on the links the nodes measure between their processes: run it with "
                                            "--node (a process per node) or over gossamer peer; one process and the simulator have none to measure, "
                                            "so give them geo, geo-fixed or uniform (--set pipeline.network=geo)");
}

skippipe::Network pipeline_network(const RunConfig& c) {
  const int n = static_cast<int>(c.pipeline.nodes);
  if (c.pipeline.network == PipelineNetwork::kGeo || c.pipeline.network == PipelineNetwork::kGeoFixed) return skippipe::geo_network(n, c.pipeline.network == PipelineNetwork::kGeoFixed);
  return skippipe::uniform_network(n, 0.05, 1e9 / 8);
}

skippipe::Costs pipeline_costs(const RunConfig& c) {
  skippipe::Costs costs;
  costs.forward_s = c.pipeline.forward_s;
  costs.activation_bytes = c.pipeline.activation_mib * 1024 * 1024;
  return costs;
}

std::vector<int> default_omitted_stages(std::int64_t stages) {
  std::vector<int> out;
  for (std::int64_t s = std::max<std::int64_t>(1, stages / 2); s < stages; ++s) out.push_back(static_cast<int>(s));
  return out;
}

}  // namespace gossamer::train
