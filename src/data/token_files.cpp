#include "data/token_files.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/mapped_file.h"
#include "core/wire.h"

namespace gossamer::data {

namespace fs = std::filesystem;

namespace {

const char* layout_name(TokenFileLayout layout) {
  switch (layout) {
    case TokenFileLayout::kRawU16: return "nanoGPT raw uint16";
    case TokenFileLayout::kLlmcU16: return "llm.c uint16";
    case TokenFileLayout::kLlmcU32: return "llm.c uint32";
  }
  return "?";
}

Status bad_file(const fs::path& path, const std::string& why) {
  return error(ErrorCode::kInvalidArgument, "token file " + path.string() + ": " + why);
}

// Token files are little-endian; the scan reads them natively.
static_assert(std::endian::native == std::endian::little, "token files are read as little-endian");

// The largest id of `count` tokens of `width` bytes from byte `offset` of the file, read in slices
// whose pages are released as soon as they are scanned: a 10 GB file is checked in little memory.
template <typename T>
std::int64_t scan_max(const MappedFile& file, std::size_t offset, std::int64_t count) {
  constexpr std::int64_t kSlice = (64 << 20) / sizeof(T);
  file.advise(MappedFile::Access::kSequential);
  T best = 0;
  for (std::int64_t begin = 0; begin < count; begin += kSlice) {
    const std::int64_t n = std::min(kSlice, count - begin);
    const std::uint8_t* p = file.data() + offset + static_cast<std::size_t>(begin) * sizeof(T);
    for (std::int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + i * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
      best = std::max(best, v);
    }
    file.release(offset + static_cast<std::size_t>(begin) * sizeof(T), static_cast<std::size_t>(n) * sizeof(T));
  }
  file.advise(MappedFile::Access::kRandom);
  return count == 0 ? -1 : static_cast<std::int64_t>(best);
}

}  // namespace

Result<TokenFile> read_token_file(const fs::path& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  const auto& file = *mapped;
  const std::uint8_t* p = file->data();
  const std::size_t size = file->size();
  if (size == 0) return bad_file(path, "empty");
  TokenFile out;
  Reader header(ByteView(reinterpret_cast<const std::byte*>(p), std::min(size, kLlmcHeaderBytes)), "llm.c header");
  const std::int32_t magic = header.i32();  // 0 when the file is shorter than 4 bytes
  if (magic == kLlmcMagicU16 || magic == kLlmcMagicU32) {
    if (size < kLlmcHeaderBytes) {
      return bad_file(path, fmt::format("starts with llm.c's magic {} but holds {} bytes, less than its 1024-byte header: truncated?", magic, size));
    }
    const std::int32_t version = header.i32();
    const std::int32_t count = header.i32();
    const bool u16 = magic == kLlmcMagicU16;
    const std::int32_t want_version = u16 ? kLlmcVersionU16 : kLlmcVersionU32;
    if (version != want_version) {
      return bad_file(path, fmt::format("llm.c magic {} with version {}; only version {} is known for it", magic, version, want_version));
    }
    if (count < 0) return bad_file(path, fmt::format("llm.c header gives a negative token count ({})", count));
    const int width = u16 ? 2 : 4;
    const std::size_t want = kLlmcHeaderBytes + static_cast<std::size_t>(count) * static_cast<std::size_t>(width);
    if (size != want) {
      return bad_file(path, fmt::format("llm.c header promises {} tokens ({} bytes with the header) but the file holds {} bytes: {}", count,
                                        want, size, size < want ? "truncated" : "trailing bytes after the tokens"));
    }
    out.layout = u16 ? TokenFileLayout::kLlmcU16 : TokenFileLayout::kLlmcU32;
    out.tokens = Tokens::of_memory(file, p + kLlmcHeaderBytes, count, width);
    out.max_token = u16 ? scan_max<std::uint16_t>(*file, kLlmcHeaderBytes, count) : scan_max<std::uint32_t>(*file, kLlmcHeaderBytes, count);
  } else {
    if (size % 2 != 0) {
      return bad_file(path, fmt::format("{} bytes is not a whole number of uint16 tokens (nanoGPT's raw layout), and there is no llm.c header", size));
    }
    out.layout = TokenFileLayout::kRawU16;
    out.tokens = Tokens::of_memory(file, p, static_cast<std::int64_t>(size / 2), 2);
    out.max_token = scan_max<std::uint16_t>(*file, 0, out.tokens.size());
  }
  return out;
}

namespace {

struct Split {
  std::vector<fs::path> files;
  Tokens tokens;
  std::optional<TokenFileLayout> layout;
  std::int64_t max_token = -1;
};

Status read_split(Split& split) {
  for (const auto& f : split.files) {
    auto file = read_token_file(f);
    if (!file.ok()) return file.status();
    if (split.layout && *split.layout != file->layout) {
      return bad_file(f, fmt::format("is {} while {} is {}: one split must hold one layout", layout_name(file->layout),
                                     split.files.front().string(), layout_name(*split.layout)));
    }
    split.layout = file->layout;
    split.max_token = std::max(split.max_token, file->max_token);
    split.tokens = Tokens::concat(split.tokens, file->tokens);
  }
  return Status();
}

std::string names(const std::vector<fs::path>& files) {
  if (files.size() == 1) return files.front().filename().string();
  return fmt::format("{} .. {} ({} files)", files.front().filename().string(), files.back().filename().string(), files.size());
}

}  // namespace

Result<TokenCorpusFiles> token_corpus_files(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return error(ErrorCode::kNotFound, path.string() + " does not exist: pass a token file, or a folder holding train and val token files");
  }
  TokenCorpusFiles out;
  if (fs::is_regular_file(path, ec)) {
    out.train.push_back(path);
    return out;
  }
  if (!fs::is_directory(path, ec)) return error(ErrorCode::kInvalidArgument, path.string() + " is neither a file nor a folder");
  for (auto it = fs::directory_iterator(path, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (it->path().extension() != ".bin" || !it->is_regular_file(ec)) continue;
    const bool is_train = name.find("train") != std::string::npos, is_val = name.find("val") != std::string::npos;
    if (is_train && is_val) {
      return error(ErrorCode::kInvalidArgument, "token file " + it->path().string() + " is named both train and val: rename it for one split");
    }
    if (is_train) out.train.push_back(it->path());
    if (is_val) out.val.push_back(it->path());
  }
  if (ec) return error(ErrorCode::kIoError, "cannot list " + path.string() + ": " + ec.message());
  if (out.train.empty()) {
    return error(ErrorCode::kInvalidArgument, "folder " + path.string() +
                                                  " holds no *.bin file named for training (train.bin, or *_train*.bin as llm.c names them)");
  }
  std::sort(out.train.begin(), out.train.end());
  std::sort(out.val.begin(), out.val.end());
  return out;
}

Result<TokenCorpus> load_token_corpus(const fs::path& path) {
  std::error_code ec;
  auto files = token_corpus_files(path);
  if (!files.ok()) return files.status();
  TokenCorpus out;
  if (fs::is_regular_file(path, ec)) {
    auto file = read_token_file(path);
    if (!file.ok()) return file.status();
    out.train = file->tokens;
    out.max_token = file->max_token;
    out.description = fmt::format("{} ({}): {} tokens", path.string(), layout_name(file->layout), out.train.size());
    return out;
  }
  Split train, val;
  train.files = std::move(files->train);
  val.files = std::move(files->val);
  if (Status st = read_split(train); !st.ok()) return st;
  out.train = train.tokens;
  out.max_token = train.max_token;
  if (val.files.empty()) {
    out.description = fmt::format("{}/{} ({}): {} tokens", path.string(), names(train.files), layout_name(*train.layout), out.train.size());
    return out;
  }
  if (Status st = read_split(val); !st.ok()) return st;
  out.val = val.tokens;
  out.max_token = std::max(out.max_token, val.max_token);
  out.description = fmt::format("{}/{} + {} ({}): {} + {} tokens", path.string(), names(train.files), names(val.files),
                                layout_name(*train.layout), out.train.size(), out.val->size());
  return out;
}

}  // namespace gossamer::data
