#include "backend/cpu/kernels/attention.h"
