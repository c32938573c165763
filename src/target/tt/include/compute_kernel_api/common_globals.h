// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/common_globals.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
// Compute kernels are written `namespace NAMESPACE { void MAIN { ... } }`; tt-metal's kernel build defines
// NAMESPACE/MAIN once per TRISC (unpack/math/pack), the emulator compiles the kernel once, as one thread.
#pragma once

#include <cstdint>

#include "compile_time_args.h"
#include "hostdevcommon/kernel_structs.h"
#include "tt_emu/runtime_api.h"

#define ALWI inline __attribute__((always_inline))

#define NAMESPACE tt_emu_compute
#define MAIN tt_emu_compute_main()

namespace ckernel {

enum VectorMode { None = 0, R = 1, C = 2, RC = 4, RC_custom = 6, Invalid = 0xFF };

enum EltwiseBinaryType { ELWMUL = 0, ELWDIV = 1, ELWADD = 2, ELWSUB = 3, ELWLESS = 4 };

enum class BroadcastType : std::uint8_t { NONE = 0, COL = 1, ROW = 2, SCALAR = 3 };

namespace p_sfpu {
constexpr std::uint16_t kCONST_1_FP16B = 0x3F80;
}  // namespace p_sfpu

}  // namespace ckernel

using namespace ckernel;

namespace tt_emu_compute {
void tt_emu_compute_main();
}  // namespace tt_emu_compute

#define TT_EMU_DEFINE_ENTRY \
    extern "C" __attribute__((visibility("default"))) void tt_emu_kernel_entry() { tt_emu_compute::tt_emu_compute_main(); } \
    extern "C" __attribute__((visibility("default"))) const int tt_emu_kernel_kind = 1;
