// Host program for C = A @ B (bf16, interleaved DRAM, tile layout) over a grid of worker cores.
// Written against tt-metal v0.62.2's single-device host API; it is the hand-written model of the
// main.cpp the Tenstorrent code generator emits from a tt.plan.json (here: gemm_multi_core.json).
//
// Usage: main_gemm A.bin B.bin C.bin
//   A.bin / B.bin hold the padded inputs in tile layout (bf16, page i = tile i, row-major over the
//   tile grid); C.bin receives the padded output in the same layout.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <tt-metalium/constants.hpp>
#include <tt-metalium/host_api.hpp>
#include <tt-metalium/tensor_accessor_args.hpp>

using namespace tt;
using namespace tt::tt_metal;

namespace {

constexpr uint32_t M = 160;  // rows of A and C
constexpr uint32_t K = 64;   // columns of A, rows of B
constexpr uint32_t N = 192;  // columns of B and C
constexpr uint32_t GRID_X = 4;
constexpr uint32_t GRID_Y = 2;

constexpr uint32_t Mt = (M + constants::TILE_HEIGHT - 1) / constants::TILE_HEIGHT;
constexpr uint32_t Kt = (K + constants::TILE_WIDTH - 1) / constants::TILE_WIDTH;
constexpr uint32_t Nt = (N + constants::TILE_WIDTH - 1) / constants::TILE_WIDTH;
constexpr uint32_t TILE_BYTES = constants::TILE_HW * 2;  // bfloat16

std::vector<uint32_t> read_tiles(const std::string& path, uint32_t num_tiles) {
    std::vector<uint32_t> data(num_tiles * TILE_BYTES / sizeof(uint32_t));
    std::ifstream in(path, std::ios::binary);
    if (!in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(uint32_t)))) {
        throw std::runtime_error("cannot read " + std::to_string(num_tiles) + " tiles from " + path);
    }
    return data;
}

void write_tiles(const std::string& path, const std::vector<uint32_t>& data) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(uint32_t)));
    if (!out) {
        throw std::runtime_error("cannot write " + path);
    }
}

std::shared_ptr<Buffer> dram_buffer(IDevice* device, uint32_t num_tiles) {
    InterleavedBufferConfig config{
        .device = device, .size = num_tiles * TILE_BYTES, .page_size = TILE_BYTES, .buffer_type = BufferType::DRAM};
    return CreateBuffer(config);
}

void add_cb(Program& program, const CoreRange& cores, uint32_t cb_index, uint32_t num_pages) {
    CircularBufferConfig config =
        CircularBufferConfig(num_pages * TILE_BYTES, {{static_cast<uint8_t>(cb_index), tt::DataFormat::Float16_b}})
            .set_page_size(static_cast<uint8_t>(cb_index), TILE_BYTES);
    CreateCircularBuffer(program, cores, config);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s A.bin B.bin C.bin\n", argv[0]);
        return 2;
    }
    IDevice* device = CreateDevice(0);
    CommandQueue& cq = device->command_queue();
    Program program = CreateProgram();
    const CoreRange cores({0, 0}, {GRID_X - 1, GRID_Y - 1});

    auto a = dram_buffer(device, Mt * Kt);
    auto b = dram_buffer(device, Kt * Nt);
    auto c = dram_buffer(device, Mt * Nt);

    add_cb(program, cores, CBIndex::c_0, 2);
    add_cb(program, cores, CBIndex::c_1, 2);
    add_cb(program, cores, CBIndex::c_16, 2);

    std::vector<uint32_t> reader_ct_args;
    TensorAccessorArgs(*a).append_to(reader_ct_args);
    TensorAccessorArgs(*b).append_to(reader_ct_args);
    std::vector<uint32_t> writer_ct_args;
    TensorAccessorArgs(*c).append_to(writer_ct_args);

    KernelHandle reader = CreateKernel(
        program,
        "tests/target/tt/kernels/reader_gemm.cpp",
        cores,
        DataMovementConfig{
            .processor = DataMovementProcessor::RISCV_1, .noc = NOC::RISCV_1_default, .compile_args = reader_ct_args});
    KernelHandle writer = CreateKernel(
        program,
        "tests/target/tt/kernels/writer_tiles.cpp",
        cores,
        DataMovementConfig{
            .processor = DataMovementProcessor::RISCV_0, .noc = NOC::RISCV_0_default, .compile_args = writer_ct_args});
    KernelHandle compute = CreateKernel(
        program,
        "tests/target/tt/kernels/compute_gemm.cpp",
        cores,
        ComputeConfig{.math_fidelity = MathFidelity::HiFi4, .fp32_dest_acc_en = false, .math_approx_mode = false});

    // Contiguous, row-major split of the Mt x Nt output tiles over the grid (first cores get the
    // remainder) -- the same assignment the plan records per core.
    const uint32_t num_cores = GRID_X * GRID_Y;
    const uint32_t total = Mt * Nt;
    uint32_t start = 0;
    for (uint32_t i = 0; i < num_cores; ++i) {
        const CoreCoord core = {i % GRID_X, i / GRID_X};
        const uint32_t count = total / num_cores + (i < total % num_cores ? 1 : 0);
        SetRuntimeArgs(program, reader, core, {a->address(), b->address(), Kt, Nt, start, count});
        SetRuntimeArgs(program, compute, core, {count, Kt});
        SetRuntimeArgs(program, writer, core, {c->address(), start, count});
        start += count;
    }

    std::vector<uint32_t> a_host = read_tiles(argv[1], Mt * Kt);
    std::vector<uint32_t> b_host = read_tiles(argv[2], Kt * Nt);
    EnqueueWriteBuffer(cq, a, a_host, false);
    EnqueueWriteBuffer(cq, b, b_host, false);
    EnqueueProgram(cq, program, false);
    Finish(cq);

    std::vector<uint32_t> c_host;
    EnqueueReadBuffer(cq, c, c_host, true);
    write_tiles(argv[3], c_host);

    return CloseDevice(device) ? 0 : 1;
}
