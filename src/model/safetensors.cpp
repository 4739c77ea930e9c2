#include "model/safetensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace gossamer::model {

namespace {

struct DtypeRow {
  const char* name;
  at::ScalarType type;
};
// The safetensors dtype names of the LibTorch types we write and read.
constexpr DtypeRow kDtypes[] = {
    {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"F64", at::kDouble}, {"I64", at::kLong},
    {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},       {"U8", at::kByte},    {"BOOL", at::kBool},
};

const char* dtype_name(at::ScalarType t) {
  for (const auto& row : kDtypes) {
    if (row.type == t) return row.name;
  }
  return nullptr;
}

Status bad(const std::string& why) { return error(ErrorCode::kMalformed, "safetensors file: " + why); }

}  // namespace

Bytes encode_safetensors(const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> host;
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const char* dtype = dtype_name(t.tensor.scalar_type());
    GOSSAMER_CHECK(dtype != nullptr, "encode_safetensors: tensor " + t.name + " has a dtype safetensors cannot hold here");
    GOSSAMER_CHECK(names.insert(t.name).second && t.name != "__metadata__", "encode_safetensors: name " + t.name + " is repeated or reserved");
    auto h = t.tensor.detach().to(torch::kCPU).contiguous();
    const auto bytes = static_cast<std::uint64_t>(h.numel()) * static_cast<std::uint64_t>(h.element_size());
    header[t.name] = {{"dtype", dtype}, {"shape", h.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    host.push_back(std::move(h));
  }
  std::string json = header.dump();
  while (json.size() % 8 != 0) json.push_back(' ');
  Bytes out(8 + json.size() + offset);
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
  std::memcpy(out.data() + 8, json.data(), json.size());
  std::size_t at = 8 + json.size();
  for (const auto& h : host) {
    const auto bytes = static_cast<std::size_t>(h.numel()) * static_cast<std::size_t>(h.element_size());
    if (bytes > 0) std::memcpy(out.data() + at, h.data_ptr(), bytes);
    at += bytes;
  }
  return out;
}

Result<SafetensorsFile> decode_safetensors(ByteView file) {
  if (file.size() < 8) return bad("shorter than its 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(file[static_cast<std::size_t>(i)]) << (8 * i);
  if (n > kSafetensorsMaxHeader) return bad("header of " + std::to_string(n) + " bytes exceeds the cap of " + std::to_string(kSafetensorsMaxHeader));
  if (n > file.size() - 8) return bad("header of " + std::to_string(n) + " bytes runs past the end of the file (truncated?)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(file.data() + 8), reinterpret_cast<const char*>(file.data() + 8 + n));
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) return bad("header is not a JSON object");
  const std::uint64_t data_size = file.size() - 8 - n;
  const std::byte* data = file.data() + 8 + n;

  SafetensorsFile out;
  struct Span {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return bad("__metadata__ value of " + k + " is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      return bad("tensor " + name + " lacks dtype, shape or data_offsets");
    }
    const auto& dt = entry["dtype"];
    const auto& shape = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!dt.is_string() || !shape.is_array() || !offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return bad("tensor " + name + " has a malformed entry");
    }
    const DtypeRow* row = nullptr;
    for (const auto& r : kDtypes) {
      if (dt.get<std::string>() == r.name) row = &r;
    }
    if (!row) return bad("tensor " + name + " has dtype " + dt.get<std::string>() + ", which this reader does not know");
    std::vector<std::int64_t> sizes;
    std::uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (1ull << 40)) return bad("tensor " + name + " has a bad dimension");
      const auto v = d.get<std::uint64_t>();
      if (v != 0 && numel > (1ull << 62) / v) return bad("tensor " + name + " is impossibly large");
      numel *= v;
      sizes.push_back(static_cast<std::int64_t>(v));
    }
    const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    const auto element = static_cast<std::uint64_t>(c10::elementSize(row->type));
    if (begin > end || end > data_size) return bad("tensor " + name + "'s data_offsets fall outside the data");
    if (end - begin != numel * element) {
      return bad("tensor " + name + " of shape " + shape.dump() + " needs " + std::to_string(numel * element) + " bytes but its offsets hold " +
                 std::to_string(end - begin));
    }
    auto t = torch::empty(sizes, torch::TensorOptions().dtype(row->type));
    if (end > begin) std::memcpy(t.data_ptr(), data + begin, static_cast<std::size_t>(end - begin));
    spans.push_back({begin, end, out.tensors.size()});
    out.tensors.push_back({name, std::move(t)});
  }
  // The data is the tensors, back to back: no overlap, no gap, nothing after.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  std::uint64_t expect = 0;
  for (const auto& s : spans) {
    if (s.begin != expect) return bad("tensor " + out.tensors[s.index].name + " overlaps another or leaves a gap before it");
    expect = s.end;
  }
  if (expect != data_size) return bad("holds " + std::to_string(data_size - expect) + " bytes after its last tensor");
  // File order.
  std::vector<NamedTensor> ordered;
  for (const auto& s : spans) ordered.push_back(std::move(out.tensors[s.index]));
  out.tensors = std::move(ordered);
  return out;
}

}  // namespace gossamer::model
