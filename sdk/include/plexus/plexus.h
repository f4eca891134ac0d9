/* The Plexus plugin ABI: everything a plugin and the host exchange, in C. */
#ifndef PLEXUS_PLEXUS_H
#define PLEXUS_PLEXUS_H

#include "plexus/abi/types.h"
#include "plexus/abi/ops.h"
#include "plexus/abi/backend.h"
#include "plexus/abi/comm.h"
#include "plexus/abi/plugin.h"

#endif /* PLEXUS_PLEXUS_H */
