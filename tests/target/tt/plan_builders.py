"""Builders for the reference tt.plan.json files in ``tests/target/tt/plans`` (and variants in tests).

The JSON files are what the Tenstorrent code generator is expected to emit for the hand-written
kernels in ``tests/target/tt/kernels``; ``python tests/target/tt/plan_builders.py`` rewrites them, and
``test_emulator.py`` checks that the files and these builders agree.
"""

from __future__ import annotations

import json
from pathlib import Path

TT_METAL_VERSION = "v0.62.2"
PLANS_DIR = Path(__file__).resolve().parent / "plans"
KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
TILE = 32
FORMATS = {"bfloat16": "Float16_b", "float16": "Float16", "float32": "Float32"}  # DRAM dtype -> CB format


def _pad(n: int) -> int:
    return -(-n // TILE) * TILE


def buffer(name: str, role: str, shape: list[int], dtype: str = "bfloat16") -> dict:
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    return {
        "name": name,
        "role": role,
        "shape": list(shape),
        "dtype": dtype,
        "layout": "tile",
        "tile_shape": [TILE, TILE],
        "padded_shape": [_pad(rows), _pad(cols)],
        "memory": "dram_interleaved",
        "page_size": 4096 if dtype == "float32" else 2048,
    }


def cb(cb_id: int, num_pages: int, name: str, data_format: str = "Float16_b") -> dict:
    return {
        "id": cb_id,
        "name": name,
        "page_size": 4096 if data_format == "Float32" else 2048,
        "num_pages": num_pages,
        "data_format": data_format,
    }


def split_tiles(total: int, num_cores: int) -> list[tuple[int, int]]:
    """Contiguous row-major split: the first ``total % num_cores`` cores get one extra tile."""
    out, start = [], 0
    for i in range(num_cores):
        count = total // num_cores + (1 if i < total % num_cores else 0)
        out.append((start, count))
        start += count
    return out


def _cores(grid: tuple[int, int], total: int, args) -> list[dict]:
    gx, gy = grid
    cores = []
    for i, (start, count) in enumerate(split_tiles(total, gx * gy)):
        if count == 0:
            continue
        cores.append({"core": [i % gx, i // gx], "tiles": [start, count], "runtime_args": args(start, count)})
    return cores


def _reader(source: str, *tensors: str) -> dict:
    return {
        "source": source,
        "processor": "RISCV_1",
        "noc": "RISCV_1_default",
        "compile_time_args": [{"tensor_accessor": t} for t in tensors],
    }


def _writer(tensor: str) -> dict:
    return {
        "source": "writer_tiles.cpp",
        "processor": "RISCV_0",
        "noc": "RISCV_0_default",
        "compile_time_args": [{"tensor_accessor": tensor}],
    }


def _compute(source: str, fp32_dest_acc_en: bool = False) -> dict:
    """A GEMM accumulates in fp32 DST, as Tessera compiles it (``fp32_dest_acc_en: auto``): with a
    16-bit DST every partial sum of the K loop would be rounded to bf16."""
    return {"source": source, "math_fidelity": "HiFi4", "fp32_dest_acc_en": fp32_dest_acc_en, "math_approx_mode": False}


def _plan(name, description, arch, grid, buffers, cbs, kernels, cores, total, output) -> dict:
    return {
        "schema_version": 1,
        "tt_metal_version": TT_METAL_VERSION,
        "name": name,
        "description": description,
        "arch": arch,
        "grid": list(grid),
        "schedule": {"policy": "contiguous", "order": "row_major", "total_tiles": total, "output": output},
        "buffers": buffers,
        "circular_buffers": cbs,
        "kernels": kernels,
        "cores": cores,
    }


def gemm_plan(name: str, M: int, K: int, N: int, grid=(1, 1), arch: str = "wormhole_b0") -> dict:
    Mt, Kt, Nt = _pad(M) // TILE, _pad(K) // TILE, _pad(N) // TILE

    def args(start, count):
        return {
            "reader": [{"buffer_address": "A"}, {"buffer_address": "B"}, Kt, Nt, start, count],
            "compute": [count, Kt],
            "writer": [{"buffer_address": "C"}, start, count],
        }

    return _plan(
        name,
        f"C[{M},{N}] = A[{M},{K}] @ B[{K},{N}], bf16, {grid[0]}x{grid[1]} cores",
        arch,
        grid,
        [buffer("A", "input", [M, K]), buffer("B", "input", [K, N]), buffer("C", "output", [M, N])],
        [cb(0, 2, "a"), cb(1, 2, "b"), cb(16, 2, "out")],
        {
            "reader": _reader("reader_gemm.cpp", "A", "B"),
            "compute": _compute("compute_gemm.cpp", fp32_dest_acc_en=True),
            "writer": _writer("C"),
        },
        _cores(grid, Mt * Nt, args),
        Mt * Nt,
        "C",
    )


def gemm_bias_gelu_plan(name: str, M: int, K: int, N: int, grid=(1, 1), arch: str = "wormhole_b0") -> dict:
    Mt, Kt, Nt = _pad(M) // TILE, _pad(K) // TILE, _pad(N) // TILE

    def args(start, count):
        return {
            "reader": [
                {"buffer_address": "A"},
                {"buffer_address": "B"},
                {"buffer_address": "bias"},
                Kt,
                Nt,
                start,
                count,
            ],
            "compute": [count, Kt],
            "writer": [{"buffer_address": "C"}, start, count],
        }

    return _plan(
        name,
        f"C[{M},{N}] = gelu(A[{M},{K}] @ B[{K},{N}] + bias[{N}]), bf16, {grid[0]}x{grid[1]} cores",
        arch,
        grid,
        [
            buffer("A", "input", [M, K]),
            buffer("B", "input", [K, N]),
            buffer("bias", "input", [N]),
            buffer("C", "output", [M, N]),
        ],
        [cb(0, 2, "a"), cb(1, 2, "b"), cb(2, 2, "bias"), cb(16, 2, "out"), cb(24, 1, "acc")],
        {
            "reader": _reader("reader_gemm_bias.cpp", "A", "B", "bias"),
            "compute": _compute("compute_gemm_bias_gelu.cpp", fp32_dest_acc_en=True),
            "writer": _writer("C"),
        },
        _cores(grid, Mt * Nt, args),
        Mt * Nt,
        "C",
    )


def eltwise_plan(name: str, op: str, shape: list[int], grid=(1, 1), arch: str = "wormhole_b0") -> dict:
    rows, cols = shape
    total = (_pad(rows) // TILE) * (_pad(cols) // TILE)

    def args(start, count):
        return {
            "reader": [{"buffer_address": "A"}, {"buffer_address": "B"}, start, count],
            "compute": [count],
            "writer": [{"buffer_address": "C"}, start, count],
        }

    return _plan(
        name,
        f"C = A {'+' if op == 'add' else '*'} B element-wise, {shape}, bf16, {grid[0]}x{grid[1]} cores",
        arch,
        grid,
        [buffer("A", "input", shape), buffer("B", "input", shape), buffer("C", "output", shape)],
        [cb(0, 2, "a"), cb(1, 2, "b"), cb(16, 2, "out")],
        {
            "reader": _reader("reader_binary.cpp", "A", "B"),
            "compute": _compute(f"compute_eltwise_{op}.cpp"),
            "writer": _writer("C"),
        },
        _cores(grid, total, args),
        total,
        "C",
    )


def unary_plan(
    name: str, op: str, shape: list[int], grid=(1, 1), arch: str = "wormhole_b0", compute_source: str | None = None
) -> dict:
    rows, cols = shape
    total = (_pad(rows) // TILE) * (_pad(cols) // TILE)

    def args(start, count):
        return {
            "reader": [{"buffer_address": "X"}, start, count],
            "compute": [count],
            "writer": [{"buffer_address": "Y"}, start, count],
        }

    return _plan(
        name,
        f"Y = {op}(X), {shape}, bf16, {grid[0]}x{grid[1]} cores",
        arch,
        grid,
        [buffer("X", "input", shape), buffer("Y", "output", shape)],
        [cb(0, 2, "in"), cb(16, 2, "out")],
        {
            "reader": _reader("reader_unary.cpp", "X"),
            "compute": _compute(compute_source or f"compute_{op}.cpp"),
            "writer": _writer("Y"),
        },
        _cores(grid, total, args),
        total,
        "Y",
    )


def retyped(plan: dict, dtypes: dict[str, str], formats: dict[int, str]) -> dict:
    """``plan`` with some DRAM buffers (by name) and CBs (by id) in another dtype / data format."""
    for buf in plan["buffers"]:
        if buf["name"] in dtypes:
            buf.update(dtype=dtypes[buf["name"]], page_size=4096 if dtypes[buf["name"]] == "float32" else 2048)
    for c in plan["circular_buffers"]:
        if c["id"] in formats:
            c.update(data_format=formats[c["id"]], page_size=4096 if formats[c["id"]] == "Float32" else 2048)
    return plan


def convert_plan(name: str, shape: list[int], src: str, dst: str, grid=(1, 1)) -> dict:
    """Y = X from a ``src`` to a ``dst`` buffer: unpacked into DST from one CB format, packed to the other."""
    plan = unary_plan(name, "copy", shape, grid, compute_source="compute_copy.cpp")
    plan["description"] = f"Y = X, {shape}, {src} -> {dst}, {grid[0]}x{grid[1]} cores"
    # float32 data keeps its bits in DST only with fp32_dest_acc_en (16-bit DST would round it)
    plan["kernels"]["compute"]["fp32_dest_acc_en"] = "float32" in (src, dst)
    return retyped(plan, {"X": src, "Y": dst}, {0: FORMATS[src], 16: FORMATS[dst]})


def deadlock_plan() -> dict:
    plan = unary_plan("deadlock", "copy", [64, 64], compute_source="compute_deadlock.cpp")
    plan["description"] = "Deliberately broken: the compute kernel waits on CB 5, which nobody pushes."
    plan["circular_buffers"].insert(1, cb(5, 2, "never_pushed"))
    return plan


def l1_over_budget_plan() -> dict:
    plan = gemm_plan("l1_over_budget", 64, 64, 64)
    plan["description"] = "Deliberately invalid: CB 0 alone needs 800 x 2048 B > the per-core L1 budget."
    plan["circular_buffers"][0]["num_pages"] = 800
    return plan


def reference_plans() -> dict[str, dict]:
    plans = [
        gemm_plan("gemm_single_core", 64, 96, 64),
        gemm_plan("gemm_single_core_padded", 50, 70, 45),
        gemm_plan("gemm_multi_core", 160, 64, 192, grid=(4, 2)),
        gemm_plan("gemm_full_grid", 256, 64, 288, grid=(8, 8)),
        gemm_bias_gelu_plan("gemm_bias_gelu", 40, 48, 72),
        gemm_bias_gelu_plan("gemm_bias_gelu_multi_core", 96, 64, 128, grid=(2, 2)),
        eltwise_plan("eltwise_add", "add", [64, 128], grid=(2, 1)),
        eltwise_plan("eltwise_mul", "mul", [45, 70]),
        unary_plan("unary_exp", "exp", [64, 96]),
        unary_plan("unary_gelu", "gelu", [33, 100], grid=(2, 1)),
        unary_plan("unary_relu", "relu", [40, 40]),
        convert_plan("convert_f32_to_f16", [40, 70], "float32", "float16"),
        deadlock_plan(),
        l1_over_budget_plan(),
    ]
    return {p["name"]: p for p in plans}


def dumps(plan: dict) -> str:
    return json.dumps(plan, indent=2) + "\n"


def main() -> None:
    PLANS_DIR.mkdir(exist_ok=True)
    for name, plan in reference_plans().items():
        (PLANS_DIR / f"{name}.json").write_text(dumps(plan))
        print(f"wrote {PLANS_DIR / (name + '.json')}")


if __name__ == "__main__":
    main()
