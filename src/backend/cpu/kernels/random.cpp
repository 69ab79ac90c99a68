#include "backend/cpu/kernels/random.h"
