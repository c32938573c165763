"""Relax programs whose storage TVM's memory planner (``StaticPlanBlockMemory``) shared wrongly in
TileLang's TVM, built by ``tessera_tvm.relax.build`` (tessera_tvm/relax/build.py
``alias_restating_match_casts``)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tvm._tvm import tvm
from tessera_tvm.relax import build
from tessera_tvm.relax.build import alias_restating_match_casts

relax = tvm.relax


def _split_after_match_cast(cast_to):
    """``split(match_cast(x + 1, cast_to), 2, axis=-1)[1]`` of x [8, 12]."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorStructInfo([8, 12], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(x, relax.const(1.0, "float32")))
            z = bb.match_cast(y, relax.TensorStructInfo(cast_to, "float32"))
            out = bb.emit_output(bb.emit(relax.TupleGetItem(bb.emit(relax.op.split(z, 2, axis=-1)), 1)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "defines a var"])
def test_a_tensor_read_through_a_match_cast_keeps_its_storage(symbolic):
    # The planner handed y's storage to the split's first output while the split read y through the
    # match_cast: the second half came out as the first half's values (off by 6 to 42), no error.
    n = tvm.tirx.Var("n", "int64")
    mod = _split_after_match_cast([n, 12] if symbolic else [8, 12])
    restated = "R.match_cast" in alias_restating_match_casts(mod)["main"].script()
    assert restated == symbolic  # a match_cast that binds a var is kept; one that restates is an alias
    x = np.arange(96, dtype=np.float32).reshape(8, 12)
    np.testing.assert_array_equal(build(mod, "cpu").run("main", x), (x + 1)[:, 6:])
