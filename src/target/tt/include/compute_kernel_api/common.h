// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/common.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/cb_api.h"
#include "compute_kernel_api/common_globals.h"
#include "compute_kernel_api/compute_kernel_hw_startup.h"
#include "compute_kernel_api/pack.h"
#include "compute_kernel_api/reg_api.h"

namespace ckernel {

template <typename T>
T get_arg_val(int arg_idx);
template <typename T>
T get_common_arg_val(int arg_idx);
std::uint32_t get_arg_addr(int arg_idx);

}  // namespace ckernel
