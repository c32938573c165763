// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): kernel API runtime.
//
// Every kernel API call of the emulator's headers lands here, on the calling kernel thread
// (g_ctx names the core and the kernel). Calls that find a kernel bug throw KernelError with a
// message naming the API; the thread entry prefixes the core and kernel.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "emu_internal.h"

namespace tt_emu {

Device* g_device = nullptr;
thread_local Ctx* g_ctx = nullptr;

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return buf;
}

[[noreturn]] void fail(const char* api, const std::string& message) { throw KernelError(std::string(api) + ": " + message); }

Ctx& ctx(const char* api) {
    if (g_ctx == nullptr) {
        throw KernelError(std::string(api) + ": called outside a kernel thread");
    }
    g_ctx->ts->last_api = api;
    g_device->last_progress_ns.store(now_ns(), std::memory_order_relaxed);
    if (g_device->abort.load(std::memory_order_relaxed)) {
        throw Aborted{};
    }
    return *g_ctx;
}

// ---- data formats ------------------------------------------------------------------------------
inline float bf16_to_float(std::uint16_t b) {
    const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

inline std::uint16_t float_to_bf16(float f) {  // round to nearest even, NaN stays NaN
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
}

inline float f16_to_float(std::uint16_t h) {  // exact: every IEEE half is a float
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    const std::uint32_t mantissa = h & 0x3ffu;
    std::uint32_t u;
    if (exponent == 0x1fu) {  // inf, or NaN with its payload
        u = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {  // normal: rebias 15 -> 127
        u = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else {  // zero or subnormal: mantissa * 2^-24
        const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
        return sign ? -magnitude : magnitude;
    }
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

inline std::uint16_t float_to_f16(float f) {  // round to nearest even; overflow -> inf, NaN stays NaN
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {  // NaN: keep the top payload bits, set the quiet bit
        return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    }
    if (magnitude >= 0x477ff000u) {  // >= 65520, halfway from the largest half (65504) up: inf
        return static_cast<std::uint16_t>(sign | 0x7c00u);
    }
    if (magnitude >= 0x38800000u) {  // >= 2^-14: a normal half; rebias 127 -> 15, drop 13 bits
        std::uint32_t r = magnitude - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1u);  // a carry out of the mantissa bumps the exponent, as it should
        return static_cast<std::uint16_t>(sign | (r >> 13));
    }
    const std::uint32_t biased = magnitude >> 23;
    if (biased < 102u) {  // below 2^-25, under half the smallest subnormal: zero
        return sign;
    }
    // A subnormal half holds round(|f| * 2^24); |f| * 2^24 = significand * 2^(biased - 126).
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - biased;  // 14..24
    std::uint32_t q = significand >> shift;
    const std::uint32_t rest = significand & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) {
        ++q;  // may reach 0x400, the smallest normal, which is its encoding
    }
    return static_cast<std::uint16_t>(sign | q);
}

// Tile layout inside a page: four 16x16 faces (TL, TR, BL, BR), each row-major.
inline std::uint32_t face_index(std::uint32_t r, std::uint32_t c) {
    return (((r >> 4) << 1) + (c >> 4)) * 256u + (r & 15u) * 16u + (c & 15u);
}

void unpack_tile(const std::uint8_t* src, Format fmt, float* out) {
    for (std::uint32_t r = 0; r < kTileRows; ++r) {
        for (std::uint32_t c = 0; c < kTileCols; ++c) {
            const std::uint32_t i = face_index(r, c);
            float v;
            if (fmt == Format::Float16_b || fmt == Format::Float16) {
                std::uint16_t b;
                std::memcpy(&b, src + 2 * i, 2);
                v = fmt == Format::Float16 ? f16_to_float(b) : bf16_to_float(b);
            } else {
                std::memcpy(&v, src + 4 * i, 4);
            }
            out[r * kTileCols + c] = v;
        }
    }
}

void pack_tile_to(const float* in, Format fmt, std::uint8_t* dst) {
    for (std::uint32_t r = 0; r < kTileRows; ++r) {
        for (std::uint32_t c = 0; c < kTileCols; ++c) {
            const std::uint32_t i = face_index(r, c);
            const float v = in[r * kTileCols + c];
            if (fmt == Format::Float16_b || fmt == Format::Float16) {
                const std::uint16_t b = fmt == Format::Float16 ? float_to_f16(v) : float_to_bf16(v);
                std::memcpy(dst + 2 * i, &b, 2);
            } else {
                std::memcpy(dst + 4 * i, &v, 4);
            }
        }
    }
}

// ---- circular buffers --------------------------------------------------------------------------
std::string configured_cb_list(const Core& core) {
    std::string s;
    for (const CB& cb : core.cbs) {
        if (cb.configured) {
            s += (s.empty() ? "" : ", ") + std::to_string(cb.id);
        }
    }
    return s.empty() ? "none" : s;
}

CB& get_cb(Core& core, std::int64_t cbid, const char* api) {
    if (cbid < 0 || cbid >= static_cast<std::int64_t>(kNumCBs)) {
        fail(api, format("CB id %lld is out of range 0..%u", static_cast<long long>(cbid), kNumCBs - 1));
    }
    CB& cb = core.cbs[cbid];
    if (!cb.configured) {
        fail(api, format("CB %lld is not configured on core (%u,%u) (configured CBs: %s)", static_cast<long long>(cbid),
                         core.x, core.y, configured_cb_list(core).c_str()));
    }
    return cb;
}

bool wait_satisfied(const Core& core, const WaitDesc& w) {
    const CB& cb = core.cbs[w.cb];
    if (w.kind == WAIT_RESERVE) {
        return cb.num_pages - cb.occupancy() >= w.n;
    }
    return cb.occupancy() >= w.n;
}

bool core_deadlocked(const Core& core) {
    for (const ThreadState& t : core.threads) {
        if (!t.present || t.finished) {
            continue;
        }
        if (!(t.waiting && !wait_satisfied(core, t.wait))) {
            return false;
        }
    }
    return true;
}

std::string deadlock_report(const Core& core) {
    std::string msg = format("deadlock on core (%u,%u): every kernel still running is blocked on a circular buffer", core.x,
                             core.y);
    for (const ThreadState& t : core.threads) {
        if (t.present) {
            msg += "; " + describe_thread(core, t);
        }
    }
    return msg;
}

void block_on(Core& core, ThreadState& me, int kind, std::uint32_t cbid, std::uint32_t n, std::unique_lock<std::mutex>& lk) {
    const WaitDesc w{kind, cbid, n};
    if (wait_satisfied(core, w)) {
        return;
    }
    me.waiting = true;
    me.wait = w;
    while (true) {
        if (core.aborted || g_device->abort.load(std::memory_order_relaxed)) {
            me.waiting = false;
            throw Aborted{};
        }
        if (wait_satisfied(core, w)) {
            break;
        }
        if (core_deadlocked(core)) {
            if (core.error.empty()) {
                core.error = deadlock_report(core);
            }
            core.aborted = true;
            core.cv.notify_all();
            me.waiting = false;
            throw Aborted{};
        }
        core.cv.wait_for(lk, std::chrono::milliseconds(50));
    }
    me.waiting = false;
}

bool overlaps(std::uint32_t a, std::uint32_t a_size, std::uint32_t b, std::uint32_t b_size) {
    return a < b + b_size && b < a + a_size;
}

void advance(CB& cb, std::uint32_t& ptr, std::uint32_t pages, const char* api) {
    ptr += pages * cb.page_size;
    if (ptr > cb.limit) {
        fail(api, format("%u page(s) cross the end of CB %u (%u pages): the CB's page count must be a multiple of "
                         "the pages moved per call",
                         pages, cb.id, cb.num_pages));
    }
    if (ptr == cb.limit) {
        ptr = cb.base;
    }
}

CB* find_cb_containing(Core& core, std::uint32_t addr, std::uint32_t size) {
    for (CB& cb : core.cbs) {
        if (cb.configured && addr >= cb.base && addr + size <= cb.limit) {
            return &cb;
        }
    }
    return nullptr;
}

// ---- DRAM --------------------------------------------------------------------------------------
constexpr std::uint64_t kKindDram = 1;
constexpr std::uint64_t kKindL1 = 2;

std::uint64_t make_noc_addr(std::uint64_t kind, std::uint32_t id, std::uint32_t addr) {
    return (kind << 56) | (static_cast<std::uint64_t>(id & 0xFFFFFFu) << 32) | addr;
}

struct DramLoc {
    DramBuffer* buffer;
    std::uint32_t page;
    std::uint8_t* ptr;
};

DramLoc resolve_dram(std::uint32_t bank, std::uint32_t addr, std::uint32_t size, const char* api) {
    Device& dev = *g_device;
    if (bank >= dev.banks.size()) {
        fail(api, format("DRAM bank %u does not exist (%zu banks)", bank, dev.banks.size()));
    }
    for (DramBuffer& b : dev.buffers) {
        const std::uint64_t start = b.spec->address;
        const std::uint64_t end = start + static_cast<std::uint64_t>(b.pages_per_bank) * b.aligned_page;
        if (addr < start || addr >= end) {
            continue;
        }
        const std::uint32_t local = (addr - b.spec->address) / b.aligned_page;
        const std::uint32_t within = (addr - b.spec->address) % b.aligned_page;
        const std::uint64_t page = static_cast<std::uint64_t>(local) * dev.banks.size() + bank;
        if (page >= b.spec->num_pages) {
            fail(api, format("DRAM bank %u address 0x%x is page %llu of buffer '%s', which has only %u pages", bank, addr,
                             static_cast<unsigned long long>(page), b.spec->name.c_str(), b.spec->num_pages));
        }
        if (within + static_cast<std::uint64_t>(size) > b.spec->page_size) {
            fail(api, format("%u bytes at byte %u of page %llu of buffer '%s' run past the page end (page size %u; "
                             "does the accessor's page size match the buffer's?)",
                             size, within, static_cast<unsigned long long>(page), b.spec->name.c_str(), b.spec->page_size));
        }
        return DramLoc{&b, static_cast<std::uint32_t>(page), dev.banks[bank].data() + addr};
    }
    fail(api, format("DRAM bank %u address 0x%x (%u bytes) is not inside any buffer of the plan", bank, addr, size));
}

}  // namespace

// ---- thread descriptions -----------------------------------------------------------------------
std::string describe_thread(const Core& core, const ThreadState& t) {
    std::string label = t.kernel != nullptr ? t.kernel->label : std::string("?");
    std::string s = format("%s kernel '%s' ", role_name(t.role), label.c_str());
    if (t.finished) {
        return s + "finished";
    }
    if (t.waiting) {
        const CB& cb = core.cbs[t.wait.cb];
        if (t.wait.kind == WAIT_RESERVE) {
            return s + format("waits in cb_reserve_back(cb %u, %u page(s)) but CB %u holds %u of %u pages (%llu pushed, "
                              "%llu popped so far; nobody pops it)",
                              t.wait.cb, t.wait.n, t.wait.cb, cb.occupancy(), cb.num_pages,
                              static_cast<unsigned long long>(cb.pages_pushed), static_cast<unsigned long long>(cb.pages_popped));
        }
        return s + format("waits in cb_wait_front(cb %u, %u page(s)) but CB %u holds %u of %u pages (%llu pushed, %llu "
                          "popped so far; nobody pushes it)",
                          t.wait.cb, t.wait.n, t.wait.cb, cb.occupancy(), cb.num_pages,
                          static_cast<unsigned long long>(cb.pages_pushed), static_cast<unsigned long long>(cb.pages_popped));
    }
    return s + format("is running (last API call: %s)", t.last_api);
}

void record_core_error(Core& core, const std::string& message) {
    std::lock_guard<std::mutex> lk(core.mu);
    if (core.error.empty()) {
        core.error = message;
    }
    core.aborted = true;
    core.cv.notify_all();
}

std::uint8_t* Core::l1_ptr(std::uint32_t addr, std::uint32_t size, const char* api) {
    if (addr < l1_addr_base || static_cast<std::uint64_t>(addr) + size > l1_addr_base + l1_size) {
        fail(api, format("L1 range [0x%x, 0x%x) is outside core (%u,%u)'s L1 arena [0x%x, 0x%llx)", addr, addr + size, x, y,
                         l1_addr_base, static_cast<unsigned long long>(l1_addr_base + l1_size)));
    }
    return l1 + (addr - l1_addr_base);
}

// ---- runtime API -------------------------------------------------------------------------------
std::uint32_t runtime_arg(int idx) {
    Ctx& c = ctx("get_arg_val");
    const auto& args = c.core->spec->args[c.ts->role];
    if (idx < 0 || static_cast<std::size_t>(idx) >= args.size()) {
        fail("get_arg_val", format("runtime arg %d requested but core (%u,%u) has %zu runtime args for this kernel", idx,
                                   c.core->x, c.core->y, args.size()));
    }
    return args[idx];
}

std::uint32_t common_runtime_arg(int idx) {
    Ctx& c = ctx("get_common_arg_val");
    const auto& args = c.core->spec->common_args[c.ts->role];
    if (idx < 0 || static_cast<std::size_t>(idx) >= args.size()) {
        fail("get_common_arg_val", format("common runtime arg %d requested but the kernel has %zu", idx, args.size()));
    }
    return args[idx];
}

std::uint32_t core_x() { return ctx("get_absolute_logical_x").core->x; }
std::uint32_t core_y() { return ctx("get_absolute_logical_y").core->y; }

void unsupported(const char* what) {
    if (g_ctx != nullptr) {
        g_ctx->ts->last_api = what;
    }
    throw KernelError(std::string(what) + ": not supported by the Tessera emulator");
}

void cb_reserve_back(std::int32_t cbid, std::int32_t n) {
    Ctx& c = ctx("cb_reserve_back");
    Core& core = *c.core;
    std::unique_lock<std::mutex> lk(core.mu);
    CB& cb = get_cb(core, cbid, "cb_reserve_back");
    if (n <= 0 || static_cast<std::uint32_t>(n) > cb.num_pages) {
        fail("cb_reserve_back", format("cannot reserve %d page(s) in CB %u, which has %u pages", n, cb.id, cb.num_pages));
    }
    cb.reserve_calls++;
    block_on(core, *c.ts, WAIT_RESERVE, cb.id, static_cast<std::uint32_t>(n), lk);
    cb.reserved = std::max(cb.reserved, static_cast<std::uint32_t>(n));
}

void cb_push_back(std::int32_t cbid, std::int32_t n) {
    Ctx& c = ctx("cb_push_back");
    Core& core = *c.core;
    std::unique_lock<std::mutex> lk(core.mu);
    CB& cb = get_cb(core, cbid, "cb_push_back");
    if (n <= 0) {
        fail("cb_push_back", format("cannot push %d page(s)", n));
    }
    const std::uint32_t pages = static_cast<std::uint32_t>(n);
    if (pages > cb.reserved) {
        fail("cb_push_back", format("pushes %u page(s) to CB %u but only %u were reserved with cb_reserve_back", pages,
                                    cb.id, cb.reserved));
    }
    for (const PendingXfer& p : c.ts->pending_reads) {
        if (overlaps(p.l1_addr, p.size, cb.wr_ptr, pages * cb.page_size)) {
            fail("cb_push_back", format("CB %u: a NoC read into the pages being pushed is still in flight; call "
                                        "noc_async_read_barrier() before cb_push_back",
                                        cb.id));
        }
    }
    cb.pages_pushed += pages;
    cb.push_calls++;
    cb.reserved -= pages;
    cb.pack_pos = cb.pack_pos > pages ? cb.pack_pos - pages : 0;
    advance(cb, cb.wr_ptr, pages, "cb_push_back");
    cb.max_occupancy = std::max(cb.max_occupancy, cb.occupancy());
    core.cv.notify_all();
}

void cb_wait_front(std::int32_t cbid, std::int32_t n) {
    Ctx& c = ctx("cb_wait_front");
    Core& core = *c.core;
    std::unique_lock<std::mutex> lk(core.mu);
    CB& cb = get_cb(core, cbid, "cb_wait_front");
    if (n <= 0 || static_cast<std::uint32_t>(n) > cb.num_pages) {
        fail("cb_wait_front", format("cannot wait for %d page(s) in CB %u, which has %u pages", n, cb.id, cb.num_pages));
    }
    cb.wait_calls++;
    block_on(core, *c.ts, WAIT_FRONT, cb.id, static_cast<std::uint32_t>(n), lk);
    cb.waited = std::max(cb.waited, static_cast<std::uint32_t>(n));
}

void cb_pop_front(std::int32_t cbid, std::int32_t n) {
    Ctx& c = ctx("cb_pop_front");
    Core& core = *c.core;
    std::unique_lock<std::mutex> lk(core.mu);
    CB& cb = get_cb(core, cbid, "cb_pop_front");
    if (n <= 0) {
        fail("cb_pop_front", format("cannot pop %d page(s)", n));
    }
    const std::uint32_t pages = static_cast<std::uint32_t>(n);
    if (pages > cb.occupancy()) {
        fail("cb_pop_front", format("pops %u page(s) from CB %u, which holds only %u", pages, cb.id, cb.occupancy()));
    }
    if (pages > cb.waited) {
        fail("cb_pop_front", format("pops %u page(s) from CB %u but only %u were waited for with cb_wait_front", pages,
                                    cb.id, cb.waited));
    }
    for (const PendingXfer& p : c.ts->pending_writes) {
        if (overlaps(p.l1_addr, p.size, cb.rd_ptr, pages * cb.page_size)) {
            fail("cb_pop_front", format("CB %u: a NoC write from the pages being popped is still in flight; call "
                                        "noc_async_write_barrier() before cb_pop_front",
                                        cb.id));
        }
    }
    cb.pages_popped += pages;
    cb.pop_calls++;
    cb.waited -= pages;
    advance(cb, cb.rd_ptr, pages, "cb_pop_front");
    core.cv.notify_all();
}

bool cb_pages_reservable_at_back(std::int32_t cbid, std::int32_t n) {
    Ctx& c = ctx("cb_pages_reservable_at_back");
    std::lock_guard<std::mutex> lk(c.core->mu);
    CB& cb = get_cb(*c.core, cbid, "cb_pages_reservable_at_back");
    return n >= 0 && cb.num_pages - cb.occupancy() >= static_cast<std::uint32_t>(n);
}

bool cb_pages_available_at_front(std::int32_t cbid, std::int32_t n) {
    Ctx& c = ctx("cb_pages_available_at_front");
    std::lock_guard<std::mutex> lk(c.core->mu);
    CB& cb = get_cb(*c.core, cbid, "cb_pages_available_at_front");
    return n >= 0 && cb.occupancy() >= static_cast<std::uint32_t>(n);
}

std::uint32_t get_write_ptr(std::uint32_t cbid) {
    Ctx& c = ctx("get_write_ptr");
    std::lock_guard<std::mutex> lk(c.core->mu);
    return get_cb(*c.core, cbid, "get_write_ptr").wr_ptr;
}

std::uint32_t get_read_ptr(std::uint32_t cbid) {
    Ctx& c = ctx("get_read_ptr");
    std::lock_guard<std::mutex> lk(c.core->mu);
    return get_cb(*c.core, cbid, "get_read_ptr").rd_ptr;
}

std::uint32_t cb_page_size(std::uint32_t cbid) {
    Ctx& c = ctx("get_tile_size");
    std::lock_guard<std::mutex> lk(c.core->mu);
    return get_cb(*c.core, cbid, "get_tile_size").page_size;
}

std::uint32_t cb_data_format(std::uint32_t cbid) {
    Ctx& c = ctx("get_dataformat");
    std::lock_guard<std::mutex> lk(c.core->mu);
    return static_cast<std::uint32_t>(get_cb(*c.core, cbid, "get_dataformat").format);
}

// ---- NoC ---------------------------------------------------------------------------------------
std::uint64_t interleaved_noc_addr(
    bool is_dram, std::uint32_t bank_base_address, std::uint32_t page_size, std::uint32_t page_id, std::uint32_t offset) {
    Ctx& c = ctx("TensorAccessor::get_noc_addr");
    (void)c;
    if (!is_dram) {
        unsupported("interleaved L1 buffers (TensorAccessorArgs without IsDram)");
    }
    if (page_size == 0) {
        fail("TensorAccessor::get_noc_addr", "page size is 0");
    }
    const ProgramSpec& prog = *g_device->prog;
    const std::uint32_t align = prog.dram_alignment;
    const std::uint32_t aligned = (page_size + align - 1) / align * align;
    const std::uint32_t bank = page_id % prog.dram_banks;
    const std::uint64_t addr = bank_base_address + static_cast<std::uint64_t>(page_id / prog.dram_banks) * aligned + offset;
    if (addr > 0xFFFFFFFFull) {
        fail("TensorAccessor::get_noc_addr", format("page %u lands beyond the 32-bit bank address space", page_id));
    }
    return make_noc_addr(kKindDram, bank, static_cast<std::uint32_t>(addr));
}

std::uint64_t core_noc_addr(std::uint32_t noc_x, std::uint32_t noc_y, std::uint32_t addr) {
    ctx("get_noc_addr");
    return make_noc_addr(kKindL1, (noc_x << 12) | (noc_y & 0xFFFu), addr);
}

std::uint64_t local_noc_addr(std::uint32_t addr) {
    Ctx& c = ctx("get_noc_addr");
    return make_noc_addr(kKindL1, (c.core->x << 12) | (c.core->y & 0xFFFu), addr);
}

namespace {

std::uint8_t* local_l1_from_noc(Core& core, std::uint64_t noc_addr, std::uint32_t size, const char* api) {
    const std::uint32_t id = static_cast<std::uint32_t>((noc_addr >> 32) & 0xFFFFFFu);
    const std::uint32_t x = id >> 12;
    const std::uint32_t y = id & 0xFFFu;
    if (x != core.x || y != core.y) {
        unsupported("NoC transfers to or from another core's L1");
    }
    return core.l1_ptr(static_cast<std::uint32_t>(noc_addr), size, api);
}

}  // namespace

void noc_read(std::uint64_t src, std::uint32_t dst_l1, std::uint32_t size) {
    const char* api = "noc_async_read";
    Ctx& c = ctx(api);
    Core& core = *c.core;
    if (size == 0) {
        return;
    }
    {
        std::lock_guard<std::mutex> lk(core.mu);
        CB* cb = find_cb_containing(core, dst_l1, size);
        if (cb == nullptr) {
            fail(api, format("destination L1 range [0x%x, 0x%x) is not inside a circular buffer", dst_l1, dst_l1 + size));
        }
        if (!(dst_l1 >= cb->wr_ptr && dst_l1 + size <= cb->wr_ptr + cb->reserved * cb->page_size)) {
            fail(api, format("destination L1 range [0x%x, 0x%x) of CB %u is outside the %u page(s) reserved at its back "
                             "(cb_reserve_back, then write at get_write_ptr)",
                             dst_l1, dst_l1 + size, cb->id, cb->reserved));
        }
    }
    std::uint8_t* dst = core.l1_ptr(dst_l1, size, api);
    const std::uint64_t kind = src >> 56;
    if (kind == kKindDram) {
        DramLoc loc = resolve_dram(static_cast<std::uint32_t>((src >> 32) & 0xFFFFFFu), static_cast<std::uint32_t>(src), size, api);
        std::memcpy(dst, loc.ptr, size);
        loc.buffer->page_reads[loc.page].fetch_add(1, std::memory_order_relaxed);
    } else if (kind == kKindL1) {
        std::memmove(dst, local_l1_from_noc(core, src, size, api), size);
    } else {
        fail(api, format("source NoC address 0x%llx was not made by get_noc_addr or a TensorAccessor",
                         static_cast<unsigned long long>(src)));
    }
    c.ts->pending_reads.push_back({dst_l1, size});
    c.ts->noc_reads++;
    c.ts->noc_read_bytes += size;
}

void noc_write(std::uint32_t src_l1, std::uint64_t dst, std::uint32_t size) {
    const char* api = "noc_async_write";
    Ctx& c = ctx(api);
    Core& core = *c.core;
    if (size == 0) {
        return;
    }
    {
        std::lock_guard<std::mutex> lk(core.mu);
        CB* cb = find_cb_containing(core, src_l1, size);
        if (cb == nullptr) {
            fail(api, format("source L1 range [0x%x, 0x%x) is not inside a circular buffer", src_l1, src_l1 + size));
        }
        if (!(src_l1 >= cb->rd_ptr && src_l1 + size <= cb->rd_ptr + cb->waited * cb->page_size)) {
            fail(api, format("source L1 range [0x%x, 0x%x) of CB %u is outside the %u page(s) made visible by "
                             "cb_wait_front (read at get_read_ptr)",
                             src_l1, src_l1 + size, cb->id, cb->waited));
        }
    }
    const std::uint8_t* src = core.l1_ptr(src_l1, size, api);
    const std::uint64_t kind = dst >> 56;
    if (kind == kKindDram) {
        DramLoc loc = resolve_dram(static_cast<std::uint32_t>((dst >> 32) & 0xFFFFFFu), static_cast<std::uint32_t>(dst), size, api);
        std::memcpy(loc.ptr, src, size);
        loc.buffer->page_writes[loc.page].fetch_add(1, std::memory_order_relaxed);
    } else if (kind == kKindL1) {
        std::memmove(local_l1_from_noc(core, dst, size, api), src, size);
    } else {
        fail(api, format("destination NoC address 0x%llx was not made by get_noc_addr or a TensorAccessor",
                         static_cast<unsigned long long>(dst)));
    }
    c.ts->pending_writes.push_back({src_l1, size});
    c.ts->noc_writes++;
    c.ts->noc_write_bytes += size;
}

void noc_read_barrier() { ctx("noc_async_read_barrier").ts->pending_reads.clear(); }
void noc_write_barrier() { ctx("noc_async_write_barrier").ts->pending_writes.clear(); }

// ---- compute -----------------------------------------------------------------------------------
namespace {

const char* fpu_mode_name(int mode) {
    switch (mode) {
        case FPU_NONE: return "nothing";
        case FPU_MATMUL: return "matmul (mm_init / mm_init_short)";
        case FPU_ADD: return "add (add_tiles_init)";
        case FPU_SUB: return "sub (sub_tiles_init)";
        case FPU_MUL: return "mul (mul_tiles_init)";
        case FPU_ADD_BCAST_ROWS: return "row-broadcast add (add_bcast_rows_init_short)";
        case FPU_MUL_BCAST_ROWS: return "row-broadcast mul (mul_bcast_rows_init_short)";
        case FPU_ADD_BCAST_COLS: return "column-broadcast add (add_bcast_cols_init_short)";
        case FPU_MUL_BCAST_COLS: return "column-broadcast mul (mul_bcast_cols_init_short)";
        case FPU_SUB_BCAST_COLS: return "column-broadcast sub (sub_bcast_cols_init_short)";
        case FPU_REDUCE_SUM_ROW: return "row sum (reduce_init<SUM, REDUCE_ROW>)";
        case FPU_REDUCE_MAX_ROW: return "row max (reduce_init<MAX, REDUCE_ROW>)";
        case FPU_COPY: return "copy (copy_tile_init / init_sfpu)";
        case FPU_TRANSPOSE: return "transpose (transpose_wh_init)";
        default: return "?";
    }
}

const char* sfpu_name(int op) {
    switch (op) {
        case SFPU_NONE: return "nothing";
        case SFPU_EXP: return "exp (exp_tile_init)";
        case SFPU_GELU: return "gelu<fast_and_approx=false> (gelu_tile_init<false>)";
        case SFPU_GELU_APPROX: return "gelu<fast_and_approx=true> (gelu_tile_init<true>)";
        case SFPU_RELU: return "relu (relu_tile_init)";
        case SFPU_BINOP_SCALAR: return "binop with scalar (binop_with_scalar_tile_init)";
        case SFPU_SQRT: return "sqrt (sqrt_tile_init)";
        case SFPU_RECIP: return "reciprocal (recip_tile_init)";
        case SFPU_MAX: return "binary max (binary_max_tile_init)";
        default: return "?";
    }
}

const char* dst_state_name(int s) {
    switch (s) {
        case DST_RELEASED: return "released";
        case DST_ACQUIRED: return "acquired by math";
        case DST_COMMITTED: return "committed (math done, packer not yet waiting)";
        case DST_PACKING: return "owned by the packer";
        case DST_FULL: return "acquired with acquire_dst";
        default: return "?";
    }
}

ComputeState& compute_ctx(const char* api) {
    Ctx& c = ctx(api);
    if (c.ts->role != COMPUTE) {
        fail(api, "compute API called from a data-movement kernel");
    }
    return c.core->compute;
}

void need_hw(ComputeState& cs, const char* api) {
    if (!cs.hw_configured) {
        fail(api, "no hardware init before the first math call: call mm_init, binary_op_init_common, "
                  "init_sfpu/unary_op_init_common or compute_kernel_hw_startup first");
    }
}

void need_math(ComputeState& cs, const char* api) {
    if (cs.state != DST_ACQUIRED && cs.state != DST_FULL) {
        fail(api, format("DST is %s; math needs it acquired (tile_regs_acquire)", dst_state_name(cs.state)));
    }
}

void need_dst(ComputeState& cs, std::uint32_t idst, const char* api) {
    if (idst >= cs.capacity) {
        fail(api, format("DST index %u is out of range: DST holds %u tiles (%s)", idst, cs.capacity,
                         g_device->prog->fp32_dest_acc ? "fp32_dest_acc_en" : "16-bit accumulation"));
    }
}

void need_fpu(ComputeState& cs, int mode, const char* api) {
    if (cs.fpu_mode != mode) {
        fail(api, format("the FPU is configured for %s, not %s: call the matching init first", fpu_mode_name(cs.fpu_mode),
                         fpu_mode_name(mode)));
    }
}

void check_cbs(Core& core, std::initializer_list<std::uint32_t> ids, const char* api) {
    std::lock_guard<std::mutex> lk(core.mu);
    for (std::uint32_t id : ids) {
        get_cb(core, id, api);
    }
}

void check_same_format(Core& core, std::uint32_t used, std::uint32_t configured, const char* api, const char* init) {
    if (used == configured) {
        return;
    }
    std::lock_guard<std::mutex> lk(core.mu);
    const CB& a = get_cb(core, used, api);
    const CB& b = get_cb(core, configured, api);
    if (a.format != b.format) {
        fail(api, format("reads CB %u (%s) but the unpacker was configured by %s for CB %u (%s)", used, format_name(a.format),
                         init, configured, format_name(b.format)));
    }
}

void read_front_tile(Core& core, std::uint32_t cbid, std::uint32_t itile, float* out, const char* api) {
    std::uint32_t addr;
    Format fmt;
    std::uint32_t page;
    {
        std::lock_guard<std::mutex> lk(core.mu);
        CB& cb = get_cb(core, cbid, api);
        if (itile >= cb.waited) {
            fail(api, format("tile %u of CB %u but only %u page(s) were made visible with cb_wait_front", itile, cb.id,
                             cb.waited));
        }
        addr = cb.rd_ptr + itile * cb.page_size;
        if (addr + cb.page_size > cb.limit) {
            fail(api, format("tile %u of CB %u wraps around the CB end", itile, cb.id));
        }
        fmt = cb.format;
        page = cb.page_size;
    }
    unpack_tile(core.l1_ptr(addr, page, api), fmt, out);
}

float* dst_tile(ComputeState& cs, std::uint32_t idst) { return cs.dst.data() + static_cast<std::size_t>(idst) * kTileElems; }

}  // namespace

void hw_startup(const char* api, std::uint32_t icb0, std::uint32_t icb1, std::uint32_t ocb) {
    ComputeState& cs = compute_ctx(api);
    check_cbs(*g_ctx->core, {icb0, icb1, ocb}, api);
    cs.hw_configured = true;
    cs.pack_cb = ocb;
    cs.hw_init_api = api;
}

void fpu_init(int mode, std::uint32_t icb0, std::uint32_t icb1, std::uint32_t flags, const char* api) {
    ComputeState& cs = compute_ctx(api);
    check_cbs(*g_ctx->core, {icb0, icb1}, api);
    cs.fpu_mode = mode;
    cs.fpu_flags = flags;
    cs.fpu_cb0 = icb0;
    cs.fpu_cb1 = icb1;
    cs.fpu_init_api = api;
}

void dst_acquire() {
    ComputeState& cs = compute_ctx("tile_regs_acquire");
    if (cs.state != DST_RELEASED) {
        fail("tile_regs_acquire", format("DST is %s (missing tile_regs_release?)", dst_state_name(cs.state)));
    }
    std::fill(cs.dst.begin(), cs.dst.end(), 0.0f);
    cs.reduced.assign(cs.capacity, false);
    cs.state = DST_ACQUIRED;
    cs.dst_acquires++;
}

void dst_commit() {
    ComputeState& cs = compute_ctx("tile_regs_commit");
    if (cs.state != DST_ACQUIRED) {
        fail("tile_regs_commit", format("DST is %s; commit follows tile_regs_acquire", dst_state_name(cs.state)));
    }
    cs.state = DST_COMMITTED;
}

void dst_wait() {
    ComputeState& cs = compute_ctx("tile_regs_wait");
    if (cs.state != DST_COMMITTED) {
        fail("tile_regs_wait", format("DST is %s; tile_regs_wait follows tile_regs_commit", dst_state_name(cs.state)));
    }
    cs.state = DST_PACKING;
}

void dst_release() {
    ComputeState& cs = compute_ctx("tile_regs_release");
    if (cs.state != DST_PACKING) {
        fail("tile_regs_release", format("DST is %s; tile_regs_release follows tile_regs_wait", dst_state_name(cs.state)));
    }
    cs.state = DST_RELEASED;
}

void dst_acquire_full() {
    ComputeState& cs = compute_ctx("acquire_dst");
    if (cs.state != DST_RELEASED) {
        fail("acquire_dst", format("DST is %s (missing release_dst?)", dst_state_name(cs.state)));
    }
    std::fill(cs.dst.begin(), cs.dst.end(), 0.0f);
    cs.state = DST_FULL;
    cs.dst_acquires++;
}

void dst_release_full() {
    ComputeState& cs = compute_ctx("release_dst");
    if (cs.state != DST_FULL) {
        fail("release_dst", format("DST is %s; release_dst follows acquire_dst", dst_state_name(cs.state)));
    }
    cs.state = DST_RELEASED;
}

// The common start of a two-operand FPU op (matmul, binary, reduce): its state checks, the
// operands' formats against the init's, the two front tiles read into ``a`` / ``b``; the DST tile.
float* fpu_operands(ComputeState& cs, Core& core, int mode, std::uint32_t in0, std::uint32_t in1, std::uint32_t i0,
                    std::uint32_t i1, std::uint32_t idst, float* a, float* b, const char* api) {
    need_hw(cs, api);
    need_fpu(cs, mode, api);
    need_math(cs, api);
    need_dst(cs, idst, api);
    check_same_format(core, in0, cs.fpu_cb0, api, cs.fpu_init_api);
    check_same_format(core, in1, cs.fpu_cb1, api, cs.fpu_init_api);
    read_front_tile(core, in0, i0, a, api);
    read_front_tile(core, in1, i1, b, api);
    return dst_tile(cs, idst);
}

// Without fp32_dest_acc_en DST holds 16-bit values: every result written to it is rounded to the
// format the unpacker was configured for (bfloat16, or IEEE half for Float16 CBs; float32 data too).
void dst_round16(ComputeState& cs, std::uint32_t idst) {
    if (g_device->prog->fp32_dest_acc) {
        return;
    }
    Format fmt;
    {
        std::lock_guard<std::mutex> lk(g_ctx->core->mu);
        fmt = get_cb(*g_ctx->core, cs.fpu_cb0, "DST").format;
    }
    float* d = dst_tile(cs, idst);
    for (std::uint32_t i = 0; i < kTileElems; ++i) {
        d[i] = fmt == Format::Float16 ? f16_to_float(float_to_f16(d[i])) : bf16_to_float(float_to_bf16(d[i]));
    }
}

void matmul_tiles(std::uint32_t in0, std::uint32_t in1, std::uint32_t i0, std::uint32_t i1, std::uint32_t idst,
                  std::uint32_t transpose) {
    const char* api = "matmul_tiles";
    ComputeState& cs = compute_ctx(api);
    float a[kTileElems];
    float b[kTileElems];
    float* d = fpu_operands(cs, *g_ctx->core, FPU_MATMUL, in0, in1, i0, i1, idst, a, b, api);
    for (std::uint32_t r = 0; r < kTileRows; ++r) {
        float acc[kTileCols] = {};
        for (std::uint32_t k = 0; k < kTileCols; ++k) {
            const float av = a[r * kTileCols + k];
            if (transpose != 0) {
                for (std::uint32_t c2 = 0; c2 < kTileCols; ++c2) {
                    acc[c2] += av * b[c2 * kTileCols + k];
                }
            } else {
                const float* brow = b + k * kTileCols;
                for (std::uint32_t c2 = 0; c2 < kTileCols; ++c2) {
                    acc[c2] += av * brow[c2];
                }
            }
        }
        for (std::uint32_t c2 = 0; c2 < kTileCols; ++c2) {
            d[r * kTileCols + c2] += acc[c2];
        }
    }
    dst_round16(cs, idst);
    cs.matmul_tiles++;
}

void reduce_tiles(int mode, std::uint32_t icb, std::uint32_t iscaler, std::uint32_t itile, std::uint32_t itile_scaler,
                  std::uint32_t idst, const char* api) {
    ComputeState& cs = compute_ctx(api);
    float a[kTileElems];
    float scaler[kTileElems];
    float* d = fpu_operands(cs, *g_ctx->core, mode, icb, iscaler, itile, itile_scaler, idst, a, scaler, api);
    const bool first = !cs.reduced[idst];
    for (std::uint32_t r = 0; r < kTileRows; ++r) {
        float v = a[r * kTileCols];
        for (std::uint32_t c2 = 1; c2 < kTileCols; ++c2) {
            const float x = a[r * kTileCols + c2];
            v = mode == FPU_REDUCE_MAX_ROW ? std::max(v, x) : v + x;
        }
        v *= scaler[0];
        float& out = d[r * kTileCols];
        out = first ? v : (mode == FPU_REDUCE_MAX_ROW ? std::max(out, v) : out + v);
    }
    cs.reduced[idst] = true;
    dst_round16(cs, idst);
    cs.binary_tiles++;
}

void binary_tiles(int mode, std::uint32_t in0, std::uint32_t in1, std::uint32_t i0, std::uint32_t i1, std::uint32_t idst,
                  const char* api) {
    ComputeState& cs = compute_ctx(api);
    float a[kTileElems];
    float b[kTileElems];
    float* d = fpu_operands(cs, *g_ctx->core, mode, in0, in1, i0, i1, idst, a, b, api);
    const bool acc = (mode == FPU_ADD || mode == FPU_SUB) && (cs.fpu_flags & 1u) != 0;
    for (std::uint32_t r = 0; r < kTileRows; ++r) {
        for (std::uint32_t c2 = 0; c2 < kTileCols; ++c2) {
            const float x = a[r * kTileCols + c2];
            float y = b[r * kTileCols + c2];
            if (mode == FPU_ADD_BCAST_ROWS || mode == FPU_MUL_BCAST_ROWS) {
                y = b[c2];
            } else if (mode == FPU_ADD_BCAST_COLS || mode == FPU_MUL_BCAST_COLS || mode == FPU_SUB_BCAST_COLS) {
                y = b[r * kTileCols];
            }
            float v;
            switch (mode) {
                case FPU_SUB:
                case FPU_SUB_BCAST_COLS: v = x - y; break;
                case FPU_MUL:
                case FPU_MUL_BCAST_ROWS:
                case FPU_MUL_BCAST_COLS: v = x * y; break;
                default: v = x + y; break;
            }
            float& out = d[r * kTileCols + c2];
            out = acc ? out + v : v;
        }
    }
    dst_round16(cs, idst);
    cs.binary_tiles++;
}

// A CB tile into DST (copy_tile), or transposed on the way (transpose_wh_tile: B[w, h] = A[h, w]).
void unpack_to_dst(std::uint32_t in_cb, std::uint32_t in_tile, std::uint32_t idst, bool transpose, const char* api) {
    ComputeState& cs = compute_ctx(api);
    need_hw(cs, api);
    need_fpu(cs, transpose ? FPU_TRANSPOSE : FPU_COPY, api);
    need_math(cs, api);
    need_dst(cs, idst, api);
    check_same_format(*g_ctx->core, in_cb, cs.fpu_cb0, api, cs.fpu_init_api);
    float* d = dst_tile(cs, idst);  // DST tiles are row-major: element (r, c) at r * 32 + c
    if (transpose) {
        float tile[kTileElems];
        read_front_tile(*g_ctx->core, in_cb, in_tile, tile, api);
        for (std::uint32_t r = 0; r < 32; ++r) {
            for (std::uint32_t c = 0; c < 32; ++c) {
                d[r * 32 + c] = tile[c * 32 + r];
            }
        }
    } else {
        read_front_tile(*g_ctx->core, in_cb, in_tile, d, api);
    }
    dst_round16(cs, idst);
    cs.copy_tiles++;
}

void copy_tile(std::uint32_t in_cb, std::uint32_t in_tile, std::uint32_t idst) {
    unpack_to_dst(in_cb, in_tile, idst, false, "copy_tile");
}

void transpose_tile(std::uint32_t in_cb, std::uint32_t in_tile, std::uint32_t idst) {
    unpack_to_dst(in_cb, in_tile, idst, true, "transpose_wh_tile");
}

void sfpu_init(int op, const char* api) { compute_ctx(api).sfpu_op = op; }

void sfpu_apply(int op, std::uint32_t idst, float scale, const char* api) {
    ComputeState& cs = compute_ctx(api);
    need_hw(cs, api);
    need_math(cs, api);
    need_dst(cs, idst, api);
    if (cs.sfpu_op != op) {
        fail(api, format("the SFPU is initialised for %s, not %s: call the matching *_tile_init first", sfpu_name(cs.sfpu_op),
                         sfpu_name(op)));
    }
    float* d = dst_tile(cs, idst);
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    constexpr float kInvSqrt2 = 0.7071067811865476f;
    for (std::uint32_t i = 0; i < kTileElems; ++i) {
        const float x = d[i];
        switch (op) {
            case SFPU_EXP: d[i] = std::exp(x * scale); break;
            case SFPU_GELU: d[i] = 0.5f * x * (1.0f + std::erf(x * kInvSqrt2)); break;
            case SFPU_GELU_APPROX:
                d[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
                break;
            case SFPU_RELU: d[i] = x > 0.0f ? x : 0.0f; break;
            case SFPU_SQRT: d[i] = std::sqrt(x); break;
            case SFPU_RECIP: d[i] = 1.0f / x; break;
            default: fail(api, "unknown SFPU op");
        }
    }
    dst_round16(cs, idst);
    cs.sfpu_tiles++;
}

void sfpu_binary(int op, std::uint32_t idst0, std::uint32_t idst1, const char* api) {
    ComputeState& cs = compute_ctx(api);
    need_hw(cs, api);
    need_math(cs, api);
    need_dst(cs, idst0, api);
    need_dst(cs, idst1, api);
    if (cs.sfpu_op != op) {
        fail(api, format("the SFPU is initialised for %s, not %s: call the matching *_tile_init first", sfpu_name(cs.sfpu_op),
                         sfpu_name(op)));
    }
    float* a = dst_tile(cs, idst0);
    const float* b = dst_tile(cs, idst1);
    for (std::uint32_t i = 0; i < kTileElems; ++i) {
        switch (op) {
            case SFPU_MAX: a[i] = std::max(a[i], b[i]); break;  // the result overwrites the first operand
            default: fail(api, "unknown binary SFPU op");
        }
    }
    dst_round16(cs, idst0);
    cs.sfpu_tiles++;
}

void sfpu_scalar(int mode, std::uint32_t idst, std::uint32_t bits, const char* api) {
    ComputeState& cs = compute_ctx(api);
    need_hw(cs, api);
    need_math(cs, api);
    need_dst(cs, idst, api);
    if (cs.sfpu_op != SFPU_BINOP_SCALAR) {
        fail(api, format("the SFPU is initialised for %s, not a binop with scalar: call binop_with_scalar_tile_init first",
                         sfpu_name(cs.sfpu_op)));
    }
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    float* d = dst_tile(cs, idst);
    for (std::uint32_t i = 0; i < kTileElems; ++i) {
        const float x = d[i];
        switch (mode) {
            case SCALAR_ADD: d[i] = x + value; break;
            case SCALAR_SUB: d[i] = x - value; break;
            case SCALAR_MUL: d[i] = x * value; break;
            case SCALAR_DIV: d[i] = x / value; break;
            case SCALAR_RSUB: d[i] = value - x; break;
            default: fail(api, "unknown binop-with-scalar mode");
        }
    }
    dst_round16(cs, idst);
    cs.sfpu_tiles++;
}

void pack_reconfig(std::uint32_t ocb) {
    const char* api = "pack_reconfig_data_format";
    ComputeState& cs = compute_ctx(api);
    check_cbs(*g_ctx->core, {ocb}, api);
    cs.pack_cb = ocb;
    cs.hw_init_api = api;
}

void pack_tile(std::uint32_t idst, std::uint32_t ocb, std::uint32_t output_tile_index, bool out_of_order) {
    const char* api = "pack_tile";
    ComputeState& cs = compute_ctx(api);
    Core& core = *g_ctx->core;
    if (cs.state != DST_PACKING && cs.state != DST_FULL) {
        fail(api, format("DST is %s; packing needs tile_regs_commit then tile_regs_wait", dst_state_name(cs.state)));
    }
    need_dst(cs, idst, api);
    std::uint32_t addr;
    Format fmt;
    std::uint32_t page;
    {
        std::lock_guard<std::mutex> lk(core.mu);
        CB& cb = get_cb(core, ocb, api);
        if (cs.pack_cb < kNumCBs && cs.pack_cb != ocb) {  // the packer converts to the format it was set up for
            const CB& configured = get_cb(core, cs.pack_cb, api);
            if (configured.format != cb.format) {
                fail(api, format("packs into CB %u (%s) but the packer was configured by %s for CB %u (%s)", ocb,
                                 format_name(cb.format), cs.hw_init_api, cs.pack_cb, format_name(configured.format)));
            }
        }
        const std::uint32_t pos = out_of_order ? output_tile_index : cb.pack_pos;
        if (pos >= cb.reserved) {
            fail(api, format("writes tile position %u of CB %u but only %u page(s) are reserved (cb_reserve_back first)", pos,
                             cb.id, cb.reserved));
        }
        addr = cb.wr_ptr + pos * cb.page_size;
        if (addr + cb.page_size > cb.limit) {
            fail(api, format("tile position %u of CB %u wraps around the CB end", pos, cb.id));
        }
        if (!out_of_order) {
            cb.pack_pos++;
        }
        fmt = cb.format;
        page = cb.page_size;
    }
    pack_tile_to(dst_tile(cs, idst), fmt, core.l1_ptr(addr, page, api));
    cs.packed_tiles++;
}

}  // namespace tt_emu
