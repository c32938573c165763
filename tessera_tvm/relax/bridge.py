"""The toolchain side of Tessera offload for upstream apache-tvm (issue #17).

One process cannot hold TileLang's TVM and upstream apache-tvm (DESIGN.md §3.1). A user's
apache-tvm process (``tessera_tvm.upstream``) therefore sends its Relax module as TVMScript text to a
toolchain process that runs here, in TileLang's TVM. This module partitions the module as
``partition_for_tessera`` does, compiles the Tessera kernels, and answers with text again:

- the Relax module, each Tessera kernel call now ``R.call_dps_packed("<kernel>", ...)`` and the
  kernels' PrimFuncs gone, in upstream's dialect (:func:`to_upstream_text`);
- the kernels as C sources that upstream's ``export_library`` (or its VM's ``jit``) compiles and
  links into the user's library, each defining the entry ``__tvm_ffi_<kernel>`` (TVM's calling
  convention), headers included by absolute path. On the CPU: TVM's host functions and the device
  kernels. On CUDA configs (hopper, ampere): one C++ source per kernel, the tvm-ffi entry
  Tessera's own CUDA libraries have (tessera_tvm/target/cuda/module.py), its cubins written into it
  as literals; it drives the GPU through the CUDA driver, so it needs no CUDA runtime in upstream's
  TVM;
- the offload report, as its dict and its text.

``python -m tessera_tvm.relax.bridge`` serves requests, one JSON object per line on stdin, each
answered by one line on stdout (:func:`serve`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import traceback
from typing import Any

from .._tvm import tvm
from ..config import load_config
from ..errors import TesseraError
from ..target.backend import backend_for
from .build import compile_module, export_options, host_library_flags
from .offload import partition_for_tessera
from .pipeline import is_tessera_kernel

relax = tvm.relax

#: Version of the request/answer format; the client refuses a toolchain that speaks another.
PROTOCOL = 1


def _to_packed_calls(mod, kernels: dict[str, Any]):
    """``mod`` with each ``R.call_tir`` of a Tessera kernel as ``R.call_dps_packed`` of its symbol,
    and the kernels' PrimFuncs removed."""
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @relax.expr_functor.mutator
    class PackedCalls(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(call_tir) and str(call.args[0].name_hint) in kernels:
                if len(call.args) > 2:
                    raise TesseraError(
                        f"{call.args[0].name_hint}: a call_tir with tir_vars cannot become a packed call"
                    )
                return relax.call_dps_packed(
                    relax.ExternFunc(kernels[str(call.args[0].name_hint)]), call.args[1], list(call.sinfo_args)
                )
            return call

    mutator = PackedCalls(mod)
    out = tvm.IRModule({}, attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if str(gv.name_hint) in kernels:
            continue
        out[gv] = mutator.visit_expr(func) if isinstance(func, relax.Function) else func
    return out


#: TileLang's Relax text -> upstream apache-tvm 0.27's (the renames the two dialects differ by).
_UPSTREAM_RENAMES = (
    (re.compile(r', out_dtype="void"'), ""),  # upstream's well-formed check rejects a void dtype
    (re.compile(r"\bout_sinfo="), "out_ty="),  # call_tir / call_dps_packed keyword
    # a PrimFunc with blocks (Tessera's index checks) is parsed as the s_tir dialect there
    (re.compile(r"@T\.prim_func\(private=True\)"), "@T.prim_func(private=True, s_tir=True)"),
)


def to_upstream_text(mod) -> str:
    """``mod`` as TVMScript that upstream apache-tvm parses."""
    text = mod.script()
    for pattern, replacement in _UPSTREAM_RENAMES:
        text = pattern.sub(replacement, text)
    return text


#: Upstream apache-tvm 0.27's Relax text -> TileLang's (applied before parsing).
_FROM_UPSTREAM_RENAMES = (
    (re.compile(r'R\.const\("(-?inf|nan)"'), r'R.const(float("\1")'),  # an infinite or NaN scalar
)


def from_upstream_text(text: str):
    """The IRModule of TVMScript that upstream apache-tvm printed. Its dialect declares symbolic dims
    at the top (``n = TypeVar("n")``), needs the script namespaces given, and spells a few things
    differently (``_FROM_UPSTREAM_RENAMES``). A parse error carries the parser's rendered message."""
    for pattern, replacement in _FROM_UPSTREAM_RENAMES:
        text = pattern.sub(replacement, text)
    from tvm.script import ir as I  # noqa: E741, N812
    from tvm.script import relax as R  # noqa: N812
    from tvm.script import tirx as T  # noqa: N812

    def type_var(name: str, *_args, **_kwargs):  # a symbolic dim, as a Relax shape holds it
        return tvm.tirx.Var(name, "int64")

    with _captured_stderr() as rendered:
        try:
            return tvm.script.from_source(text, extra_vars={"TypeVar": type_var, "I": I, "R": R, "T": T})
        except Exception as exc:  # noqa: BLE001 - the parser's message, named
            error = exc
    detail = "".join(rendered).strip() or str(error)
    raise TesseraError(f"the toolchain's TVM could not parse the module's TVMScript:\n{detail}")


@contextlib.contextmanager
def _captured_stderr():
    """What is written to fd 2 inside the block (the TVMScript parser renders its errors there, from
    C++), in the yielded list once the block ends."""
    sys.stderr.flush()
    saved, written = os.dup(2), []
    with tempfile.TemporaryFile(mode="w+") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield written
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            written.append(capture.read())


def _c_sources(runtime_module) -> list[dict[str, Any]]:
    """Every C source module in ``runtime_module``'s import tree: its code, format and functions."""
    found: list[dict[str, Any]] = []

    def visit(module) -> None:
        if module.kind == "c":
            found.append({"code": module.inspect_source(), "format": "cc", "names": []})
        for imported in module.imports:
            visit(imported)

    visit(runtime_module)
    return found


def host_c_sources(partitioned, kernels: dict[str, str], config) -> list[dict[str, Any]]:
    """The C sources of the Tessera kernels of ``partitioned`` on a CPU config: the host module built
    with them holds their entry functions (the CPU backend's ``upstream_sources``)."""
    kernel_mod = tvm.IRModule({gv: f for gv, f in partitioned.functions.items() if str(gv.name_hint) in kernels})
    sources = _c_sources(compile_module(kernel_mod, config).mod)
    sources[0]["names"] = sorted(kernels.values())  # the host module holds the entry functions
    return sources


def cuda_sources(partitioned, kernels: dict[str, str], config) -> list[dict[str, Any]]:
    """One C++ source per Tessera kernel of ``partitioned`` on a CUDA config: its tvm-ffi entry
    ``__tvm_ffi_<symbol>`` with its cubins in it (:func:`standalone_entry_source`). Each kernel is
    lowered and compiled with nvcc here (the kernel cache keeps the cubins)."""
    from ..lower import lower
    from ..target.cuda.module import device_launches, standalone_entry_source
    from ..target.module import Call, ModuleError, ModulePlan, TensorArg
    from .pipeline import tile_program

    outputs = _output_counts(partitioned, kernels)
    sources = []
    for gv, func in partitioned.functions.items():
        name = str(gv.name_hint)
        if name not in kernels:
            continue
        lowered = lower(tile_program(func), config)
        dtypes = {str(b.name): str(b.dtype) for b in func.buffer_map.values()}
        shapes = lowered._program_shapes
        order = list(lowered._program_order)
        dynamic = {b: shapes[b] for b in order if not all(isinstance(d, int) for d in shapes[b])}
        if dynamic:
            raise TesseraError(
                f"kernel {name} for config {config.name!r} has symbolic dims ({', '.join(f'{b} {d}' for b, d in dynamic.items())}); "
                "offload from upstream to a GPU takes static shapes for now: import the model with fixed shapes"
            )
        cubin = lowered.artifacts.get("cubin")
        if cubin is None:
            raise TesseraError(
                f"kernel {name} for config {config.name!r} has no cubin to carry to upstream's TVM: "
                f"{'; '.join(lowered.notes) or 'nvcc did not produce one'}"
            )
        tensors = [TensorArg(b, dtypes[b], tuple(shapes[b])) for b in order]
        count = outputs.get(name, 1)
        try:
            launches = device_launches(lowered)
            plan = ModulePlan(
                name=kernels[name],
                inputs=tuple(tensors[:-count]),
                outputs=tuple(tensors[-count:]),
                intermediates=(),
                calls=(Call(name, lowered.name, tuple(order), launches=launches, binary=str(cubin)),),
                copies=(),
                sources=((name, lowered.source),),
                device="cuda",
            )
            code = standalone_entry_source(plan, [cubin.read_bytes()])
        except ModuleError as exc:
            raise TesseraError(f"kernel {name} for config {config.name!r}: {exc}") from None
        sources.append({"code": code, "format": "cc", "names": [kernels[name]]})
    return sources


def _output_counts(mod, kernels: dict[str, Any]) -> dict[str, int]:
    """How many outputs each kernel's ``R.call_tir`` writes (its PrimFunc's last parameters)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    counts: dict[str, int] = {}

    def visit(node) -> None:
        if isinstance(node, relax.Call) and node.op.same_as(call_tir) and str(node.args[0].name_hint) in kernels:
            out = node.sinfo_args[0]
            counts[str(node.args[0].name_hint)] = len(out.fields) if isinstance(out, relax.TupleStructInfo) else 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def offload_for_upstream(
    text: str,
    config: str = "cpu",
    *,
    functions: list[str] | None = None,
    dim_hints: dict[str, int] | None = None,
    folded: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Partition the Relax module ``text`` for ``config`` and compile its Tessera kernels (see the
    module docstring); returns the answer's fields. ``folded``: the ops the upstream side folded
    before the weights were lifted (op -> count), for the report."""
    config = load_config(config)
    backend = backend_for(config)
    # Tenstorrent (TVM kind c) goes on to partition_for_tessera, which refuses it with its own reason.
    if backend.upstream_sources is None and backend.relax_refused is None:
        raise TesseraError(
            f"config {config.name!r} (TVM target kind {config.tvm_kind!r}): offload from upstream apache-tvm "
            "takes the CPU and CUDA configs (cpu, hopper, ampere); its kernels have no binary here to carry"
        )
    mod = from_upstream_text(text)
    partitioned, report = partition_for_tessera(mod, config, functions=functions, dim_hints=dim_hints)
    for op, count in (folded or {}).items():
        report.folded[op] = report.folded.get(op, 0) + int(count)
    kernels = {
        str(gv.name_hint): str(f.attrs["global_symbol"])
        for gv, f in partitioned.functions.items()
        if is_tessera_kernel(f)
    }
    sources: list[dict[str, Any]] = []
    if kernels:
        sources = backend.hook("upstream_sources")(partitioned, kernels, config)
    return {
        "text": to_upstream_text(_to_packed_calls(partitioned, kernels)),
        "sources": sources,
        "kernels": sorted(kernels.values()),
        "tvm_kind": config.tvm_kind,
        # the TVM runtime its kernels need beside the host's, and what messages call it (None: C in the host)
        "device_runtime": None if backend.kernels_in_host else backend.tvm_kind,
        "device_title": backend.title,
        "report": report.as_dict(),
        "report_text": str(report),
    }


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "hello":
        import tilelang

        return {"protocol": PROTOCOL, "tvm": tvm.__version__, "tilelang": tilelang.__version__}
    if op == "offload":
        return offload_for_upstream(
            request["text"],
            request.get("config", "cpu"),
            functions=request.get("functions"),
            dim_hints=request.get("dim_hints"),
            folded=request.get("folded"),
        )
    if op == "export_options":
        return {"options": export_options(request.get("config", "cpu"))}
    if op == "build_library":
        return build_library_for_upstream(request)
    raise TesseraError(f"unknown request {op!r}; expected 'hello', 'offload', 'export_options' or 'build_library'")


def build_library_for_upstream(request: dict[str, Any]) -> dict[str, Any]:
    """The compile step of an upstream ``export_library`` on a CPU config (its sources and objects
    already written by upstream TVM): one object per source, cached, the kernels with the precompiled
    prelude (tessera_tvm.target.cpu.host_library). ``{"built": False}`` for other configs: upstream
    then compiles as it does by default."""
    from ..target.cpu.host_library import build_host_library

    flags = host_library_flags(load_config(request.get("config", "cpu")))
    if flags is None:
        return {"built": False}
    files, options = request.get("files"), request.get("options", [])
    if not isinstance(request.get("output"), str) or not isinstance(files, list) or not isinstance(options, list):
        raise TesseraError("build_library takes 'output' (a path), 'files' and 'options' (lists of strings)")
    build_host_library(request["output"], [str(f) for f in files], [str(o) for o in options], flags)
    return {"built": True}


def serve(stdin=None, stdout=None) -> None:
    """Answer requests until stdin closes: one JSON object per line in, one per line out, each
    ``{"ok": true, ...}`` or ``{"ok": false, "error": ..., "type": ...}``."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    for line in stdin:
        if not line.strip():
            continue
        try:
            answer = {"ok": True, **_answer(json.loads(line))}
        except TesseraError as exc:
            answer = {"ok": False, "type": type(exc).__name__, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a bug: say where, keep serving
            answer = {"ok": False, "type": type(exc).__name__, "error": str(exc), "trace": traceback.format_exc()}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()


def main() -> None:
    """Serve on stdin/stdout. Whatever TVM, TileLang or g++ print (from Python or C) goes to stderr:
    the process's stdout (fd 1) is pointed there, and the answers go to a copy of the original."""
    import os

    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, protocol)


if __name__ == "__main__":
    main()
