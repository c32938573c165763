// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/reduce.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
// The template arguments are given explicitly (the real header defaults them to the REDUCE_OP /
// REDUCE_DIM defines), so this stub has no defaults: stricter than the real one.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

enum PoolType { SUM, AVG, MAX };
enum ReduceDim { REDUCE_ROW, REDUCE_COL, REDUCE_SCALAR };

template <PoolType reduce_type, ReduceDim reduce_dim>
void reduce_init(std::uint32_t icb, std::uint32_t icb_scaler, std::uint32_t ocb);
void reduce_uninit();
template <PoolType reduce_type, ReduceDim reduce_dim>
void reduce_tile(std::uint32_t icb, std::uint32_t icb_scaler, std::uint32_t itile, std::uint32_t itile_scaler,
                 std::uint32_t idst);

}  // namespace ckernel
