// convert_multi_tensor (backend/cuda/kernels/convert_multi_tensor.h): float32 -> bf16 /
// f16 over many tensors, bitwise against the CPU's conversions (tessera/base/dtype.h;
// f16 NaNs: any quiet NaN, see matches()): special values (NaN, infinities,
// subnormals, ties at both formats' rounding points), sizes that are not multiples of
// anything, pointers off the 16/32-byte alignment (the scalar path), more tensors and
// chunks than one launch holds (60 tensors; one of 481 chunks); an unsupported pair
// launches nothing.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/kernels/convert_multi_tensor.h"
#include "cuda/cuda_test_util.h"

namespace ts = tessera;
using ts::DType;
using ts::cuda_test::DeviceBuffer;

namespace {

std::vector<float> values(size_t n, uint64_t seed) {
  std::vector<float> v = ts::cuda_test::random_floats(n, seed, 3.0f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -1e-40f,
                            0.0f,
                            -0.0f,
                            65520.0f,                           // rounds to f16 infinity
                            std::bit_cast<float>(0x3f808000u),  // a bf16 tie (rounds to even)
                            std::bit_cast<float>(0x3f818000u),  // the other bf16 tie
                            std::bit_cast<float>(0x7fc12345u),  // NaN with a payload
                            1.0009765625f};                     // an f16 tie
  for (size_t i = 0; i < n; i += 97) v[i] = specials[(i / 97) % (sizeof(specials) / sizeof(specials[0]))];
  return v;
}

uint16_t reference(float f, DType to) {
  return to == DType::BFloat16 ? ts::float_to_bf16(f).bits : ts::float_to_f16(f).bits;
}

// Equal bits, except that a NaN converted to f16 may be any quiet NaN: the GPU's
// cvt.rn.f16.f32 (in this kernel and in the single convert kernel alike) returns the
// canonical 0x7fff where the CPU keeps the sign and payload.
bool matches(uint16_t got, float f, DType to) {
  if (to == DType::Float16 && std::isnan(f)) return (got & 0x7e00u) == 0x7e00u;
  return got == reference(f, to);
}

}  // namespace

TEST(CudaConvertMultiTensor, BitwiseTheCpuConversionsOverManyTensors) {
  TESSERA_REQUIRE_GPU();
  std::vector<size_t> sizes = {1, 7, 8, 65536, 65537, 3 * 65536 + 5, 30 * 1024 * 1024 + 13};  // 481 chunks last
  for (size_t i = 0; sizes.size() < 60; ++i) sizes.push_back(1000 + 4099 * i);
  for (DType to : {DType::BFloat16, DType::Float16}) {
    std::vector<DeviceBuffer<float>> src;
    std::vector<DeviceBuffer<uint16_t>> dst;
    std::vector<std::vector<float>> host;
    std::vector<ts::cuda::ConvertTensor> tensors;
    for (size_t t = 0; t < sizes.size(); ++t) {
      // Every fifth tensor starts one element into its buffers: 4 and 2 bytes off.
      const size_t offset = t % 5 == 4 ? 1 : 0;
      host.push_back(values(sizes[t] + offset, 100 + t));
      src.emplace_back(host.back());
      dst.emplace_back(sizes[t] + offset);
      dst.back().poison();
      tensors.push_back({src.back().get() + offset, dst.back().get() + offset, static_cast<int64_t>(sizes[t])});
    }
    ASSERT_TRUE(ts::cuda::convert_multi_tensor(DType::Float32, to, tensors, nullptr));
    for (size_t t = 0; t < sizes.size(); ++t) {
      const size_t offset = t % 5 == 4 ? 1 : 0;
      const std::vector<uint16_t> got = dst[t].download();
      size_t wrong = 0, first = 0;
      for (size_t i = 0; i < sizes[t]; ++i) {
        if (!matches(got[i + offset], host[t][i + offset], to) && wrong++ == 0) first = i;
      }
      EXPECT_EQ(wrong, 0u) << ts::name(to) << " tensor " << t << " (" << sizes[t] << " elements): first at " << first;
      if (offset == 1) {
        EXPECT_EQ(got[0], 0xFFFF) << "wrote before the tensor";
      }
    }
  }
  // Other pairs: not this kernel's.
  EXPECT_FALSE(ts::cuda::convert_multi_tensor(DType::BFloat16, DType::Float32, {}, nullptr));
  EXPECT_FALSE(ts::cuda::convert_multi_tensor(DType::Float32, DType::Int32, {}, nullptr));
}
