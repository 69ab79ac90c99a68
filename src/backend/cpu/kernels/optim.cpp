#include "backend/cpu/kernels/optim.h"
