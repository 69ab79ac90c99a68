#include "backend/cpu/kernels/reduce.h"
