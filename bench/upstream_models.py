# ruff: noqa: B023  (the lambdas run inside their loop iteration)
"""The models section on upstream apache-tvm (issue #17), run in the apache-tvm venv by bench.py:

    ./tessera.sh apache-tvm-run bench/upstream_models.py [--quick]

Each model of examples/torch_models.py, imported with upstream's torch frontend at its defaults, is
timed three ways on the same input and threads: upstream TVM alone (``tvm.compile(mod, "llvm")``,
its default pipeline), upstream TVM with Tessera offload (partitioned through the toolchain process,
built with LLVM, exported with ``export_options``), and torch eager. Prints one JSON object per
model on stdout (bench.py turns them into rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))

import tessera_tvm  # noqa: E402  (upstream mode: no tilelang here)

# isort: split
import torch_models  # noqa: E402
import tvm  # noqa: E402
from timing import interleaved_medians  # noqa: E402
from tvm import relax  # noqa: E402

CASES = {
    "GPT-2 block (B=1 S=128 D=256 H=4)": lambda: (torch_models.Gpt2Block(256, 4, 1024), torch.randn(1, 128, 256)),
    "LLaMA block (B=1 S=128 D=256 H=8/4)": lambda: (
        torch_models.LlamaBlock(256, 8, 4, 688, 128),
        torch.randn(1, 128, 256),
    ),
    "MLP (B=64, 784-1024-1024-10)": lambda: (torch_models.Mlp((784, 1024, 1024, 10)), torch.randn(64, 784)),
    "ResNet basic block (B=1 C=64 56x56)": lambda: (torch_models.BasicBlock(64), torch.randn(1, 64, 56, 56)),
    "MobileNetV2 inverted residual (B=1 C=32 x6 56x56)": lambda: (
        torch_models.InvertedResidual(32),
        torch.randn(1, 32, 56, 56),
    ),
}


def _first(out):
    return (out[0] if not hasattr(out, "numpy") else out).numpy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    assert tessera_tvm.UPSTREAM, "run in the apache-tvm venv (./tessera.sh apache-tvm-run ...)"
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    workdir = Path(tempfile.mkdtemp(prefix="tessera-upstream-bench-"))
    torch.manual_seed(0)
    for name, make in CASES.items():
        model, x = make()
        model = model.eval()
        mod = torch_models.import_model(model, x)
        arg = tvm.runtime.tensor(x.numpy())
        alone = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"]
        partitioned, report = tessera_tvm.partition_for_tessera(mod, "cpu")
        library = workdir / f"{len(os.listdir(workdir))}.so"
        tvm.compile(partitioned, "llvm").export_library(str(library), options=tessera_tvm.export_options("cpu"))
        offloaded = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())["main"]
        with torch.no_grad():
            expected = model(x).numpy()
            errors = {
                "alone": float(np.abs(_first(alone(arg)) - expected).max()),
                "tessera": float(np.abs(_first(offloaded(arg)) - expected).max()),
            }
            times = interleaved_medians(
                {"tessera": lambda: offloaded(arg), "alone": lambda: alone(arg), "torch": lambda: model(x)},
                5 if args.quick else 11,
            )
        print(
            json.dumps(
                {
                    "model": name,
                    "times": times,
                    "errors": errors,
                    "offloaded": len(report.offloaded),
                    "left": len(report.not_offloaded),
                    "threads": threads,
                    "tvm": tvm.__version__,
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
