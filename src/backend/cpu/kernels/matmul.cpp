#include "backend/cpu/kernels/matmul.h"
