// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/buffer.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>
#include <memory>

#include "tt-metalium/data_types.hpp"

namespace tt::tt_metal {

class IDevice;

struct InterleavedBufferConfig {
    IDevice* device;
    DeviceAddr size;       // total size of the buffer in bytes
    DeviceAddr page_size;  // size of one page (a 32x32 tile in tile layout) in bytes
    BufferType buffer_type;
};

class Buffer {
public:
    IDevice* device() const;
    DeviceAddr size() const;
    std::uint32_t address() const;
    DeviceAddr page_size() const;
    std::uint32_t num_pages() const;
    BufferType buffer_type() const;
    TensorMemoryLayout buffer_layout() const;
    bool is_dram() const;
    bool is_l1() const;
};

}  // namespace tt::tt_metal
