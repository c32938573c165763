"""Constants whose structural hashes collide keep their own values (tessera_tvm/relax/constants.py).

TileLang's TVM pools a function's constants by hash: without the fix, every pair below came out as
one value (``where(m, inf, 1)`` and ``where(m, finfo.min, 2)`` both read inf), with no error."""

from __future__ import annotations

import numpy as np

from tessera_tvm._tvm import tvm
from tessera_tvm.relax import build, load_vm, partition_for_tessera
from tessera_tvm.relax.constants import merged_constants

relax = tvm.relax

#: (dtype, a, b): values whose constants hash alike in TileLang's TVM.
COLLIDING = [
    ("float32", np.inf, float(np.finfo(np.float32).min)),
    ("int32", 2**31 - 1, 0),
    ("int32", -(2**31), 1),
    ("int64", 2**63 - 1, 1),
]


def _module():
    bb = relax.BlockBuilder()
    mask = relax.Var("mask", relax.TensorStructInfo((2,), "bool"))
    with bb.function("main", [mask]):
        outputs = []
        for dtype, a, b in COLLIDING:
            for value, other in ((a, 5), (b, 6)):
                const = relax.const(np.array(value, dtype), dtype)
                outputs.append(bb.emit(relax.op.where(mask, const, relax.const(np.array(other, dtype), dtype))))
        bb.emit_func_output(relax.Tuple(outputs))
    return bb.get()


def test_constants_with_colliding_hashes_keep_their_values():
    mod = _module()
    # The premise: each pair shares a hash in this TVM (pinned with TileLang).
    assert len(merged_constants(mod["main"])) == len(COLLIDING)
    mask = np.array([True, False])
    expected = [np.array([value, other], dtype) for dtype, a, b in COLLIDING for value, other in ((a, 5), (b, 6))]
    # tessera_tvm.relax.build, and tvm.compile with the report's pipelines (the README's route)
    partitioned, report = partition_for_tessera(mod, "cpu")
    with report.target:
        ex = tvm.compile(
            partitioned, report.target, relax_pipeline=report.relax_pipeline, tir_pipeline=report.tir_pipeline
        )
    vm_out = load_vm(ex, "cpu")["main"](tvm.runtime.tensor(mask))
    for got in (build(mod, "cpu").run("main", mask), [t.numpy() for t in vm_out]):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g.dtype == e.dtype and np.array_equal(g, e), (g, e)
