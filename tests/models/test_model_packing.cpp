// Packed documents (Model::logits / loss with a Packing): a row A|B|C gives each
// document the logits it gets alone, for GPT-2 (learned positions gathered at the
// in-document positions) and llama (RoPE at those positions, GQA). The same row without
// segment ids gives different logits, so attention crossing a boundary cannot pass;
// with row positions GPT-2's differ too (llama's do not: RoPE is relative). The row is longer than the attention
// kernels' 64-token tiles, so their tile skipping is on the path.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/models/model.h"
#include "tessera/tessera.h"

namespace tessera::models {
namespace {

ModelConfig packing_config(const std::string& family) {
  ModelConfig c;
  c.family = family;
  c.vocab = 37;
  c.dim = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = family == "llama" ? 2 : 0;
  c.mlp_dim = family == "llama" ? 24 : 0;
  c.context = 96;
  c.init_std = 0.3;  // attention must matter to the logits, or a wrong mask passes
  return c;
}

// Norm scales and biases moved off 1 and 0, so their use is visible in the outputs.
Tree perturbed(const Tree& params, uint32_t seed) {
  uint32_t next = seed;
  return params.map([&](const Array& a) {
    std::vector<double> v = a.to_vector<double>();
    std::vector<double> noise = test::random_values(a.size(), next++, -0.05, 0.05);
    for (size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
    return test::make_array(v, a.shape(), DType::Float32);
  });
}

// Rows of documents (token ids) packed as data::Batch lays them out: tokens, segment
// ids (the document's index in its row), positions inside the document, and next-token
// targets with -100 at each document's last token.
struct Packed {
  Array tokens, segments, positions, targets;
};

Packed pack(const std::vector<std::vector<std::vector<int32_t>>>& rows) {
  std::vector<int32_t> tokens, segments, positions, targets;
  int64_t t = 0;
  for (const auto& row : rows) {
    t = 0;
    for (size_t d = 0; d < row.size(); ++d)
      for (size_t i = 0; i < row[d].size(); ++i, ++t) {
        tokens.push_back(row[d][i]);
        segments.push_back(static_cast<int32_t>(d));
        positions.push_back(static_cast<int32_t>(i));
        targets.push_back(i + 1 < row[d].size() ? row[d][i + 1] : -100);
      }
  }
  const Shape shape{static_cast<int64_t>(rows.size()), t};
  return {Array::from_vector(tokens, shape), Array::from_vector(segments, shape), Array::from_vector(positions, shape),
          Array::from_vector(targets, shape)};
}

std::vector<int32_t> document(int64_t length, uint32_t seed) {
  std::vector<int64_t> v = test::random_ints(length, seed, 0, 36);
  return {v.begin(), v.end()};
}

void check_packed_equals_alone(const std::string& family) {
  SCOPED_TRACE(family);
  const Model model(packing_config(family));
  const Tree p = perturbed(model.init(3), 4);
  // Row 0: A|B|C crossing the 64-token tile boundary; row 1: D|E.
  const std::vector<std::vector<int32_t>> row0{document(30, 1), document(25, 2), document(17, 3)};
  const std::vector<std::vector<int32_t>> row1{document(50, 4), document(22, 5)};
  const Packed b = pack({row0, row1});
  const Packing packing{b.segments, b.positions};
  Array packed = model.logits(p, b.tokens, std::nullopt, packing);
  Array plain = model.logits(p, b.tokens);
  Array row_positions =
      model.logits(p, b.tokens, std::nullopt, Packing{b.segments, broadcast_to(arange(72, DType::Int32), {2, 72})});
  ASSERT_EQ(packed.shape(), (Shape{2, 72, 37}));

  int64_t row = 0;
  for (const auto& docs : {row0, row1}) {
    int64_t start = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      const int64_t len = static_cast<int64_t>(docs[d].size());
      Array alone = model.logits(p, Array::from_vector(docs[d], {1, len}));
      Array part = slice_axis(slice_axis(packed, 0, row, row + 1), 1, start, start + len);
      EXPECT_TRUE(test::all_close(part, alone, 1e-4, 1e-5)) << "row " << row << " document " << d;
      if (start > 0) {  // a later document: without packing it sees the earlier ones
        Array unpacked = slice_axis(slice_axis(plain, 0, row, row + 1), 1, start, start + len);
        EXPECT_FALSE(test::all_close(unpacked, alone, 1e-2, 1e-2)) << "row " << row << " document " << d;
        // Row positions: GPT-2's learned table is absolute, so they change the logits;
        // RoPE is relative, so a document shifted as a whole keeps them (up to rounding).
        Array shifted = slice_axis(slice_axis(row_positions, 0, row, row + 1), 1, start, start + len);
        if (family == "gpt2")
          EXPECT_FALSE(test::all_close(shifted, alone, 1e-2, 1e-2))
              << "row positions, row " << row << " document " << d;
        else
          EXPECT_TRUE(test::all_close(shifted, alone, 1e-3, 1e-4)) << "row positions, row " << row << " document " << d;
      }
      start += len;
    }
    ++row;
  }

  // The loss over the packed rows is the token-weighted mean of the documents' losses.
  double total = 0, count = 0;
  for (const auto& docs : {row0, row1})
    for (const auto& doc : docs) {
      const Packed alone = pack({{doc}});
      const double n = static_cast<double>(doc.size() - 1);
      total += n * model.loss(p, alone.tokens, alone.targets).item<double>();
      count += n;
    }
  EXPECT_NEAR(model.loss(p, b.tokens, b.targets, std::nullopt, packing).item<double>(), total / count, 1e-5);
}

TEST(ModelPacking, Gpt2DocumentsSeeOnlyThemselves) { check_packed_equals_alone("gpt2"); }

TEST(ModelPacking, LlamaDocumentsSeeOnlyThemselves) { check_packed_equals_alone("llama"); }

TEST(ModelPacking, RejectsBadPacking) {
  const Model model(packing_config("llama"));
  const Tree p = model.init(1);
  const Packed b = pack({{document(3, 1), document(2, 2)}});
  EXPECT_THROW(model.logits(p, b.tokens, std::nullopt, Packing{b.segments, zeros({1, 5})}), ShapeError);
  EXPECT_THROW(model.logits(p, b.tokens, std::nullopt, Packing{b.segments, zeros({1, 4}, DType::Int32)}), ShapeError);
  EXPECT_THROW(model.loss(p, b.tokens, b.targets, std::nullopt, Packing{Array(), b.positions}), ShapeError);
  // Positions index the RoPE / position tables of the row: each must be < T.
  EXPECT_THROW(model.logits(p, b.tokens, std::nullopt,
                            Packing{b.segments, Array::from_vector<int32_t>({0, 1, 2, 0, 5}, {1, 5})}),
               ValueError);
}

}  // namespace
}  // namespace tessera::models
