// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/eltwise_unary/eltwise_unary.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

void unary_op_init_common(std::uint32_t icb, std::uint32_t ocb);
void init_sfpu(std::uint32_t icb, std::uint32_t ocb);

}  // namespace ckernel
