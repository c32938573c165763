"""``@tessera.kernel``: a Python function on typed tensors, traced into Graph IR.

    @ts.kernel
    def linear(A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]) \\
            -> Tensor["M", "N", ts.f16]:
        return ops.gelu(ops.matmul(A, W) + b)

    linear.inspect_ir("graph")            # Graph IR after the graph passes, before any target
    linear.graph(shapes={"M": 128}).groups  # the fused kernels
    linear.reference(a, w, b)             # the body on numpy arrays (reference semantics)

The body is traced once per set of known dim values on symbolic tensors; every op checks its
operands there and reports mistakes at the body's line. The return annotation is checked against
what the body returns.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from tessera_tvm.graph import GraphIR
from tessera_tvm.pipeline import graph_phase_key, run_graph_passes

from .errors import DTypeError, KernelError, ShapeError
from .tracing import Dim, Trace, TracedTensor, describe_dims, dims_agree
from .types import TensorType

__all__ = ["Kernel", "kernel", "schedule"]

STAGES = ("graph", "sched", "tile", "target")


def _def_location(fn: Callable) -> tuple[str, int]:
    code = fn.__code__
    return code.co_filename, code.co_firstlineno


def _return_location(fn: Callable) -> tuple[str, int]:
    """The line of the function's (last) ``return`` statement, or its ``def`` line."""
    filename, first = _def_location(fn)
    try:
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return filename, first
    returns = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Return)]
    return filename, (start + max(returns) - 1) if returns else first


class Kernel:
    """A Tessera kernel: the function, its typed parameters and result, schedule overrides."""

    #: What else than the function its Graph IR depends on (a rank's sharding), for the compile cache;
    #: a class default, so that a kernel restored from a repro pack (made without __init__) has it.
    variant: str = ""

    def __init__(self, fn: Callable, schedule: Mapping[str, Any] | None = None) -> None:
        if not callable(fn) or not hasattr(fn, "__code__"):
            raise TypeError(f"@tessera.kernel decorates a Python function, found {fn!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = fn.__name__
        self.schedule_overrides: dict[str, Any] = dict(schedule or {})
        self._traces: dict[Any, Any] = {}  # shapes -> the traced Relax module
        self._graphs: dict[Any, GraphIR] = {}  # (shapes, config, PassContext) -> after the graph passes
        location = _def_location(fn)
        try:
            hints = inspect.get_annotations(fn, eval_str=True)
        except Exception as exc:  # a NameError in a string annotation, typically
            raise KernelError(
                f"kernel {self.name}: cannot evaluate its annotations: {exc}", location=location
            ) from None
        params = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise KernelError(
                    f"kernel {self.name}: parameter {p.name} is {p.kind.description}; kernel "
                    "parameters are plain positional tensors",
                    location=location,
                )
            ann = hints.get(p.name)
            if not isinstance(ann, TensorType):
                found = "no annotation" if ann is None else f"{ann!r}"
                raise KernelError(
                    f"kernel {self.name}: parameter {p.name} has {found}; annotate it as a tensor, "
                    f"e.g. {p.name}: Tensor['M', 'N', ts.f32]",
                    location=location,
                )
            if not ann.dims:
                raise KernelError(
                    f"kernel {self.name}: parameter {p.name} is rank 0; give it at least one dim", location=location
                )
            params.append((p.name, ann))
        if not params:
            raise KernelError(
                f"kernel {self.name} takes no tensors; a kernel needs at least one parameter", location=location
            )
        self.params: tuple[tuple[str, TensorType], ...] = tuple(params)
        result = hints.get("return")
        if isinstance(result, tuple) and all(isinstance(r, TensorType) for r in result) and result:
            self.result: TensorType | tuple[TensorType, ...] | None = result
        elif result is None or isinstance(result, TensorType):
            self.result = result
        else:
            raise KernelError(
                f"kernel {self.name}: return annotation {result!r} is not a tensor type; write "
                "-> Tensor[...] or -> (Tensor[...], Tensor[...])",
                location=location,
            )
        symbols: list[str] = []
        for _, t in self.params:
            for d in t.symbols:
                if d not in symbols:
                    symbols.append(d)
        self.symbols: tuple[str, ...] = tuple(symbols)

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {t!r}" for n, t in self.params)
        return f"<tessera.kernel {self.name}({params})>"

    # Shapes -----------------------------------------------------------------------------------
    def check_shapes(self, shapes: Mapping[str, int] | None) -> dict[str, int]:
        """``shapes`` validated against the kernel's symbols."""
        out: dict[str, int] = {}
        for name, value in dict(shapes or {}).items():
            if name not in self.symbols:
                raise ShapeError(
                    f"shapes= names {name!r}, which is not a dim of kernel {self.name}; its dims are "
                    f"{', '.join(self.symbols) or 'all literal'}",
                    location=_def_location(self.fn),
                )
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ShapeError(
                    f"shapes[{name!r}] is {value!r}; expected a positive int", location=_def_location(self.fn)
                )
            out[name] = value
        return out

    # Tracing ----------------------------------------------------------------------------------
    def graph(
        self,
        shapes: Mapping[str, int] | None = None,
        arg_shapes: Mapping[str, tuple[int, ...]] | None = None,
        *,
        target: Any = None,
        dump_dir: Any = None,
    ) -> GraphIR:
        """The kernel's Graph IR, traced with ``shapes`` (dim values) or per-argument ``arg_shapes``,
        after the graph passes of ``target``'s config (the shared list when None). ``dump_dir``
        receives the module after each graph pass."""
        env = self.check_shapes(shapes)
        key = (tuple(sorted(env.items())), tuple(sorted((arg_shapes or {}).items())))
        if key not in self._traces:
            self._traces[key] = self._trace(env, dict(arg_shapes or {}))
        phase_key = graph_phase_key(target)  # None: the PassContext has instruments, which must see every pass
        if phase_key is None or dump_dir is not None:
            return run_graph_passes(self._traces[key], self.name, target, dump_dir)
        if (key, phase_key) not in self._graphs:
            self._graphs[key, phase_key] = run_graph_passes(self._traces[key], self.name, target)
        return self._graphs[key, phase_key]

    def _trace(self, env: dict[str, int], arg_shapes: dict[str, tuple[int, ...]]):
        trace = Trace(self.name, env)
        params = [trace.param(n, t, arg_shapes.get(n)) for n, t in self.params]

        def body():
            with trace.active():
                result = self.fn(*params)
            outs = self._check_result(result)
            values = [o._value for o in outs]
            return values if isinstance(self.result, tuple) or isinstance(result, tuple) else values[0]

        return trace.builder.build([p._value for p in params], body)

    def _check_result(self, result: Any) -> list[TracedTensor]:
        where = _return_location(self.fn)
        items = list(result) if isinstance(result, tuple) else [result]
        for r in items:
            if not isinstance(r, TracedTensor):
                raise KernelError(
                    f"kernel {self.name} returns {type(r).__name__} {r!r}; a kernel returns tensors", location=where
                )
        if self.result is None:
            return items
        expected = list(self.result) if isinstance(self.result, tuple) else [self.result]
        if len(expected) != len(items) or isinstance(self.result, tuple) != isinstance(result, tuple):
            raise KernelError(
                f"kernel {self.name} returns {len(items)} tensor(s) but is annotated with {len(expected)}",
                location=where,
            )
        for i, (r, e) in enumerate(zip(items, expected, strict=True)):
            what = f"kernel {self.name} returns {describe_dims(r.dims)} {r.dtype}"
            if len(expected) > 1:
                what += f" as result {i}"
            if r.dtype != e.dtype:
                raise DTypeError(
                    f"{what} but is annotated -> {e!r}: dtype {r.dtype} vs {e.dtype} (cast the result: "
                    f"ops.cast(..., ts.{e.dtype}))",
                    location=where,
                )
            if r.ndim != e.rank:
                raise ShapeError(f"{what} but is annotated -> {e!r}: rank {r.ndim} vs {e.rank}", location=where)
            for axis, (d, want) in enumerate(zip(r.dims, e.dims, strict=True)):
                w = Dim(None, want) if isinstance(want, int) else Dim(want, d.value if d.name == want else None)
                agree = dims_agree(d, w)
                named_apart = d.name is not None and w.name is not None and d.name != w.name
                if agree is False or (agree is None and named_apart):
                    raise ShapeError(
                        f"{what} but is annotated -> {e!r}: dim {axis} is {d.text()}"
                        f"{'' if d.value is None or d.name is None else f' = {d.value}'}, "
                        f"annotated {want}",
                        location=where,
                    )
        return items

    # Inspection ---------------------------------------------------------------------------------
    def inspect_ir(self, stage: str = "graph", *, shapes: Mapping[str, int] | None = None, traced: bool = False) -> str:
        """Graph IR text (``traced=True``: as traced, before the graph passes). Later stages need a
        target: ``ts.compile(kernel, target=...).inspect_ir(stage)``."""
        if stage != "graph":
            if stage in STAGES:
                raise KernelError(
                    f"stage {stage!r} needs a target: ts.compile({self.name}, target='cpu' | 'hopper' "
                    f"| ...).inspect_ir({stage!r})",
                    location=_def_location(self.fn),
                )
            raise KernelError(
                f"unknown stage {stage!r}; stages are {', '.join(STAGES)}", location=_def_location(self.fn)
            )
        return self.graph(shapes).text(traced=traced)

    # Running ------------------------------------------------------------------------------------
    def reference(self, *arrays):
        """Run the body on numpy arrays with the ops' reference semantics (no compilation)."""
        import numpy as np

        if len(arrays) != len(self.params):
            raise TypeError(
                f"{self.name} takes {len(self.params)} arrays "
                f"({', '.join(n for n, _ in self.params)}), got {len(arrays)}"
            )
        from .reference import unwrap, wrap

        return unwrap(self.fn(*[wrap(np.asarray(a)) for a in arrays]))

    def __call__(self, *args):
        """Inside another kernel: inline this one. Outside: compile it first."""
        if args and all(isinstance(a, TracedTensor) for a in args):
            if len(args) != len(self.params):
                raise KernelError(f"kernel {self.name} takes {len(self.params)} tensors, got {len(args)}")
            return self.fn(*args)
        raise TypeError(
            f"kernel {self.name} is not called directly: compile it (ts.compile({self.name}, "
            f"target='cpu')(...)) or run its reference semantics ({self.name}.reference(...))"
        )

    def with_schedule(self, overrides: Mapping[str, Any]) -> Kernel:
        """This kernel with schedule overrides (merged over any it has)."""
        clone = Kernel(self.fn, {**self.schedule_overrides, **dict(overrides)})
        clone._traces = self._traces
        clone._graphs = self._graphs
        return clone


def kernel(fn: Callable | None = None, *, schedule: Mapping[str, Any] | None = None):
    """Decorator: ``@tessera.kernel`` or ``@tessera.kernel(schedule={"block_m": 64})``."""
    if fn is None:
        return lambda f: Kernel(f, schedule)
    return Kernel(fn, schedule)


def schedule(overrides: Mapping[str, Any] | None = None, **fields: Any):
    """Decorator form of schedule overrides, above ``@tessera.kernel``:

    @ts.schedule(block_m=64, stages=2)              # every fused kernel
    @ts.schedule({"fused_matmul_add_gelu": {"block_n": 64}})   # one fused kernel
    @ts.kernel
    def linear(...): ...
    """
    merged = {**dict(overrides or {}), **fields}

    def apply(k):
        if not isinstance(k, Kernel):
            k = Kernel(k)
        return k.with_schedule(merged)

    return apply
