// Tessera's tt-metal v0.62.2 (2025-08-20) API: tensix_types.h (kernel-side DataFormat)
// No behaviour to emulate: the emulator and the syntax check use these definitions as they are.
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>

enum class DataFormat : std::uint8_t {
    Float32 = 0,
    Float16 = 1,
    Bfp8 = 2,
    Bfp4 = 3,
    Tf32 = 4,
    Float16_b = 5,
    Bfp8_b = 6,
    Bfp4_b = 7,
    Int32 = 8,
    UInt16 = 9,
    Int8 = 14,
    UInt32 = 24,
    UInt8 = 30,
    Invalid = 0xff,
};
