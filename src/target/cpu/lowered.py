"""The CPU backend's part of ``tessera_tvm.lower``: build, load and call a lowered module on the host.

``tessera_tvm.lower`` reaches these through the CPU manifest (:mod:`.backend`): :func:`entry` reads
the C kernel's symbol and ctypes signature from the device module when it is lowered, :func:`build`
runs g++ and loads the library, :func:`reload` loads it again after its files moved (kernel cache,
``out_dir``), and :func:`run` calls it on numpy arrays (building it first when ``build=False``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..._tvm import tvm
from ...errors import TesseraError
from ...kernel_store import scratch_directory
from ..metadata import write_metadata
from .build import compile_cpu, instruction_sets
from .loader import KernelParam, load_cpu_kernel


def entry(device_mod, input_buffers: dict[str, Any], buffer_order: list[str]) -> tuple[str, list, list]:
    """The C symbol, signature (``KernelParam``s) and the program's buffer order of a CPU kernel."""
    kernels = [(gv, f) for gv, f in device_mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    if len(kernels) != 1:
        raise TesseraError(f"the CPU runner expects one device kernel, found {[gv.name_hint for gv, _ in kernels]}")
    gv, func = kernels[0]
    written = written_vars(func)
    params = []
    for var in func.params:
        buf = input_buffers.get(var.name)
        if buf is not None:
            shape = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in buf.shape)
            params.append(KernelParam(buf.name, "buffer", str(buf.dtype), shape, written=var.name in written))
        else:
            params.append(KernelParam(var.name, "scalar", str(var.dtype), ()))
    return gv.name_hint, params, buffer_order


def written_vars(func) -> set[str]:
    """The names of the pointer variables ``func`` may write through: the targets of its stores, and
    every pointer handed to a call (an extern function, ``address_of``), except ``tvm_access_ptr``s
    whose mask says read-only. Conservative: a read-only array is refused only for these."""
    written: set[str] = set()

    def pointers(expr) -> set[str]:
        found: set[str] = set()

        def visit(node):
            if isinstance(node, tvm.tirx.Var) and "handle" in str(node.dtype):
                found.add(node.name)
            elif isinstance(node, tvm.tirx.BufferLoad):
                found.add(node.buffer.data.name)

        tvm.tirx.stmt_functor.post_order_visit(expr, visit)
        return found

    def visit(node):
        if isinstance(node, tvm.tirx.BufferStore):
            written.add(node.buffer.data.name)
        elif isinstance(node, tvm.tirx.Call) and isinstance(node.op, tvm.ir.Op):
            name = node.op.name
            if name == "tirx.tvm_access_ptr":
                mask = node.args[4]
                if not (isinstance(mask, tvm.tirx.IntImm) and int(mask) & 2 == 0):
                    written.update(pointers(node.args[1]))
            elif name.startswith("tirx.call_") or name == "tirx.address_of":
                for arg in node.args:
                    written.update(pointers(arg))

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return written


def build(lowered, out_dir: Path) -> None:
    """g++ -> shared library, loaded so the LoweredModule can be called with numpy arrays."""
    codegen = lowered.config.codegen_dict
    lowered.artifacts["library"] = compile_cpu(
        lowered.source, out_dir=out_dir, name=lowered.name, flags=tuple(codegen["flags"]), link_runtime=True
    )
    isa = instruction_sets(codegen["flags"], codegen["compiler"])
    for kernel in lowered.metadata:  # what the library may execute (and the cache key's isa digest covers)
        kernel["instruction_sets"] = list(isa)
    write_metadata(lowered)
    _load(lowered)


def reload(lowered) -> None:
    """Load the library again from where ``lowered.artifacts`` now says it is (if it was built)."""
    if "library" in lowered.artifacts:
        _load(lowered)


def _load(lowered) -> None:
    symbol, params, _ = lowered._entry
    lowered._kernel = load_cpu_kernel(lowered.artifacts["library"], symbol, params)


def run(lowered, arrays: tuple, named: dict) -> None:
    """Call the kernel on numpy arrays (program order, or by buffer name); outputs written in place."""
    if lowered._kernel is None:  # compiled with build=False: build now, in a scratch directory
        build(lowered, scratch_directory(f"tessera_{lowered.name}_"))
    _, params, order = lowered._entry
    by_name = dict(zip(order, lowered._ordered(order, arrays, named), strict=True))
    # The C kernel orders its parameters as the host/device split left them, not as the program did.
    return lowered._kernel(*[by_name[p.name] for p in params if p.kind == "buffer"], **named)
