// Small statistics over measured times, shared by the trainer's throughput, the goodput
// calculator and the benchmarks.
#pragma once

#include <vector>

namespace tessera {

// The median (the mean of the two middle values for an even count); 0 for no values.
double median(std::vector<double> values);

}  // namespace tessera
