// base/bytes.h: what the writer writes the reader reads back, and damaged bytes are
// refused (throwing reads: a ValueError naming the format and what was read; try_
// reads: false with nothing consumed).
#include <gtest/gtest.h>

#include <string>

#include "tessera/base/bytes.h"
#include "tessera/base/error.h"

using tessera::ByteReader;
using tessera::ByteWriter;

TEST(Bytes, WhatIsWrittenReadsBack) {
  ByteWriter w;
  w.pod<uint32_t>(7);
  w.str("hello");
  w.pod<double>(-2.5);
  w.blob("", 0);
  ByteReader r(w.bytes(), "test");
  EXPECT_EQ(r.pod<uint32_t>("a"), 7u);
  EXPECT_EQ(r.blob("b"), "hello");
  EXPECT_EQ(r.pod<double>("c"), -2.5);
  EXPECT_EQ(r.blob("d"), "");
  EXPECT_TRUE(r.done());
}

TEST(Bytes, TruncatedBytesAreAValueErrorNamingFormatAndField) {
  ByteWriter w;
  w.str("abcdef");
  const std::string cut = w.bytes().substr(0, w.bytes().size() - 2);
  ByteReader r(cut, "executable");
  try {
    r.blob("the constant");
    FAIL() << "expected a ValueError";
  } catch (const tessera::ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("executable: truncated bytes reading the constant"), std::string::npos) << what;
  }
}

TEST(Bytes, ACountLargerThanTheBytesLeftIsRefusedBeforeAnyAllocation) {
  ByteWriter w;
  w.pod<uint64_t>(uint64_t{1} << 60);
  ByteReader r(w.bytes(), "executable");
  EXPECT_THROW(r.count("nodes", 16), tessera::ValueError);
}

TEST(Bytes, TryReadsRefuseWithoutConsuming) {
  ByteWriter w;
  w.pod<uint64_t>(100);  // a blob length with no bytes behind it
  ByteReader r(w.bytes(), "index");
  std::string_view s;
  EXPECT_FALSE(r.try_blob(s));
  EXPECT_EQ(r.position(), 0u) << "a refused read consumes nothing";
  uint64_t n = 0;
  EXPECT_TRUE(r.try_pod(n));
  EXPECT_EQ(n, 100u);
  uint32_t more = 0;
  EXPECT_FALSE(r.try_pod(more));
  EXPECT_FALSE(r.try_bytes(1, s));
}
