// The safetensors format (https://github.com/huggingface/safetensors): 8-byte
// little-endian header length N, N bytes of JSON {"name": {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the data.
// Readable by the `safetensors` Python package, and it reads theirs.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "tessera/core/array.h"

namespace tessera::ckpt {

struct SafetensorsFile {
  std::map<std::string, Array> tensors;  // evaluated, contiguous
  std::map<std::string, std::string> metadata;
};

// Writes `path` directly (callers make it atomic by writing into a temporary
// directory) and fsyncs it. Tensor names are sorted; data is 8-byte aligned.
void write_safetensors(const std::filesystem::path& path, const std::map<std::string, Array>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads and validates (header length within the file, JSON well-formed, known dtypes,
// offsets in bounds, contiguous and non-overlapping, shape * itemsize == bytes).
// Problems are IOErrors naming the file and the tensor.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

}  // namespace tessera::ckpt
