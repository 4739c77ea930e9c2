#include "train/inputs.h"

#include <algorithm>
#include <optional>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "data/dataset.h"
#include "data/token_files.h"

namespace gossamer::train {

namespace fs = std::filesystem;

namespace {

// An error reading a file the user named, as bad input naming the key.
Status about(const std::string& key, const Status& st) {
  const ErrorCode code = st.code() == ErrorCode::kNotFound || st.code() == ErrorCode::kIoError ? ErrorCode::kInvalidArgument : st.code();
  return error(code, key + ": " + st.message());
}

Status pin(std::vector<PinnedInput>& out, const std::string& key, const fs::path& path) {
  auto d = digest_file(path);
  if (!d.ok()) return about(key, d.status());
  out.push_back(PinnedInput{key, path.string(), d->size, d->digest.hex(), d->sampled});
  return Status();
}

std::string short_digest(const std::string& hex) { return hex.substr(0, 12); }

}  // namespace

Result<std::vector<PinnedInput>> pin_inputs(const RunConfig& c) {
  std::vector<PinnedInput> out;
  if (!c.data.path.empty()) {
    std::vector<fs::path> files;
    if (c.data.format == DataFormat::kTokens) {
      auto listed = data::token_corpus_files(c.data.path);
      if (!listed.ok()) return about("data.path", listed.status());
      files = listed->train;
      files.insert(files.end(), listed->val.begin(), listed->val.end());
    } else {
      auto listed = data::corpus_files(c.data.path);
      if (!listed.ok()) return about("data.path", listed.status());
      files = std::move(*listed);
    }
    for (const auto& f : files) {
      if (Status st = pin(out, "data.path", f); !st.ok()) return st;
    }
  }
  if (c.model.kind != ModelKind::kGpt && !c.model.path.empty()) {
    if (Status st = pin(out, "model.path", c.model.path); !st.ok()) return st;
  }
  return out;
}

std::string inputs_json(const std::vector<PinnedInput>& inputs) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& i : inputs) {
    files.push_back({{"key", i.key}, {"path", i.path}, {"size", i.size}, {"blake2b", i.digest}, {"sampled", i.sampled}});
  }
  return nlohmann::json{{"format", 1}, {"files", files}}.dump(2) + "\n";
}

Result<std::vector<PinnedInput>> parse_inputs_json(const std::string& text) {
  std::vector<PinnedInput> out;
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.at("format").get<int>() != 1) return error(ErrorCode::kInvalidArgument, "an inputs record of an unknown format");
    for (const auto& f : j.at("files")) {
      out.push_back(PinnedInput{f.at("key").get<std::string>(), f.at("path").get<std::string>(), f.at("size").get<std::uint64_t>(),
                                f.at("blake2b").get<std::string>(), f.at("sampled").get<bool>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return error(ErrorCode::kInvalidArgument, std::string("not a record of a run's inputs (") + e.what() + ")");
  }
  return out;
}

std::vector<std::string> input_changes(const std::vector<PinnedInput>& pinned, const std::vector<PinnedInput>& now) {
  std::vector<std::string> out;
  auto find = [](const std::vector<PinnedInput>& in, const PinnedInput& p) {
    return std::find_if(in.begin(), in.end(), [&](const PinnedInput& q) { return q.key == p.key && q.path == p.path; });
  };
  for (const auto& p : pinned) {
    auto it = find(now, p);
    if (it == now.end()) {
      out.push_back(fmt::format("{} {} is gone", p.key, p.path));
    } else if (it->size != p.size) {
      out.push_back(fmt::format("{} {} changed: {} bytes when the run started, {} now", p.key, p.path, p.size, it->size));
    } else if (it->digest != p.digest) {
      out.push_back(fmt::format("{} {} changed: the same {} bytes but other content (digest {} then, {} now)", p.key, p.path, p.size,
                                short_digest(p.digest), short_digest(it->digest)));
    }
  }
  for (const auto& n : now) {
    if (find(pinned, n) == pinned.end()) out.push_back(fmt::format("{} {} is new (the run started without it)", n.key, n.path));
  }
  return out;
}

namespace {

// The folder's record; nullopt where it has none.
Result<std::optional<std::vector<PinnedInput>>> read_record(const fs::path& folder) {
  const fs::path record = folder / kInputsFile;
  std::error_code ec;
  if (!fs::exists(record, ec)) return std::optional<std::vector<PinnedInput>>();
  auto text = read_text_file(record, 16 << 20);
  if (!text.ok()) return text.status();
  auto parsed = parse_inputs_json(*text);
  if (!parsed.ok()) return parsed.status().with_context(record.string());
  return std::optional<std::vector<PinnedInput>>(std::move(*parsed));
}

}  // namespace

Status check_model_input(const fs::path& folder, const RunConfig& config) {
  if (config.model.kind == ModelKind::kGpt || config.model.path.empty()) return Status();
  auto record = read_record(folder);
  if (!record.ok()) return record.status();
  if (!*record) return Status();
  for (const auto& p : **record) {
    if (p.key != "model.path") continue;
    std::vector<PinnedInput> now;
    if (Status st = pin(now, "model.path", config.model.path); !st.ok()) return st;
    const auto changes = input_changes({p}, now);
    if (changes.empty()) return Status();
    return error(ErrorCode::kInvalidArgument, fmt::format("{}: the run's weights belong to the module it trained, and that file is not it any "
                                                          "more. Put the module the run trained back at {} to use them",
                                                          changes.front(), config.model.path));
  }
  return Status();
}

Result<std::string> check_inputs(const fs::path& folder, const RunConfig& config) {
  auto record = read_record(folder);
  if (!record.ok()) return record.status();
  const std::optional<std::vector<PinnedInput>>& pinned = *record;
  auto now = pin_inputs(config);
  if (!now.ok()) {
    if (!pinned || pinned->empty()) return now.status();
    return error(ErrorCode::kInvalidArgument, fmt::format("the files this run started with cannot be read as they were ({}): put them back, or start a "
                                                          "new run in another --out", now.status().message()));
  }
  if (pinned) {
    const auto changes = input_changes(*pinned, *now);
    if (!changes.empty()) {
      std::string list;
      for (const auto& c : changes) list += (list.empty() ? "" : "; ") + c;
      return error(ErrorCode::kInvalidArgument,
                   fmt::format("cannot resume {} on these files: {}. It would go on with other data or another model than it was trained on: put "
                               "the files back as they were, or start a new run in another --out",
                               folder.string(), list));
    }
  }
  return inputs_json(*now);
}

}  // namespace gossamer::train
