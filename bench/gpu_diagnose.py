"""Where a model built for a GPU config first goes wrong: each call of its Relax VM against the same
model built for the CPU (which matches torch), call by call.

    python bench/gpu_diagnose.py [--model hf-llama] [--config hopper] [--tolerance 5e-2]

Run on a lent GPU machine (``bash bench/device_run.sh diagnose``). Both builds start from one
``torch.export`` of the model and are partitioned alike (the same Tessera kernels, by name), so the
calls of the two VMs pair up by their function's name and order. The VM's instrument copies every
call's tensor arguments after the call (the outputs of a destination-passing call are among them);
the script prints, for each call, the largest error of its arguments against the CPU's, relative to
the largest value, and names the first call whose error passes ``--tolerance``: the kernel (or
TVM's operator) that computes the first wrong value. bf16 models: a few 1e-3 is rounding.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def _model(name: str):
    import hf_model
    import torch_models

    torch.manual_seed(0)
    if name.startswith("hf-"):
        sizes = dict(hidden=256, ffn=688, layers=2, heads=8, vocab=1024, positions=256)
        return hf_model.make_model(name[3:], **sizes), (torch.randint(0, 1024, (1, 128)),)
    if name == "llama-block":
        return torch_models.LlamaBlock(256, 8, 4, 688, 128), (torch.randn(1, 128, 256),)
    raise SystemExit(f"unknown model {name!r}: hf-<kind> (hf_model.make_model) or llama-block")


def _trace(vm, args) -> list[tuple[str, list[np.ndarray]]]:
    """[(function, [its tensor arguments after the call as float64 arrays])] of one run of ``main``."""
    from tessera_tvm import tvm

    calls: list[tuple[str, list[np.ndarray]]] = []

    def instrument(func, symbol, before_run, ret_value, *call_args):
        if not before_run:
            arrays = [a.numpy().astype(np.float64) for a in call_args if isinstance(a, tvm.runtime.Tensor)]
            calls.append((str(symbol), arrays))
        return 0  # go on

    vm.set_instrument(instrument)
    vm["main"](*args)
    vm.set_instrument(None)
    return calls


def _error(got: np.ndarray, want: np.ndarray) -> float:
    """Max-abs error relative to the largest value; NaN where the shapes differ (a constant the two
    configs lay out differently), which the comparison skips."""
    if got.shape != want.shape:
        return float("nan")
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    return float(np.abs(got - want).max(initial=0.0)) / scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hf-llama")
    parser.add_argument("--config", default="hopper")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tolerance", type=float, default=5e-2)
    args = parser.parse_args()

    from tessera_tvm import tvm  # first: it puts TileLang's TVM on the path
    from tessera_tvm.relax import build

    from_exported_program = tvm.relax.frontend.torch.from_exported_program

    model, inputs = _model(args.model)
    dtype = getattr(torch, args.dtype)
    model = model.eval().to(dtype)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    exported = torch.export.export(model, inputs)
    traces = {}
    for config in ("cpu", args.config):
        on_gpu = config != "cpu"
        # weights as they are: each config packs a GEMM's weight its own way
        built = build(from_exported_program(exported, keep_params_as_input=False), config, pack_weights=False)
        vm = built.vm(tvm.cuda() if on_gpu else tvm.cpu())
        on_device = [tvm.runtime.from_dlpack(t.cuda() if on_gpu else t) for t in inputs]
        traces[config] = _trace(vm, on_device)
        print(f"{config}: {len(traces[config])} calls, {len(built.report.offloaded)} Tessera calls", flush=True)
    reference, device_calls = traces["cpu"], traces[args.config]
    with torch.no_grad():
        expected = model(*inputs)
    expected = (expected[0] if isinstance(expected, tuple) else expected).float().numpy()

    # pair calls by (function, how many times it was called before)
    seen: dict[str, int] = {}
    keyed = {}
    for symbol, arrays in reference:
        seen[symbol] = seen.get(symbol, 0) + 1
        keyed[(symbol, seen[symbol])] = arrays
    seen.clear()
    first_wrong = None
    for symbol, arrays in device_calls:
        seen[symbol] = seen.get(symbol, 0) + 1
        if symbol.startswith("vm.builtin.") or not arrays:  # allocations, reshapes, kills
            continue
        want = keyed.get((symbol, seen[symbol]))
        if want is None or len(want) != len(arrays):
            print(f"  {symbol} #{seen[symbol]}: no matching call on the CPU")
            continue
        errors = [_error(g, w) for g, w in zip(arrays, want, strict=True)]
        worst = max((e for e in errors if e == e), default=0.0)  # e != e: NaN, shapes differ
        shapes = " ".join("x".join(map(str, a.shape)) for a in arrays)
        mark = "  <-- wrong" if worst > args.tolerance else ""
        print(f"  {symbol} #{seen[symbol]} [{shapes}]: {' '.join(f'{e:.0e}' for e in errors)}{mark}")
        if mark and first_wrong is None:
            first_wrong = (symbol, seen[symbol], errors)
    outputs = [a for _, arrays in device_calls for a in arrays if a.shape == expected.shape]
    if outputs:
        print(f"the last tensor of the model's output shape against torch: rel err {_error(outputs[-1], expected):.0e}")
    if first_wrong is None:
        print(f"every call within {args.tolerance:g} of the CPU build's")
        return 0
    symbol, count, errors = first_wrong
    print(f"first wrong call: {symbol} (call {count}), argument errors {errors}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
