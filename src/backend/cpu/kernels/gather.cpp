#include "backend/cpu/kernels/gather.h"
