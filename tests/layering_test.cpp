// The layering of DESIGN.md, checked mechanically: a file of one layer may include only headers of
// the layers below it (and its own).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

namespace fs = std::filesystem;

TEST_CASE("no layer includes a header of a layer above it") {
  const fs::path root = GOSSAMER_SOURCE_DIR;
  // layer folder (relative to the root) -> include prefixes it may use
  const std::map<std::string, std::set<std::string>> allowed = {
      {"src/core", {"core"}},
      {"quant", {"core", "quant"}},
      {"transport", {"core", "transport"}},
      {"optim", {"core", "quant", "transport", "optim"}},
      {"src/model", {"core", "model"}},
      {"src/data", {"core", "data"}},
      {"src/train", {"core", "quant", "transport", "optim", "model", "data", "train"}},
      {"sim", {"core", "quant", "transport", "optim", "model", "data", "train", "sim"}},
      {"src/run", {"core", "quant", "transport", "optim", "model", "data", "train", "run"}},
  };
  const std::regex include_re(R"re(^\s*#\s*include\s*"([a-z_]+)/)re");
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
        std::smatch m;
        if (std::regex_search(line, m, include_re)) {
          INFO(entry.path().string() << " includes " << line);
          CHECK(prefixes.count(m[1].str()) == 1);
        }
      }
    }
  }
  CHECK(files > 10);
}
