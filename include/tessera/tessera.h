// The umbrella header: everything a user needs.
#pragma once

#include "tessera/api/jit.h"
#include "tessera/base/dtype.h"
#include "tessera/base/error.h"
#include "tessera/base/shape.h"
#include "tessera/base/thread_pool.h"
#include "tessera/base/version.h"
#include "tessera/core/array.h"
#include "tessera/core/checkpoint.h"
#include "tessera/core/graph.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/core/transforms.h"
#include "tessera/core/tree.h"
