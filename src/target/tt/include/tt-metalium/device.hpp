// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/device.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tt-metalium/core_coord.hpp"
#include "tt-metalium/data_types.hpp"

namespace tt::tt_metal {

class CommandQueue;

class IDevice {
public:
    virtual ~IDevice() = default;
    virtual tt::ARCH arch() const = 0;
    virtual chip_id_t id() const = 0;
    virtual CoreCoord grid_size() const = 0;
    virtual CoreCoord logical_grid_size() const = 0;
    virtual CoreCoord compute_with_storage_grid_size() const = 0;
    virtual std::uint32_t num_dram_channels() const = 0;
    virtual std::uint32_t l1_size_per_core() const = 0;
    virtual CoreCoord worker_core_from_logical_core(const CoreCoord& logical_core) const = 0;
    virtual CommandQueue& command_queue(std::size_t cq_id = 0) = 0;
};

}  // namespace tt::tt_metal
