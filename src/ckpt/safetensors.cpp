#include "tessera/ckpt/safetensors.h"

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <bit>
#include <nlohmann/json.hpp>
#include <set>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"

namespace tessera::ckpt {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian: byte swaps needed");

// The Rust reference implementation refuses headers over 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

constexpr std::array<std::pair<DType, std::string_view>, kNumDTypes> kDTypeNames = {{
    {DType::Bool, "BOOL"},
    {DType::UInt8, "U8"},
    {DType::Int8, "I8"},
    {DType::UInt32, "U32"},
    {DType::Int32, "I32"},
    {DType::Int64, "I64"},
    {DType::Float16, "F16"},
    {DType::BFloat16, "BF16"},
    {DType::Float32, "F32"},
    {DType::Float64, "F64"},
}};

bool dtype_from_safetensors(std::string_view name, DType* dtype) {
  for (const auto& [d, n] : kDTypeNames)
    if (n == name) return *dtype = d, true;
  return false;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Parses one tensor entry {"dtype", "shape", "data_offsets"}.
SafetensorsEntry parse_entry(const std::filesystem::path& path, const std::string& name, const nlohmann::json& info) {
  const std::string where = fmt::format("safetensors {}: tensor '{}'", path.string(), name);
  if (!info.is_object()) fail<IOError>("{}: entry is {} (expected an object)", where, info.type_name());
  for (const auto& [key, value] : info.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail<IOError>("{}: unknown field '{}' (expected dtype, shape, data_offsets)", where, key);
  SafetensorsEntry entry;
  entry.name = name;
  const auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) fail<IOError>("{}: missing or non-string 'dtype'", where);
  if (!dtype_from_safetensors(dtype->get<std::string>(), &entry.dtype))
    fail<IOError>("{}: dtype {} is not supported (supported: BOOL U8 I8 U32 I32 I64 F16 BF16 F32 F64)", where,
                  dtype->get<std::string>());
  const auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) fail<IOError>("{}: missing or non-array 'shape'", where);
  uint64_t elements = 1;
  // The product of the dims with zeros counted as 1: an empty tensor still gets strides
  // from its other dims, so [0, 2^40, 2^40] must be refused too (its element count, 0,
  // would pass the byte check).
  uint64_t extent = 1;
  bool overflow = false;
  for (const auto& dim : *shape) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail<IOError>("{}: shape {} has a dim that is not a non-negative integer", where, shape->dump());
    const uint64_t d = dim.get<uint64_t>();
    if (d != 0 && elements > UINT64_MAX / d) overflow = true;
    elements *= d;
    const uint64_t e = std::max<uint64_t>(d, 1);
    if (extent > static_cast<uint64_t>(INT64_MAX) / e)
      fail<IOError>("{}: shape {} is too large (the product of its dims exceeds 2^63)", where, shape->dump());
    extent *= e;
    entry.shape.push_back(static_cast<int64_t>(d));
  }
  const auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    fail<IOError>("{}: 'data_offsets' must be [begin, end] of non-negative integers", where);
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.begin > entry.end)
    fail<IOError>("{}: data_offsets [{}, {}] end before they begin", where, entry.begin, entry.end);
  const uint64_t item = itemsize(entry.dtype);
  if (overflow || elements > UINT64_MAX / item || elements * item != entry.end - entry.begin)
    fail<IOError>("{}: {} {} needs {} bytes but data_offsets [{}, {}] hold {}", where, dtype->get<std::string>(),
                  to_string(entry.shape), overflow ? std::string("more than 2^64") : std::to_string(elements * item),
                  entry.begin, entry.end, entry.end - entry.begin);
  return entry;
}

}  // namespace

std::string_view safetensors_dtype(DType dtype) {
  for (const auto& [d, n] : kDTypeNames)
    if (d == dtype) return n;
  fail<ValueError>("safetensors: no name for dtype {}", static_cast<int>(dtype));
}

void write_safetensors(const std::filesystem::path& path, const std::map<std::string, Array>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Data in order of decreasing alignment, then name (as the Python writer does): every
  // tensor then starts at a multiple of its itemsize, the data section being 8-aligned.
  std::vector<std::pair<std::string, Array>> order(tensors.begin(), tensors.end());
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second.itemsize() > b.second.itemsize(); });
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, array] : order) {
    if (name == kMetadataKey) fail<ValueError>("write_safetensors {}: '{}' is a reserved name", path.string(), name);
    if (!array.valid()) fail<ValueError>("write_safetensors {}: tensor '{}' is an empty handle", path.string(), name);
    const uint64_t bytes = array.nbytes();
    header[name] = {{"dtype", safetensors_dtype(array.dtype())},
                    {"shape", array.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  fileio::File file(path, O_WRONLY | O_CREAT | O_TRUNC);
  std::array<uint8_t, 8> length{};
  for (int i = 0; i < 8; ++i) length[static_cast<size_t>(i)] = static_cast<uint8_t>(text.size() >> (8 * i));
  file.write_all(length.data(), length.size());
  file.write_all(text.data(), text.size());
  for (const auto& [name, array] : order) {
    if (array.nbytes() == 0) continue;
    array.eval();
    file.write_all(array.raw_data(), array.nbytes());
  }
  file.sync();
  file.close();
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  fileio::File file(path, O_RDONLY);
  const uint64_t file_size = file.size();
  std::array<uint8_t, 8> length_bytes{};
  if (file_size < 8 || file.read_at(0, length_bytes.data(), 8) != 8)
    fail<IOError>("safetensors {}: file is {} bytes, too short for the 8-byte header length", path.string(), file_size);
  const uint64_t length = read_u64_le(length_bytes.data());
  if (length > file_size - 8 || length > kMaxHeaderBytes)
    fail<IOError>("safetensors {}: header length {} exceeds the file ({} bytes after the length) or the {} byte limit",
                  path.string(), length, file_size - 8, kMaxHeaderBytes);
  std::string text(length, '\0');
  if (file.read_at(8, text.data(), length) != length)
    fail<IOError>("safetensors {}: the file shrank while its header was read", path.string());
  if (text.empty() || text[0] != '{')
    fail<IOError>("safetensors {}: header does not start with '{{' (not a safetensors file?)", path.string());

  // nlohmann keeps the last of duplicate keys silently; a file with two entries for one
  // tensor is ambiguous, so reject it.
  std::string duplicate;
  std::set<std::string> top_keys;
  const auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && !top_keys.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, callback);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number past double's range ("1e999") is an out_of_range.
    fail<IOError>("safetensors {}: header is not valid JSON: {}", path.string(), e.what());
  }
  if (!header.is_object()) fail<IOError>("safetensors {}: header is not a JSON object", path.string());
  if (!duplicate.empty())
    fail<IOError>("safetensors {}: tensor '{}' appears twice in the header", path.string(), duplicate);

  SafetensorsHeader result;
  result.data_start = 8 + length;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      if (!info.is_object()) fail<IOError>("safetensors {}: __metadata__ is not an object", path.string());
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string())
          fail<IOError>("safetensors {}: __metadata__ value of '{}' is {} (expected a string)", path.string(), key,
                        value.type_name());
        result.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    result.tensors.push_back(parse_entry(path, name, info));
  }

  // The data section must be tiled exactly: no gaps, no overlaps, nothing after the last tensor.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& entry : result.tensors) by_offset.push_back(&entry);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  for (const SafetensorsEntry* entry : by_offset) {
    if (entry->begin != expected)
      fail<IOError>("safetensors {}: tensor '{}' data_offsets [{}, {}] {} (expected it to begin at {})", path.string(),
                    entry->name, entry->begin, entry->end,
                    entry->begin < expected ? "overlap another tensor" : "leave a gap", expected);
    expected = entry->end;
  }
  const uint64_t data_bytes = file_size - result.data_start;
  if (expected != data_bytes)
    fail<IOError>("safetensors {}: the tensors cover {} data bytes but the file has {} ({})", path.string(), expected,
                  data_bytes, expected < data_bytes ? "trailing bytes" : "truncated");
  return result;
}

SafetensorsFile read_safetensors(const std::filesystem::path& path,
                                 const std::function<bool(const std::string& name)>& wanted) {
  return read_safetensors(path, read_safetensors_header(path), wanted);
}

SafetensorsFile read_safetensors(const std::filesystem::path& path, const SafetensorsHeader& header,
                                 const std::function<bool(const std::string& name)>& wanted) {
  fileio::File file(path, O_RDONLY);
  SafetensorsFile result;
  result.metadata = header.metadata;
  for (const SafetensorsEntry& entry : header.tensors) {
    if (wanted && !wanted(entry.name)) continue;
    Array array = Array::empty(entry.shape, entry.dtype);
    const uint64_t bytes = entry.end - entry.begin;
    if (bytes > 0) {
      auto* data = static_cast<uint8_t*>(array.mutable_raw_data());
      if (file.read_at(header.data_start + entry.begin, data, bytes) != bytes)
        fail<IOError>("safetensors {}: tensor '{}': the file shrank while it was read", path.string(), entry.name);
      if (entry.dtype == DType::Bool)
        for (uint64_t i = 0; i < bytes; ++i)
          if (data[i] > 1)
            fail<IOError>("safetensors {}: tensor '{}': BOOL element {} is {} (expected 0 or 1)", path.string(),
                          entry.name, i, data[i]);
    }
    result.tensors.emplace(entry.name, std::move(array));
  }
  return result;
}

}  // namespace tessera::ckpt
