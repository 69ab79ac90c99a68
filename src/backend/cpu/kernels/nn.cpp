#include "backend/cpu/kernels/nn.h"
