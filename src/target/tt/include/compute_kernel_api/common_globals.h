// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/common_globals.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
// Compute kernels are written `namespace NAMESPACE { void MAIN { ... } }`; the kernel build defines
// NAMESPACE/MAIN once per TRISC (unpack/math/pack). The stub picks one spelling.
#pragma once

#include <cstdint>

#include "compile_time_args.h"
#include "hostdevcommon/kernel_structs.h"

#define ALWI inline __attribute__((always_inline))

#ifndef NAMESPACE
#define NAMESPACE chlkc_math
#endif
#ifndef MAIN
#define MAIN math_main()
#endif

namespace ckernel {

enum VectorMode { None = 0, R = 1, C = 2, RC = 4, RC_custom = 6, Invalid = 0xFF };

enum EltwiseBinaryType { ELWMUL = 0, ELWDIV = 1, ELWADD = 2, ELWSUB = 3, ELWLESS = 4 };

enum class BroadcastType : std::uint8_t { NONE = 0, COL = 1, ROW = 2, SCALAR = 3 };

namespace p_sfpu {
constexpr std::uint16_t kCONST_1_FP16B = 0x3F80;
}  // namespace p_sfpu

}  // namespace ckernel

using namespace ckernel;
