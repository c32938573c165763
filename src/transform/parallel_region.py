"""The parallel region of a CPU kernel grid: the names and TIR ops tessera/cpu.h implements.

TileLang's C codegen prints the grid of a CPU kernel (``T.Kernel(nx, ny)``) as serial loops and has
no way to print a pragma. Three passes make the grid run on all cores with OpenMP, each in a file of
its own: ``tessera.MarkParallelGrid`` (mark_parallel_grid.py) annotates the grid loops,
``tessera.LowerParallelGrid`` (lower_parallel_grid.py) turns them into one parallel region of the
ops below, and ``tessera.ImportCpuRuntime`` (import_cpu_runtime.py) includes the header that
defines them. Thread count: ``TESSERA_NUM_THREADS``, else OpenMP's ``OMP_NUM_THREADS``, else one
per core.
"""

from __future__ import annotations

from tessera_tvm._tvm import register_op, tvm

from . import analysis

ANNOTATION = analysis.PARALLEL_GRID
ROOT_BLOCK = "tilelang_root"  # the block TileLang's T.Kernel opens inside its grid loops
RUNTIME_HEADER = "#include <tessera/cpu.h>\n"
RUNTIME_PREFIX = "tessera_"  # extern functions of tessera/cpu.h

# Ops printed as the macros of tessera/cpu_parallel.h (an op with a global symbol is printed as a
# call without the forward declaration a call_extern gets, which a macro could not take).
PARALLEL_BEGIN = "tessera.parallel_begin"
NEXT_BLOCK = "tessera.next_block"
PARALLEL_END = "tessera.parallel_end"
OPS = {
    PARALLEL_BEGIN: ("TESSERA_PARALLEL_BEGIN", "open the parallel region of a CPU kernel grid (arg: blocks)"),
    NEXT_BLOCK: ("TESSERA_NEXT_BLOCK", "claim the next block of the grid in the current parallel region"),
    PARALLEL_END: ("TESSERA_PARALLEL_END", "close the parallel region opened by tessera.parallel_begin"),
}


def register_ops() -> None:
    """Register the region ops with TVM (idempotent; IR holding them can be loaded only after this)."""
    known = set(tvm.ir.Op.list_op_names())
    for name, (symbol, doc) in OPS.items():
        if name in known:
            continue
        register_op(
            name,
            doc,
            TCallEffectKind=tvm.tirx.CallEffectKind.Opaque,
            TGlobalSymbol=symbol,
            TScriptPrinterName=name,  # dumps read T.tessera.parallel_begin(...)
        )


register_ops()


def parallel_begin(blocks):
    """``TESSERA_PARALLEL_BEGIN(blocks)``."""
    return tvm.tirx.Call("int32", tvm.ir.Op.get(PARALLEL_BEGIN), [blocks])


def next_block():
    """``TESSERA_NEXT_BLOCK()``: the next unclaimed block index of the region's grid."""
    return tvm.tirx.Call("int32", tvm.ir.Op.get(NEXT_BLOCK), [])


def parallel_end():
    """``TESSERA_PARALLEL_END()``."""
    return tvm.tirx.Call("int32", tvm.ir.Op.get(PARALLEL_END), [])
