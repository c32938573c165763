// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/host_api.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "tt-metalium/buffer.hpp"
#include "tt-metalium/circular_buffer_config.hpp"
#include "tt-metalium/command_queue.hpp"
#include "tt-metalium/core_coord.hpp"
#include "tt-metalium/data_types.hpp"
#include "tt-metalium/device.hpp"
#include "tt-metalium/kernel_types.hpp"
#include "tt-metalium/program.hpp"
#include "tt-metalium/sub_device_types.hpp"
#include "tt_stl/span.hpp"

namespace tt::tt_metal {

constexpr std::size_t DEFAULT_L1_SMALL_SIZE = 0;
constexpr std::size_t DEFAULT_TRACE_REGION_SIZE = 0;
constexpr std::size_t DEFAULT_WORKER_L1_SIZE = 0;

struct DispatchCoreConfig {};

using HostDataType = std::variant<const void*, void*>;

// ---- device management ------------------------------------------------------------------------
std::size_t GetNumAvailableDevices();
IDevice* CreateDevice(
    chip_id_t device_id,
    std::uint8_t num_hw_cqs = 1,
    std::size_t l1_small_size = DEFAULT_L1_SMALL_SIZE,
    std::size_t trace_region_size = DEFAULT_TRACE_REGION_SIZE,
    const DispatchCoreConfig& dispatch_core_config = DispatchCoreConfig{},
    const std::vector<std::uint32_t>& l1_bank_remap = {},
    std::size_t worker_l1_size = DEFAULT_WORKER_L1_SIZE);
bool CloseDevice(IDevice* device);

// ---- program & kernels ------------------------------------------------------------------------
Program CreateProgram();
KernelHandle CreateKernel(
    Program& program,
    const std::string& file_name,
    const std::variant<CoreCoord, CoreRange, CoreRangeSet>& core_spec,
    const std::variant<DataMovementConfig, ComputeConfig, EthernetConfig>& config);

// ---- buffers ----------------------------------------------------------------------------------
CBHandle CreateCircularBuffer(
    Program& program,
    const std::variant<CoreCoord, CoreRange, CoreRangeSet>& core_spec,
    const CircularBufferConfig& config);
std::shared_ptr<Buffer> CreateBuffer(const InterleavedBufferConfig& config);
void DeallocateBuffer(Buffer& buffer);

// ---- runtime args -----------------------------------------------------------------------------
void SetRuntimeArgs(
    const Program& program,
    KernelHandle kernel,
    const std::variant<CoreCoord, CoreRange, CoreRangeSet>& core_spec,
    stl::Span<const std::uint32_t> runtime_args);
void SetRuntimeArgs(
    const Program& program,
    KernelHandle kernel,
    const std::variant<CoreCoord, CoreRange, CoreRangeSet>& core_spec,
    std::initializer_list<std::uint32_t> runtime_args);
void SetRuntimeArgs(
    const Program& program,
    KernelHandle kernel,
    const std::vector<CoreCoord>& core_spec,
    const std::vector<std::vector<std::uint32_t>>& runtime_args);
void SetCommonRuntimeArgs(const Program& program, KernelHandle kernel_id, stl::Span<const std::uint32_t> runtime_args);

// ---- command queue ----------------------------------------------------------------------------
template <typename DType>
void EnqueueWriteBuffer(
    CommandQueue& cq,
    const std::variant<std::reference_wrapper<Buffer>, std::shared_ptr<Buffer>>& buffer,
    std::vector<DType>& src,
    bool blocking);
void EnqueueWriteBuffer(
    CommandQueue& cq,
    const std::variant<std::reference_wrapper<Buffer>, std::shared_ptr<Buffer>>& buffer,
    HostDataType src,
    bool blocking);
template <typename DType>
void EnqueueReadBuffer(
    CommandQueue& cq,
    const std::variant<std::reference_wrapper<Buffer>, std::shared_ptr<Buffer>>& buffer,
    std::vector<DType>& dst,
    bool blocking);
void EnqueueReadBuffer(
    CommandQueue& cq,
    const std::variant<std::reference_wrapper<Buffer>, std::shared_ptr<Buffer>>& buffer,
    void* dst,
    bool blocking);
void EnqueueProgram(CommandQueue& cq, Program& program, bool blocking);
void Finish(CommandQueue& cq, tt::stl::Span<const SubDeviceId> sub_device_ids = {});

}  // namespace tt::tt_metal
