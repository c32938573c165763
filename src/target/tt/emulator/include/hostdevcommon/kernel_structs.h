// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): hostdevcommon/kernel_structs.h
// Same definitions as the stub tree (data only, no behaviour to emulate).
#pragma once
#include "../../../include/hostdevcommon/kernel_structs.h"
