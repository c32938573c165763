// Tessera stub of tt-metal v0.62.2 (2025-08-20): tt-metalium/sub_device_types.hpp
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include <cstdint>

namespace tt::tt_metal {

struct SubDeviceId {
    std::uint8_t id;
};

}  // namespace tt::tt_metal
