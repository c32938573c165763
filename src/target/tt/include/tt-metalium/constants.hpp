// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/constants.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>

namespace tt::constants {

constexpr std::uint32_t TILE_HEIGHT = 32;
constexpr std::uint32_t TILE_WIDTH = 32;
constexpr std::uint32_t TILE_HW = TILE_WIDTH * TILE_HEIGHT;
constexpr std::uint32_t FACE_HEIGHT = 16;
constexpr std::uint32_t FACE_WIDTH = 16;

}  // namespace tt::constants
