"""The main job: compile every example kernel for every target and show its stages.

    python examples/main_job.py [--out build/demo] [--targets cpu,hopper,ampere,rocm,tenstorrent]

For each @tessera.kernel in examples/ (linear+bias+gelu, causal GQA flash attention, layer norm,
softmax): its Graph IR, then per target the Schedule IR, where the Tile IR and Target IR (with
the IR after every pass) were written, and the artifacts (CUDA/HIP/C source, cubin/PTX where nvcc
is present, the CPU library, tt-metal reader/compute/writer/host sources). On the CPU each kernel
also runs on small random arrays and is checked against its numpy reference; the Tenstorrent build
runs in the tt-metal emulator (on arrays whose sequence length is whole 32-row blocks, which
attention needs). Then the TileLang GEMM is lowered through every target config directly
(tessera_tvm.lower) with its pass lists.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tessera as ts  # noqa: E402
import tessera_tvm  # noqa: E402

EXAMPLES = ["linear", "flash_attention", "layer_norm", "softmax"]
TARGETS = ["cpu", "hopper", "ampere", "rocm", "tenstorrent"]
# Small dims for the CPU check (the examples' SHAPES are GPU-sized); not multiples of any block.
SMALL = {"M": 100, "N": 72, "K": 48, "B": 1, "H": 8, "H_kv": 2, "S": 67, "D": 64}
# The emulator check: M, N, K ragged (padded tiles); attention's S whole 32-row blocks.
SMALL_TT = {"M": 50, "N": 72, "K": 48, "B": 1, "H": 4, "H_kv": 2, "S": 64, "D": 64}


def _rule(title: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}")


def _random(kernel, rng, dims=SMALL) -> list[np.ndarray]:
    arrays = []
    for _, annotation in kernel.params:
        shape = tuple(d if isinstance(d, int) else dims[d] for d in annotation.dims)
        arrays.append(rng.standard_normal(shape).astype(annotation.dtype.numpy))
    return arrays


def _check_on_cpu(kernel) -> float:
    rng = np.random.default_rng(0)
    arrays = _random(kernel, rng)
    out = ts.compile(kernel, target="cpu")(*arrays)
    ref = kernel.reference(*arrays)
    return float(np.abs(np.asarray(out, np.float32) - np.asarray(ref, np.float32)).max())


def _check_in_emulator(kernel, out: Path) -> float:
    """max |emulator - reference| of the Tenstorrent build on SMALL_TT arrays (g++ builds each kernel)."""
    arrays = _random(kernel, np.random.default_rng(0), SMALL_TT)
    shapes = {d: v for d, v in SMALL_TT.items() if any(d in a.dims for _, a in kernel.params)}
    result = ts.compile(kernel, target="tenstorrent", shapes=shapes).emulate(*arrays, cache_dir=out / "emulator")
    ref = kernel.reference(*arrays)
    return float(np.abs(np.asarray(result, np.float32) - np.asarray(ref, np.float32)).max())


def language_examples(out: Path, targets: list[str]) -> int:
    failures = 0
    for name in EXAMPLES:
        module = importlib.import_module(name)
        kernel = getattr(module, name)
        _rule(f"{name}  (examples/{name}.py, shapes {module.SHAPES})")
        print("[graph] before any target is chosen:")
        print(kernel.inspect_ir("graph", shapes=module.SHAPES))
        for target in targets:
            start = time.perf_counter()
            dump = out / name / target
            compiled = ts.compile(
                kernel, target=target, shapes=module.SHAPES, dump=["graph", "sched", "tile", "target"], dump_dir=dump
            )
            print(
                f"--- {target}: compiled in {time.perf_counter() - start:.1f} s; "
                f"stages and IR after every pass in {dump}/"
            )
            print(compiled.inspect_ir("sched"))
            for kernel_name, files in compiled.artifacts.items():
                print(f"  {kernel_name}: " + ", ".join(f"{k}={Path(v).name}" for k, v in files.items()))
            for note in compiled.notes:
                print(f"  note: {note}")
        error = _check_on_cpu(kernel)
        small = {d: v for d, v in SMALL.items() if any(d in a.dims for _, a in kernel.params)}
        print(f"[cpu run] {small}: max |tessera - numpy reference| = {error:.2e}")
        failures += error > 0.1  # bf16/f16 outputs; the tests state tighter per-dtype tolerances
        if "tenstorrent" in targets:
            start = time.perf_counter()
            error = _check_in_emulator(kernel, out)
            small = {d: v for d, v in SMALL_TT.items() if any(d in a.dims for _, a in kernel.params)}
            print(
                f"[tt emulator] {small}: max |emulator - numpy reference| = {error:.2e} "
                f"({time.perf_counter() - start:.0f} s)"
            )
            failures += error > 0.1
    return failures


def tile_gemm_every_config(out: Path) -> None:
    from gemm import cpu_gemm, gemm, tt_gemm

    _rule("TileLang GEMM through tessera_tvm.lower for every target config")
    for name in tessera_tvm.available_configs():
        config = tessera_tvm.load_config(name)
        program = {"c": cpu_gemm, "tt": tt_gemm}.get(config.codegen_kind, gemm)()
        lowered = tessera_tvm.lower(
            program, config, out_dir=out / "gemm" / name, dump_dir=out / "gemm" / name / "passes"
        )
        phases = " + ".join(
            f"{len(config.phase(p))}" for p in ("lower_and_legalize", "optimize_for_target", "codegen_prep")
        )
        seconds = sum(r.seconds for r in lowered.pass_log)
        print(
            f"{name:<12} {phases} passes ({seconds:.2f} s; `tessera passes --target {name}` lists them) -> "
            + ", ".join(sorted(lowered.artifacts))
        )
        for note in lowered.notes:
            print(f"{'':<12} note: {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/demo", help="where stages, dumps and artifacts go")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated target configs")
    args = parser.parse_args()
    out = Path(args.out)
    failures = language_examples(out, args.targets.split(","))
    tile_gemm_every_config(out)
    print(f"\nEverything is under {out}/")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
