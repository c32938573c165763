"""Registry entries for the TileLang and TVM passes that Tessera's pipelines name.

Names are stable and namespaced by who owns the pass: ``tl.`` (TileLang), ``tirx.`` and ``s_tir.``
(TVM). Constructors are looked up by attribute when a pipeline is built, so a rename in TileLang or
TVM is absorbed by editing the tables below and nothing else.
"""

from __future__ import annotations

import importlib

from .registry import BuildContext, Param, register_pass, register_predicate

_MODULES = {
    "tl": "tilelang.transform",
    "tl.cuda": "tilelang.cuda.transform",
    "tl.cpu": "tilelang.cpu.transform",
    "tl.analysis": "tilelang.analysis",
    "tirx": "tvm.tirx.transform",
    "relax": "tvm.relax.transform",
    "s_tir": "tvm.s_tir.transform",
}


def _constructor(module_key: str, attr: str):
    from ._tvm import tilelang  # noqa: F401  (tvm must come from tilelang)

    return getattr(importlib.import_module(_MODULES[module_key]), attr)


def _register_plain(prefix: str, module_key: str, names: list[str], doc: str, ir: str = "tir") -> None:
    for attr in names:

        def factory(ctx: BuildContext, _attr=attr, _key=module_key):
            return _constructor(_key, _attr)()

        register_pass(f"{prefix}.{attr}", doc=doc, ir=ir)(factory)


# Passes that take no arguments. ------------------------------------------------------------------
_register_plain(
    "tl",
    "tl",
    [
        "AddWrapperForSingleBufStore",
        "LegalizeNegativeIndex",
        "VerifyParallelLoop",
        "InjectAssumes",
        "LetInline",
        "CanonicalizeLegacyReducer",
        "VerifyReducerEpoch",
        "VerifyBufferInit",
        "IfStmtBinding",
        "UnrollLoop",
        "PipelinePlanning",
        "InjectSoftwarePipeline",
        "LayoutInference",
        "ReducerPlanAndMaterialize",
        "LowerTileOp",
        "VerifyReducerConsumed",
        "DecoupleTypeCast",
        "LegalizeVectorizedLoop",
        "LegalizeSafeMemoryAccess",
        "LowerAccessPtr",
        "HoistNonRestrictParams",
        "PlanAndUpdateBufferAllocationLocation",
        "HoistGlobalBufferAllocations",
        "LowerOpaqueBlock",
        "FlattenBuffer",
        "ConfigIndexBitwidth",
        "StorageRewrite",
        "LoopUnswitching",
        "LowerThreadAllreduce",
        "AnnotateDeviceRegions",
        "SplitHostDevice",
        "AnnotateReadOnlyParams",
        "MergeIfStmt",
        "MakePackedAPI",
        "LowerDeviceKernelLaunch",
        "LowerIntrin",
        "HoistBroadcastValues",
    ],
    "TileLang pass",
)
_register_plain(
    "tl",
    "tl.cuda",
    [
        "AnnotateDeviceBoundTmaCopies",
        "AutoWarpSpecialization",
        "MaterializeWSSchedule",
        "ProducerConsumerWarpSpecialized",
        "LowerBlackwell2SM",
        "LowerL2Persistent",
        "LowerSharedTmem",
        "LowerSharedBarrier",
        "FuseMBarrierArriveExpectTx",
        "LowerLDGSTG",
        "LowerHopperIntrin",
        "InjectFenceProxy",
        "InjectTcgen05Fence",
        "AnnotateWarpGroupRegAlloc",
        "PersistThreadblock",
    ],
    "TileLang CUDA pass",
)
_register_plain("tl", "tl.cpu", ["LowerCPUAtomics"], "TileLang CPU pass")
_register_plain(
    "tl",
    "tl.analysis",
    [
        "NestedLoopChecker",
        "ParallelLocalIndexChecker",
        "FragmentLoopChecker",
    ],
    "TileLang semantic check (analysis; leaves the IR unchanged)",
)
_register_plain(
    "tirx",
    "tirx",
    [
        "RemoveNoOp",
        "VerifyMemory",
        "AnnotateEntryFunc",
        "BF16ComputeLegalize",
        "BF16StorageLegalize",
    ],
    "TVM TIR pass",
)
_register_plain("s_tir", "s_tir", ["RenormalizeSplitPattern", "HoistIfThenElse", "InferFragment"], "TVM s_tir pass")
# The graph phase's Relax passes (DeadCodeElimination keeps what the public functions use).
_register_plain("relax", "relax", ["CanonicalizeBindings", "DeadCodeElimination"], "TVM Relax pass", ir="relax")


# Passes with arguments (from the config's pass_args or the entry's args). -------------------------
@register_pass("tirx.BindTarget", doc="attach the config's TVM target to every function")
def _bind_target(ctx: BuildContext):
    return _constructor("tirx", "BindTarget")(ctx.target)


@register_pass("tirx.Simplify", doc="TVM arithmetic simplification")
def _tirx_simplify(ctx: BuildContext):
    return _constructor("tirx", "Simplify")()


@register_pass(
    "tl.Simplify",
    params={"simplify_arguments": Param(bool, False)},
    doc="TileLang simplification (symbolic-bound aware)",
)
def _tl_simplify(ctx: BuildContext, simplify_arguments: bool = False):
    return _constructor("tl", "Simplify")(simplify_arguments=simplify_arguments)


@register_pass(
    "tl.MaterializeKernelLaunch",
    params={
        "lower_thread_binding": Param(bool, True),
        "default_threads": Param(int, 128),
        "unsupported_annotations": Param(list, None),
        "lower_grid_binding": Param(bool, None),
    },
    doc="turn T.Kernel launch frames into grid/thread bindings (or serial loops on CPU)",
)
def _materialize_kernel_launch(
    ctx: BuildContext,
    lower_thread_binding=True,
    default_threads=128,
    unsupported_annotations=None,
    lower_grid_binding=None,
):
    kwargs = {}
    if lower_grid_binding is not None:
        kwargs["lower_grid_binding"] = lower_grid_binding
    return _constructor("tl", "MaterializeKernelLaunch")(
        lower_thread_binding=lower_thread_binding,
        default_threads=default_threads,
        unsupported_annotations=list(unsupported_annotations) if unsupported_annotations else None,
        **kwargs,
    )


@register_pass("tirx.NarrowDataType", params={"target_bits": Param(int, 32)}, doc="narrow index types")
def _narrow(ctx: BuildContext, target_bits: int = 32):
    return _constructor("tirx", "NarrowDataType")(target_bits)


@register_pass("tl.VectorizeLoop", params={"enable_vectorize": Param(bool, True)}, doc="vectorize loops")
def _vectorize(ctx: BuildContext, enable_vectorize: bool = True):
    return _constructor("tl", "VectorizeLoop")(enable_vectorize=enable_vectorize)


@register_pass(
    "tl.MergeSharedMemoryAllocations",
    params={
        "enable_aggressive_merge": Param(bool, False),
        "disable_reuse": Param(bool, False),
        "align_bytes": Param(int, 16),
    },
    doc="merge shared allocations of a device kernel into one dynamic buffer",
)
def _merge_smem(ctx: BuildContext, enable_aggressive_merge=False, disable_reuse=False, align_bytes=16):
    return _constructor("tl", "MergeSharedMemoryAllocations")(
        enable_aggressive_merge=enable_aggressive_merge, align_bytes=align_bytes, disable_reuse=disable_reuse
    )


@register_pass("tl.ThreadSync", params={"storage_scope": Param(str, "shared")}, doc="insert barriers")
def _thread_sync(ctx: BuildContext, storage_scope: str = "shared"):
    return _constructor("tl", "ThreadSync")(storage_scope)


@register_pass(
    "tl.MarkCudaSyncCalls",
    params={"have_pdl": Param((bool, str), "auto")},
    doc="mark kernels that use programmatic dependent launch; 'auto' asks the target",
)
def _mark_cuda_sync(ctx: BuildContext, have_pdl="auto"):
    if have_pdl == "auto":
        from ._tvm import have_pdl as target_has_pdl

        have_pdl = target_has_pdl(ctx.target)
    return _constructor("tl.cuda", "MarkCudaSyncCalls")(have_pdl)


# IR predicates for `when: ir.<name>` conditions. -------------------------------------------------
@register_predicate("has_tma", doc="some function was lowered with TMA copies (attr tl.has_tma)")
def _has_tma(mod) -> bool:
    return any(func.attrs and func.attrs.get("tl.has_tma", False) for _, func in mod.functions.items())
