"""The API headers (``src/target/tt/include``, one copy: the emulator implements the kernel API in them)
mirror the pinned tt-metal API: kernels and host programs pass ``g++ -std=c++17 -fsyntax-only`` against
them, and code calling anything outside the pinned API (or with the wrong signature) does not."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tessera_tvm.target.tt import INCLUDE_DIR, PACKAGE_DIR, TT_METAL_RELEASE_DATE, TT_METAL_VERSION
from tessera_tvm.target.tt.emulate import TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS

HERE = Path(__file__).resolve().parent
KERNELS = HERE / "kernels"
PLANS = HERE / "plans"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _ct_args_by_kernel() -> dict[str, list[int]]:
    """Compile-time args each reference kernel is built with, resolved as the driver does."""
    out: dict[str, list[int]] = {}
    for path in sorted(PLANS.glob("*.json")):
        plan = json.loads(path.read_text())
        for k in plan["kernels"].values():
            args: list[int] = []
            for a in k.get("compile_time_args", []):
                args.extend(TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS if isinstance(a, dict) else [int(a)])
            out.setdefault(k["source"], args)
    return out


CT_ARGS = _ct_args_by_kernel()
KERNEL_SOURCES = sorted(p.name for p in KERNELS.glob("*.cpp") if not p.name.startswith("main_"))
HOST_SOURCES = sorted(p.name for p in KERNELS.glob("main_*.cpp"))


def syntax_check(source: Path, include: Path, ct_args: list[int] | None = None) -> subprocess.CompletedProcess:
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-I", str(include)]
    if ct_args:
        cmd.append("-DKERNEL_COMPILE_TIME_ARGS=" + ",".join(map(str, ct_args)))
    cmd.append(str(source))
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def test_every_reference_kernel_is_used_by_a_plan():
    assert set(KERNEL_SOURCES) == set(CT_ARGS), "kernels without a plan (or plans naming missing kernels)"


@pytest.mark.parametrize("name", KERNEL_SOURCES)
def test_kernel_passes_syntax_check(name):
    proc = syntax_check(KERNELS / name, INCLUDE_DIR, CT_ARGS.get(name))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", HOST_SOURCES)
def test_host_program_passes_syntax_check(name):
    proc = syntax_check(KERNELS / name, INCLUDE_DIR)
    assert proc.returncode == 0, proc.stderr


def test_the_package_holds_one_copy_of_the_api_headers():
    """The syntax check and the emulator read the same headers: every header of the Tenstorrent package
    is under include/, but the emulator runner's own (emulator/src)."""
    headers = {p.relative_to(PACKAGE_DIR).as_posix() for p in PACKAGE_DIR.rglob("*") if p.suffix in {".h", ".hpp"}}
    outside = {h for h in headers if not h.startswith("include/")}
    assert outside == {"emulator/src/emu_internal.h"}, outside
    names = sorted(Path(h).relative_to("include").as_posix() for h in headers - outside)
    assert len(names) == len(set(names)) and "tt_emu/runtime_api.h" in names


def _headers(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in {".h", ".hpp"})


#: The host API's headers (declared only); the others are the kernels' (implemented for the emulator).
HOST_HEADERS = ("tt-metalium/", "tt_stl/")


@pytest.mark.parametrize("side", ["kernel", "host"])
def test_headers_name_the_pinned_version_and_are_self_contained(side, tmp_path):
    root = INCLUDE_DIR
    headers = [h for h in _headers(root) if h.relative_to(root).as_posix().startswith(HOST_HEADERS) == (side == "host")]
    assert len(headers) >= 10
    tag = f"{TT_METAL_VERSION} ({TT_METAL_RELEASE_DATE})"
    for h in headers:
        head = h.read_text().splitlines()[0]
        assert tag in head, f"{h} does not name the pinned version in its first line: {head!r}"
    # every header compiles on its own (one TU including them all, one at a time via pragma once); a
    # kernel and a host program never include each other's headers
    tu = tmp_path / "all_headers.cpp"
    tu.write_text("".join(f'#include "{h.relative_to(root)}"\n' for h in headers))
    proc = syntax_check(tu, root)
    assert proc.returncode == 0, proc.stderr


# A kernel touching every device API the headers hold: the emulator implements the whole surface
# with the pinned signatures.
DATAFLOW_PROBE = r"""
#include "dataflow_api.h"
void kernel_main() {
    uint32_t a = get_arg_val<uint32_t>(0);
    int32_t b = get_common_arg_val<int32_t>(1);
    (void)get_absolute_logical_x(); (void)get_absolute_logical_y();
    (void)get_relative_logical_x(); (void)get_relative_logical_y();
    constexpr auto args = TensorAccessorArgs<0>();
    constexpr auto args2 = TensorAccessorArgs<args.next_compile_time_args_offset()>();
    static_assert(args2.next_compile_time_args_offset() == 2, "one CTA per interleaved tensor");
    const auto s = TensorAccessor(args, a, get_tile_size(tt::CBIndex::c_0));
    InterleavedAddrGenFast<true> g{a, 2048, DataFormat::Float16_b};
    cb_reserve_back(tt::CBIndex::c_0, 1);
    (void)cb_pages_reservable_at_back(0, 1); (void)cb_pages_available_at_front(0, 1);
    uint32_t w = get_write_ptr(0);
    noc_async_read_tile(0, s, w);
    noc_async_read_tile(0, g, w);
    noc_async_read_page(0, s, w);
    noc_async_read(get_noc_addr(1, s), w, 32);
    noc_async_read(get_noc_addr(w), w, 32);
    noc_async_read(get_noc_addr(1, 1, w), w, 32);
    noc_async_read(s.get_noc_addr(2), w, 32);
    noc_async_read_barrier();
    cb_push_back(0, 1);
    cb_wait_front(0, 1);
    uint32_t r = get_read_ptr(0);
    noc_async_write_tile(0, s, r);
    noc_async_write_tile(0, g, r);
    noc_async_write_page(0, s, r, 2048);
    noc_async_write(r, g.get_noc_addr(0), 32);
    noc_async_writes_flushed();
    noc_async_write_barrier();
    noc_async_full_barrier();
    cb_pop_front(0, 1);
    (void)get_dataformat(0); (void)b;
}
"""

COMPUTE_PROBE = r"""
#include "compute_kernel_api/common.h"
#include "compute_kernel_api/matmul.h"
#include "compute_kernel_api/eltwise_binary.h"
#include "compute_kernel_api/bcast.h"
#include "compute_kernel_api/tile_move_copy.h"
#include "compute_kernel_api/eltwise_unary/eltwise_unary.h"
#include "compute_kernel_api/eltwise_unary/exp.h"
#include "compute_kernel_api/eltwise_unary/gelu.h"
#include "compute_kernel_api/eltwise_unary/relu.h"
namespace NAMESPACE {
void MAIN {
    uint32_t n = get_arg_val<uint32_t>(0) + get_common_arg_val<uint32_t>(0) + get_compile_time_arg_val(0);
    compute_kernel_hw_startup(0, 1, 16); compute_kernel_hw_startup(0, 16);
    mm_init(0, 1, 16); mm_init_short(0, 1); mm_init_short_with_dt(0, 1, 2);
    binary_op_init_common(0, 1, 16); add_tiles_init(0, 1); add_tiles_init(0, 1, true);
    sub_tiles_init(0, 1); mul_tiles_init(0, 1);
    add_bcast_rows_init_short(0, 1); mul_bcast_rows_init_short(0, 1);
    add_bcast_cols_init_short(0, 1); mul_bcast_cols_init_short(0, 1);
    copy_tile_init(0); copy_tile_to_dst_init_short(0); copy_tile_to_dst_init_short_with_dt(1, 0);
    unary_op_init_common(0, 16); init_sfpu(0, 16);
    exp_tile_init(); exp_tile_init<true>(); gelu_tile_init(); gelu_tile_init<false>(); relu_tile_init();
    cb_wait_front(0, 1); cb_wait_front(1, 1);
    tile_regs_acquire();
    matmul_tiles(0, 1, 0, 0, 0, false);
    add_tiles(0, 1, 0, 0, 1); sub_tiles(0, 1, 0, 0, 1); mul_tiles(0, 1, 0, 0, 1);
    add_tiles_bcast_rows(0, 1, 0, 0, 2); mul_tiles_bcast_rows(0, 1, 0, 0, 2);
    add_tiles_bcast_cols(0, 1, 0, 0, 2); mul_tiles_bcast_cols(0, 1, 0, 0, 2);
    copy_tile(0, 0, 3);
    exp_tile(3); exp_tile<true>(3, (int)VectorMode::RC); gelu_tile(3); gelu_tile<false>(3); relu_tile(3);
    tile_regs_commit();
    tile_regs_wait();
    cb_reserve_back(16, 2);
    pack_tile(0, 16); pack_tile<true>(1, 16, 1);
    cb_push_back(16, 2);
    tile_regs_release();
    acquire_dst(); release_dst();
    cb_pop_front(0, 1); cb_pop_front(1, 1);
    (void)n;
}
}  // namespace NAMESPACE
"""


# A host program touching every host API the headers declare (the reference main_gemm.cpp and the
# generated ones use part of it).
HOST_PROBE = r"""
#include <tt-metalium/host_api.hpp>
#include <tt-metalium/tensor_accessor_args.hpp>
using namespace tt;
using namespace tt::tt_metal;
int main() {
    std::size_t n = GetNumAvailableDevices();
    IDevice* device = CreateDevice(0, 1);
    CommandQueue& cq = device->command_queue();
    Program program = CreateProgram();
    const CoreRange cores({0, 0}, {1, 1});
    const CoreRangeSet set(std::vector<CoreRange>{cores});
    InterleavedBufferConfig dram{.device = device, .size = 4096, .page_size = 2048, .buffer_type = BufferType::DRAM};
    std::shared_ptr<Buffer> buffer = CreateBuffer(dram);
    CreateCircularBuffer(
        program, set, CircularBufferConfig(4096, {{CBIndex::c_0, DataFormat::Float16_b}}).set_page_size(CBIndex::c_0, 2048));
    std::vector<uint32_t> ct_args;
    TensorAccessorArgs(*buffer).append_to(ct_args);
    KernelHandle reader = CreateKernel(
        program, "reader.cpp", cores,
        DataMovementConfig{.processor = DataMovementProcessor::RISCV_1, .noc = NOC::RISCV_1_default, .compile_args = ct_args});
    KernelHandle compute = CreateKernel(
        program, "compute.cpp", CoreCoord{0, 0},
        ComputeConfig{.math_fidelity = MathFidelity::HiFi4, .fp32_dest_acc_en = true, .math_approx_mode = false});
    std::vector<uint32_t> args{buffer->address(), 2u};
    SetRuntimeArgs(program, reader, cores, args);
    SetRuntimeArgs(program, compute, CoreCoord{0, 0}, {1u, 2u});
    SetRuntimeArgs(program, reader, std::vector<CoreCoord>{{0, 0}, {1, 0}}, std::vector<std::vector<uint32_t>>{{1u}, {2u}});
    SetCommonRuntimeArgs(program, reader, args);
    std::vector<uint32_t> host(1024);
    EnqueueWriteBuffer(cq, buffer, host, false);
    EnqueueWriteBuffer(cq, *buffer, HostDataType{static_cast<const void*>(host.data())}, true);
    EnqueueProgram(cq, program, false);
    EnqueueReadBuffer(cq, buffer, host, true);
    EnqueueReadBuffer(cq, buffer, static_cast<void*>(host.data()), true);
    Finish(cq);
    DeallocateBuffer(*buffer);
    (void)n;
    return CloseDevice(device) ? 0 : 1;
}
"""

PROBES = {"dataflow": DATAFLOW_PROBE, "compute": COMPUTE_PROBE, "host": HOST_PROBE}


@pytest.mark.parametrize("probe", list(PROBES))
def test_api_probe_compiles(probe, tmp_path):
    src = tmp_path / f"{probe}_probe.cpp"
    src.write_text(PROBES[probe])
    proc = syntax_check(src, INCLUDE_DIR, [2, 2])
    assert proc.returncode == 0, proc.stderr


# Calls that are NOT in tt-metal v0.62.2 (made-up names, newer/older signatures, wrong arity).
# The headers must reject every one of them: they are not permissive.
BAD_COMPUTE = {
    "add_tile": "add_tile(0, 1, 0, 0, 0);",  # invented name (the fork emitted such calls)
    "matmul_tiles_5_args": "matmul_tiles(0, 1, 0, 0, 0);",  # later releases dropped `transpose`
    "mm_init_no_args": "mm_init();",  # no defaults in the pinned release
    "tile_regs_acquire_arg": "tile_regs_acquire(0);",
    "pack_tile_one_arg": "pack_tile(0);",
    "exp_tile_no_dst": "exp_tile();",
    "gelu_tile_runtime_flag": "gelu_tile(0, true);",  # fast_and_approx is a template argument
    "sfpu_exp_raw": "sfpu_exp(0);",
    "noc_read_in_compute": "noc_async_read(0, 0, 32);",  # dataflow API is not visible to compute
    "cb_wait_front_arity": "cb_wait_front(0);",
}

BAD_DATAFLOW = {
    "noc_async_read_tile_no_addrgen": "noc_async_read_tile(0, get_write_ptr(0));",
    "dram_read_invented": "dram_read_tile(0, 0, 0);",
    "cb_reserve_back_arity": "cb_reserve_back(0);",
    "get_arg_val_untyped": "uint32_t v = get_arg_val(0); (void)v;",
    "compute_api_in_dataflow": "tile_regs_acquire();",
    "tensor_accessor_no_args": "const auto t = TensorAccessor(0, 2048); (void)t;",
}

BAD_HOST = {
    "create_device_no_id": "IDevice* d = CreateDevice(); (void)d;",
    "enqueue_write_no_blocking": "std::vector<uint32_t> v; EnqueueWriteBuffer(cq, buf, v);",
    "set_runtime_args_no_kernel": "SetRuntimeArgs(program, CoreCoord{0, 0}, {1u, 2u});",
    "launch_program_invented": "LaunchKernels(program);",
    "cb_config_no_formats": "CircularBufferConfig c(2048); (void)c;",
}


def _bad_compute_source(stmt: str) -> str:
    return (
        '#include "compute_kernel_api/common.h"\n#include "compute_kernel_api/matmul.h"\n'
        '#include "compute_kernel_api/eltwise_binary.h"\n#include "compute_kernel_api/eltwise_unary/exp.h"\n'
        '#include "compute_kernel_api/eltwise_unary/gelu.h"\n'
        f"namespace NAMESPACE {{\nvoid MAIN {{\n    {stmt}\n}}\n}}\n"
    )


def _bad_dataflow_source(stmt: str) -> str:
    return f'#include "dataflow_api.h"\nvoid kernel_main() {{\n    {stmt}\n}}\n'


def _bad_host_source(stmt: str) -> str:
    return (
        "#include <tt-metalium/host_api.hpp>\nusing namespace tt;\nusing namespace tt::tt_metal;\n"
        "void f(IDevice* device, CommandQueue& cq, Program& program, std::shared_ptr<Buffer> buf) {\n"
        f"    {stmt}\n    (void)device; (void)cq; (void)program; (void)buf;\n}}\n"
    )


@pytest.mark.parametrize(
    "kind, name, stmt",
    [("compute", n, s) for n, s in BAD_COMPUTE.items()]
    + [("dataflow", n, s) for n, s in BAD_DATAFLOW.items()]
    + [("host", n, s) for n, s in BAD_HOST.items()],
)
def test_calls_outside_the_pinned_api_fail(kind, name, stmt, tmp_path):
    make = {"compute": _bad_compute_source, "dataflow": _bad_dataflow_source, "host": _bad_host_source}[kind]
    src = tmp_path / f"{name}.cpp"
    src.write_text(make(stmt))
    proc = syntax_check(src, INCLUDE_DIR, [2])
    assert proc.returncode != 0, f"the headers accepted a call outside the pinned API: {stmt}"
    assert "error" in proc.stderr
    # control: the same file minus the bad statement compiles, so the failure is the statement's
    src.write_text(make(""))
    assert syntax_check(src, INCLUDE_DIR, [2]).returncode == 0


def test_compile_time_arg_index_out_of_range_fails(tmp_path):
    src = tmp_path / "k.cpp"
    src.write_text(_bad_dataflow_source("constexpr uint32_t x = get_compile_time_arg_val(3); (void)x;"))
    assert syntax_check(src, INCLUDE_DIR, [2, 2]).returncode != 0
    assert syntax_check(src, INCLUDE_DIR, [2, 2, 2, 7]).returncode == 0
