// The Plexus SDK for plugin authors: the C ABI plus header-only C++ helpers.
// A plugin includes this header and links nothing of Plexus.
#pragma once

#include "plexus/plexus.h"
#include "plexus/sdk/backend.hpp"
#include "plexus/sdk/comm.hpp"
#include "plexus/sdk/dtype.hpp"
#include "plexus/sdk/fusion.hpp"
#include "plexus/sdk/fusion_chunked.hpp"
#include "plexus/sdk/fusion_conv_pool.hpp"
#include "plexus/sdk/host_backend.hpp"
#include "plexus/sdk/kernel.hpp"
#include "plexus/sdk/op_params.hpp"
#include "plexus/sdk/op_schema.hpp"
#include "plexus/sdk/philox.hpp"
#include "plexus/sdk/plugin.hpp"
#include "plexus/sdk/reduce_plan.hpp"
#include "plexus/sdk/status.hpp"
#include "plexus/sdk/tensor.hpp"
