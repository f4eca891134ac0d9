#pragma once

#define PLEXUS_VERSION_STRING "0.1.0"
