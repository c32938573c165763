// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/data_types.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>

#include "hostdevcommon/kernel_structs.h"

using chip_id_t = int;

namespace tt {

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
    RawUInt8 = 0xf0,
    RawUInt16 = 0xf1,
    RawUInt32 = 0xf2,
    Invalid = 0xff,
};

enum class ARCH { GRAYSKULL = 0, WORMHOLE_B0 = 1, BLACKHOLE = 2, QUASAR = 3, Invalid = 0xFF };

}  // namespace tt

enum class MathFidelity : std::uint8_t { LoFi = 0, HiFi2 = 2, HiFi3 = 3, HiFi4 = 4, Invalid = 0xff };

enum class UnpackToDestMode : std::uint8_t { UnpackToDestFp32, Default };

namespace tt::tt_metal {

enum class DataMovementProcessor { RISCV_0 = 0, RISCV_1 = 1 };

enum NOC : std::uint8_t { RISCV_0_default = 0, RISCV_1_default = 1, NOC_0 = 0, NOC_1 = 1 };

enum class NOC_MODE : std::uint8_t { DM_DEDICATED_NOC = 0, DM_DYNAMIC_NOC = 1 };

enum class CoreType { WORKER = 0, ETH = 1, PCIE = 2, DRAM = 3, ACTIVE_ETH = 4, IDLE_ETH = 5 };

enum class BufferType { DRAM, L1, SYSTEM_MEMORY, L1_SMALL, TRACE };

enum class TensorMemoryLayout { INTERLEAVED = 0, HEIGHT_SHARDED = 2, WIDTH_SHARDED = 3, BLOCK_SHARDED = 4 };

using KernelHandle = std::uint32_t;
using CBHandle = std::uintptr_t;
using DeviceAddr = std::uint64_t;

}  // namespace tt::tt_metal
