#include "model/language_model.h"

#include <torch/torch.h>

#include <map>
#include <regex>

#include <fmt/format.h>

#include "core/check.h"

namespace gossamer::model {

namespace {

std::string some_names(const std::vector<NamedParameter>& params) {
  std::string out;
  for (std::size_t i = 0; i < params.size() && i < 6; ++i) out += (i ? ", " : "") + params[i].name;
  if (params.size() > 6) out += fmt::format(", ... ({} in all)", params.size());
  return out;
}

}  // namespace

Result<std::vector<ParameterBlock>> cut_into_blocks(const std::vector<NamedParameter>& params, const std::string& block_pattern, const std::string& where) {
  std::regex pattern;
  try {
    pattern = std::regex(block_pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return error(ErrorCode::kInvalidArgument, "model.block_pattern \"" + block_pattern + "\" is not a regular expression: " + e.what());
  }
  ParameterBlock embed{"embed", {}}, final_block{"final", {}};
  std::map<long long, ParameterBlock> layers;
  for (const auto& p : params) {
    std::smatch m;
    if (std::regex_search(p.name, m, pattern) && m.size() >= 2 && m[1].matched) {
      long long index = 0;
      try {
        index = std::stoll(m[1].str());
      } catch (const std::exception&) {
        return error(ErrorCode::kInvalidArgument, "model.block_pattern's first group matched \"" + m[1].str() + "\" in " + p.name +
                                                      ", which is not a layer number");
      }
      layers[index].parameters.push_back(p);
    } else {
      (layers.empty() ? embed : final_block).parameters.push_back(p);
    }
  }
  if (layers.empty() || embed.parameters.empty() || final_block.parameters.empty()) {
    const char* what = layers.empty() ? "no parameter name holds a layer number" : embed.parameters.empty() ? "no parameter comes before the first layer (an embedding)" : "no parameter comes after the last layer (a final norm or head)";
    return error(ErrorCode::kInvalidArgument,
                 fmt::format("{} cannot be cut into blocks with model.block_pattern \"{}\": {}. Its parameters: {}. Set model.block_pattern "
                             "to a regular expression whose first group is the layer number in these names",
                             where, block_pattern, what, some_names(params)));
  }
  std::vector<ParameterBlock> out;
  out.push_back(std::move(embed));
  std::int64_t next = 0;
  for (auto& [index, block] : layers) {
    block.name = "block." + std::to_string(next++);
    out.push_back(std::move(block));
  }
  out.push_back(std::move(final_block));
  return out;
}

at::Tensor LanguageModel::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  GOSSAMER_CHECK(tokens.sizes() == targets.sizes(), "LanguageModel::loss: tokens and targets must have the same shape");
  auto logits = forward(tokens).to(torch::kFloat);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::vector<NamedParameter> LanguageModel::named_parameters() const {
  std::vector<NamedParameter> out;
  for (auto& b : blocks()) {
    for (auto& p : b.parameters) out.push_back(std::move(p));
  }
  return out;
}

std::vector<at::Tensor> LanguageModel::parameters() const {
  std::vector<at::Tensor> out;
  for (auto& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

std::int64_t LanguageModel::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace gossamer::model
