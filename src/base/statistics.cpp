#include "tessera/base/statistics.h"

#include <algorithm>
#include <cstddef>

namespace tessera {

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto mid = static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  double m = values[static_cast<size_t>(mid)];
  // Even count: the lower middle value is the largest of the lower half.
  if (values.size() % 2 == 0) m = (m + *std::max_element(values.begin(), values.begin() + mid)) / 2;
  return m;
}

}  // namespace tessera
