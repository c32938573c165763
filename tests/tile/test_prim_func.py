"""tessera_tvm._tvm.prim_func: TileLang's @T.prim_func with the AST rewrite kept per function code.

The tile programs it builds must be the ones @T.prim_func builds, for every generator and target,
also when a kept rewrite is rebound to another schedule's closure values (a second shape here).
"""

import pytest
import tilelang.language as T

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera.build import tile_programs
from tessera_tvm import _tvm
from tessera_tvm._tvm import tvm
from tessera_tvm.target.tt import tile_programs as tt
from tessera_tvm.tile import attention, elementwise, gemm, reduce

from ..frontend.test_examples import EXAMPLES, kernel_of, load

GENERATORS = (attention, elementwise, gemm, reduce, tt)


def tiles(kernel, target: str, shapes: dict[str, int]) -> list:
    # The programs as ts.compile builds them, not lowered (the lowering is not what is compared).
    env = kernel.check_shapes(shapes)
    return list(tile_programs(kernel, tessera_tvm.load_config(target), env, dict(kernel.schedule_overrides)).values())


def halved(shapes: dict[str, int]) -> dict[str, int]:
    return {name: max(value // 2, 1) if name not in ("D", "H_kv") else value for name, value in shapes.items()}


@ts.kernel
def tt_linear(
    A: Tensor["M", "K", ts.bf16], W: Tensor["K", "N", ts.bf16], b: Tensor["N", ts.bf16]
) -> Tensor["M", "N", ts.bf16]:
    return ops.relu(ops.matmul(A, W) + b)


def assert_programs_match_tilelang(monkeypatch, kernel, target: str, shapes: dict[str, int]) -> None:
    cases = [shapes, halved(shapes)]
    ours = [tiles(kernel, target, shapes) for shapes in cases]
    for generator in GENERATORS:
        monkeypatch.setattr(generator, "prim_func", T.prim_func)
    for shapes, built in zip(cases, ours, strict=True):
        reference = tiles(kernel, target, shapes)
        assert len(built) == len(reference)
        for a, b in zip(built, reference, strict=True):
            tvm.ir.assert_structural_equal(a, b, map_free_vars=True)


@pytest.mark.parametrize("target", ["cpu", "hopper"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_programs_match_tilelang(repo, monkeypatch, name, target):
    module = load(repo, name)
    assert_programs_match_tilelang(monkeypatch, kernel_of(module), target, module.SHAPES)


def test_tenstorrent_programs_match_tilelang(monkeypatch):
    assert_programs_match_tilelang(monkeypatch, tt_linear, "tenstorrent", {"M": 256, "N": 128, "K": 192})


def test_rewrite_is_kept_per_function_and_rebound():
    def program(extent: int):
        @_tvm.prim_func
        def main():
            out = T.alloc_global((extent,), "float32")  # noqa: F841 (the body only has to differ by extent)
            with T.Kernel(extent) as bx:
                T.evaluate(bx)

        return main

    first, second = program(4), program(8)
    assert len([code for code in _tvm._rewritten if code.co_name == "main" and "extent" in code.co_freevars]) == 1
    assert "4" in first.script() and "8" in second.script()
    assert not tvm.ir.structural_equal(first, second)


def test_parameters_are_refused():
    def main(A):
        pass

    with pytest.raises(TypeError, match="without parameters"):
        _tvm.prim_func(main)
