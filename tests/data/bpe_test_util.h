// Shared by the BPE tokenizer tests: the committed fixtures and the oracle's golden ids
// (tests/oracles/tokenizers_bpe.py: Hugging Face tokenizers == tiktoken).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::testing {

inline std::filesystem::path bpe_fixtures() {
  return std::filesystem::path(TESSERA_SOURCE_DIR) / "tests/data/fixtures/tokenizers";
}

struct BpeGolden {
  std::vector<std::string> texts;
  nlohmann::json cases;  // name -> {"ids": [[...]], ...}
  const std::vector<std::vector<int32_t>> ids(const std::string& name) const {
    return cases.at(name).at("ids").get<std::vector<std::vector<int32_t>>>();
  }
};

inline const BpeGolden& bpe_golden() {
  static const BpeGolden golden = [] {
    std::ifstream in(std::filesystem::path(TESSERA_SOURCE_DIR) / "tests/oracles/goldens/tokenizers_bpe.json");
    const nlohmann::json json = nlohmann::json::parse(in);
    BpeGolden g;
    g.texts = json.at("texts").get<std::vector<std::string>>();
    for (const auto& c : json.at("tokenizers")) g.cases[c.at("name").get<std::string>()] = c;
    return g;
  }();
  return golden;
}

}  // namespace tessera::testing
