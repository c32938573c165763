// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/bfloat16.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>
#include <vector>

class bfloat16 {
public:
    bfloat16();
    bfloat16(float float_num);
    explicit bfloat16(std::uint16_t uint16_data);
    float to_float() const;
    std::uint16_t to_uint16() const;
    std::uint16_t to_packed() const;
};

std::vector<std::uint32_t> pack_bfloat16_vec_into_uint32_vec(const std::vector<bfloat16>& data);
std::vector<bfloat16> unpack_uint32_vec_into_bfloat16_vec(const std::vector<std::uint32_t>& data);
