// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/eltwise_unary/binop_with_scalar.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
// The scalar is a float32 passed as its bit pattern (param1).
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

void binop_with_scalar_tile_init();
void add_unary_tile(std::uint32_t idst, std::uint32_t param1);
void sub_unary_tile(std::uint32_t idst, std::uint32_t param1);
void mul_unary_tile(std::uint32_t idst, std::uint32_t param1);
void div_unary_tile(std::uint32_t idst, std::uint32_t param1);
void rsub_unary_tile(std::uint32_t idst, std::uint32_t param1);

}  // namespace ckernel
