// Tessera's tt-metal v0.62.2 (2025-08-20) API: hostdevcommon/kernel_structs.h
// No behaviour to emulate: the emulator and the syntax check use these definitions as they are.
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>

namespace tt {

// Circular-buffer ids. Unscoped enum (as in tt-metal) so values convert to uint32_t arguments.
enum CBIndex : std::uint8_t {
    c_0 = 0, c_1 = 1, c_2 = 2, c_3 = 3, c_4 = 4, c_5 = 5, c_6 = 6, c_7 = 7,
    c_8 = 8, c_9 = 9, c_10 = 10, c_11 = 11, c_12 = 12, c_13 = 13, c_14 = 14, c_15 = 15,
    c_16 = 16, c_17 = 17, c_18 = 18, c_19 = 19, c_20 = 20, c_21 = 21, c_22 = 22, c_23 = 23,
    c_24 = 24, c_25 = 25, c_26 = 26, c_27 = 27, c_28 = 28, c_29 = 29, c_30 = 30, c_31 = 31,
    SIZE = 32
};

}  // namespace tt

constexpr std::uint32_t NUM_CIRCULAR_BUFFERS = 32;
