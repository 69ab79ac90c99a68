// Llama 3.1's RoPE scaling (nn::Rotary::llama3, Hugging Face rope_type "llama3")
// against a float64 reference written here from the published formula, in the
// transformers order: every inverse frequency divided by the factor where its
// wavelength exceeds L / low_freq_factor, then the middle band replaced by the
// interpolation (1 - s) f' / factor + s f'. The configurations put frequencies in all
// three bands; the cos/sin tables follow the scaled frequencies; bad values are errors
// naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/base/error.h"
#include "tessera/nn/rotary.h"

namespace tessera::nn {
namespace {

enum class Band { High, Middle, Low };

struct Reference {
  std::vector<double> inv_freq;
  std::vector<Band> band;
};

Reference reference_llama3(int64_t head_dim, double theta, double factor, double low, double high, double context) {
  Reference out;
  for (int64_t k = 0; k < head_dim; k += 2) {
    const double base = 1.0 / std::pow(theta, static_cast<double>(k) / static_cast<double>(head_dim));
    const double wavelength = 2 * std::numbers::pi / base;
    const double low_edge = context / low, high_edge = context / high;
    const double divided = wavelength > low_edge ? base / factor : base;
    const double s = (context / wavelength - low) / (high - low);
    const bool middle = !(wavelength < high_edge) && !(wavelength > low_edge);
    out.inv_freq.push_back(middle ? (1 - s) * divided / factor + s * divided : divided);
    out.band.push_back(middle ? Band::Middle : (wavelength > low_edge ? Band::Low : Band::High));
  }
  return out;
}

struct Case {
  std::string name;
  int64_t head_dim;
  double theta;
  Llama3RopeScaling scaling;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"llama-3.1-8b", 128, 500000.0, {}},  // the defaults are Llama 3.1's factors and context
      {"llama-3.2-1b", 64, 500000.0, {.factor = 32.0}},
      {"hf_llama31 fixture", 8, 100.0, {.original_context = 32}},
      {"fractional factors",
       16,
       10000.0,
       {.factor = 2.5, .low_freq_factor = 0.5, .high_freq_factor = 3.0, .original_context = 64}},
  };
  return all;
}

TEST(RotaryLlama3, InverseFrequenciesMatchTheFloat64Formula) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Llama3RopeScaling& s = c.scaling;
    const Reference want = reference_llama3(c.head_dim, c.theta, s.factor, s.low_freq_factor, s.high_freq_factor,
                                            static_cast<double>(s.original_context));
    const std::vector<double> got = Rotary{.head_dim = c.head_dim, .theta = c.theta, .llama3 = s}.inverse_frequencies();
    ASSERT_EQ(got.size(), want.inv_freq.size());
    int per_band[3] = {0, 0, 0};
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want.inv_freq[i], 1e-14 * want.inv_freq[i]) << "i = " << i;
      ++per_band[static_cast<int>(want.band[i])];
    }
    // Every branch of the rule is exercised by each case.
    EXPECT_GT(per_band[0], 0);
    EXPECT_GT(per_band[1], 0);
    EXPECT_GT(per_band[2], 0);
  }
}

TEST(RotaryLlama3, ScalingSlowsOnlyTheLowFrequencies) {
  const Rotary plain{.head_dim = 128, .theta = 500000.0};
  const Rotary scaled{.head_dim = 128, .theta = 500000.0, .llama3 = Llama3RopeScaling{}};
  const std::vector<double> f = plain.inverse_frequencies(), g = scaled.inverse_frequencies();
  EXPECT_EQ(f[0], g[0]);                     // the highest frequency: unchanged, bit for bit
  EXPECT_DOUBLE_EQ(g.back(), f.back() / 8);  // the lowest: divided by the factor
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_LE(g[i], f[i]) << i;
    EXPECT_GE(g[i], f[i] / 8 * (1 - 1e-15)) << i;
  }
}

TEST(RotaryLlama3, TablesUseTheScaledFrequencies) {
  const Case& c = cases()[2];
  const Rotary rotary{.head_dim = c.head_dim, .theta = c.theta, .llama3 = c.scaling};
  const Reference ref = reference_llama3(c.head_dim, c.theta, 8.0, 1.0, 4.0, 32.0);
  const int64_t length = 5, offset = 40, half = c.head_dim / 2;
  auto [cos_t, sin_t] = rotary.tables(length, offset, DType::Float64);
  std::vector<double> want_cos, want_sin;
  for (int64_t t = 0; t < length; ++t)
    for (int64_t j = 0; j < c.head_dim; ++j) {
      const double angle = static_cast<double>(offset + t) * ref.inv_freq[static_cast<size_t>(j % half)];
      want_cos.push_back(std::cos(angle));
      want_sin.push_back(std::sin(angle));
    }
  EXPECT_CLOSE(cos_t, want_cos, 1e-13, 1e-13);
  EXPECT_CLOSE(sin_t, want_sin, 1e-13, 1e-13);
  // And they differ from plain RoPE's at these positions (far beyond rounding).
  auto [plain_cos, plain_sin] = Rotary{.head_dim = c.head_dim, .theta = c.theta}.tables(length, offset, DType::Float64);
  EXPECT_FALSE(test::all_close(plain_cos, want_cos, 1e-3, 1e-3));
}

TEST(RotaryLlama3, BadValuesAreErrorsNamingTheField) {
  auto error_of = [](const Llama3RopeScaling& s) -> std::string {
    try {
      Rotary{.head_dim = 8, .llama3 = s}.tables(2, 0, DType::Float32);
    } catch (const ValueError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of({.factor = 0}).find("factor = 0 must be positive"), std::string::npos);
  EXPECT_NE(error_of({.factor = -2}).find("factor = -2 must be positive"), std::string::npos);
  EXPECT_NE(error_of({.low_freq_factor = 0}).find("low_freq_factor = 0 must be positive"), std::string::npos);
  EXPECT_NE(error_of({.low_freq_factor = 4, .high_freq_factor = 4})
                .find("high_freq_factor = 4 must be greater than low_freq_factor = 4"),
            std::string::npos);
  EXPECT_NE(error_of({.original_context = 0}).find("original_context = 0 must be positive"), std::string::npos);
  EXPECT_EQ(error_of({}), "no error");
}

}  // namespace
}  // namespace tessera::nn
