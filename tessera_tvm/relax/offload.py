"""``partition_for_tessera``: replace what Tessera compiles well in a Relax module by Tessera kernels.

    mod, report = tessera_tvm.partition_for_tessera(mod, "cpu")
    print(report)                       # what was offloaded, what stayed with TVM and why
    ex = tvm.compile(mod, report.target, relax_pipeline=report.relax_pipeline, tir_pipeline=report.tir_pipeline)

In TVM's BYOC style: ``FuseOpsByPattern`` groups the matches of Tessera's patterns
(``tessera_tvm.relax.patterns``) into composite functions, each accepted only if Tessera can build
it for the config; each composite call then becomes ``R.call_tir`` of a TileLang tile program
generated from its kernel spec (``tessera_tvm.graph.kernel_spec`` -> ``tessera_tvm.tile``), and the
composite functions go away. The tile programs stay Tile IR: the ``tessera.<config>`` TIR pipeline
lowers them inside ``tvm.compile``. Everything else is left to TVM.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from .. import op_table, planner
from .._tvm import tvm
from ..config import TargetConfig, load_config
from ..errors import TesseraError
from ..graph.nodes import call_with, flatten, kernel_dim_name, node_of
from ..lower import lower
from ..target.backend import backend_for
from ..tile import GemmSpec, KernelSpec
from .elementwise import elementwise_trees
from .index_checks import check_indices
from .patterns import (
    ANCHORS,
    KernelPlan,
    MatchLog,
    OffloadRejected,
    ops_in,
    plan_kernel,
    required_ops,
    tessera_patterns,
)
from .pipeline import (
    CONFIG_ATTR,
    FINGERPRINT_ATTR,
    KERNEL_ATTR,
    RELAX_ATTRS,
    check_supported,
    is_tessera_kernel,
    pipeline_name,
)
from .recover import (
    fold_batch_norms,
    fold_constant_slices,
    recover_attention,
    recover_gelu_tanh,
    recover_rms_norm,
    recover_silu,
    sink_reshapes,
)
from .recover_scores import recover_scored_attention
from .torch_frontend import (
    HALF,
    NAN_EXTREMA,
    NAN_ORDER,
    fix_imported,
    half_ops_in_float32,
    nan_ordered_sorts,
    nan_propagating_extrema,
)

relax = tvm.relax

_COMPOSITE_PREFIX = "tessera."
BINDING_ATTR = "tessera.binding"  # on composite functions: the name of the binding it replaces

#: Why an operator that is not an anchor stays with TVM, by kind (the report's wording).
_KINDS = {
    "data movement: left to TVM": {
        "reshape", "permute_dims", "split", "concat", "squeeze", "expand_dims", "flatten", "strided_slice",
        "take", "broadcast_to", "repeat", "tile", "flip", "layout_transform",
    },
    "element-wise, not in a GEMM epilogue: left to TVM (which fuses it)": {
        *op_table.BY_RELAX, "erf", "where", "equal", "less", "greater",
    },
    "reduction: left to TVM (Tessera offloads sum, mean and max, softmax and norms)": {
        "min", "prod", "variance", "std", "argmax", "argmin", "collapse_sum_to",
        "collapse_sum_like", "cumsum",
    },
    "tensor creation: left to TVM": {"ones", "zeros", "full", "ones_like", "zeros_like", "full_like", "arange"},
    "already a TIR/packed call: compiled by TVM": {"call_tir", "call_dps_packed", "call_pure_packed"},
}  # fmt: skip


@dataclass(frozen=True)
class Offloaded:
    """One call site now served by a Tessera kernel."""

    function: str  # the Relax function it is in
    binding: str  # the Relax variable the kernel computes
    kernel: str  # the PrimFunc (and TIR pipeline kernel) name
    ops: str  # e.g. "matmul + add + gelu"
    spec: KernelSpec
    # Symbolic dims the kernel binds at call time -> the value its schedule was chosen for.
    dynamic: dict[str, int] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def packed_weight(self) -> bool:
        """Whether the kernel reads its weight (a constant B) packed when the module was built."""
        return isinstance(self.spec, GemmSpec) and self.spec.packed_b is not None


@dataclass(frozen=True)
class LeftToTVM:
    """One operator call TVM compiles, and why Tessera did not take it."""

    function: str
    binding: str
    op: str  # e.g. "R.nn.conv2d"
    reason: str


@dataclass
class OffloadReport:
    """What ``partition_for_tessera`` did; ``str(report)`` is a readable table."""

    config: TargetConfig
    tir_pipeline: str  # pass to tvm.compile(..., tir_pipeline=...)
    offloaded: list[Offloaded] = field(default_factory=list)
    not_offloaded: list[LeftToTVM] = field(default_factory=list)
    # Ops rebuilt from how torch's decomposition spells them (relax.recover): name -> count.
    rebuilt: dict[str, int] = field(default_factory=dict)
    # What TVM's torch frontend imported wrong, put right (relax.torch_frontend): what -> count.
    fixed: dict[str, int] = field(default_factory=dict)
    # Ops folded into the kernel before them (relax.recover.fold_batch_norms): op -> count.
    folded: dict[str, int] = field(default_factory=dict)
    # Calls whose indices are checked at run time (relax.index_checks): op -> count.
    checked: dict[str, int] = field(default_factory=dict)

    @property
    def recovered_attention(self) -> int:
        return self.rebuilt.get("attention", 0)

    @property
    def target(self):
        """The TVM target to compile for (the config's, with a C host)."""
        return self.config.tvm_target()

    @property
    def relax_pipeline(self):
        """The Relax pipeline to pass to ``tvm.compile(..., relax_pipeline=...)``: TVM's default
        for :attr:`target`, with two silent errors of TileLang's TVM kept out
        (:func:`tessera_tvm.relax.build.relax_pipeline`)."""
        from .build import relax_pipeline

        return relax_pipeline(self.config)

    @property
    def kernels(self) -> list[str]:
        """Names of the Tessera kernels (PrimFuncs) in the module, each once."""
        return sorted({o.kernel for o in self.offloaded})

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.name,
            "tir_pipeline": self.tir_pipeline,
            "offloaded": [
                {
                    "function": o.function,
                    "binding": o.binding,
                    "kernel": o.kernel,
                    "ops": o.ops,
                    "family": o.family,
                    "dynamic": dict(o.dynamic),
                    "packed_weight": o.packed_weight,
                }
                for o in self.offloaded
            ],
            "not_offloaded": [vars(n) for n in self.not_offloaded],
            "rebuilt": dict(self.rebuilt),
            "fixed": dict(self.fixed),
            "folded": dict(self.folded),
            "checked": dict(self.checked),
        }

    def __str__(self) -> str:
        lines = [
            f"Tessera offload for config {self.config.name!r} (tir_pipeline={self.tir_pipeline!r}): "
            f"{len(self.offloaded)} call(s) on {len(self.kernels)} Tessera kernel(s), "
            f"{len(self.not_offloaded)} operator call(s) left to TVM"
        ]
        rebuilt = ", ".join(f"{n} {op}" for op, n in self.rebuilt.items() if n)
        if rebuilt:
            lines.append(f"  rebuilt from the ops torch decomposes them into: {rebuilt}")
        fixed = ", ".join(f"{n} {what}" for what, n in self.fixed.items() if n)
        if fixed:
            lines.append(f"  put right from what TVM's import got wrong: {fixed}")
        folded = ", ".join(f"{n} {op}" for op, n in self.folded.items() if n)
        if folded:
            lines.append(f"  folded into the convolution before them: {folded}")
        checked = ", ".join(f"{n} {op}" for op, n in self.checked.items() if n)
        if checked:
            lines.append(f"  indices checked at run time: {checked}")
        width = max([len(f"{r.function}.{r.binding}") for r in [*self.offloaded, *self.not_offloaded]] + [8])
        for o in self.offloaded:
            dynamic = ", ".join(f"{d} ~ {v}" for d, v in o.dynamic.items())
            scheduled = f"  (dynamic {dynamic}: scheduled for that size)" if dynamic else ""
            packed = "  (weight packed ahead)" if o.packed_weight else ""
            lines.append(
                f"  Tessera  {o.function + '.' + o.binding:<{width}}  {o.ops:<24} -> {o.kernel}{scheduled}{packed}"
            )
        for n in self.not_offloaded:
            lines.append(f"  TVM      {n.function + '.' + n.binding:<{width}}  {n.op:<24} {n.reason}")
        return "\n".join(lines)


def partition_for_tessera(
    mod,
    config: TargetConfig | str,
    *,
    functions: list[str] | None = None,
    dim_hints: dict[str, int] | None = None,
    pack_weights: bool = True,
):
    """Offload matmul(+epilogue), attention, softmax, layer_norm and rms_norm to Tessera kernels.

    ``config`` is a config name (``"cpu"``, ``"hopper"``, ...) or a TargetConfig/YAML path; it is
    loaded and checked first, so a bad config fails before any work. ``functions`` limits the
    Relax functions considered (default: all). Symbolic dims (a dynamic batch) stay symbolic in the
    kernels that loop over them; ``dim_hints`` gives the value each is expected to take (by the
    Relax name, e.g. ``{"s0": 8}``, default 64), for which the kernel's schedule is chosen. A GEMM
    whose B is a constant (a linear's weight) takes it packed now, in the layout its kernel reads
    (the CPU: the micro-kernel's panels, not packed again at every call); ``pack_weights=False``
    keeps the constants as they are. Returns
    ``(module, OffloadReport)``; compile the module with ``tvm.compile(mod, report.target,
    relax_pipeline=report.relax_pipeline, tir_pipeline=report.tir_pipeline)``.
    """
    config = load_config(config)
    check_supported(config)
    dim_hints = _checked_hints(dim_hints)
    name = pipeline_name(config)
    if not isinstance(mod, tvm.IRModule):
        raise TesseraError(f"partition_for_tessera takes a tvm.IRModule of Relax functions, found {type(mod).__name__}")
    _refuse_legalized(mod)
    mod, fixed = fix_imported(mod)
    mod, folded_norms = fold_batch_norms(mod)
    mod, _ = fold_constant_slices(mod)  # a part of a weight (one expert's of several) read as a constant
    rebuilt = {}
    plans = _plans_kernel(config, dim_hints)

    def attention(mod):  # as SDPA's decomposition and HF's eager attention write it, then with ALiBi too
        mod, plain = recover_attention(mod, takes=plans)
        mod, scored = recover_scored_attention(mod, takes=plans)
        return mod, plain + scored

    steps = (
        ("silu", recover_silu),
        ("gelu_tanh", recover_gelu_tanh),
        ("rms_norm", recover_rms_norm),
        ("attention", attention),
    )
    for op, rebuild in steps:
        mod, rebuilt[op] = rebuild(mod)
    mod, fixed[HALF] = half_ops_in_float32(mod)  # after the rebuilds: they read the ops as imported
    mod, _ = sink_reshapes(mod)
    log = MatchLog()

    def composite_attrs(_annotations) -> dict[str, str]:  # the name of the binding a kernel replaces
        return {BINDING_ATTR: log.last_accepted}

    # FuseOpsByPattern rewrites the module once per pattern (354 of them, most GEMM epilogue chains):
    # a pattern that needs an op the module never calls cannot match, so it is left out.
    present = ops_in(mod)
    patterns = [
        p for p in tessera_patterns(config, log, composite_attrs, dim_hints) if required_ops(p.pattern) <= present
    ]
    fuse = relax.transform.FuseOpsByPattern(
        patterns,
        bind_constants=False,
        annotate_codegen=False,
        entry_functions=functions,
    )
    fused = fuse(mod)
    report = OffloadReport(config, name, rebuilt=rebuilt, fixed=fixed, folded={"batch_norm": folded_norms})
    rewriter = _Offloader(fused, config, report, log, dim_hints, pack_weights=pack_weights)
    for gv, func in list(fused.functions.items()):
        if isinstance(func, relax.Function) and not _is_composite(func):
            rewriter.current = str(gv.name_hint)
            considered = functions is None or rewriter.current in functions
            rewriter.trees = elementwise_trees(func) if considered else {}
            new = rewriter.visit_expr(func)
            if rewriter.trees:  # the inner bindings of the trees now offloaded are dead
                new = relax.analysis.remove_all_unused(new)
            rewriter.builder_.update_func(gv, new)
    out = rewriter.builder_.get()
    out = tvm.IRModule(
        {gv: f for gv, f in out.functions.items() if not (isinstance(f, relax.Function) and _is_composite(f))},
        attrs=out.attrs,
    )
    _list_left_to_tvm(out, report, log, rewriter.layout_bindings, functions)
    out, report.fixed[NAN_EXTREMA] = nan_propagating_extrema(out)  # of the ops left to TVM
    out, report.fixed[NAN_ORDER] = nan_ordered_sorts(out)
    out, report.checked = check_indices(out, gpu=not backend_for(config).kernels_in_host)
    if not relax.analysis.well_formed(out):
        raise TesseraError("partition_for_tessera produced a malformed module (a bug): please report it")
    return out, report


def _plans_kernel(config: TargetConfig, dim_hints: dict[str, int]):
    """Whether Tessera builds a kernel for an attention ``call`` (on Vars) on ``config``."""

    def plans(call) -> bool:
        try:
            plan_kernel(
                "attention", [node_of(relax.Var("attention", call.struct_info), call)], config, dim_hints=dim_hints
            )
        except TesseraError:  # OffloadRejected included
            return False
        return True

    return plans


def _checked_hints(dim_hints) -> dict[str, int]:
    if dim_hints is None:
        return {}
    if not isinstance(dim_hints, dict):
        raise TesseraError(f"dim_hints is {dim_hints!r}; expected a dict of symbolic dim name -> positive int")
    for name, value in dim_hints.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise TesseraError(f"dim_hints[{name!r}] is {value!r}; expected a positive int for symbolic dim {name!r}")
    return dict(dim_hints)


#: Names LegalizeOps gives the PrimFuncs of the operators Tessera would have offloaded.
_OFFLOADABLE_PRIMFUNC = re.compile(r"^(matmul|attention|softmax|layer_norm|rms_norm|group_norm|dense)")


def _refuse_legalized(mod) -> None:
    """A module LegalizeOps already ran on has no operators left to match, only ``call_tir`` of
    TVM's PrimFuncs: partitioning it would offload nothing. Say so, and where to partition."""
    prim_funcs = {gv for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    legalized: list[str] = []
    high_level = 0

    def visit(node):
        nonlocal high_level
        if not isinstance(node, relax.Call) or not isinstance(node.op, tvm.ir.Op):
            return
        if node.op.name == "relax.call_tir" and node.args[0] in prim_funcs:
            name = str(node.args[0].name_hint)
            if _OFFLOADABLE_PRIMFUNC.match(name) and not is_tessera_kernel(mod[node.args[0]]):
                legalized.append(name)
        elif node.op.name.startswith(("relax.matmul", "relax.nn.", "relax.linear")):
            high_level += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    if legalized and not high_level:
        shown = ", ".join(sorted(set(legalized))[:4])
        raise TesseraError(
            f"this module was already legalized (LegalizeOps turned its operators into R.call_tir of TVM PrimFuncs: "
            f"{shown}), so Tessera has nothing to offload. Call partition_for_tessera on the module as imported, "
            "before relax.transform.LegalizeOps or tvm.compile's pipeline"
        )


def _with_scalar_constants(func, args):
    """``func`` (a composite function) with the scalar constants its call passes bound in: FuseOpsByPattern
    (bind_constants=False) makes every constant a parameter, and an epilogue's scale or a quick GELU's
    1.702 must be a number when the kernel is planned."""
    scalars = {
        p: a for p, a in zip(func.params, args, strict=True) if isinstance(a, relax.Constant) and not a.data.shape
    }
    return func.bind_params(scalars) if scalars else func


def _is_composite(func) -> bool:
    return (
        func.attrs is not None
        and "Composite" in func.attrs
        and str(func.attrs["Composite"]).startswith(_COMPOSITE_PREFIX)
    )


@relax.expr_functor.mutator
class _Offloader(relax.PyExprMutator):
    """Rewrites each call of a Tessera composite function into ``R.call_tir`` of its tile program."""

    def __init__(
        self, mod, config: TargetConfig, report: OffloadReport, log: MatchLog, dim_hints=None, *, pack_weights=True
    ) -> None:
        super().__init__(mod)
        self.pack_weights = pack_weights
        self.packed: dict[tuple, Any] = {}  # (weight constant, panels, transposed) -> the packed constant
        self.dim_hints = dim_hints or {}
        self.kernel_vars: dict[str, Any] = {}  # symbolic dim name -> its int32 kernel dim (one per name)
        self.mod_ = mod
        self.config = config
        self.report = report
        self.log = log
        self.current = ""
        self.built: dict[Any, tuple[Any, KernelPlan] | OffloadRejected] = {}  # composite GlobalVar -> kernel
        self.by_spec: dict[tuple, Any] = {}  # (spec, schedule) -> kernel GlobalVar (one PrimFunc per kernel)
        self.names: set[str] = {str(gv.name_hint) for gv in mod.get_global_vars()}
        self.binding = ""
        # permutes around [B, S, H, D] attention kernels, reshapes around conv1d kernels -> the report's reason
        self.layout_bindings: dict[str, str] = {}
        self.trees: dict[Any, list] = {}  # root var -> the element-wise tree it computes (relax/elementwise.py)
        self.tree = None  # the tree of the binding being visited

    def visit_var_binding_(self, binding) -> None:
        self.binding = str(binding.var.name_hint)
        self.tree = self.trees.get(binding.var)
        super().visit_var_binding_(binding)

    def visit_call_(self, call):
        tree, self.tree = self.tree, None
        if tree is not None:  # the root of an element-wise tree: one kernel for the whole tree
            kernel = self._elementwise(tree)
            if kernel is not None:
                return kernel
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.GlobalVar):
            return call
        func = self.mod_[call.op] if call.op in self.mod_.get_global_vars() else None
        if func is None or not isinstance(func, relax.Function) or not _is_composite(func):
            return call
        arguments = dict(zip(func.params, call.args, strict=True))
        kernel = self._kernel(call.op, _with_scalar_constants(func, call.args), arguments)
        if isinstance(kernel, OffloadRejected):
            return self._inline(func, call.args)
        gv, plan = kernel
        binding = str(func.attrs.get(BINDING_ATTR, "")) or self.binding
        params = list(func.params)
        inputs = [call.args[params.index(v)] if v in params else v for v in plan.inputs]
        out = plan.spec.outputs()[0]
        sinfo = relax.TensorStructInfo(_relax_shape(out.shape, inputs), out.dtype)
        if plan.layout == "bshd":  # the kernel reads [B, H, S, D]; TVM transposes around it (not the bias)
            inputs = [
                self.builder_.emit(relax.op.permute_dims(x, [0, 2, 1, 3]), name_hint=f"{binding}_{t}_bhsd")
                for x, t in zip(inputs[:3], "qkv", strict=True)
            ] + inputs[3:]
            result = self.builder_.emit(relax.call_tir(gv, inputs, sinfo), name_hint=f"{binding}_bhsd")
            result = self.builder_.emit(relax.op.permute_dims(result, [0, 2, 1, 3]), name_hint=f"{binding}_bshd")
            self.layout_bindings.update({str(v.name_hint): _BSHD_REASON for v in [*inputs[:3], result]})
        elif plan.layout == "ncw":  # a conv1d: the kernel reads [N, C, 1, W] (the same bytes); TVM reshapes
            declared = [_relax_shape(a.shape, inputs) for a in plan.spec.inputs()]
            views = [
                relax.const(x.data.numpy().reshape([int(d) for d in shape]))  # a weight: reshaped here
                if isinstance(x, relax.Constant)
                else self.builder_.emit(relax.op.reshape(x, shape), name_hint=f"{binding}_in{i}_nc1w")
                for i, (x, shape) in enumerate(zip(inputs, declared, strict=True))
            ]
            result = self.builder_.emit(relax.call_tir(gv, views, sinfo), name_hint=f"{binding}_nc1w")
            ncw = [d for i, d in enumerate(sinfo.shape.values) if i != 2]
            result = self.builder_.emit(relax.op.reshape(result, ncw), name_hint=f"{binding}_ncw")
            self.layout_bindings.update(
                {str(v.name_hint): _NCW_REASON for v in [*views, result] if isinstance(v, relax.Var)}
            )
        else:
            result = self._as_declared(relax.call_tir(gv, inputs, sinfo), sinfo, call.struct_info, binding)
        self.report.offloaded.append(
            Offloaded(self.current, binding, str(gv.name_hint), plan.name, plan.spec, dict(plan.hints))
        )
        return result

    def _as_declared(self, result, sinfo, declared, binding: str):
        """``result`` reshaped to the rank the replaced call had: a kernel's output has at least one
        dim, so a reduction to a scalar (``x.sum()``) comes back [1] and is given back its shape ()."""
        shape = getattr(declared, "shape", None)
        if not isinstance(declared, relax.TensorStructInfo) or not isinstance(shape, relax.ShapeExpr):
            return result
        if len(shape.values) == len(sinfo.shape.values):
            return result
        kernel = self.builder_.emit(result, name_hint=f"{binding}_kernel")
        view = self.builder_.emit(relax.op.reshape(kernel, shape), name_hint=f"{binding}_scalar")
        self.layout_bindings[str(view.name_hint)] = _SCALAR_REASON
        return view

    def _elementwise(self, nodes):
        """The call of one element-wise kernel computing ``nodes`` (None: TVM keeps them)."""
        try:
            gv, plan = self._planned("elementwise", nodes)
        except TesseraError as exc:  # OffloadRejected included
            self.log.record(nodes[-1].var, f"element-wise, no kernel: {exc}")
            return None
        inputs = [self.visit_expr(x) for x in plan.inputs]
        out = plan.spec.outputs()[0]
        sinfo = relax.TensorStructInfo(_relax_shape(out.shape, inputs), out.dtype)
        self.report.offloaded.append(
            Offloaded(self.current, self.binding, str(gv.name_hint), plan.name, plan.spec, dict(plan.hints))
        )
        return self._as_declared(relax.call_tir(gv, inputs, sinfo), sinfo, nodes[-1].var.struct_info, self.binding)

    def _planned(self, family: str, nodes, arguments: dict | None = None) -> tuple[Any, KernelPlan]:
        """The kernel PrimFunc of ``nodes`` (one per spec and schedule) and its plan; raises
        OffloadRejected (or another TesseraError) when Tessera cannot build it. ``arguments``: what
        the call passes for the composite's parameters (a constant weight is packed ahead)."""
        plan = plan_kernel(family, nodes, self.config, kernel_vars=self.kernel_vars, dim_hints=self.dim_hints)
        plan = self._with_packed_weight(plan, arguments or {})
        key = (plan.spec, plan.schedule)
        if key not in self.by_spec:
            try:
                self.by_spec[key] = self._add_tile_program(plan)
            except OffloadRejected as exc:
                self.by_spec[key] = exc
        if isinstance(self.by_spec[key], OffloadRejected):
            raise self.by_spec[key]
        return self.by_spec[key], plan

    def _with_packed_weight(self, plan: KernelPlan, arguments: dict) -> KernelPlan:
        """``plan`` with its B packed ahead where it is a constant the kernel can take packed
        (``planner.with_packed_b``): the spec says so, and the input is the packed constant."""
        if not self.pack_weights or not isinstance(plan.spec, GemmSpec):
            return plan
        weight = arguments.get(plan.inputs[1], plan.inputs[1])
        if not isinstance(weight, relax.Constant):
            return plan
        spec = planner.with_packed_b(plan.spec, plan.schedule, self.config)
        if spec is None:
            return plan
        key = (weight, spec.packed_b, plan.spec.transpose_b)
        if key not in self.packed:  # a weight two calls share is packed once
            packed = spec.packed_b.pack(weight.data.numpy(), transposed=plan.spec.transpose_b)
            self.packed[key] = relax.const(packed)
        return dataclasses.replace(plan, spec=spec, inputs=(plan.inputs[0], self.packed[key], *plan.inputs[2:]))

    def _kernel(self, composite_gv, func, arguments: dict):
        if composite_gv in self.built:
            return self.built[composite_gv]
        family = str(func.attrs["Composite"])[len(_COMPOSITE_PREFIX) :]
        flat = flatten(func, str(composite_gv.name_hint))
        try:
            result: tuple[Any, KernelPlan] | OffloadRejected = self._planned(family, flat.nodes, arguments)
        except OffloadRejected as exc:
            result = exc
        except TesseraError as exc:  # the tile generator refused: keep TVM's operators
            result = OffloadRejected(f"no tile program: {exc}")
        if isinstance(result, OffloadRejected):  # _inline re-emits the anchor under the same name
            anchor = next(n for n in flat.nodes if f"relax.{n.op}" in ANCHORS)
            self.log.record(anchor.var, str(result))
            if anchor.var.same_as(flat.outputs[0]):  # the composite's output: _inline names it as the user did
                self.log.by_name[str(func.attrs.get(BINDING_ATTR, ""))] = str(result)
        self.built[composite_gv] = result
        return result

    def _add_tile_program(self, plan: KernelPlan):
        base = "tessera_" + "_".join(plan.name.replace(" + ", " ").split())
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        prim, held = planner.tile_program(plan.spec, plan.schedule, self.config, name)
        if held != plan.spec:  # the call passes the Relax tensors as they are
            raise OffloadRejected(f"{self.config.name}'s kernels hold {plan.spec.family} parameters in other dtypes")
        try:  # lower now: a kernel the pipeline cannot lower stays with TVM (tvm.compile reuses the result)
            lower(prim, self.config, build=False)
        except TesseraError as exc:
            lines = str(exc).splitlines()
            raise OffloadRejected(f"lowering failed: {' '.join(lines[:1] + lines[-1:])}") from None
        self.names.add(name)
        prim = prim.with_attrs(
            {
                KERNEL_ATTR: plan.family,
                CONFIG_ATTR: self.config.name,
                FINGERPRINT_ATTR: self.config.fingerprint(),
                **RELAX_ATTRS,
            }
        )
        return self.builder_.add_func(prim, name)

    def _inline(self, func, args):
        """The composite's operators again, in place of the call (its kernel could not be built)."""
        subst = dict(zip(func.params, args, strict=True))
        flat = flatten(func, "composite")
        output_name = str(func.attrs.get(BINDING_ATTR, ""))
        value = None
        for node in flat.nodes:
            name = output_name if output_name and node.var.same_as(flat.outputs[0]) else node.name
            value = self.builder_.emit(call_with(node, [subst.get(a, a) for a in node.args]), name_hint=name)
            subst[node.var] = value
        return subst.get(flat.outputs[0], value)


_BSHD_REASON = "layout change [B, S, H, D] <-> [B, H, S, D] around a Tessera attention kernel"
_SCALAR_REASON = "view [1] -> () of a Tessera kernel's result (a kernel's output has at least one dim)"
_NCW_REASON = "view [N, C, W] <-> [N, C, 1, W] around a Tessera conv1d kernel (a conv2d of height 1)"


def _relax_shape(shape, inputs) -> list:
    """A kernel's output ``shape`` in the caller's terms: each symbolic kernel dim becomes the Relax
    dim of that name in the inputs' shapes (the call binds it from them)."""
    by_name = {}
    for x in inputs:
        sinfo = x.struct_info
        if isinstance(sinfo, relax.TensorStructInfo) and sinfo.shape is not None:
            by_name.update({kernel_dim_name(d): d for d in sinfo.shape.values if not isinstance(d, tvm.tirx.IntImm)})
    return [by_name[str(d.name)] if isinstance(d, tvm.tirx.Var) else d for d in shape]


def _op_name(call) -> str:
    name = str(call.op.name)
    return name[len("relax.") :] if name.startswith("relax.") else name


def _why_not(op: str) -> str:
    return next((reason for reason, ops in _KINDS.items() if op in ops), "no Tessera kernel")


def _list_left_to_tvm(
    mod, report: OffloadReport, log: MatchLog, layout_bindings: dict[str, str], functions: list[str] | None
) -> None:
    tessera = set(report.kernels)
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        considered = functions is None or str(gv.name_hint) in functions
        for binding in _var_bindings(func):
            value = binding.value
            if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
                continue
            op = _op_name(value)
            if op == "call_tir" and str(value.args[0].name_hint) in tessera:
                continue
            anchor = f"relax.{op}" in ANCHORS
            reason = (log.reason(binding.var) if anchor else None) or _why_not(op)
            if op in ("permute_dims", "reshape") and str(binding.var.name_hint) in layout_bindings:
                reason = layout_bindings[str(binding.var.name_hint)]
            if not considered:
                reason = f"not considered: partition_for_tessera(functions={functions}) leaves {gv.name_hint} out"
            if anchor and reason == "no Tessera kernel":
                reason = "no Tessera pattern matched this use"
            if op.startswith("nn.attention") and _grouped_heads(value):
                reason += f". {GQA_WARNING}"
                warnings.warn(f"{gv.name_hint}.{binding.var.name_hint}: {GQA_WARNING}", stacklevel=3)
            report.not_offloaded.append(LeftToTVM(str(gv.name_hint), str(binding.var.name_hint), f"R.{op}", reason))


#: What a grouped-query attention left to TVM computes (TVM's lowering of R.nn.attention, measured).
GQA_WARNING = (
    "WARNING: this attention has fewer KV heads than query heads, and TVM's own lowering pairs query "
    "head h with KV head h % H_kv where torch (and Tessera) use h // (H / H_kv): its results will "
    "differ from torch's"
)


def _grouped_heads(call) -> bool:
    """Whether ``R.nn.attention`` ``call`` ([B, S, H, D] operands) has fewer KV heads than query heads."""
    q, k = call.args[0], call.args[1]
    try:
        return int(q.struct_info.shape.values[2]) != int(k.struct_info.shape.values[2])
    except (AttributeError, IndexError, TypeError):
        return False


def _var_bindings(func) -> list:
    out: list = []

    def visit(expr) -> None:
        if isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                for binding in block.bindings:
                    if isinstance(binding, relax.VarBinding):
                        out.append(binding)
                        if isinstance(binding.value, relax.SeqExpr | relax.If):
                            visit(binding.value)
            visit(expr.body)
        elif isinstance(expr, relax.If):
            visit(expr.true_branch)
            visit(expr.false_branch)

    visit(func.body)
    return out
