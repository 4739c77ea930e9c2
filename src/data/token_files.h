// Token files: corpora tokenized by other tools, read in place (memory-mapped).
//
// Two layouts are recognised, both little-endian:
// - nanoGPT's: raw uint16 token ids and nothing else (prepare.py's train.bin and val.bin).
// - llm.c's: a header of 256 int32 (magic, version, token count, then zeros), then the tokens:
//   magic 20240520 version 1 for uint16 ids (GPT-2), magic 20240801 version 7 for uint32 ids (Llama 3).
// A file that starts with an llm.c magic must be a whole llm.c file (its version known, its count
// matching its size); a raw file must hold a whole number of uint16. Anything else is one clear error
// naming the file and what is wrong; nothing is trusted before it is checked.
//
// A corpus is one token file (split into train and validation like a text), or a folder whose
// *.bin files are named for their split: every file whose name contains "train" is training data and
// every file whose name contains "val" is validation data, each list in sorted order (nanoGPT's
// train.bin and val.bin; llm.c's tiny_shakespeare_train.bin or fineweb_train_000001.bin ...).
//
// Threading: pure functions; the returned Tokens are immutable. Errors: Status values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/tokens.h"

namespace gossamer::data {

inline constexpr std::int32_t kLlmcMagicU16 = 20240520;
inline constexpr std::int32_t kLlmcVersionU16 = 1;
inline constexpr std::int32_t kLlmcMagicU32 = 20240801;
inline constexpr std::int32_t kLlmcVersionU32 = 7;
inline constexpr std::size_t kLlmcHeaderBytes = 256 * 4;

enum class TokenFileLayout { kRawU16, kLlmcU16, kLlmcU32 };

struct TokenFile {
  Tokens tokens;
  TokenFileLayout layout = TokenFileLayout::kRawU16;
  std::int64_t max_token = -1;  // the largest id in the file (-1: none); reading scans the whole file
};

[[nodiscard]] Result<TokenFile> read_token_file(const std::filesystem::path& path);

struct TokenCorpus {
  Tokens train;
  std::optional<Tokens> val;  // set when the folder names its validation files
  std::int64_t max_token = -1;  // over every file
  std::string description;    // "train.bin + val.bin (nanoGPT raw uint16): 301,966 + 36,059 tokens"
};

[[nodiscard]] Result<TokenCorpus> load_token_corpus(const std::filesystem::path& path);

// The files load_token_corpus reads: the file itself, or a folder's training files then its
// validation files, each in sorted order.
struct TokenCorpusFiles {
  std::vector<std::filesystem::path> train, val;
};
[[nodiscard]] Result<TokenCorpusFiles> token_corpus_files(const std::filesystem::path& path);

}  // namespace gossamer::data
