// json_field / json_field_or: typed reads of JSON from disk. A value of the wrong type or
// out of the target's range reads as absent, where nlohmann's value() would throw.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "tessera/base/json_field.h"

namespace tessera {
namespace {

using nlohmann::json;

TEST(JsonField, ReadsValuesOfTheRightType) {
  const json obj = {{"name", "gpt2"}, {"step", 42}, {"lr", 3e-4}, {"async", true}, {"extra", {{"a", 1}}}};
  EXPECT_EQ(json_field<std::string>(obj, "name"), "gpt2");
  EXPECT_EQ(json_field<int64_t>(obj, "step"), 42);
  EXPECT_EQ(json_field<uint32_t>(obj, "step"), 42u);
  EXPECT_EQ(json_field<double>(obj, "lr"), 3e-4);
  EXPECT_EQ(json_field<double>(obj, "step"), 42.0);  // an integer is a number
  EXPECT_EQ(json_field<bool>(obj, "async"), true);
  EXPECT_EQ(json_field<json>(obj, "extra"), (json{{"a", 1}}));
}

TEST(JsonField, WrongTypesMissingKeysAndNullReadAsAbsent) {
  const json obj = {{"name", 7}, {"step", "42"}, {"lr", "fast"}, {"async", 1}, {"none", nullptr}, {"real", 2.5}};
  EXPECT_FALSE(json_field<std::string>(obj, "name"));
  EXPECT_FALSE(json_field<int64_t>(obj, "step"));
  EXPECT_FALSE(json_field<double>(obj, "lr"));
  EXPECT_FALSE(json_field<bool>(obj, "async"));
  EXPECT_FALSE(json_field<json>(obj, "none"));
  EXPECT_FALSE(json_field<int64_t>(obj, "real"));  // 2.5 is not an integer
  EXPECT_FALSE(json_field<std::string>(obj, "missing"));
  EXPECT_EQ(json_field_or<std::string>(obj, "name", "?"), "?");
  EXPECT_EQ(json_field_or<double>(obj, "lr", 1.0), 1.0);
}

TEST(JsonField, NotAnObjectReadsAsAbsent) {
  for (const json& not_object : {json::array({1, 2}), json("text"), json(3), json(nullptr)}) {
    SCOPED_TRACE(not_object.dump());
    EXPECT_FALSE(json_field<int64_t>(not_object, "step"));
    EXPECT_EQ(json_field_or<std::string>(not_object, "format", "none"), "none");
  }
}

TEST(JsonField, IntegersOutOfTheTargetsRangeReadAsAbsent) {
  const json obj = {{"negative", -1}, {"big", uint64_t{1} << 40}, {"huge", UINT64_MAX}, {"small", -129}};
  EXPECT_FALSE(json_field<uint64_t>(obj, "negative"));
  EXPECT_EQ(json_field<int64_t>(obj, "negative"), -1);
  EXPECT_FALSE(json_field<int32_t>(obj, "big"));
  EXPECT_EQ(json_field<int64_t>(obj, "big"), int64_t{1} << 40);
  EXPECT_FALSE(json_field<int64_t>(obj, "huge"));
  EXPECT_EQ(json_field<uint64_t>(obj, "huge"), UINT64_MAX);
  EXPECT_FALSE(json_field<int8_t>(obj, "small"));
}

}  // namespace
}  // namespace tessera
