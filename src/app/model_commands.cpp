// gossamer sample and gossamer export: what a user does with a trained model.
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "app/args.h"
#include "app/commands.h"
#include "core/file.h"
#include "model/gpt.h"
#include "model/gpt_script.h"
#include "model/safetensors.h"
#include "model/sample.h"
#include "model/torchscript_model.h"
#include "train/trained_model.h"

namespace gossamer::app {

namespace fs = std::filesystem;

namespace {

bool byte_level(const train::RunConfig& c) { return c.data.format == train::DataFormat::kText && train::vocab_size(c) == 256; }

Result<std::vector<std::int64_t>> prompt_of(const SampleArgs& args, const train::RunConfig& c) {
  std::vector<std::int64_t> out;
  if (!args.prompt_tokens.empty()) {
    std::istringstream in(args.prompt_tokens);
    std::string word;
    const std::int64_t vocab = train::vocab_size(c);
    while (in >> word) {
      std::int64_t id = -1;
      try {
        std::size_t used = 0;
        id = std::stoll(word, &used);
        if (used != word.size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      if (id < 0 || id >= vocab) {
        return error(ErrorCode::kInvalidArgument, fmt::format("--prompt-tokens: \"{}\" is not a token id of this model (0 .. {})", word, vocab - 1));
      }
      out.push_back(id);
    }
  } else {
    if (!byte_level(c)) {
      return error(ErrorCode::kInvalidArgument, "this model reads token ids (data.vocab_size " + std::to_string(train::vocab_size(c)) +
                                                    "), not text: pass the prompt as ids with --prompt-tokens \"15496 11 995\"");
    }
    for (unsigned char ch : args.prompt) out.push_back(ch);
  }
  if (out.empty()) return error(ErrorCode::kInvalidArgument, "the prompt is empty: pass --prompt \"text\" (or --prompt-tokens for token models)");
  return out;
}

}  // namespace

void add_sample_command(CLI::App& app, SampleArgs& args) {
  auto* cmd = app.add_subcommand("sample", "Generate text from a trained run's model (the weights in its checkpoint.bin)");
  cmd->add_option("--from", args.from, "run folder of gossamer train, peer or pipeline")->required()->check(not_empty());
  auto* text = cmd->add_option("--prompt", args.prompt, "text to continue (byte-level models)");
  cmd->add_option("--prompt-tokens", args.prompt_tokens, "token ids to continue, separated by spaces (models of token files)")->excludes(text);
  cmd->add_option("--tokens", args.tokens, "tokens to generate")->capture_default_str()->check(integer_in(1, 1 << 20));
  cmd->add_option("--temperature", args.temperature, "0: always the most likely token; higher: more varied")
      ->capture_default_str()
      ->check(number_in(0.0, 100.0));
  cmd->add_option("--top-k", args.top_k, "draw from the k most likely tokens only (0: all)")->capture_default_str()->check(integer_in(0, 1 << 30));
  cmd->add_option("--seed", args.seed, "seed of the draws: the same seed gives the same text")->capture_default_str()->check(integer_in(0, std::numeric_limits<std::int64_t>::max()));
}

int run_sample_command(const SampleArgs& args) {
  auto trained = train::load_trained_model(args.from);
  if (!trained.ok()) return report_failure(trained.status());
  auto prompt = prompt_of(args, trained->config);
  if (!prompt.ok()) return report_failure(prompt.status());
  spdlog::info("sampling {} tokens from {} (step {}, {} parameters), temperature {}, top-k {}, seed {}", args.tokens, args.from, trained->step,
               trained->model->num_parameters(), args.temperature, args.top_k, args.seed);
  const bool text = args.prompt_tokens.empty();
  model::SampleOptions o;
  o.tokens = args.tokens;
  o.temperature = args.temperature;
  o.top_k = args.top_k;
  o.seed = args.seed;
  if (text) {
    std::fwrite(args.prompt.data(), 1, args.prompt.size(), stdout);
  } else {
    std::fputs(args.prompt_tokens.c_str(), stdout);
  }
  model::sample(*trained->model, *prompt, o, [&](std::int64_t token) {
    if (text) {
      std::fputc(static_cast<int>(token), stdout);
    } else {
      std::fprintf(stdout, " %lld", static_cast<long long>(token));
    }
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

void add_export_command(CLI::App& app, ExportArgs& args) {
  auto* cmd = app.add_subcommand("export", "Write a trained run's weights for PyTorch: safetensors (named tensors) or TorchScript (a whole module)");
  cmd->add_option("--from", args.from, "run folder of gossamer train, peer or pipeline")->required()->check(not_empty());
  cmd->add_option("--format", args.format, "safetensors or torchscript")->capture_default_str()->check(CLI::IsMember({"safetensors", "torchscript"}));
  cmd->add_option("--out", args.out, "file to write (model.safetensors, model.pt)")->required();
  cmd->add_flag("--force", args.force, "replace an existing file");
}

int run_export_command(const ExportArgs& args) {
  std::error_code ec;
  if (Status st = check_output_file(args.out, args.force); !st.ok()) return report_failure(st);
  auto trained = train::load_trained_model(args.from);
  if (!trained.ok()) return report_failure(trained.status());
  auto& m = *trained->model;
  if (args.format == "safetensors") {
    std::vector<model::NamedTensor> tensors;
    for (const auto& p : m.named_parameters()) tensors.push_back({p.name, p.tensor});
    const auto& c = trained->config;
    std::map<std::string, std::string> meta = {{"format", "pt"},
                                               {"gossamer.model.kind", train::name_of(c.model.kind)},
                                               {"gossamer.step", std::to_string(trained->step)},
                                               {"gossamer.vocab_size", std::to_string(train::vocab_size(c))},
                                               {"gossamer.context", std::to_string(c.model.context)}};
    if (c.model.kind == train::ModelKind::kGpt) {
      meta["gossamer.layers"] = std::to_string(c.model.layers);
      meta["gossamer.width"] = std::to_string(c.model.width);
      meta["gossamer.heads"] = std::to_string(c.model.heads);
    }
    if (Status st = write_file_atomic(args.out, model::encode_safetensors(tensors, meta)); !st.ok()) return report_failure(st);
  } else {
    const fs::path tmp = args.out + ".tmp";
    if (auto* gpt = dynamic_cast<model::Gpt*>(&m)) {
      model::script_gpt(*gpt).save(tmp.string());
    } else if (auto* ts = dynamic_cast<model::TorchScriptModel*>(&m)) {
      ts->save_module(tmp.string());
    } else {
      return report_failure(error(ErrorCode::kInvalidArgument, "this model cannot be written as TorchScript; use --format safetensors"));
    }
    fs::rename(tmp, args.out, ec);
    if (ec) return report_failure(error(ErrorCode::kIoError, "cannot move " + tmp.string() + " to " + args.out + ": " + ec.message()));
  }
  spdlog::info("wrote {} ({}) with the {} parameters of {} at step {}", args.out, args.format, m.num_parameters(), args.from, trained->step);
  if (args.format == "safetensors") {
    spdlog::info("in PyTorch: from safetensors.torch import load_file; state = load_file(\"{}\")", args.out);
  } else {
    spdlog::info("in PyTorch: model = torch.jit.load(\"{}\"); logits = model(tokens)", args.out);
  }
  return 0;
}

}  // namespace gossamer::app
