// WordOf<N>::type: an unsigned word of N bytes (1, 2, 4, 8, 16), so copies and gathers
// move bits, never values, whatever the element dtype.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::cuda {

template <size_t N>
struct WordOf;
template <>
struct WordOf<1> {
  using type = uint8_t;
};
template <>
struct WordOf<2> {
  using type = uint16_t;
};
template <>
struct WordOf<4> {
  using type = uint32_t;
};
template <>
struct WordOf<8> {
  using type = unsigned long long;
};
template <>
struct WordOf<16> {
  using type = uint4;
};

}  // namespace tessera::cuda
