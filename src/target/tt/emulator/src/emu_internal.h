// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): runner internals.
//
// Model: one Device with interleaved DRAM banks (host byte arrays); per worker core an L1 arena
// holding the program's circular buffers, a DST register file of 32x32 float32 tiles, and three
// kernel threads (reader, compute, writer) that share the core's CB state under one mutex.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tt_emu/runtime_api.h"

namespace tt_emu {

constexpr std::uint32_t kTileRows = 32;
constexpr std::uint32_t kTileCols = 32;
constexpr std::uint32_t kTileElems = kTileRows * kTileCols;
constexpr std::uint32_t kNumCBs = 32;

enum Role : int { READER = 0, COMPUTE = 1, WRITER = 2 };
const char* role_name(int role);

// tt::DataFormat values of the formats the emulator stores.
enum class Format : std::uint32_t { Float32 = 0, Float16 = 1, Float16_b = 5 };  // Float16: IEEE half
std::uint32_t format_bytes(Format f);
const char* format_name(Format f);

// A kernel API call found a bug in the kernel (message names the API and what is wrong).
struct KernelError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// Another thread of the core (or another core) failed; unwind quietly.
struct Aborted {};

// ---- the run specification (written by tessera_tvm.target.tt.emulate) -------------------------
struct CBSpec {
    std::uint32_t id = 0;
    std::uint32_t page_size = 0;
    std::uint32_t num_pages = 0;
    Format format = Format::Float16_b;
};

struct BufferSpec {
    std::string name;
    std::uint32_t address = 0;
    std::uint32_t page_size = 0;
    std::uint32_t num_pages = 0;
    std::string input_path;   // empty: zero-initialised
    std::string output_path;  // empty: not read back
};

struct KernelSpec {
    bool present = false;
    std::string label;
    std::string so_path;
    void (*entry)() = nullptr;
};

struct CoreSpec {
    std::uint32_t x = 0;
    std::uint32_t y = 0;
    std::vector<std::uint32_t> args[3];
    std::vector<std::uint32_t> common_args[3];
};

struct ProgramSpec {
    std::string name;
    std::string arch;
    std::uint32_t dram_banks = 12;
    std::uint32_t dram_alignment = 32;
    std::uint32_t l1_alignment = 16;
    std::uint64_t l1_budget = 0;
    std::uint32_t dst_tiles = 16;
    bool fp32_dest_acc = false;
    std::uint32_t stall_timeout_ms = 10000;
    std::uint32_t max_parallel_cores = 4;
    std::vector<BufferSpec> buffers;
    std::vector<CBSpec> cbs;
    KernelSpec kernels[3];
    std::vector<CoreSpec> cores;
    std::string counters_path;
};

// ---- per-core state ----------------------------------------------------------------------------
struct CB {
    bool configured = false;
    std::uint32_t id = 0;
    std::uint32_t page_size = 0;
    std::uint32_t num_pages = 0;
    Format format = Format::Float16_b;
    std::uint32_t base = 0;   // L1 address of the first page
    std::uint32_t limit = 0;  // one past the last byte
    std::uint32_t rd_ptr = 0;
    std::uint32_t wr_ptr = 0;
    std::uint64_t pages_pushed = 0;
    std::uint64_t pages_popped = 0;
    std::uint64_t push_calls = 0;
    std::uint64_t pop_calls = 0;
    std::uint64_t reserve_calls = 0;
    std::uint64_t wait_calls = 0;
    std::uint32_t max_occupancy = 0;
    std::uint32_t reserved = 0;  // producer: pages reserved and not yet pushed
    std::uint32_t waited = 0;    // consumer: pages waited for and not yet popped
    std::uint32_t pack_pos = 0;  // packer's position inside the reserved pages
    std::uint32_t occupancy() const { return static_cast<std::uint32_t>(pages_pushed - pages_popped); }
};

enum WaitKind : int { WAIT_NONE = 0, WAIT_RESERVE = 1, WAIT_FRONT = 2 };

struct WaitDesc {
    int kind = WAIT_NONE;
    std::uint32_t cb = 0;
    std::uint32_t n = 0;
};

struct PendingXfer {
    std::uint32_t l1_addr;
    std::uint32_t size;
};

struct ThreadState {
    int role = READER;
    const KernelSpec* kernel = nullptr;
    bool present = false;
    bool finished = false;
    bool waiting = false;
    WaitDesc wait;
    const char* last_api = "(not started)";
    std::vector<PendingXfer> pending_reads;
    std::vector<PendingXfer> pending_writes;
    std::uint64_t noc_reads = 0;
    std::uint64_t noc_read_bytes = 0;
    std::uint64_t noc_writes = 0;
    std::uint64_t noc_write_bytes = 0;
};

enum DstState : int { DST_RELEASED = 0, DST_ACQUIRED, DST_COMMITTED, DST_PACKING, DST_FULL };

struct ComputeState {
    std::vector<float> dst;  // capacity * 1024 floats, row-major tiles
    std::vector<bool> reduced;  // per DST tile: a reduce_tile wrote it since tile_regs_acquire
    std::uint32_t capacity = 16;
    int state = DST_RELEASED;
    bool hw_configured = false;
    std::uint32_t pack_cb = kNumCBs;  // the CB whose format the packer was configured for (kNumCBs: none)
    const char* hw_init_api = "(none)";
    int fpu_mode = FPU_NONE;
    const char* fpu_init_api = "(none)";
    std::uint32_t fpu_flags = 0;
    std::uint32_t fpu_cb0 = 0;
    std::uint32_t fpu_cb1 = 0;
    int sfpu_op = SFPU_NONE;
    std::uint64_t matmul_tiles = 0;
    std::uint64_t binary_tiles = 0;
    std::uint64_t copy_tiles = 0;
    std::uint64_t sfpu_tiles = 0;
    std::uint64_t packed_tiles = 0;
    std::uint64_t dst_acquires = 0;
};

struct Core {
    const CoreSpec* spec = nullptr;
    std::uint32_t x = 0;
    std::uint32_t y = 0;
    std::uint8_t* l1 = nullptr;
    std::size_t l1_size = 0;
    std::uint32_t l1_addr_base = 0;
    std::uint64_t l1_used = 0;  // sum of CB sizes
    CB cbs[kNumCBs];
    std::mutex mu;
    std::condition_variable cv;
    ThreadState threads[3];
    bool aborted = false;
    std::string error;
    ComputeState compute;
    bool done = false;
    double elapsed_ms = 0.0;

    std::uint8_t* l1_ptr(std::uint32_t addr, std::uint32_t size, const char* api);
};

// ---- the device --------------------------------------------------------------------------------
struct DramBuffer {
    const BufferSpec* spec = nullptr;
    std::uint32_t aligned_page = 0;
    std::uint32_t pages_per_bank = 0;
    std::unique_ptr<std::atomic<std::uint32_t>[]> page_reads;
    std::unique_ptr<std::atomic<std::uint32_t>[]> page_writes;
};

struct Device {
    const ProgramSpec* prog = nullptr;
    std::vector<std::vector<std::uint8_t>> banks;
    std::vector<DramBuffer> buffers;
    std::vector<std::unique_ptr<Core>> cores;
    std::atomic<std::int64_t> last_progress_ns{0};
    std::atomic<bool> abort{false};
    std::mutex error_mu;
    std::string first_error;
};

extern Device* g_device;

struct Ctx {
    Core* core;
    ThreadState* ts;
};
extern thread_local Ctx* g_ctx;

std::int64_t now_ns();
void record_core_error(Core& core, const std::string& message);
void run_core(Core& core);
std::string describe_thread(const Core& core, const ThreadState& ts);

}  // namespace tt_emu
