"""The op table (tessera_tvm/op_table.py): every element-wise op has its reference, frontend function,
tile emitter, Relax constructor and, on every backend, a program or a refusal that names it; every
anchor its reference, its kernel family built or refused by name on every backend, and its Relax
form; the tables derived from it say what the table says."""

import inspect

import numpy as np
import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops, reference
from tessera_tvm import op_table
from tessera_tvm._tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.errors import TesseraError
from tessera_tvm.graph import builder, fusion, kernels, nodes, sharding
from tessera_tvm.graph.builder import OPS as GRAPH_OPS
from tessera_tvm.relax import autodiff, interop, offload, patterns, recover
from tessera_tvm.target.backend import backend_for, known_kinds
from tessera_tvm.tile import (
    SPEC_FAMILIES,
    AttentionSpec,
    Binary,
    Conv2dSpec,
    ElementwiseSpec,
    EpilogueOp,
    GemmSpec,
    Input,
    NormSpec,
    Pool2dSpec,
    ReduceSpec,
    SoftmaxSpec,
    Unary,
    build_tile_program,
)
from tessera_tvm.tile.common import binary, unary
from tessera_tvm.tile.expr import BINARY_OPS, UNARY_OPS
from tessera_tvm.tile.specs import EPILOGUE_KINDS

FRONTEND = [op for op in (*op_table.OPS, op_table.CLIP) if op.frontend]


def test_names_are_unique_in_every_vocabulary():
    everything = (*op_table.OPS, op_table.CLIP)
    for field in ("name", "relax"):
        names = [getattr(op, field) for op in everything]
        assert len(names) == len(set(names)), field
    graph_ops = [op.graph_op for op in everything if op.graph_op]
    assert len(graph_ops) == len(set(graph_ops))
    assert all(op.arity == 1 for op in op_table.UNARY) and all(op.arity == 2 for op in op_table.BINARY)
    assert all(op.frontend and op.reference for op in everything if op.graph_op), (
        "an op the graph takes but no user can write"
    )


@pytest.mark.parametrize("op", FRONTEND, ids=lambda op: op.name)
def test_every_frontend_op_computes_its_reference_eagerly(op):
    # On numpy arrays the frontend function evaluates eagerly: it must be the table's reference.
    kwargs = dict(op.frontend_kwargs)
    if op.name == "cast":
        kwargs["dtype"] = ts.f16
    elif op.name == "clip":
        kwargs.update(lo=-0.5, hi=0.75)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(op.arity)]
    got = np.asarray(getattr(ops, op.frontend)(*args, **kwargs))
    want = np.asarray(getattr(reference, op.reference)(*args, **kwargs))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", op_table.OPS, ids=lambda op: op.name)
def test_every_op_has_a_tile_emitter(op):
    x, y = (tvm.tirx.Var(n, "float32") for n in "xy")
    expr = unary(op.name, x, "float32", cast_to="float16") if op.arity == 1 else binary(op.name, x, y)
    assert isinstance(expr, tvm.tirx.PrimExpr)
    # and not silently something else: the expression reads x (and y)
    names = set()
    tvm.tirx.stmt_functor.post_order_visit(expr, lambda e: names.add(e.name) if isinstance(e, tvm.tirx.Var) else None)
    assert names == ({"x"} if op.arity == 1 else {"x", "y"})


def _build_or_refusal(spec, kind: str, takes: bool, name: str, lower: bool = True):
    """Build and (``lower``) lower ``spec`` on ``kind``'s default config (no toolchain): a lowered
    module where the backend's manifest says it takes the op, else a refusal naming it."""
    backend = backend_for(kind)
    if takes:
        program = build_tile_program(spec, None, kind)
        assert isinstance(program, tvm.tirx.PrimFunc)
        if lower:
            lowered = tessera_tvm.lower(program, backend.default_config, build=False)
            assert lowered.source, (name, kind)  # e.g. Tenstorrent's tensorizer found an SFPU op for it
        return
    with pytest.raises(TesseraError) as info:
        build_tile_program(spec, None, kind)
    assert str(info.value).startswith(name) and "does not support" in str(info.value), str(info.value)


@pytest.mark.parametrize("kind", known_kinds())
@pytest.mark.parametrize("op", op_table.OPS, ids=lambda op: op.name)
def test_every_backend_builds_each_op_or_refuses_it_by_name(op, kind):
    operands = (("x", (32, 32), "float32"), ("y", (32, 32), "float32"))[: op.arity]
    inputs = [Input(name) for name, _, _ in operands]
    if op.arity == 1:
        expr, takes = (
            Unary(op.name, *inputs, dtype="float16" if op.name == "cast" else None),
            backend_for(kind).unary_ops,
        )
    else:
        expr, takes = Binary(op.name, *inputs), backend_for(kind).binary_ops
    spec = ElementwiseSpec((32, 32), operands, expr)
    _build_or_refusal(spec, kind, takes is None or op.name in takes, op.name)


@pytest.mark.parametrize("kind", known_kinds())
@pytest.mark.parametrize("op", op_table.epilogue_activations(), ids=lambda op: op.name)
def test_every_backend_takes_each_epilogue_activation_or_refuses_it_by_name(op, kind):
    spec = GemmSpec(64, 64, 64, dtype_a="bfloat16", epilogue=(EpilogueOp(op.name),))
    takes = backend_for(kind).epilogue_ops
    # Lowered where the manifest lists the kinds it takes (what its tensorizer maps); elsewhere the
    # epilogue computes with the element-wise emitters, lowered on every backend above.
    _build_or_refusal(spec, kind, takes is None or op.name in takes, f"epilogue {op.name}", lower=takes is not None)


def test_a_backends_op_lists_name_only_ops_of_the_table():
    for kind in known_kinds():
        manifest = backend_for(kind)
        assert set(manifest.unary_ops or ()) <= {op.name for op in op_table.UNARY}, kind
        assert set(manifest.binary_ops or ()) <= {op.name for op in op_table.BINARY}, kind
        assert set(manifest.epilogue_ops or ()) <= set(EPILOGUE_KINDS), kind


@pytest.mark.parametrize("op", [op for op in op_table.OPS if op.graph_op and not op.attrs], ids=lambda op: op.name)
def test_the_graph_builder_emits_each_op_as_its_relax_op(op):
    @ts.kernel
    def one(x: Tensor["N", ts.f32], y: Tensor["N", ts.f32]) -> Tensor["N", ts.f32]:
        function = getattr(ops, op.frontend)
        return function(x, **dict(op.frontend_kwargs)) if op.arity == 1 else function(x, y)

    assert op.graph_op in GRAPH_OPS
    text = one.inspect_ir("graph", shapes={"N": 8}, traced=True)
    assert f"R.{op.relax}(" in text, text


def test_the_derived_tables_say_what_the_table_says():
    fused = [op for op in op_table.OPS if op.fuses and op.relax]  # quick GELU: no Relax op (a motif)
    assert fusion.UNARY == {op.relax: op.name for op in fused if op.arity == 1}
    assert fusion.BINARY == {op.relax: op.name for op in fused if op.arity == 2}
    activations = {op.relax for op in op_table.UNARY if op.epilogue and op.relax}
    assert set(fusion.EPILOGUE_ACTIVATIONS) == activations == set(kernels._EPILOGUE_UNARY)
    assert all(fusion._SHORT[op.relax] == (op.short or op.name) for op in fused)
    assert fusion._SHORT["nn.gelu"] == "gelu"  # kernel names say gelu, the tile name is gelu_erf
    assert UNARY_OPS == tuple(op.name for op in op_table.UNARY) and BINARY_OPS == tuple(
        op.name for op in op_table.BINARY
    )
    assert {k for k in EPILOGUE_KINDS if k in op_table.BY_NAME} == {op.name for op in op_table.UNARY if op.epilogue} | {
        "cast"
    }
    assert sharding._UNARY | sharding._BINARY == set(op_table.BY_RELAX)
    assert sharding._LINEAR_UNARY == {"negative", "astype"}
    assert set(interop.OP_SET) >= {op.relax for op in FRONTEND}
    elementwise = offload._KINDS["element-wise, not in a GEMM epilogue: left to TVM (which fuses it)"]
    assert set(op_table.BY_RELAX) <= elementwise
    # the table's unary ops that sink through a reshape, and the cast (a half model's float32 activation)
    sinks = {f"relax.{op.relax}" for op in op_table.UNARY if op.sinks_reshape and op.relax}
    assert set(recover._UNARY) == sinks | {"relax.astype"}
    # an activation Relax has no op for is matched as x * sigmoid(beta x)
    assert [(op.name, op.swish_beta) for op in op_table.swish_motifs()] == [("gelu_quick", 1.702)]
    assert all(op.epilogue and op.relax is None for op in op_table.swish_motifs())
    assert "relax.exp" not in recover._UNARY  # an activation, not moved in front of reshapes (yet)
    assert ops._BINARY["ops.sub"] == ("subtract", reference.sub)


def test_every_reference_and_frontend_function_is_public():
    # what the table names is what `from tessera.reference import *` and `from tessera.ops import *` give
    for op in FRONTEND:
        assert op.reference in reference.__all__ and op.frontend in ops.__all__, op.name


# ---- anchors -------------------------------------------------------------------------------------

#: The frontend call of each anchor a kernel body writes: its inputs' shapes and its keywords.
ANCHOR_CALLS = {
    "matmul": ([(4, 8), (8, 6)], {}),
    "softmax": ([(3, 5)], {"axis": 0}),
    "layer_norm": ([(3, 8), (8,), (8,)], {"eps": 1e-5}),
    "rms_norm": ([(3, 8), (8,)], {"eps": 1e-6}),
    "sum": ([(3, 5)], {"axis": 1}),
    "max": ([(3, 5)], {"axis": 1, "keepdims": True}),
    "mean": ([(3, 5)], {}),
    "attention": ([(1, 2, 8, 16)] * 3, {"causal": True}),
}
WRITTEN = [op for op in op_table.ANCHORS if op.frontend]


def _anchor_spec(op: op_table.AnchorDef):
    """A small spec of ``op``'s kernel family (the table's kind where the family has kinds)."""
    height, rows = (1, 1) if op.name == "conv1d" else (8, 3)  # a conv1d: the conv2d kernel of height 1
    return {
        "gemm": lambda: GemmSpec(64, 64, 64, dtype_a="bfloat16"),
        "conv2d": lambda: Conv2dSpec(1, 4, height, 8, 8, rows, 3),
        "pool2d": lambda: Pool2dSpec(1, 4, 8, 8, op.kind, (2, 2), stride=(2, 2)),
        "softmax": lambda: SoftmaxSpec((32, 64)),
        "norm": lambda: NormSpec(op.kind, (32, 64)),
        "reduce": lambda: ReduceSpec((32, 64), 1, op.kind),
        "attention": lambda: AttentionSpec(1, 2, 2, 64, 64, 64, dtype_in="bfloat16"),
    }[op.family]()


def test_anchor_names_are_unique_and_families_are_the_specs():
    names = [op.name for op in op_table.ANCHORS]
    relax_ops = [r for op in op_table.ANCHORS for r in op.relax]
    assert len(names) == len(set(names)) and len(relax_ops) == len(set(relax_ops))
    assert not set(relax_ops) & set(op_table.BY_RELAX), "an op both an anchor and element-wise"
    assert {op.family for op in op_table.ANCHORS} <= set(SPEC_FAMILIES)
    assert set(ANCHOR_CALLS) == {op.name for op in WRITTEN}, "a frontend anchor without its test call"
    assert all(op.graph_op and op.reference for op in WRITTEN), "an op a kernel body writes but cannot trace or check"
    for op in op_table.ANCHORS:
        spec = _anchor_spec(op)
        assert spec.family == op.family and getattr(spec, "kind", None) == op.kind, op.name


@pytest.mark.parametrize("op", WRITTEN, ids=lambda op: op.name)
def test_every_frontend_anchor_computes_its_reference_eagerly(op):
    shapes, kwargs = ANCHOR_CALLS[op.name]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    got = np.asarray(getattr(ops, op.frontend)(*args, **kwargs))
    want = np.asarray(getattr(reference, op.reference)(*args, **kwargs))
    assert np.isfinite(want).all() and want.size
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", [op for op in op_table.ANCHORS if not op.frontend], ids=lambda op: op.name)
def test_a_relax_only_anchor_computes_as_relax_legalizes_it(op):
    # No kernel body writes it (a model's convolutions and pools): its reference is Relax's own op,
    # which TVM legalizes; tests/relax/test_conv2d.py checks the kernels against torch.
    import tvm.relax.transform.legalize_ops  # noqa: F401  (registers the legalizations)

    for name in op.relax:
        assert tvm.ir.Op.get(f"relax.{name}").get_attr("FLegalize") is not None, name


@pytest.mark.parametrize("kind", known_kinds())
@pytest.mark.parametrize("op", op_table.ANCHORS, ids=lambda op: op.name)
def test_every_backend_builds_each_anchor_or_refuses_it_by_name(op, kind):
    # On the backend's default config, no toolchain: a program where its manifest lists the family;
    # else the refusal names the family, or (an anchor its graph phase decomposes first) the anchor.
    backend = backend_for(kind)
    spec = _anchor_spec(op)
    assert set(backend.decomposed_anchors) <= {a.name for a in op_table.ANCHORS}, kind
    if op.family in backend.tile_programs and op.name not in backend.decomposed_anchors:
        assert isinstance(build_tile_program(spec, None, kind), tvm.tirx.PrimFunc)
        return
    with pytest.raises(TesseraError) as info:
        build_tile_program(spec, None, kind)
    message = str(info.value)
    if op.family not in backend.tile_programs:
        assert f"no tile program for {op.family!r} kernels" in message, message
    else:
        assert message.startswith(f"{op.name}: ") and "does not support" in message, message


def test_a_backend_that_decomposes_anchors_runs_the_decomposition_in_its_graph_phase():
    for kind in known_kinds():
        backend = backend_for(kind)
        if backend.decomposed_anchors:
            graph = dict(load_config(backend.default_config).pipeline)["graph"]
            assert "tessera.DecomposeRowOps" in [entry.name for entry in graph], kind


def _traced(op: op_table.AnchorDef):
    """A kernel whose body is ``op``'s frontend call on float32 inputs of ANCHOR_CALLS' shapes."""
    shapes, kwargs = ANCHOR_CALLS[op.name]

    def body(*xs):
        return getattr(ops, op.frontend)(*xs, **kwargs)

    params = [
        inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Tensor[(*shape, ts.f32)])
        for i, shape in enumerate(shapes)
    ]
    body.__signature__ = inspect.Signature(params)
    body.__annotations__ = {p.name: p.annotation for p in params}
    body.__name__ = body.__qualname__ = op.name
    return ts.kernel(body)


@pytest.mark.parametrize("op", WRITTEN, ids=lambda op: op.name)
def test_the_graph_builder_emits_each_anchor_as_its_relax_op_and_fuses_it_into_its_family(op):
    kernel = _traced(op)
    assert op.graph_op in GRAPH_OPS
    assert f"R.{op.relax[0]}(" in kernel.inspect_ir("graph", traced=True)
    groups = kernel.graph().groups
    assert [(g.family, g.anchor.op) for g in groups if g.family != "elementwise"] == [(op.family, op.relax[0])]


def test_the_derived_anchor_tables_say_what_the_table_says():
    relax_ops = op_table.relax_ops()
    assert fusion.ANCHORS == relax_ops and fusion.REDUCTIONS == ("sum", "max", "mean")
    assert all(fusion._SHORT[op.relax[0]] == op.name for op in op_table.ANCHORS)
    assert patterns.ANCHORS == {f"relax.{r}": op.name for op in op_table.ANCHORS for r in op.relax}
    assert patterns.ANCHORS["relax.nn.attention_bias"] == "attention"  # an alias reads as its anchor
    # the Relax patterns: a family per anchor, each anchor's op matched
    names = {p.name for p in patterns.tessera_patterns(load_config("cpu"), patterns.MatchLog())}
    assert names == {f"tessera.{op.family}" for op in op_table.ANCHORS}
    # the specs' kinds (in their error messages' order: the table's)
    assert ReduceSpec.REDUCE_KINDS == ("sum", "max", "mean") == tuple(op.kind for op in op_table.anchors("reduce"))
    assert NormSpec.NORM_KINDS == ("layer_norm", "rms_norm") and Pool2dSpec.KINDS == ("max", "avg")
    assert sharding._ANCHOR_RULE == {op.relax[0]: op.sharding for op in op_table.ANCHORS if op.sharding}
    assert {r for r, rule in sharding._ANCHOR_RULE.items() if rule == "row"} == {
        "nn.softmax", "nn.layer_norm", "nn.rms_norm", "sum", "max", "mean"
    }  # fmt: skip
    assert set(sharding._REDUCTIONS) == {"sum", "max", "mean"}
    assert interop.OP_SET[: len(WRITTEN)] == tuple(op.relax[0] for op in WRITTEN)
    assert nodes._SAME_OP == {"nn.attention_bias": "nn.attention"}
    assert all(nodes._ATTR_FIELDS[op.relax[0]] == op.attrs for op in op_table.ANCHORS)
    assert nodes._ATTR_FIELDS["astype"] == ("dtype",)
    assert set(autodiff.NO_GRADIENT) == {"nn.attention", "max"}
    assert set(autodiff._DECOMPOSED) == {"nn.rms_norm"}
    assert set(autodiff._RULES) == {"relax.nn.gelu", "relax.nn.gelu_tanh"}
    assert set(builder._REDUCE) == {"sum", "max", "mean"}
    # an anchor's reason in the offload report comes from its check, never from the op kinds
    assert not set(relax_ops) & set().union(*offload._KINDS.values())
    assert all(
        op.name in next(k for k in offload._KINDS if k.startswith("reduction")) for op in op_table.anchors("reduce")
    )
