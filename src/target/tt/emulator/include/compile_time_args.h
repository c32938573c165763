// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): compile_time_args.h
// Same definitions as the stub tree (data only, no behaviour to emulate).
#pragma once
#include "../../include/compile_time_args.h"
