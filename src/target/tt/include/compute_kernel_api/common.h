// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/common.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include <cstring>

#include "compute_kernel_api/cb_api.h"
#include "compute_kernel_api/common_globals.h"
#include "compute_kernel_api/compute_kernel_hw_startup.h"
#include "compute_kernel_api/pack.h"
#include "compute_kernel_api/reg_api.h"

namespace ckernel {

template <typename T>
inline T get_arg_val(int arg_idx) {
    return tt_emu::arg_as<T>(tt_emu::runtime_arg(arg_idx));
}
template <typename T>
inline T get_common_arg_val(int arg_idx) {
    return tt_emu::arg_as<T>(tt_emu::common_runtime_arg(arg_idx));
}
inline std::uint32_t get_arg_addr(int) { tt_emu::unsupported("get_arg_addr (runtime args do not live in emulated L1)"); }

}  // namespace ckernel
