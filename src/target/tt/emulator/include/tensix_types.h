// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): tensix_types.h
// Same definitions as the stub tree (data only, no behaviour to emulate).
#pragma once
#include "../../include/tensix_types.h"
