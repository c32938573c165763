"""What Tessera offloads from a Relax module: dataflow patterns (``relax.dpl``) and their checks.

Each pattern is a ``FusionPattern`` named ``tessera.<family>`` for ``FuseOpsByPattern``:

    tessera.gemm        R.matmul, operands optionally transposed (permute_dims of the last two axes),
                        then an epilogue chain: [astype] [add bias|residual] [activation or clip]
                        [add bias|residual] [astype]; activations are the GEMM epilogue's
    tessera.conv2d      R.nn.conv2d (NCHW/OIHW), then [astype] [add bias] [add residual] [activation or
                        clip] [add] [astype]; R.nn.conv1d (NCW/OIW) likewise, as the conv2d kernel of height 1
    tessera.pool2d      R.nn.max_pool2d / R.nn.avg_pool2d (NCHW) [+ astype]
    tessera.attention   R.nn.attention or R.nn.attention_bias (no window), [B, S, H, D]; or Tessera's
                        own form, permute_dims to [B, H, S, D] around it, whose permutes join the
                        kernel; a bias ([B|1, H|1, S_q|1, S_kv], torch SDPA's float attn_mask) is the
                        kernel's fourth input
    tessera.softmax     R.nn.softmax [+ astype]
    tessera.norm        R.nn.layer_norm / R.nn.rms_norm over the last axis [+ astype]
    tessera.reduce      R.sum / R.mean / R.max of a float tensor over consecutive axes [+ astype]
                        (a CNN's global average pooling)

Longer patterns come first (FuseOpsByPattern takes the first that matches and passes its check). A
check accepts a match only when Tessera can build the kernel for the config: symbolic dims only where
the tile program loops over them (a dynamic batch), dtypes
the target holds, a tile spec that validates and a schedule that fits. Every rejection is recorded
with its reason, so the offload report can say why an operator stayed with TVM.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import op_table, planner
from .._tvm import tvm
from ..config import TargetConfig
from ..errors import TesseraError
from ..graph.fusion import EPILOGUE_ACTIVATIONS, KernelGroup, swish_motif, swish_shape
from ..graph.kernels import KernelBinding, kernel_spec
from ..graph.nodes import Node, clip_bounds, kernel_dim_name, node_of
from ..target.backend import backend_for
from ..tile import (
    AttentionSpec,
    Conv2dSpec,
    ElementwiseSpec,
    GemmSpec,
    KernelSpec,
    Pool2dSpec,
    TileSchedule,
)
from ..tile import base as tile_base
from ..tile.expr import Binary, Input, Unary

relax = tvm.relax
tir = tvm.tirx

#: Relax ops a Tessera kernel is built around (the report explains each one that stays with TVM).
ANCHORS = {f"relax.{relax}": op.name for op in op_table.ANCHORS for relax in op.relax}

#: The GEMM epilogue grammar; every sub-sequence (in this order) is a pattern.
_EPILOGUE = ("cast", "add", "act", "mul", "add", "cast")  # mul: a gate of the output's shape (SwiGLU)
#: A half-precision linear imports as an f32 product plus an f32 bias, rounded to f16/bf16 before
#: its activation or residual (as torch rounds it): the epilogue takes that cast too.
_HALF_LINEAR_CHAINS = (("add", "cast", "act"), ("add", "cast", "add"), ("add", "cast", "act", "add"))
#: ... or without a bias, its activation computed in float32 between two casts (LLaMA's SiLU in bf16).
_HALF_ACTIVATION_CHAINS = (("cast", "cast", "act", "cast"), ("add", "cast", "cast", "act", "cast"))
#: A convolution's: its bias (or a folded batch norm's), a residual, then the activation (ResNet).
_CONV_EPILOGUE = ("cast", "add", "add", "act", "add", "cast")

_BHSD = (0, 2, 1, 3)


class OffloadRejected(TesseraError):
    """A match Tessera cannot build a kernel for; the message is the reason shown in the report."""


# ---------------------------------------------------------------------------------------------
# Patterns
# ---------------------------------------------------------------------------------------------


def _is(op: str):
    return relax.dpl.is_op(op)


def _gemm_pattern(steps: tuple[str, ...], transpose_a: bool, transpose_b: bool):
    wildcard = relax.dpl.wildcard
    lhs, rhs = wildcard(), wildcard()
    lhs = _is("relax.permute_dims")(lhs) if transpose_a else lhs
    rhs = _is("relax.permute_dims")(rhs) if transpose_b else rhs
    return _with_epilogue(_is("relax.matmul")(lhs, rhs), steps)


def _conv2d_pattern(steps: tuple[str, ...], op: str = "relax.nn.conv2d"):
    return _with_epilogue(_is(op)(relax.dpl.wildcard(), relax.dpl.wildcard()), steps)


def _with_epilogue(out, steps: tuple[str, ...]):
    """``out`` followed by the epilogue ``steps`` (cast, add, act, mul), each matched as it is spelled."""
    wildcard = relax.dpl.wildcard
    for step in steps:
        if step == "cast":
            out = _is("relax.astype")(out)
        elif step in ("add", "mul"):
            op, other = "relax.add" if step == "add" else "relax.multiply", wildcard()
            out = _is(op)(out, other) | _is(op)(other, out)
        else:  # an activation, or a clip (its bounds are checked: constants)
            acts = [_is(f"relax.{name}")(out) for name in EPILOGUE_ACTIVATIONS]
            acts.append(_is("relax.clip")(out, wildcard(), wildcard()))
            if op_table.swish_motifs():  # x * sigmoid(beta x), x read twice (its beta is checked)
                multiply = _is("relax.multiply")
                gate = _is("relax.sigmoid")(multiply(out, wildcard()) | multiply(wildcard(), out))
                acts.append(multiply(out, gate) | multiply(gate, out))
            out = acts[0]
            for alternative in acts[1:]:
                out = out | alternative
    return out


def _epilogue_chains(
    grammar: tuple[str, ...] = _EPILOGUE, extra: tuple[tuple[str, ...], ...] = ()
) -> list[tuple[str, ...]]:
    """Every order-preserving sub-sequence of the epilogue ``grammar`` and the ``extra`` chains,
    longest first, each once."""
    chains = {
        tuple(s for s, keep in zip(grammar, mask, strict=True) if keep)
        for mask in itertools.product((True, False), repeat=len(grammar))
    }
    return sorted(chains | set(extra), key=lambda c: (-len(c), c))


def _attention_tessera_form(bias: bool):
    """permute_dims around ``R.nn.attention`` (or ``_bias``, whose bias is [B, H, S_q, S_kv] in either form)."""
    q, k, v = (_is("relax.permute_dims")(relax.dpl.wildcard()) for _ in range(3))
    return _is("relax.permute_dims")(_attention_call(bias, q, k, v))


def _attention_call(bias: bool, q, k, v):
    if bias:
        return _is("relax.nn.attention_bias")(q, k, v, relax.dpl.wildcard())
    return _is("relax.nn.attention")(q, k, v)


def _with_cast(pattern):
    return _is("relax.astype")(pattern)


# ---------------------------------------------------------------------------------------------
# Checks: can Tessera build this match for the config? (and why not)
# ---------------------------------------------------------------------------------------------


@dataclass
class MatchLog:
    """What the checks decided: why each anchor operator (by its bound Var) was rejected (the last
    check's reason wins), and the output binding of the match accepted last."""

    by_var: dict[Any, str] = field(default_factory=dict)
    by_name: dict[str, str] = field(default_factory=dict)
    last_accepted: str = ""

    def record(self, var, reason: str) -> None:
        self.by_var[var] = reason
        self.by_name[str(var.name_hint)] = reason

    def reason(self, var) -> str | None:
        return self.by_var.get(var) or self.by_name.get(str(var.name_hint))


def ordered_nodes(bindings) -> list[Node]:
    """The matched bindings as Nodes, producers before consumers.

    Tensor constants (weights bound with BindParams) stand in as Vars of the same type: the composite
    function FuseOpsByPattern makes takes them as parameters (bind_constants=False), and the kernel
    spec names its parameters after Vars.
    """
    pending = {var: value for var, value in bindings.items() if isinstance(value, relax.Call)}
    placeholders: dict[Any, Any] = {}

    def arg(a):
        if isinstance(a, relax.Constant) and a.data.shape:
            if a not in placeholders:
                placeholders[a] = relax.Var(f"const{len(placeholders)}", a.struct_info)
            return placeholders[a]
        return a

    nodes: list[Node] = []
    while pending:
        ready = [
            var
            for var, value in pending.items()
            if not any(isinstance(a, relax.Var) and a in pending for a in value.args)
        ]
        if not ready:  # a cycle cannot happen in a dataflow block
            raise OffloadRejected("the matched bindings do not form a dataflow chain")
        for var in ready:
            node = node_of(var, pending.pop(var))
            node.args = [arg(a) for a in node.args]
            nodes.append(node)
    return nodes


def _dims(expr) -> list:
    sinfo = expr.struct_info
    if not isinstance(sinfo, relax.TensorStructInfo) or sinfo.shape is None:
        raise OffloadRejected(f"{_name(expr)} has no known shape")
    return list(sinfo.shape.values)


def _name(expr) -> str:
    return str(expr.name_hint) if isinstance(expr, relax.Var) else type(expr).__name__


def _dim_keys(dims) -> list:
    """Dims as comparable values: a static dim its int, a symbolic one its name (one per dim however
    it is spelled: ``2 * s0`` and ``s0 * 2`` compare equal)."""
    return [int(d) if isinstance(d, tir.IntImm) else kernel_dim_name(d) for d in dims]


#: The value a symbolic dim takes where Tessera needs a number (choosing the schedule, checking that
#: it fits): ``partition_for_tessera(..., dim_hints={"batch": 8})`` overrides it per dim.
DEFAULT_DIM_HINT = 64


def _symbols(
    anchor: Node, nodes: list[Node], kernel_vars: dict[str, Any], dim_hints: dict[str, int]
) -> tuple[dict[str, Any], dict[str, int]]:
    """The group's symbolic dims as Tessera kernel dims, and the value each is expected to take.

    Each symbolic dim, a variable (``s0``) or an expression of variables (``s0 * 24``, where a
    reshape flattened the batch into the rows), becomes one int32 ``tirx.Var`` named by
    :func:`kernel_dim_name` (kept in ``kernel_vars``, so equal kernels compare equal) that the kernel
    binds from its buffers' shapes. Its hint is the expression at ``dim_hints`` (DEFAULT_DIM_HINT for
    a variable not given)."""
    exprs = [n.var for n in nodes] + [a for n in nodes for a in n.args if isinstance(a, relax.Var)]
    found: dict[str, Any] = {}
    hints: dict[str, int] = {}
    for e in exprs:
        for d in _dims(e):
            if isinstance(d, tir.IntImm):
                continue
            name = kernel_dim_name(d)
            found[name] = kernel_vars.setdefault(name, tir.Var(name, "int32"))
            values = {
                v: tir.IntImm(v.dtype, dim_hints.get(str(v.name), DEFAULT_DIM_HINT))
                for v in tir.analysis.undefined_vars(d)
            }
            value = tvm.arith.Analyzer().simplify(tir.stmt_functor.substitute(d, values))
            if not isinstance(value, tir.IntImm) or value.value <= 0:
                op = ANCHORS.get(f"relax.{anchor.op}", anchor.op)
                raise OffloadRejected(
                    f"{op} with dynamic dim {d} of {_name(e)}: it has no positive value at {dim_hints}"
                )
            hints[name] = int(value.value)
    return found, hints


def _symbolic_reason(anchor: Node, spec: KernelSpec, config: TargetConfig) -> str | None:
    """Why ``spec`` cannot keep its symbolic dims on ``config`` (None when it can).

    Every tile program takes a symbolic dim where its grid runs over it (a GEMM's M and batch, the
    rows of a row kernel, attention's batch). A backend with ``symbolic_extents`` (the CPU) also
    takes one in the extents its blocks loop over, clamped at the edge: a GEMM's K and N, a reduced
    axis, attention's sequence lengths (a model exported with a dynamic sequence length). No tile
    program takes a symbolic head count or head dim: they size the grid's heads and the tiles."""
    is_sym = tile_base.is_symbolic
    op = ANCHORS.get(f"relax.{anchor.op}", anchor.op)
    extents = backend_for(config).symbolic_extents
    where = f"on config {config.name!r}"  # named where a backend without symbolic_extents refuses
    if isinstance(spec, GemmSpec):
        named = [f"{role} ({spec_dim})" for role, spec_dim in (("K", spec.K), ("N", spec.N)) if is_sym(spec_dim)]
        if named and not extents:
            return f"{op} with dynamic {', '.join(named)}: Tessera's GEMM takes symbolic M and batch dims only {where}"
        return None
    if isinstance(spec, Conv2dSpec | Pool2dSpec):
        return None  # the spec refuses symbolic dims other than the batch itself
    if isinstance(spec, AttentionSpec):
        fixed = ("H", "H_kv", "D") if extents else ("H", "H_kv", "S_q", "S_kv", "D")
        named = [f"{f} ({getattr(spec, f)})" for f in fixed if is_sym(getattr(spec, f))]
        if named:
            takes = "a symbolic batch and sequence lengths" if extents else f"a symbolic batch only {where}"
            return f"{op} with dynamic {', '.join(named)}: Tessera's attention takes {takes}"
        return None
    if extents:
        return None
    axes = getattr(spec, "axis", -1)
    shape = tuple(spec.shape)
    axes = tuple(a % len(shape) for a in (axes if isinstance(axes, tuple) else (axes,)))
    if spec.family == "elementwise":
        axes = (len(shape) - 1,)
    named = [str(shape[a]) for a in axes if is_sym(shape[a])]
    if named:
        return (
            f"{op} over a dynamic axis ({', '.join(named)}): Tessera takes symbolic dims outside the reduced "
            f"axis only {where}"
        )
    return None


def _check_dtypes(nodes: list[Node], config: TargetConfig) -> None:
    unsupported = backend_for(config).relax_unsupported_dtypes  # CPU: what TileLang's C codegen has no type for
    if not unsupported:
        return
    for n in nodes:
        for e in [n.var, *n.args]:
            if isinstance(e, relax.Var) and isinstance(e.struct_info, relax.TensorStructInfo):
                dtype = str(e.struct_info.dtype)
                if dtype in unsupported:
                    raise OffloadRejected(
                        f"{_name(e)} is {dtype}: TileLang's C codegen (the CPU target) has no {dtype} type"
                    )


def swaps_last_two(node: Node) -> bool:
    """``permute_dims`` that transposes the last two axes (no axes on a matrix reverses them)."""
    rank = len(_dims(node.var))
    axes = node.attrs.get("axes")
    if axes is None:
        return rank == 2  # permute_dims without axes reverses them
    return rank >= 2 and tuple(axes) == (*range(rank - 2), rank - 1, rank - 2)


def _check_gemm_group(nodes: list[Node]) -> None:
    by_var = {n.var: n for n in nodes}
    (matmul,) = [n for n in nodes if n.op == "matmul"]
    for arg in matmul.args:
        prod = by_var.get(arg)
        if prod is not None and not swaps_last_two(prod):
            raise OffloadRejected(
                f"{prod.name} = permute_dims{prod.attrs.get('axes')} is not a transpose of the last two axes"
            )
    out = _dim_keys(_dims(matmul.var))
    _check_epilogue_operands(nodes, by_var, matmul, out[-1:], "a GEMM", f"[{out[-1]}]", "bias [N] or residual")


def _check_conv2d_group(nodes: list[Node]) -> None:
    """NCHW x OIHW (a conv1d's NCW x OIW), and epilogue adds of a bias ``[1, O, 1, 1]`` (``[1, O, 1]``)
    or a residual."""
    by_var = {n.var: n for n in nodes}
    (conv,) = [n for n in nodes if n.op in ("nn.conv1d", "nn.conv2d")]
    attrs = conv.attrs
    layouts = (attrs["data_layout"], attrs["kernel_layout"], attrs["out_layout"])
    op, expected = ("conv1d", ("NCW", "OIW", "NCW")) if conv.op == "nn.conv1d" else ("conv2d", ("NCHW", "OIHW", "NCHW"))
    if layouts != expected:
        raise OffloadRejected(
            f"{op} with layouts {'/'.join(layouts)}: Tessera's convolution takes {'/'.join(expected)}"
        )
    channels = _dim_keys(_dims(conv.var))[1]
    bias = [1, channels, *[1] * (len(expected[0]) - 2)]
    bias_text = f"({', '.join(map(str, bias))})"
    _check_epilogue_operands(nodes, by_var, conv, bias, "a convolution's", bias_text, "bias or residual")


def _check_epilogue_operands(nodes, by_var, anchor: Node, bias: list, whose: str, bias_text: str, takes: str) -> None:
    """The epilogue of ``anchor`` (a matmul or conv2d) multiplies by a scale or a gate, and adds a
    tensor of the ``bias`` dims (a GEMM's [N], a convolution's [1, O, 1, 1]) or of the output's."""
    out_dims = _dims(anchor.var)
    out = _dim_keys(out_dims)
    in_motifs = _swish_motif_nodes(nodes, by_var)
    for n in nodes:
        if n.var in in_motifs:
            continue
        if n.op == "clip" and clip_bounds(n) is None:
            raise OffloadRejected(f"{n.name}: clip with bounds that are not constants")
        if n.op == "multiply":
            _check_gate(n, by_var, out_dims)
        if n.op != "add":
            continue
        others = [a for a in n.args if not (isinstance(a, relax.Var) and a in by_var)]
        if len(others) != 1 or not isinstance(others[0], relax.Var):
            raise OffloadRejected(f"{n.name}: an epilogue add takes a tensor ({takes}), found {others}")
        dims = _dim_keys(_dims(others[0]))
        if dims not in (bias, out):
            raise OffloadRejected(
                f"{n.name}: adds {_name(others[0])} of shape {tuple(dims)}; {whose} epilogue adds a bias "
                f"{bias_text} or a residual {tuple(out)}"
            )


def _swish_motif_nodes(nodes, by_var) -> set:
    """The bound Vars of ``x * sigmoid(beta * x)`` activations in ``nodes``; one whose beta is not an
    op-table activation's is refused."""
    found = set()
    for gate in nodes:
        scaled = by_var.get(gate.args[0]) if gate.op == "sigmoid" else None
        outs = [n for n in nodes if n.op == "multiply" and any(a.same_as(gate.var) for a in n.args)]
        if scaled is None or len(outs) != 1:
            continue
        triple = [scaled, gate, outs[0]]
        x = next((a for a in scaled.args if isinstance(a, relax.Var) and a in by_var), None)
        beta = swish_shape(triple, x)
        if beta is None:
            continue
        if swish_motif(triple, x) is None:
            known = ", ".join(f"{op.name}: x * sigmoid({op.swish_beta:g} x)" for op in op_table.swish_motifs())
            raise OffloadRejected(f"{outs[0].name}: x * sigmoid({beta:g} x) is not an epilogue activation ({known})")
        found.update(n.var for n in triple)
    return found


def _check_gate(node: Node, by_var, out_dims) -> None:
    """An epilogue multiply takes a scalar constant (a scale) or a tensor of the output's shape (a gate)."""
    others = [a for a in node.args if not (isinstance(a, relax.Var) and a in by_var)]
    if len(others) == 1 and isinstance(others[0], relax.Constant) and others[0].data.numpy().size == 1:
        return
    if len(others) == 1 and isinstance(others[0], relax.Var):
        dims = _dim_keys(_dims(others[0]))
        if dims == _dim_keys(out_dims):
            return
        raise OffloadRejected(
            f"{node.name}: multiplies by {_name(others[0])} of shape {tuple(dims)}; a GEMM epilogue multiplies by a "
            f"scalar or a gate of the output's shape {tuple(_dim_keys(out_dims))}"
        )
    raise OffloadRejected(f"{node.name}: an epilogue multiply takes a scalar or a tensor, found {others}")


def _check_reduce(node: Node) -> None:
    dtype = str(node.args[0].struct_info.dtype)
    if dtype not in ("float32", "float16", "bfloat16"):
        raise OffloadRejected(f"{node.op} of {dtype}: Tessera's reductions take float tensors (they sum in float32)")
    if len(_dims(node.args[0])) == 0:
        raise OffloadRejected(f"{node.op} of a 0-d tensor")


def _check_norm(node: Node) -> None:
    rank = len(_dims(node.var))
    axes = tuple(int(a) % rank for a in node.attrs.get("axes") or ())
    if axes != (rank - 1,):
        raise OffloadRejected(f"{node.op} over axes {node.attrs.get('axes')}: Tessera normalises the last axis only")
    if node.op == "nn.layer_norm" and not (node.attrs.get("center") and node.attrs.get("scale")):
        raise OffloadRejected("layer_norm with center=False or scale=False: Tessera's kernel applies both")


def attention_spec_bshd(node: Node, dtype_out: str, symbols: dict[str, Any] | None = None) -> KernelSpec:
    """The AttentionSpec of a plain ``R.nn.attention`` on [B, S, H, D] (the kernel reads [B, H, S, D]);
    ``symbols``: the kernel dims of its symbolic dims (:func:`_symbols`)."""

    def dim(x):
        return int(x) if isinstance(x, tir.IntImm) else (symbols or {})[kernel_dim_name(x)]

    q, k = node.args[:2]
    b, s_q, h, d = (dim(x) for x in _dims(q))
    _, s_kv, h_kv, _ = (dim(x) for x in _dims(k))
    mask = node.attrs.get("causal_mask")
    scale = node.attrs.get("scale")
    bias = {}
    if len(node.args) > 3:  # R.nn.attention_bias: [B|1, H|1, S_q|1, S_kv] in either layout
        bias = {"bias": tuple(dim(x) for x in _dims(node.args[3])), "dtype_bias": str(node.args[3].struct_info.dtype)}
    return AttentionSpec(
        b,
        h,
        h_kv,
        s_q,
        s_kv,
        d,
        causal=mask is not None,
        scale=float(scale) if scale is not None else None,
        dtype_in=str(q.struct_info.dtype),
        dtype_out=dtype_out,
        causal_align="bottom_right" if mask == "BottomRight" else "top_left",
        **bias,
    )


def _check_attention(node: Node, nodes: list[Node]) -> None:
    mask = node.attrs.get("causal_mask")
    if mask not in (None, "TopLeft", "BottomRight"):
        raise OffloadRejected(f"attention with causal_mask={mask!r}")
    window = getattr(node.call.attrs, "window_size", None)
    if window is not None:
        raise OffloadRejected("attention with a sliding window: not supported")
    if any(n.op == "permute_dims" and not is_bhsd_swap(n) for n in nodes):
        raise OffloadRejected("attention between permute_dims that are not [B, S, H, D] <-> [B, H, S, D] swaps")
    for arg in node.args[:3]:
        if len(_dims(arg)) != 4:
            raise OffloadRejected(f"attention on rank-{len(_dims(arg))} {_name(arg)}: expected [B, S, H, D]")
    # torch SDPA lets V's head dim differ from Q's and K's (the output has V's); the kernel takes one D.
    # Checked here for both forms: the one between permute_dims built a kernel reading V as [.., D].
    head_dims = [_dim_keys(_dims(arg))[-1] for arg in node.args[:3]]
    if len(set(head_dims)) != 1:
        q_d, k_d, v_d = head_dims
        raise OffloadRejected(f"attention with head dims q={q_d}, k={k_d}, v={v_d}: Tessera's kernel needs one D")
    if len(node.args) > 3:
        _check_attention_bias(node)
    dtypes = {str(a.struct_info.dtype) for a in node.args[:3]}
    if len(dtypes) != 1:
        raise OffloadRejected(f"attention with q, k, v of dtypes {sorted(dtypes)}: expected one dtype")


def _check_attention_bias(node: Node) -> None:
    """The bias of ``R.nn.attention_bias`` is a float [B|1, H|1, S_q|1, S_kv|1] (q, k on [B, S, H, D])."""
    q, k, bias = node.args[0], node.args[1], node.args[3]
    b, s_q, h, _ = _dim_keys(_dims(q))
    dims = _dim_keys(_dims(bias))
    full = (b, h, s_q, _dim_keys(_dims(k))[1])
    if len(dims) != 4 or any(d not in (1, f) for d, f in zip(dims, full, strict=True)):
        found, expected = ", ".join(map(str, dims)), ", ".join(f"{f}|1" for f in full)
        raise OffloadRejected(
            f"attention with a bias {_name(bias)} of shape [{found}]: Tessera's kernel takes a bias "
            f"[B, H, S_q, S_kv] = [{expected}], a dim 1 where it is broadcast"
        )
    dtype = str(bias.struct_info.dtype)
    if not dtype.startswith(("float", "bfloat")):
        raise OffloadRejected(f"attention with a bias {_name(bias)} of {dtype}: an additive bias is a float tensor")


@dataclass(frozen=True)
class KernelPlan:
    """What a match becomes: the spec, its schedule, and the Relax values feeding the spec's inputs."""

    family: str
    name: str  # the ops, e.g. "matmul + add + gelu"
    spec: KernelSpec
    schedule: TileSchedule
    inputs: tuple[Any, ...]  # Relax exprs, in spec.inputs() order
    layout: str = ""  # "bshd": the kernel reads [B, H, S, D]; the caller transposes around it. "ncw": a
    # conv1d's kernel reads its [N, C, W] tensors as [N, C, 1, W] (the spec's shapes); the caller reshapes
    hints: tuple[tuple[str, int], ...] = ()  # symbolic dim -> the value its schedule was chosen for


def plan_kernel(
    family: str,
    nodes: list[Node],
    config: TargetConfig,
    *,
    kernel_vars: dict[str, Any] | None = None,
    dim_hints: dict[str, int] | None = None,
) -> KernelPlan:
    """The kernel Tessera builds for ``nodes`` (one fused group) on ``config``; raises OffloadRejected.

    Symbolic dims (a model exported with a dynamic batch) stay symbolic in the spec where the tile
    program loops over them (:func:`_symbolic_reason`); the schedule is chosen and checked for the
    dim's hint (``dim_hints``, else DEFAULT_DIM_HINT). ``kernel_vars`` keeps one kernel dim per name
    across calls, so the kernels of equal groups are one PrimFunc."""
    anchor = next((n for n in nodes if f"relax.{n.op}" in ANCHORS), nodes[-1])  # element-wise: the root
    if anchor.op == "matmul" and any(len(_dims(a)) < 2 for a in anchor.args):
        raise OffloadRejected("matmul of a rank-1 operand (a matrix-vector product): Tessera's GEMM needs rank >= 2")
    symbols, hints = _symbols(anchor, nodes, {} if kernel_vars is None else kernel_vars, dim_hints or {})
    _check_dtypes(nodes, config)
    group = KernelGroup(family, list(nodes))
    layout = ""
    try:
        if family == "gemm":
            _check_gemm_group(nodes)
        elif family == "conv2d":
            _check_conv2d_group(nodes)
        elif family == "norm":
            _check_norm(anchor)
        elif family == "attention":
            _check_attention(anchor, nodes)
        elif family == "reduce":
            _check_reduce(anchor)
        if family == "attention" and nodes[0].op != "permute_dims":  # plain [B, S, H, D] attention
            out_dtype = str(nodes[-1].var.struct_info.dtype)
            spec = attention_spec_bshd(anchor, out_dtype, symbols)
            binding = KernelBinding("attention", spec, (*anchor.args, nodes[-1].var))  # Q, K, V[, bias]
            layout = "bshd"
        else:
            binding = kernel_spec(group, symbols, tensor_constants=True)
            spec = binding.spec
            layout = "ncw" if anchor.op == "nn.conv1d" else ""  # the kernel reads [N, C, 1, W]
        reason = _symbolic_reason(anchor, spec, config) if symbols else None
        if reason:
            raise OffloadRejected(reason)
        backend = backend_for(config)
        if spec.family not in backend.tile_programs:  # a family only some targets build (conv2d: the CPU)
            raise OffloadRejected(
                f"{ANCHORS.get(f'relax.{anchor.op}', anchor.op)}: Tessera has no {backend.title} {spec.family} kernel "
                f"yet (config {config.name!r})"
            )
        if isinstance(spec, GemmSpec) and spec.dtype_acc in ("float16", "bfloat16"):
            # Relax's f16 matmul (out_dtype void) accumulates in f16; Tessera accumulates in f32 and rounds once.
            spec = dataclasses.replace(spec, dtype_acc="float32")
        spec = canonical_names(spec)
        schedule = planner.schedule_for(spec, config, hints=hints if symbols else None)
    except OffloadRejected:
        raise
    except TesseraError as exc:
        raise OffloadRejected(str(exc)) from None
    return KernelPlan(group.family, group.describe(), spec, schedule, binding.inputs, layout, tuple(hints.items()))


def canonical_names(spec: KernelSpec) -> KernelSpec:
    """``spec`` with its parameters named by role (A, B, bias, C, ...), not by the graph's values.

    Two matches that compute the same thing then have equal specs and share one kernel; the
    parameter order (spec.inputs()) does not change.
    """
    changes: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(spec) if f.name.startswith("name_")}
    if isinstance(spec, GemmSpec):
        renamed: dict[str, str] = {}
        epilogue = []
        for op in spec.epilogue:
            if op.operand is not None:
                if op.operand not in renamed:
                    name, i = op.kind, 1
                    while name in renamed.values():
                        name, i = f"{op.kind}_{i}", i + 1
                    renamed[op.operand] = name
                op = dataclasses.replace(op, operand=renamed[op.operand])
            epilogue.append(op)
        changes["epilogue"] = tuple(epilogue)
    if isinstance(spec, ElementwiseSpec):
        renamed = {arg.name: f"in{i}" for i, arg in enumerate(spec.operands)}
        changes["operands"] = tuple(arg._replace(name=renamed[arg.name]) for arg in spec.operands)
        changes["expr"] = _renamed_inputs(spec.expr, renamed)
    return dataclasses.replace(spec, **changes)


def _renamed_inputs(expr, renamed: dict[str, str]):
    """``expr`` with each ``Input`` renamed by ``renamed``."""
    if isinstance(expr, Input):
        return Input(renamed[expr.name])
    if isinstance(expr, Unary):
        return dataclasses.replace(expr, x=_renamed_inputs(expr.x, renamed))
    if isinstance(expr, Binary):
        return dataclasses.replace(expr, x=_renamed_inputs(expr.x, renamed), y=_renamed_inputs(expr.y, renamed))
    return expr


def make_check(
    family: str, config: TargetConfig, log: MatchLog, dim_hints: dict[str, int] | None = None
) -> Callable[[Any], bool]:
    """The FusionPattern check for ``family`` on ``config`` (records why a match is rejected)."""
    from .._tvm import has_leaking_intermediate_variables

    def check(context) -> bool:
        try:
            nodes = ordered_nodes(context.matched_bindings)
        except OffloadRejected:
            return False
        anchor = next((n for n in nodes if f"relax.{n.op}" in ANCHORS), None)
        if anchor is None:
            return False
        try:
            if has_leaking_intermediate_variables(context):
                raise OffloadRejected("an intermediate value of the fused kernel is used elsewhere")
            plan_kernel(family, nodes, config, dim_hints=dim_hints)
        except OffloadRejected as exc:
            log.record(anchor.var, str(exc))
            return False
        except Exception as exc:  # a check must answer, never raise into FuseOpsByPattern
            log.record(anchor.var, f"{type(exc).__name__}: {exc}")
            return False
        log.last_accepted = str(context.value_to_bound_var[context.matched_expr].name_hint)
        return True

    return check


def tessera_patterns(
    config: TargetConfig,
    log: MatchLog,
    attrs_getter: Callable | None = None,
    dim_hints: dict[str, int] | None = None,
) -> list:
    """Every FusionPattern, highest priority first.

    ``attrs_getter(annotations)`` receives the matched root expression as ``annotations["root"]``
    and returns attributes for the composite function (FuseOpsByPattern calls it right after the
    check accepted the match: partition_for_tessera records ``log.last_accepted``, the name of the
    binding the kernel replaces).
    """

    def fusion_pattern(name, pattern, _annotations, check):
        return relax.transform.FusionPattern(name, pattern, {"root": pattern}, check, attrs_getter)

    patterns = []
    gemm_check = make_check("gemm", config, log, dim_hints)
    for chain in _epilogue_chains(extra=_HALF_LINEAR_CHAINS + _HALF_ACTIVATION_CHAINS):
        for transpose_a, transpose_b in ((True, True), (False, True), (True, False), (False, False)):
            patterns.append(
                fusion_pattern("tessera.gemm", _gemm_pattern(chain, transpose_a, transpose_b), {}, gemm_check)
            )
    conv2d_check = make_check("conv2d", config, log, dim_hints)
    for chain in _epilogue_chains(_CONV_EPILOGUE):
        for op in _relax_ops("conv2d"):  # a conv1d runs as the conv2d kernel of height 1
            patterns.append(fusion_pattern("tessera.conv2d", _conv2d_pattern(chain, op), {}, conv2d_check))
    wildcard = relax.dpl.wildcard
    pool_check = make_check("pool2d", config, log, dim_hints)
    for op in _relax_ops("pool2d"):
        pool = _is(op)(wildcard())
        patterns += [
            fusion_pattern("tessera.pool2d", _with_cast(pool), {}, pool_check),
            fusion_pattern("tessera.pool2d", pool, {}, pool_check),
        ]
    attention_check = make_check("attention", config, log, dim_hints)
    for bias in (False, True):
        patterns.append(fusion_pattern("tessera.attention", _attention_tessera_form(bias), {}, attention_check))
    for bias in (False, True):
        plain = _attention_call(bias, wildcard(), wildcard(), wildcard())
        patterns.append(fusion_pattern("tessera.attention", plain, {}, attention_check))
    # The row kernels: the op on its tensor arguments, with or without a trailing cast.
    for family in ("softmax", "norm", "reduce"):
        check = make_check(family, config, log, dim_hints)
        for op in op_table.anchors(family):
            row = _is(f"relax.{op.relax[0]}")(*(wildcard() for _ in range(op.arity)))
            patterns += [
                fusion_pattern(f"tessera.{family}", _with_cast(row), {}, check),
                fusion_pattern(f"tessera.{family}", row, {}, check),
            ]
    return patterns


def required_ops(pattern) -> frozenset[str]:
    """The Relax ops every expression ``pattern`` matches must contain (an alternative needs only
    what both sides need)."""
    dpl = relax.dpl
    memo: dict[int, frozenset[str]] = {}  # a pattern is a DAG: alternatives share their operands

    def need(node) -> frozenset[str]:
        key = node.__chandle__()
        if key in memo:
            return memo[key]
        if isinstance(node, dpl.CallPattern):
            op = node.op
            own = {op.expr.name} if isinstance(op, dpl.ExprPattern) and isinstance(op.expr, tvm.ir.Op) else set()
            found = frozenset(own).union(*(need(a) for a in node.args or ()))
        elif isinstance(node, dpl.OrPattern):
            found = need(node.left) & need(node.right)
        elif isinstance(node, dpl.AndPattern):
            found = need(node.left) | need(node.right)
        elif isinstance(node, (dpl.AttrPattern, dpl.DataTypePattern, dpl.ShapePattern, dpl.StructInfoPattern)):
            found = need(node.pattern)
        elif isinstance(node, dpl.TuplePattern):
            found = frozenset().union(*(need(f) for f in node.fields))
        elif isinstance(node, dpl.TupleGetItemPattern):
            found = need(node.tuple)
        else:  # a wildcard, a var, a constant, a negation: no op needed
            found = frozenset()
        memo[key] = found
        return found

    return need(pattern)


def ops_in(mod) -> frozenset[str]:
    """The names of the Relax ops that ``mod``'s Relax functions call."""
    found: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, relax.Call) and isinstance(node.op, tvm.ir.Op):
            found.add(node.op.name)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return frozenset(found)


def _relax_ops(family: str) -> tuple[str, ...]:
    """The Relax ops of ``family``'s anchors, as patterns name them (``relax.nn.conv2d``)."""
    return tuple(f"relax.{op}" for op in op_table.relax_ops(family))


def is_bhsd_swap(node: Node) -> bool:
    return node.op == "permute_dims" and tuple(node.attrs.get("axes") or ()) == _BHSD
