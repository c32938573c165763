// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/sub_device_types.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>

namespace tt::tt_metal {

struct SubDeviceId {
    std::uint8_t id;
};

}  // namespace tt::tt_metal
