// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): hostdevcommon/tensor_accessor/arg_config.hpp
// Same definitions as the stub tree (data only, no behaviour to emulate).
#pragma once
#include "../../../../include/hostdevcommon/tensor_accessor/arg_config.hpp"
