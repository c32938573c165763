// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/kernel_types.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tt-metalium/data_types.hpp"

namespace tt::tt_metal {

struct DataMovementConfig {
    DataMovementProcessor processor = DataMovementProcessor::RISCV_0;
    NOC noc = NOC::RISCV_0_default;
    NOC_MODE noc_mode = NOC_MODE::DM_DEDICATED_NOC;
    std::vector<std::uint32_t> compile_args;
    std::map<std::string, std::string> defines;
};

struct ReaderDataMovementConfig : public DataMovementConfig {
    ReaderDataMovementConfig(
        std::vector<std::uint32_t> compile_args = {}, std::map<std::string, std::string> defines = {});
};

struct WriterDataMovementConfig : public DataMovementConfig {
    WriterDataMovementConfig(
        std::vector<std::uint32_t> compile_args = {}, std::map<std::string, std::string> defines = {});
};

struct ComputeConfig {
    MathFidelity math_fidelity = MathFidelity::HiFi4;
    bool fp32_dest_acc_en = false;
    bool dst_full_sync_en = false;
    std::vector<UnpackToDestMode> unpack_to_dest_mode;
    bool bfp8_pack_precise = false;
    bool math_approx_mode = false;
    std::vector<std::uint32_t> compile_args;
    std::map<std::string, std::string> defines;
};

struct EthernetConfig {
    NOC noc = NOC::NOC_0;
    DataMovementProcessor processor = DataMovementProcessor::RISCV_0;
    std::vector<std::uint32_t> compile_args;
    std::map<std::string, std::string> defines;
};

}  // namespace tt::tt_metal
