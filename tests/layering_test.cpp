// The layering of DESIGN.md, checked mechanically: a file of one layer may include only headers of
// the layers below it (and its own).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

namespace fs = std::filesystem;

TEST_CASE("no layer includes a header of a layer above it") {
  const fs::path root = GOSSAMER_SOURCE_DIR;
  // layer folder (relative to the root) -> include prefixes it may use
  const std::map<std::string, std::set<std::string>> allowed = {
      {"src/core", {"core"}},
      {"src/skippipe", {"core", "skippipe"}},
      {"quant", {"core", "quant"}},
      {"transport", {"core", "transport"}},
      {"optim", {"core", "quant", "transport", "optim"}},
      {"src/model", {"core", "model"}},
      {"src/data", {"core", "data"}},
      {"src/train", {"core", "quant", "transport", "optim", "model", "data", "skippipe", "train"}},
      // The simulator runs the real peer runtime (src/runtime) over its emulated clock and network.
      {"sim", {"core", "quant", "transport", "optim", "model", "data", "skippipe", "train", "runtime", "sim"}},
      {"src/runtime", {"core", "quant", "transport", "optim", "model", "data", "skippipe", "train", "runtime"}},
  };
  // The project prefix of `#include "prefix/..."`, or "" for any other line.
  auto include_prefix = [](const std::string& line) -> std::string {
    const auto hash = line.find_first_not_of(" \t");
    if (hash == std::string::npos || line[hash] != '#') return "";
    const auto inc = line.find("include", hash);
    const auto quote = line.find('"', inc == std::string::npos ? line.size() : inc);
    const auto slash = line.find('/', quote == std::string::npos ? line.size() : quote);
    if (inc == std::string::npos || quote == std::string::npos || slash == std::string::npos) return "";
    return line.substr(quote + 1, slash - quote - 1);
  };
  int files = 0;
  for (const auto& [layer, prefixes] : allowed) {
    const fs::path dir = root / layer;
    if (!fs::exists(dir)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      const auto ext = entry.path().extension();
      if (ext != ".h" && ext != ".cpp") continue;
      ++files;
      std::ifstream in(entry.path());
      std::string line;
      while (std::getline(in, line)) {
        const std::string prefix = include_prefix(line);
        if (!prefix.empty()) {
          INFO(entry.path().string() << " includes " << line);
          CHECK(prefixes.count(prefix) == 1);
        }
      }
    }
  }
  CHECK(files > 10);
}
