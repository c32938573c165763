"""TileLang tile operations for TVMScript tests of the ``tt.*`` passes.

TVMScript's parser does not know TileLang's ``T.copy`` / ``T.gemm`` / ``T.fill``; these helpers
build exactly the calls TileLang's frontend emits (``tl.tileop.*`` on ``tl.region`` operands), so
a test's Before/Expected functions can write ``copy(A[by * 32, k * 32], A_s[0, 0])`` as a statement.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm

READ, WRITE, READ_WRITE = 1, 2, 3
TILE = 32


def _i32(value: int):
    return tvm.tirx.IntImm("int32", value)


def region(load, access: int, *extents: int):
    return tvm.tirx.call_intrin("handle", tvm.ir.Op.get("tl.region"), load, _i32(access), *(_i32(e) for e in extents))


def _extents(load) -> tuple[int, ...]:
    return (TILE,) * len(load.indices)


def copy(src, dst):
    """``T.copy(src, dst)`` of one 32x32 tile (src/dst are the first elements, e.g. ``A[by * 32, 0]``)."""
    return tvm.tirx.call_intrin(
        "handle", tvm.ir.Op.get("tl.tileop.copy"), region(src, READ, *_extents(src)), region(dst, WRITE, *_extents(dst))
    )


def fill(dst, value: int = 0):
    """``T.fill(dst, value)`` (``T.clear`` is ``fill(dst, 0)``)."""
    return tvm.tirx.call_intrin(
        "handle", tvm.ir.Op.get("tl.tileop.fill"), region(dst, WRITE, *_extents(dst)), _i32(value)
    )


def gemm(a, b, c, transpose_b: bool = False):
    """``T.gemm(a, b, c)`` of 32x32 tiles, as TileLang 0.1.15 emits it."""
    false = tvm.tirx.IntImm("bool", 0)
    return tvm.tirx.call_intrin(
        "handle",
        tvm.ir.Op.get("tl.tileop.gemm"),
        region(a, READ, TILE, TILE),
        region(b, READ, TILE, TILE),
        region(c, READ_WRITE, TILE, TILE),
        false,
        tvm.tirx.IntImm("bool", int(transpose_b)),
        _i32(TILE),
        _i32(TILE),
        _i32(TILE),
        _i32(0),
        false,
        _i32(0),
        _i32(0),
        _i32(0),
    )
