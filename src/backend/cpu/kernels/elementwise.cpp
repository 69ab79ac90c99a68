#include "backend/cpu/kernels/elementwise.h"
