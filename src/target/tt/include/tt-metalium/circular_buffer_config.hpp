// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/circular_buffer_config.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "tt-metalium/data_types.hpp"

namespace tt::tt_metal {

class Buffer;

class CircularBufferConfig {
public:
    CircularBufferConfig(std::uint32_t total_size, const std::map<std::uint8_t, tt::DataFormat>& data_format_spec);
    CircularBufferConfig(
        std::uint32_t total_size, const std::map<std::uint8_t, tt::DataFormat>& data_format_spec, const Buffer& buffer);
    CircularBufferConfig& set_page_size(std::uint8_t buffer_index, std::uint32_t page_size);
    CircularBufferConfig& set_total_size(std::uint32_t total_size);
    CircularBufferConfig& set_globally_allocated_address(const Buffer& buffer);
    std::uint32_t total_size() const;
    const std::optional<std::uint32_t>& page_size(std::uint8_t buffer_index) const;
};

}  // namespace tt::tt_metal
