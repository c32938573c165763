"""The op table: one definition per op, in every spelling the compiler uses.

An op has six names, and each layer keys on its own: the frontend function (``tessera.ops.gelu``),
the graph builder's op (``"gelu"``), the Relax op (``nn.gelu``, as ``Node.op`` spells it), the tile
name (``gelu_erf``: ``Unary.op``, ``EpilogueOp.kind``, the emitter in ``tile/common.py``), the
fragment of kernel names (``gelu``) and the reference (``tessera.reference.gelu``). The tables
that used to spell them one by one (graph fusion, kernel specs, sharding, tile expressions, the
Relax op set, offload reasons and recovery) are derived from :data:`OPS` here.

Adding an element-wise op: an :class:`OpDef` below, its tile math (``tile/common.py`` ``unary`` or
``binary``), its reference and frontend function (``python/tessera/{reference,ops}.py``) when it has
one, and its tests. ``tests/test_op_table.py`` checks that every op has a reference, a tile
emitter, and on every backend a program or a refusal that names it.

The anchors (:data:`ANCHORS`: matmul, convolutions and pools, softmax, the norms, the reductions,
attention) are the ops a kernel is built around; each :class:`AnchorDef` names its kernel family
(``tile/specs.py`` spec, the backend's ``tile_programs``), its Relax ops, the frontend function and
reference where there is one, the Relax attributes it reads, and how it shards and differentiates.
Fusion's anchors, the Relax patterns' ops, the specs' kinds, sharding's rules, the Relax op set,
the attributes ``graph/nodes.py`` reads and the gradients' refusals derive from it. Adding an
anchor of a family that exists: an entry, its frontend function and reference, its tests; a new
family also needs its spec and tile programs.

This module imports nothing but the standard library, so every layer may read it (the frontend's
functions are named by string, as backend manifests name their hooks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AnchorDef",
    "ANCHORS",
    "ANCHOR_BY_RELAX",
    "anchors",
    "relax_ops",
    "relax_aliases",
    "OpDef",
    "OPS",
    "UNARY",
    "BINARY",
    "CLIP",
    "BY_NAME",
    "BY_RELAX",
    "relax_to_tile",
    "epilogue_activations",
    "short_names",
    "swish_motifs",
    "swish_op",
]


@dataclass(frozen=True)
class OpDef:
    """One element-wise op."""

    #: Tile name: ``Unary``/``Binary`` op, ``EpilogueOp`` kind, ``tile.common`` emitter.
    name: str
    #: 1 (``Unary``) or 2 (``Binary``).
    arity: int
    #: The Relax op as ``Node.op`` spells it (``nn.silu``, ``negative``); patterns add ``relax.``.
    #: None: Relax has no op for it (see ``swish_beta``).
    relax: str | None
    #: :meth:`GraphBuilder.emit`'s op, None when the frontend cannot emit it.
    graph_op: str | None = None
    #: The ``tessera.ops`` function and the keyword arguments that select this op (``gelu`` with
    #: ``approximate="tanh"``); None when the frontend has no such op.
    frontend: str | None = None
    frontend_kwargs: tuple[tuple[str, str], ...] = ()
    #: The ``tessera.reference`` function (called with ``frontend_kwargs``).
    reference: str | None = None
    #: The fragment of kernel names and offload reports, when it is not ``name``.
    short: str | None = None
    #: Relax attributes the op carries (built and read by code, not by a table constructor).
    attrs: tuple[str, ...] = ()
    #: Tessera computes it in element-wise kernels and their fusions (``is_elementwise``); False for
    #: tile ops that nothing in a graph produces yet (abs, log, max, min, pow).
    fuses: bool = True
    #: A GEMM or convolution epilogue activation (Fuser, kernel specs, the Relax patterns).
    epilogue: bool = False
    #: ``sink_reshapes`` moves it in front of a reshape, so that it meets its GEMM.
    sinks_reshape: bool = False
    #: Sharding: ``pointwise`` (a split passes through) or ``linear`` (a partial sum passes too).
    sharding: Literal["pointwise", "linear"] = "pointwise"
    #: The op is ``x * sigmoid(beta * x)`` with this beta, and Relax spells it that way (three
    #: bindings, ``x`` read twice): the epilogue patterns match that motif (quick GELU, beta 1.702).
    swish_beta: float | None = None
    #: Its gradient: Relax's rule (``relax``), or a rule Tessera registers (``rule``: ``relax/autodiff.py``).
    gradient: Literal["relax", "rule"] = "relax"

    @property
    def kernel_name(self) -> str:
        return self.short or self.name


#: Unary ops, in the order the tile layer lists them (``Unary``'s error message).
UNARY: tuple[OpDef, ...] = (
    OpDef("exp", 1, "exp", "exp", "exp", reference="exp", epilogue=True),
    OpDef("tanh", 1, "tanh", "tanh", "tanh", reference="tanh", epilogue=True, sinks_reshape=True),
    OpDef("relu", 1, "nn.relu", "relu", "relu", reference="relu", epilogue=True, sinks_reshape=True),
    OpDef(
        "gelu_erf",
        1,
        "nn.gelu",
        "gelu",
        "gelu",
        reference="gelu",
        short="gelu",
        epilogue=True,
        sinks_reshape=True,
        gradient="rule",
    ),
    OpDef(
        "gelu_tanh",
        1,
        "nn.gelu_tanh",
        "gelu_tanh",
        "gelu",
        frontend_kwargs=(("approximate", "tanh"),),
        reference="gelu",
        epilogue=True,
        sinks_reshape=True,
        gradient="rule",
    ),
    # x * sigmoid(1.702 x) (CLIP's and some ViTs' activation, written by hand: Relax has no op)
    OpDef("gelu_quick", 1, None, epilogue=True, sinks_reshape=True, swish_beta=1.702),
    OpDef("silu", 1, "nn.silu", "silu", "silu", reference="silu", epilogue=True, sinks_reshape=True),
    OpDef("sigmoid", 1, "sigmoid", "sigmoid", "sigmoid", reference="sigmoid", epilogue=True, sinks_reshape=True),
    OpDef("neg", 1, "negative", "negative", "neg", reference="neg", sharding="linear"),
    OpDef("sqrt", 1, "sqrt"),
    OpDef("rsqrt", 1, "rsqrt"),
    OpDef("abs", 1, "abs", fuses=False),
    OpDef("log", 1, "log", fuses=False),
    OpDef("cast", 1, "astype", "astype", "cast", reference="cast", attrs=("dtype",), sharding="linear"),
)

#: Binary ops, in the order the tile layer lists them (``Binary``'s error message).
BINARY: tuple[OpDef, ...] = (
    OpDef("add", 2, "add", "add", "add", reference="add"),
    OpDef("sub", 2, "subtract", "subtract", "sub", reference="sub"),
    OpDef("mul", 2, "multiply", "multiply", "mul", reference="mul"),
    OpDef("div", 2, "divide", "divide", "div", reference="div"),
    OpDef("max", 2, "maximum", fuses=False),
    OpDef("min", 2, "minimum", fuses=False),
    OpDef("pow", 2, "power", fuses=False),
)

#: ``clip(x, lo, hi)``: element-wise with constant bounds (attributes); a kernel computes it with
#: ``max``/``min`` (``max_scalar``/``min_scalar`` in an epilogue), so it has no tile name of its own.
CLIP = OpDef("clip", 1, "clip", "clip", "clip", reference="clip", attrs=("min", "max"))

OPS: tuple[OpDef, ...] = (*UNARY, *BINARY)
BY_NAME: dict[str, OpDef] = {op.name: op for op in OPS}
BY_RELAX: dict[str, OpDef] = {op.relax: op for op in (*OPS, CLIP) if op.relax}


def relax_to_tile(ops: tuple[OpDef, ...]) -> dict[str, str]:
    """Relax op -> tile name, for the ops Tessera computes (``fuses``) that Relax has an op for."""
    return {op.relax: op.name for op in ops if op.fuses and op.relax}


def epilogue_activations() -> tuple[OpDef, ...]:
    """The activations a GEMM or convolution epilogue takes, in table order (with those Relax
    spells as a motif: ``relax`` None)."""
    return tuple(op for op in UNARY if op.epilogue)


def short_names() -> dict[str, str]:
    """Relax op -> its fragment of kernel names, for the ops Tessera computes."""
    return {op.relax: op.kernel_name for op in OPS if op.fuses and op.relax}


def swish_motifs() -> tuple[OpDef, ...]:
    """The epilogue activations Relax spells as ``x * sigmoid(beta * x)``."""
    return tuple(op for op in UNARY if op.swish_beta is not None)


def swish_op(beta: float) -> OpDef | None:
    """The activation ``x * sigmoid(beta * x)`` is for this ``beta`` (to float32's precision), or None."""
    return next((op for op in swish_motifs() if math.isclose(beta, op.swish_beta, rel_tol=1e-6)), None)


@dataclass(frozen=True)
class AnchorDef:
    """One anchor: an op a kernel is built around (a GEMM, a convolution, attention, a row op)."""

    #: Its name in kernel names and offload reports (``KernelGroup.describe``, the Relax report).
    name: str
    #: Its kernel family: ``KernelGroup.family``, the spec's ``family``, the Relax pattern
    #: ``tessera.<family>``, the key of a backend manifest's ``tile_programs``.
    family: str
    #: Its Relax ops as ``Node.op`` spells them (patterns add ``relax.``): the first is the one the
    #: graph passes see, the others are read as it (``nn.attention_bias``: attention with a bias).
    relax: tuple[str, ...]
    #: The tensor arguments of the first Relax op (a layer norm's x, weight and bias: 3).
    arity: int
    #: The spec's ``kind`` in its family (``ReduceSpec``, ``NormSpec``, ``Pool2dSpec``), None where
    #: the family has no kinds.
    kind: str | None = None
    #: :meth:`GraphBuilder.emit`'s op, the ``tessera.ops`` function and the ``tessera.reference``
    #: function; None for the Relax-only anchors (convolutions, pools), which no kernel body writes.
    graph_op: str | None = None
    frontend: str | None = None
    reference: str | None = None
    #: The Relax attributes ``graph/nodes.py`` reads into ``Node.attrs``.
    attrs: tuple[str, ...] = ()
    #: Its sharding rule (``graph/sharding.py``): ``matmul``, ``attention``, ``row`` (a split of a
    #: dim it does not reduce passes through); None: none (a split input is refused).
    sharding: Literal["matmul", "attention", "row"] | None = None
    #: Its gradient (``relax/autodiff.py``): ``relax``: left to Relax's Gradient pass (its rule, TVM's
    #: training decomposition for layer_norm; conv1d has neither and Relax refuses it); ``decompose``:
    #: Tessera decomposes it first; ``none``: ``grad`` refuses it.
    gradient: Literal["relax", "decompose", "none"] = "relax"


_CONV_ATTRS = ("strides", "padding", "dilation", "groups", "data_layout", "kernel_layout", "out_layout", "out_dtype")
_POOL_ATTRS = ("pool_size", "strides", "padding", "dilation", "ceil_mode", "count_include_pad", "layout", "out_layout")

#: The anchors, in the order the specs list their kinds (``ReduceSpec``'s error message: sum, max,
#: mean) and the Relax patterns try them (a conv2d before a conv1d).
ANCHORS: tuple[AnchorDef, ...] = (
    AnchorDef(
        "matmul",
        "gemm",
        ("matmul",),
        arity=2,
        graph_op="matmul",
        frontend="matmul",
        reference="matmul",
        attrs=("out_dtype",),
        sharding="matmul",
    ),
    # Relax-only (a model's CNN layers); a conv1d runs as the conv2d kernel of height 1
    AnchorDef("conv2d", "conv2d", ("nn.conv2d",), arity=2, attrs=_CONV_ATTRS),
    AnchorDef("conv1d", "conv2d", ("nn.conv1d",), arity=2, attrs=_CONV_ATTRS),
    AnchorDef("max_pool2d", "pool2d", ("nn.max_pool2d",), arity=1, kind="max", attrs=_POOL_ATTRS),
    AnchorDef("avg_pool2d", "pool2d", ("nn.avg_pool2d",), arity=1, kind="avg", attrs=_POOL_ATTRS),
    AnchorDef(
        "softmax",
        "softmax",
        ("nn.softmax",),
        arity=1,
        graph_op="softmax",
        frontend="softmax",
        reference="softmax",
        attrs=("axis",),
        sharding="row",
    ),
    AnchorDef(
        "layer_norm",
        "norm",
        ("nn.layer_norm",),
        arity=3,
        kind="layer_norm",
        graph_op="layer_norm",
        frontend="layer_norm",
        reference="layer_norm",
        attrs=("axes", "epsilon", "center", "scale"),
        sharding="row",
    ),
    AnchorDef(
        "rms_norm",
        "norm",
        ("nn.rms_norm",),
        arity=2,
        kind="rms_norm",
        graph_op="rms_norm",
        frontend="rms_norm",
        reference="rms_norm",
        attrs=("axes", "epsilon"),
        sharding="row",
        gradient="decompose",
    ),
    *(
        AnchorDef(
            kind,
            "reduce",
            (kind,),
            arity=1,
            kind=kind,
            graph_op=kind,
            frontend=kind,
            reference=kind,
            attrs=("axis", "keepdims"),
            sharding="row",
            gradient="none" if kind == "max" else "relax",  # Relax has no rule for max
        )
        for kind in ("sum", "max", "mean")
    ),
    AnchorDef(
        "attention",
        "attention",
        ("nn.attention", "nn.attention_bias"),
        arity=3,
        graph_op="attention",
        frontend="flash_attention",
        reference="flash_attention",
        attrs=("scale", "causal_mask"),
        sharding="attention",
        gradient="none",
    ),
)

#: Every Relax op of an anchor (aliases included) -> the anchor.
ANCHOR_BY_RELAX: dict[str, AnchorDef] = {relax: op for op in ANCHORS for relax in op.relax}


def anchors(family: str) -> tuple[AnchorDef, ...]:
    """The anchors of kernel ``family``, in table order."""
    return tuple(op for op in ANCHORS if op.family == family)


def relax_ops(family: str | None = None) -> tuple[str, ...]:
    """The Relax ops of the anchors of ``family`` (every anchor: None) as the graph passes see them
    (``Node.op``: aliases read as their anchor's first op), in table order."""
    return tuple(op.relax[0] for op in ANCHORS if family is None or op.family == family)


def relax_aliases() -> dict[str, str]:
    """Relax op -> the op the graph passes read it as (``nn.attention_bias`` -> ``nn.attention``)."""
    return {alias: op.relax[0] for op in ANCHORS for alias in op.relax[1:]}
