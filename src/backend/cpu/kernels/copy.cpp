#include "backend/cpu/kernels/copy.h"
