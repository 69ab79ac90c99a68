// The safetensors format (https://github.com/huggingface/safetensors): 8-byte
// little-endian header length N, N bytes of JSON {"name": {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the data.
// Readable by the `safetensors` Python package, and it reads theirs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

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
// Problems are IOErrors naming the file and the tensor. With `wanted`, only the tensors
// it accepts are read (the header is still read and checked whole).
SafetensorsFile read_safetensors(const std::filesystem::path& path,
                                 const std::function<bool(const std::string& name)>& wanted = {});

// Dtype names: BOOL U8 I8 U32 I32 I64 F16 BF16 F32 F64 (every tessera DType). Files with
// another safetensors dtype (I16, U16, U64, F8_*) are IOErrors naming the tensor.
std::string_view safetensors_dtype(DType dtype);

// One tensor's header entry; begin and end are offsets into the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section (8 + header length)
};

// Reads and validates the header only (every check of read_safetensors except the
// BOOL values): what `tessera ckpt inspect` shows without reading the data.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);
// read_safetensors with the file's header already read (by read_safetensors_header).
SafetensorsFile read_safetensors(const std::filesystem::path& path, const SafetensorsHeader& header,
                                 const std::function<bool(const std::string& name)>& wanted = {});

}  // namespace tessera::ckpt
