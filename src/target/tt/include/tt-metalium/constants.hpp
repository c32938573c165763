// Tessera stub of tt-metal v0.62.2 (2025-08-20): tt-metalium/constants.hpp
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include <cstdint>

namespace tt::constants {

constexpr std::uint32_t TILE_HEIGHT = 32;
constexpr std::uint32_t TILE_WIDTH = 32;
constexpr std::uint32_t TILE_HW = TILE_WIDTH * TILE_HEIGHT;
constexpr std::uint32_t FACE_HEIGHT = 16;
constexpr std::uint32_t FACE_WIDTH = 16;

}  // namespace tt::constants
