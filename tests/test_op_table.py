"""The element-wise op table (tessera_tvm/op_table.py): every op has its reference, frontend function,
tile emitter, Relax constructor and, on every backend, a program or a refusal that names it; the
tables derived from it say what the table says."""

import numpy as np
import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops, reference
from tessera_tvm import op_table
from tessera_tvm._tvm import tvm
from tessera_tvm.errors import TesseraError
from tessera_tvm.graph import fusion, kernels, sharding
from tessera_tvm.graph.builder import OPS as GRAPH_OPS
from tessera_tvm.relax import interop, offload, recover
from tessera_tvm.target.backend import backend_for, known_kinds
from tessera_tvm.tile import (
    Binary,
    ElementwiseSpec,
    EpilogueOp,
    GemmSpec,
    Input,
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
    assert set(recover._UNARY) == {f"relax.{op.relax}" for op in op_table.UNARY if op.sinks_reshape and op.relax}
    # an activation Relax has no op for is matched as x * sigmoid(beta x)
    assert [(op.name, op.swish_beta) for op in op_table.swish_motifs()] == [("gelu_quick", 1.702)]
    assert all(op.epilogue and op.relax is None for op in op_table.swish_motifs())
    assert "relax.exp" not in recover._UNARY  # an activation, not moved in front of reshapes (yet)
    assert ops._BINARY["ops.sub"] == ("subtract", reference.sub)


def test_every_reference_and_frontend_function_is_public():
    # what the table names is what `from tessera.reference import *` and `from tessera.ops import *` give
    for op in FRONTEND:
        assert op.reference in reference.__all__ and op.frontend in ops.__all__, op.name
