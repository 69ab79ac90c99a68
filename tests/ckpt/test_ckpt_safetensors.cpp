// safetensors: a hand-built file as the Python package writes it, bitwise round trips
// of every dtype, the layout rules (8-byte aligned data, tensors aligned to their
// itemsize) and malformed headers rejected with the file and tensor named.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/ckpt/safetensors.h"

namespace tessera::ckpt {
namespace {

using tessera::testing::read_bytes;
using tessera::testing::TempDir;
using tessera::testing::write_bytes;

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return out;
}

// A file from a header (padded with spaces to a multiple of 8, as the Python writer does) and data bytes.
std::string safetensors_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

std::string float_bytes(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return out;
}

void expect_same_bits(const Array& a, const Array& b) {
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  if (a.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  }
}

TEST(Safetensors, ReadsAFileBuiltByHand) {
  // What safetensors.numpy.save_file({"w": np.array([1, -2.5], np.float32)}, metadata={"format": "np"}) writes.
  TempDir dir;
  const std::string header = R"({"__metadata__":{"format":"np"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_bytes(dir / "golden.safetensors", safetensors_bytes(header, float_bytes({1.0f, -2.5f})));
  const SafetensorsFile file = read_safetensors(dir / "golden.safetensors");
  ASSERT_EQ(file.tensors.size(), 1u);
  const Array& w = file.tensors.at("w");
  EXPECT_EQ(w.dtype(), DType::Float32);
  EXPECT_EQ(w.shape(), Shape{2});
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"format", "np"}}));
}

TEST(Safetensors, WritesTheExpectedBytes) {
  TempDir dir;
  write_safetensors(dir / "w.safetensors", {{"w", Array::from_vector<float>({1.0f, -2.5f})}}, {{"format", "np"}});
  const std::string header = R"({"__metadata__":{"format":"np"},"w":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  EXPECT_EQ(read_bytes(dir / "w.safetensors"), safetensors_bytes(header, float_bytes({1.0f, -2.5f})));
}

TEST(Safetensors, RoundTripsEveryDTypeBitwise) {
  TempDir dir;
  std::map<std::string, Array> tensors;
  tensors["bool"] = Array::from_vector<bool>({true, false, true, true}, {2, 2});
  tensors["u8"] = Array::from_vector<uint8_t>({0, 1, 254, 255}, {4});
  tensors["i8"] = Array::from_vector<int8_t>({-128, -1, 0, 127}, {4});
  tensors["u32"] = Array::from_vector<uint32_t>({0, 1, 0xffffffffu}, {3, 1});
  tensors["i32"] = Array::from_vector<int32_t>({INT32_MIN, -7, INT32_MAX}, {3});
  tensors["i64"] = Array::from_vector<int64_t>({INT64_MIN, 42}, {1, 2});
  tensors["f16"] = Array::from_vector<float16>({float16{0x3c00}, float16{0x7e00}, float16{0x0001}}, {3});
  tensors["bf16"] = Array::from_vector<bfloat16>({bfloat16{0x3f80}, bfloat16{0xff80}, bfloat16{0x7fc1}}, {3});
  tensors["f32"] = Array::from_vector<float>({1.5f, -0.0f, 3.4e38f, 1e-45f, 7.0f, 8.0f}, {2, 3});
  tensors["f64"] = Array::from_vector<double>({3.141592653589793, -1e-310}, {2});
  tensors["scalar"] = Array::from_vector<float>({2.0f}, Shape{});
  tensors["empty"] = Array::from_vector<float>({}, {0, 3});
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "12"}};
  write_safetensors(dir / "all.safetensors", tensors, metadata);

  const SafetensorsFile back = read_safetensors(dir / "all.safetensors");
  EXPECT_EQ(back.metadata, metadata);
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (const auto& [name, array] : tensors) {
    SCOPED_TRACE(name);
    expect_same_bits(back.tensors.at(name), array);
  }

  // Layout: the data section starts 8-aligned and every tensor at a multiple of its itemsize.
  const SafetensorsHeader header = read_safetensors_header(dir / "all.safetensors");
  EXPECT_EQ(header.data_start % 8, 0u);
  for (const SafetensorsEntry& entry : header.tensors) EXPECT_EQ(entry.begin % itemsize(entry.dtype), 0u) << entry.name;
  // The dtype names are the safetensors ones.
  const nlohmann::json json =
      nlohmann::json::parse(read_bytes(dir / "all.safetensors").substr(8, header.data_start - 8));
  EXPECT_EQ(json["bf16"]["dtype"], "BF16");
  EXPECT_EQ(json["bool"]["dtype"], "BOOL");
  EXPECT_EQ(json["u32"]["dtype"], "U32");
  EXPECT_EQ(json["scalar"]["shape"], nlohmann::json::array());
}

TEST(Safetensors, RejectsMalformedFiles) {
  TempDir dir;
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data = float_bytes({1.0f, 2.0f});
  struct Case {
    const char* name;
    std::string bytes;
    const char* expect;  // a part of the message
  };
  const std::vector<Case> cases = {
      {"short", "abc", "too short"},
      {"length_past_end", le64(1000) + "{}", "header length 1000"},
      {"not_json", safetensors_bytes("{\"w\": [", data), "not valid JSON"},
      // The JSON library's out_of_range, not a parse_error (found by the fuzz targets).
      {"number_overflow", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,8]}})", data),
       "header is not valid JSON: [json.exception.out_of_range.406] number overflow parsing '1e999'"},
      {"not_object_start", safetensors_bytes("[1, 2]", ""), "does not start with '{'"},
      {"unknown_dtype", safetensors_bytes(R"({"w":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", data),
       "dtype I16 is not supported"},
      {"unknown_field", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", data),
       "unknown field 'x'"},
      {"size_mismatch", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
       "needs 12 bytes"},
      {"negative_dim", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
       "non-negative"},
      {"reversed", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data),
       "end before they begin"},
      {"truncated", safetensors_bytes("{" + ok_entry + "}", data.substr(0, 6)), "truncated"},
      {"trailing", safetensors_bytes("{" + ok_entry + "}", data + "xx"), "trailing bytes"},
      {"gap", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "leave a gap"},
      {"overlap",
       safetensors_bytes(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           data),
       "overlap"},
      {"duplicate", safetensors_bytes("{" + ok_entry + "," + ok_entry + "}", data), "appears twice"},
      {"metadata_value", safetensors_bytes(R"({"__metadata__":{"n":1},)" + ok_entry + "}", data), "expected a string"},
      {"bool_value", safetensors_bytes(R"({"w":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"),
       "expected 0 or 1"},
      // Zero elements, so zero bytes, but strides from the other dims overflow.
      {"empty_but_huge",
       safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}})", ""),
       "too large"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto path = dir / (std::string(c.name) + ".safetensors");
    write_bytes(path, c.bytes);
    try {
      read_safetensors(path);
      ADD_FAILURE() << "expected IOError";
    } catch (const IOError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path.string()), std::string::npos) << message;
      EXPECT_NE(message.find(c.expect), std::string::npos) << message;
    }
  }
}

TEST(Safetensors, WriterRejectsTheReservedName) {
  TempDir dir;
  EXPECT_THROW(write_safetensors(dir / "x.safetensors", {{"__metadata__", Array::scalar(1.0)}}), ValueError);
}

}  // namespace
}  // namespace tessera::ckpt
