// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): the runner executable.
//
//   ttemu_runner RUN_SPEC
//
// Reads a run specification written by tessera_tvm.target.tt.emulate (buffers, CBs, the three
// kernel shared objects, per-core runtime args), loads DRAM inputs, runs every core's reader,
// compute and writer kernels as three threads (cores in parallel, up to max_parallel_cores at a
// time), writes DRAM outputs and a JSON file of counters (and the first error, if any).
// Exit status: 0 ok, 2 kernel/plan error, 3 stalled (watchdog), 4 bad spec.
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "emu_internal.h"

namespace tt_emu {

const char* role_name(int role) {
    switch (role) {
        case READER: return "reader";
        case COMPUTE: return "compute";
        case WRITER: return "writer";
        default: return "?";
    }
}

std::uint32_t format_bytes(Format f) { return f == Format::Float32 ? 4 : 2; }
const char* format_name(Format f) {
    switch (f) {
        case Format::Float32: return "Float32";
        case Format::Float16: return "Float16";
        case Format::Float16_b: return "Float16_b";
    }
    return "?";
}

std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

// ---- crash reporting ---------------------------------------------------------------------------
thread_local char t_signal_label[256] = "runner main thread";

void crash_handler(int sig) {
    const char* head = "ttemu_runner: fatal signal in ";
    ssize_t ignored = write(STDERR_FILENO, head, std::strlen(head));
    ignored = write(STDERR_FILENO, t_signal_label, std::strlen(t_signal_label));
    ignored = write(STDERR_FILENO, "\n", 1);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
}

// ---- spec parsing ------------------------------------------------------------------------------
[[noreturn]] void spec_error(const std::string& path, int line, const std::string& msg) {
    std::cerr << "ttemu_runner: " << path << ":" << line << ": " << msg << "\n";
    std::exit(4);
}

std::string rest_of_line(std::istringstream& in) {
    std::string rest;
    std::getline(in, rest);
    const auto first = rest.find_first_not_of(' ');
    return first == std::string::npos ? std::string() : rest.substr(first);
}

ProgramSpec parse_spec(const std::string& path) {
    std::ifstream file(path);
    if (!file) {
        spec_error(path, 0, "cannot open run spec");
    }
    ProgramSpec prog;
    std::string line;
    int lineno = 0;
    CoreSpec* core = nullptr;
    auto find_buffer = [&](const std::string& name) -> BufferSpec& {
        for (BufferSpec& b : prog.buffers) {
            if (b.name == name) {
                return b;
            }
        }
        spec_error(path, lineno, "unknown buffer " + name);
    };
    bool header = false;
    while (std::getline(file, line)) {
        ++lineno;
        if (line.empty() || line[0] == '#') {
            continue;
        }
        std::istringstream in(line);
        std::string key;
        in >> key;
        if (!header) {
            if (key != "TTEMU") {
                spec_error(path, lineno, "not a ttemu run spec");
            }
            header = true;
            continue;
        }
        if (key == "name") {
            prog.name = rest_of_line(in);
        } else if (key == "arch") {
            in >> prog.arch;
        } else if (key == "dram_banks") {
            in >> prog.dram_banks;
        } else if (key == "dram_alignment") {
            in >> prog.dram_alignment;
        } else if (key == "l1_alignment") {
            in >> prog.l1_alignment;
        } else if (key == "l1_budget") {
            in >> prog.l1_budget;
        } else if (key == "dst_tiles") {
            in >> prog.dst_tiles;
        } else if (key == "fp32_dest_acc") {
            int v = 0;
            in >> v;
            prog.fp32_dest_acc = v != 0;
        } else if (key == "stall_timeout_ms") {
            in >> prog.stall_timeout_ms;
        } else if (key == "max_parallel_cores") {
            in >> prog.max_parallel_cores;
        } else if (key == "counters") {
            prog.counters_path = rest_of_line(in);
        } else if (key == "cb") {
            CBSpec cb;
            std::uint32_t fmt = 0;
            in >> cb.id >> cb.page_size >> cb.num_pages >> fmt;
            cb.format = static_cast<Format>(fmt);
            if (cb.id >= kNumCBs || (cb.format != Format::Float32 && cb.format != Format::Float16 && cb.format != Format::Float16_b) ||
                cb.page_size != kTileElems * format_bytes(cb.format) || cb.num_pages == 0) {
                spec_error(path, lineno, "bad circular buffer line");
            }
            prog.cbs.push_back(cb);
        } else if (key == "buffer") {
            BufferSpec b;
            in >> b.name >> b.address >> b.page_size >> b.num_pages;
            prog.buffers.push_back(b);
        } else if (key == "buffer_input") {
            std::string name;
            in >> name;
            find_buffer(name).input_path = rest_of_line(in);
        } else if (key == "buffer_output") {
            std::string name;
            in >> name;
            find_buffer(name).output_path = rest_of_line(in);
        } else if (key == "kernel") {
            int role = -1;
            in >> role;
            if (role < 0 || role > 2) {
                spec_error(path, lineno, "bad kernel role");
            }
            prog.kernels[role].present = true;
            prog.kernels[role].label = rest_of_line(in);
        } else if (key == "kernel_so") {
            int role = -1;
            in >> role;
            if (role < 0 || role > 2) {
                spec_error(path, lineno, "bad kernel role");
            }
            prog.kernels[role].so_path = rest_of_line(in);
        } else if (key == "core") {
            prog.cores.emplace_back();
            core = &prog.cores.back();
            in >> core->x >> core->y;
        } else if (key == "args" || key == "common_args") {
            if (core == nullptr) {
                spec_error(path, lineno, "args before core");
            }
            int role = -1;
            std::size_t n = 0;
            in >> role >> n;
            if (role < 0 || role > 2) {
                spec_error(path, lineno, "bad kernel role");
            }
            auto& dst = key == "args" ? core->args[role] : core->common_args[role];
            dst.resize(n);
            for (std::size_t i = 0; i < n; ++i) {
                in >> dst[i];
            }
        } else if (key == "end") {
            break;
        } else {
            spec_error(path, lineno, "unknown key " + key);
        }
        if (in.fail()) {
            spec_error(path, lineno, "malformed line");
        }
    }
    if (prog.counters_path.empty()) {
        spec_error(path, lineno, "no counters path");
    }
    return prog;
}

// ---- JSON output -------------------------------------------------------------------------------
std::string json_str(const std::string& s) {
    std::string out = "\"";
    for (char ch : s) {
        switch (ch) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            default:
                if (static_cast<unsigned char>(ch) < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
                    out += buf;
                } else {
                    out += ch;
                }
        }
    }
    return out + "\"";
}

void write_counters(const Device& dev, const std::string& status, const std::string& error, double elapsed_ms) {
    const ProgramSpec& prog = *dev.prog;
    std::ostringstream o;
    o << "{\n  \"status\": " << json_str(status) << ",\n  \"error\": " << json_str(error) << ",\n  \"elapsed_ms\": " << elapsed_ms
      << ",\n  \"buffers\": {";
    for (std::size_t i = 0; i < dev.buffers.size(); ++i) {
        const DramBuffer& b = dev.buffers[i];
        o << (i ? "," : "") << "\n    " << json_str(b.spec->name) << ": {\"address\": " << b.spec->address
          << ", \"num_pages\": " << b.spec->num_pages << ", \"page_reads\": [";
        for (std::uint32_t p = 0; p < b.spec->num_pages; ++p) {
            o << (p ? "," : "") << b.page_reads[p].load();
        }
        o << "], \"page_writes\": [";
        for (std::uint32_t p = 0; p < b.spec->num_pages; ++p) {
            o << (p ? "," : "") << b.page_writes[p].load();
        }
        o << "]}";
    }
    o << "\n  },\n  \"cores\": [";
    bool first_core = true;
    for (const auto& cp : dev.cores) {
        const Core& c = *cp;
        if (!c.done) {
            continue;
        }
        o << (first_core ? "" : ",") << "\n    {\"core\": [" << c.x << ", " << c.y << "], \"l1_bytes\": " << c.l1_used
          << ", \"elapsed_ms\": " << c.elapsed_ms << ", \"cbs\": [";
        first_core = false;
        bool first_cb = true;
        for (const CB& cb : c.cbs) {
            if (!cb.configured) {
                continue;
            }
            o << (first_cb ? "" : ", ") << "{\"id\": " << cb.id << ", \"page_size\": " << cb.page_size
              << ", \"num_pages\": " << cb.num_pages << ", \"pages_pushed\": " << cb.pages_pushed
              << ", \"pages_popped\": " << cb.pages_popped << ", \"push_calls\": " << cb.push_calls
              << ", \"pop_calls\": " << cb.pop_calls << ", \"reserve_calls\": " << cb.reserve_calls
              << ", \"wait_calls\": " << cb.wait_calls << ", \"max_occupancy\": " << cb.max_occupancy << "}";
            first_cb = false;
        }
        o << "], \"kernels\": {";
        bool first_k = true;
        for (const ThreadState& t : c.threads) {
            if (!t.present) {
                continue;
            }
            o << (first_k ? "" : ", ") << json_str(role_name(t.role)) << ": {\"noc_reads\": " << t.noc_reads
              << ", \"noc_read_bytes\": " << t.noc_read_bytes << ", \"noc_writes\": " << t.noc_writes
              << ", \"noc_write_bytes\": " << t.noc_write_bytes;
            if (t.role == COMPUTE) {
                const ComputeState& cs = c.compute;
                o << ", \"matmul_tiles\": " << cs.matmul_tiles << ", \"binary_tiles\": " << cs.binary_tiles
                  << ", \"copy_tiles\": " << cs.copy_tiles << ", \"sfpu_tiles\": " << cs.sfpu_tiles
                  << ", \"packed_tiles\": " << cs.packed_tiles << ", \"dst_acquires\": " << cs.dst_acquires;
            }
            o << "}";
            first_k = false;
        }
        o << "}}";
    }
    o << "\n  ],\n  \"program\": {\"name\": " << json_str(prog.name) << ", \"arch\": " << json_str(prog.arch)
      << ", \"dst_tiles\": " << prog.dst_tiles << ", \"dram_banks\": " << prog.dram_banks << "}\n}\n";
    const std::string tmp = prog.counters_path + ".tmp";
    {
        std::ofstream f(tmp);
        f << o.str();
    }
    std::rename(tmp.c_str(), prog.counters_path.c_str());
}

// ---- setup -------------------------------------------------------------------------------------
void setup_dram(Device& dev) {
    const ProgramSpec& prog = *dev.prog;
    std::uint64_t bank_bytes = 0;
    dev.buffers.resize(prog.buffers.size());
    for (std::size_t i = 0; i < prog.buffers.size(); ++i) {
        const BufferSpec& s = prog.buffers[i];
        DramBuffer& b = dev.buffers[i];
        b.spec = &s;
        b.aligned_page = (s.page_size + prog.dram_alignment - 1) / prog.dram_alignment * prog.dram_alignment;
        b.pages_per_bank = (s.num_pages + prog.dram_banks - 1) / prog.dram_banks;
        b.page_reads.reset(new std::atomic<std::uint32_t>[s.num_pages]);
        b.page_writes.reset(new std::atomic<std::uint32_t>[s.num_pages]);
        for (std::uint32_t p = 0; p < s.num_pages; ++p) {
            b.page_reads[p] = 0;
            b.page_writes[p] = 0;
        }
        bank_bytes = std::max<std::uint64_t>(bank_bytes, s.address + static_cast<std::uint64_t>(b.pages_per_bank) * b.aligned_page);
    }
    dev.banks.assign(prog.dram_banks, std::vector<std::uint8_t>(bank_bytes, 0));
}

void page_copy(Device& dev, DramBuffer& b, std::vector<char>& host, bool to_device) {
    const std::uint32_t banks = dev.prog->dram_banks;
    for (std::uint32_t p = 0; p < b.spec->num_pages; ++p) {
        std::uint8_t* dram = dev.banks[p % banks].data() + b.spec->address + static_cast<std::size_t>(p / banks) * b.aligned_page;
        char* h = host.data() + static_cast<std::size_t>(p) * b.spec->page_size;
        if (to_device) {
            std::memcpy(dram, h, b.spec->page_size);
        } else {
            std::memcpy(h, dram, b.spec->page_size);
        }
    }
}

std::string load_inputs(Device& dev) {
    for (DramBuffer& b : dev.buffers) {
        if (b.spec->input_path.empty()) {
            continue;
        }
        const std::size_t bytes = static_cast<std::size_t>(b.spec->num_pages) * b.spec->page_size;
        std::vector<char> host(bytes);
        std::ifstream in(b.spec->input_path, std::ios::binary);
        if (!in.read(host.data(), static_cast<std::streamsize>(bytes))) {
            return "cannot read " + std::to_string(bytes) + " bytes for buffer '" + b.spec->name + "' from " + b.spec->input_path;
        }
        page_copy(dev, b, host, true);
    }
    return "";
}

std::string store_outputs(Device& dev) {
    for (DramBuffer& b : dev.buffers) {
        if (b.spec->output_path.empty()) {
            continue;
        }
        std::vector<char> host(static_cast<std::size_t>(b.spec->num_pages) * b.spec->page_size);
        page_copy(dev, b, host, false);
        std::ofstream out(b.spec->output_path, std::ios::binary);
        out.write(host.data(), static_cast<std::streamsize>(host.size()));
        if (!out) {
            return "cannot write buffer '" + b.spec->name + "' to " + b.spec->output_path;
        }
    }
    return "";
}

std::string load_kernels(ProgramSpec& prog) {
    for (int role = 0; role < 3; ++role) {
        KernelSpec& k = prog.kernels[role];
        if (!k.present) {
            continue;
        }
        void* handle = dlopen(k.so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) {
            return std::string("cannot load ") + role_name(role) + " kernel '" + k.label + "': " + dlerror();
        }
        k.entry = reinterpret_cast<void (*)()>(dlsym(handle, "tt_emu_kernel_entry"));
        const int* kind = reinterpret_cast<const int*>(dlsym(handle, "tt_emu_kernel_kind"));
        if (k.entry == nullptr || kind == nullptr) {
            return std::string(role_name(role)) + " kernel '" + k.label + "' has no emulator entry point";
        }
        if ((*kind == 1) != (role == COMPUTE)) {
            return std::string(role_name(role)) + " kernel '" + k.label + "' is a " +
                   (*kind == 1 ? "compute kernel (namespace NAMESPACE { void MAIN })"
                               : "data-movement kernel (void kernel_main())") +
                   " but the plan uses it as the " + role_name(role) + " kernel";
        }
    }
    return "";
}

std::string setup_core(Device& dev, Core& core, const CoreSpec& spec) {
    const ProgramSpec& prog = *dev.prog;
    core.spec = &spec;
    core.x = spec.x;
    core.y = spec.y;
    std::uint64_t used = 0;
    for (const CBSpec& cb : prog.cbs) {
        used = (used + prog.l1_alignment - 1) / prog.l1_alignment * prog.l1_alignment;
        used += static_cast<std::uint64_t>(cb.page_size) * cb.num_pages;
    }
    core.l1_used = 0;
    for (const CBSpec& cb : prog.cbs) {
        core.l1_used += static_cast<std::uint64_t>(cb.page_size) * cb.num_pages;
    }
    if (prog.l1_budget != 0 && core.l1_used > prog.l1_budget) {
        return "core (" + std::to_string(core.x) + "," + std::to_string(core.y) + ") needs " + std::to_string(core.l1_used) +
               " bytes of L1 for its circular buffers but the arch allows " + std::to_string(prog.l1_budget);
    }
    const std::size_t size = static_cast<std::size_t>((used + 4095) / 4096 * 4096 + 4096);
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_32BIT
    flags |= MAP_32BIT;  // L1 addresses are 32-bit: keep the arena addressable by a uint32_t
#endif
    void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (mem == MAP_FAILED) {
        return "cannot allocate " + std::to_string(size) + " bytes of emulated L1";
    }
    core.l1 = static_cast<std::uint8_t*>(mem);
    core.l1_size = size;
    const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(mem);
    // With MAP_32BIT the L1 address is the host address (kernels may dereference it); otherwise
    // addresses are offsets from a fixed base and are translated on every access.
    core.l1_addr_base = p <= 0xFFFFFFFFull - size ? static_cast<std::uint32_t>(p) : 0x10000u;
    std::uint32_t offset = 0;
    for (const CBSpec& s : prog.cbs) {
        offset = (offset + prog.l1_alignment - 1) / prog.l1_alignment * prog.l1_alignment;
        CB& cb = core.cbs[s.id];
        cb.configured = true;
        cb.id = s.id;
        cb.page_size = s.page_size;
        cb.num_pages = s.num_pages;
        cb.format = s.format;
        cb.base = core.l1_addr_base + offset;
        cb.limit = cb.base + s.page_size * s.num_pages;
        cb.rd_ptr = cb.base;
        cb.wr_ptr = cb.base;
        offset += s.page_size * s.num_pages;
    }
    core.compute.capacity = prog.dst_tiles;
    core.compute.dst.assign(static_cast<std::size_t>(prog.dst_tiles) * kTileElems, 0.0f);
    for (int role = 0; role < 3; ++role) {
        ThreadState& t = core.threads[role];
        t.role = role;
        t.kernel = &prog.kernels[role];
        t.present = prog.kernels[role].present;
    }
    return "";
}

void kernel_thread(Core& core, int role) {
    ThreadState& ts = core.threads[role];
    Ctx ctx{&core, &ts};
    g_ctx = &ctx;
    std::snprintf(t_signal_label, sizeof(t_signal_label), "core (%u,%u) %s kernel '%s'", core.x, core.y, role_name(role),
                  ts.kernel->label.c_str());
    const std::string prefix = std::string(t_signal_label) + ": ";
    try {
        ts.last_api = "(kernel entry)";
        ts.kernel->entry();
        ts.last_api = "(returned)";
        if (!ts.pending_reads.empty()) {
            throw KernelError("kernel returned with " + std::to_string(ts.pending_reads.size()) +
                              " NoC read(s) not waited for (missing noc_async_read_barrier)");
        }
        if (!ts.pending_writes.empty()) {
            throw KernelError("kernel returned with " + std::to_string(ts.pending_writes.size()) +
                              " NoC write(s) not waited for (missing noc_async_write_barrier)");
        }
        if (role == COMPUTE && core.compute.state != DST_RELEASED) {
            throw KernelError("kernel returned with the DST register still acquired (missing tile_regs_release)");
        }
    } catch (const Aborted&) {
    } catch (const KernelError& e) {
        record_core_error(core, prefix + e.what());
    } catch (const std::exception& e) {
        record_core_error(core, prefix + "unexpected C++ exception: " + e.what());
    } catch (...) {
        record_core_error(core, prefix + "unexpected exception");
    }
    {
        std::lock_guard<std::mutex> lk(core.mu);
        ts.finished = true;
        ts.waiting = false;
    }
    core.cv.notify_all();
    g_ctx = nullptr;
}

}  // namespace

void run_core(Core& core) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int role = 0; role < 3; ++role) {
        if (core.threads[role].present) {
            threads.emplace_back(kernel_thread, std::ref(core), role);
        }
    }
    for (std::thread& t : threads) {
        t.join();
    }
    core.elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    core.done = true;
}

}  // namespace tt_emu

int main(int argc, char** argv) {
    using namespace tt_emu;
    if (argc != 2) {
        std::cerr << "usage: ttemu_runner RUN_SPEC\n";
        return 4;
    }
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
        signal(sig, crash_handler);
    }
    ProgramSpec prog = parse_spec(argv[1]);
    Device dev;
    dev.prog = &prog;
    g_device = &dev;
    setup_dram(dev);
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };

    std::string err = load_kernels(prog);
    if (err.empty()) {
        err = load_inputs(dev);
    }
    if (err.empty()) {
        for (const CoreSpec& cs : prog.cores) {
            dev.cores.push_back(std::make_unique<Core>());
            err = setup_core(dev, *dev.cores.back(), cs);
            if (!err.empty()) {
                break;
            }
        }
    }
    if (!err.empty()) {
        write_counters(dev, "error", err, elapsed());
        return 2;
    }

    // Worker pool: each worker runs whole cores (three kernel threads each) off a shared index.
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> finished_workers{0};
    const std::size_t n_workers = std::max<std::size_t>(1, std::min<std::size_t>(prog.max_parallel_cores, dev.cores.size()));
    std::vector<std::thread> workers;
    dev.last_progress_ns = now_ns();
    for (std::size_t w = 0; w < n_workers; ++w) {
        workers.emplace_back([&] {
            while (!dev.abort.load()) {
                const std::size_t i = next.fetch_add(1);
                if (i >= dev.cores.size()) {
                    break;
                }
                Core& core = *dev.cores[i];
                run_core(core);
                if (!core.error.empty()) {
                    std::lock_guard<std::mutex> lk(dev.error_mu);
                    if (dev.first_error.empty()) {
                        dev.first_error = core.error;
                    }
                    dev.abort = true;
                }
            }
            finished_workers.fetch_add(1);
        });
    }
    // Watchdog: a kernel that makes no API call for stall_timeout_ms (e.g. spins forever) stops
    // the run with a report of what every running kernel was last doing.
    while (finished_workers.load() < n_workers) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const std::int64_t idle_ms = (now_ns() - dev.last_progress_ns.load()) / 1000000;
        if (idle_ms > static_cast<std::int64_t>(prog.stall_timeout_ms)) {
            std::string report = "no kernel made progress for " + std::to_string(idle_ms) + " ms (stall timeout " +
                                 std::to_string(prog.stall_timeout_ms) + " ms)";
            for (const auto& cp : dev.cores) {
                Core& c = *cp;
                std::lock_guard<std::mutex> lk(c.mu);
                for (const ThreadState& t : c.threads) {
                    if (t.present && !t.finished && !c.done && (t.waiting || std::string(t.last_api) != "(not started)")) {
                        report += "; core (" + std::to_string(c.x) + "," + std::to_string(c.y) + ") " + describe_thread(c, t);
                    }
                }
            }
            write_counters(dev, "stalled", report, elapsed());
            std::fflush(nullptr);
            _exit(3);
        }
    }
    for (std::thread& w : workers) {
        w.join();
    }
    if (!dev.first_error.empty()) {
        write_counters(dev, "error", dev.first_error, elapsed());
        return 2;
    }
    err = store_outputs(dev);
    write_counters(dev, err.empty() ? "ok" : "error", err, elapsed());
    return err.empty() ? 0 : 2;
}
