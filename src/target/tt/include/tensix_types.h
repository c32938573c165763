// Tessera stub of tt-metal v0.62.2 (2025-08-20): tensix_types.h (kernel-side DataFormat)
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
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
