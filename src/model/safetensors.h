// safetensors files: named tensors as Hugging Face's format lays them out, so PyTorch, JAX and
// NumPy users load a model's weights without Gossamer (`safetensors.torch.load_file`).
//
// Layout: u64 little-endian N, then N bytes of JSON (a UTF-8 object; padded with spaces to a
// multiple of 8), then the tensors' bytes back to back. The JSON maps each name to {"dtype",
// "shape", "data_offsets": [begin, end]} (offsets into the data after the header) and may hold
// "__metadata__": {string: string}. Tensors are row-major, little-endian.
//
// Reading treats the file as untrusted: the header length is capped and checked against the file,
// the JSON must parse, every dtype be known, every shape's bytes match its offsets, offsets stay
// inside the data, and tensors neither overlap nor leave gaps. A bad file is a
// kMalformed Status saying what is wrong; nothing is allocated before it is checked.
// Threading: pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer::model {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in file order
  std::map<std::string, std::string> metadata;
};

inline constexpr std::size_t kSafetensorsMaxHeader = 100u << 20;

// Tensors of dtype float32, float16, bfloat16, float64, int64, int32, int16, int8, uint8 or bool,
// on any device (copied to the host); names must be unique.
Bytes encode_safetensors(const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata = {});
[[nodiscard]] Result<SafetensorsFile> decode_safetensors(ByteView file);

}  // namespace gossamer::model
