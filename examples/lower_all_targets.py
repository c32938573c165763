"""The main job: lower the example GEMM for every target config and show what came out.

    python examples/lower_all_targets.py [--out build/demo]

For each config: the pass list (phase by phase), the time spent, the artifacts written (CUDA/HIP/C
source, cubin and PTX where nvcc is present, a shared library on the CPU), the kernel metadata,
and, on the CPU, a run of the kernel checked against numpy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemm import cpu_gemm, gemm  # noqa: E402

import tessera_tvm  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/demo", help="where artifacts and IR dumps go")
    args = parser.parse_args()
    out = Path(args.out)
    for name in tessera_tvm.available_configs():
        config = tessera_tvm.load_config(name)
        program = cpu_gemm() if config.target_kind == "c" else gemm()
        print(f"\n=== {name}: {config.description}")
        print(tessera_tvm.format_pass_list(config), end="")
        start = time.perf_counter()
        lowered = tessera_tvm.lower(program, config, out_dir=out / name, dump_dir=out / name / "passes")
        seconds = time.perf_counter() - start
        passes = sum(r.seconds for r in lowered.pass_log)
        print(f"\n{len(lowered.pass_log)} passes in {passes:.2f} s; lowered and built in {seconds:.2f} s; artifacts:")
        for key, path in lowered.artifacts.items():
            print(f"  {key:<9} {path}")
        for note in lowered.notes:
            print(f"  note: {note}")
        print(f"  IR after every pass: {out / name / 'passes'}/")
        print("metadata:", json.dumps(lowered.metadata))
        if config.target_kind == "c":
            rng = np.random.default_rng(0)
            a = rng.standard_normal((512, 512), dtype=np.float32)
            b = rng.standard_normal((512, 512), dtype=np.float32)
            c = np.zeros((512, 512), np.float32)
            start = time.perf_counter()
            lowered(a, b, c)
            seconds = time.perf_counter() - start
            error = float(np.abs(c - a @ b).max())
            print(f"ran on the CPU: 512^3 GEMM in {seconds * 1e3:.1f} ms, max |C - numpy| = {error:.2e}")
            if error > 1e-3:
                print("MISMATCH against numpy", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
