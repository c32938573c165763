"""tessera.VerifyBarrierSupport: T.alloc_barrier needs hardware mbarriers (sm_90+)."""

from __future__ import annotations

import re

import pytest

from tessera_tvm._tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.errors import LoweringError
from tessera_tvm.pipeline import LowerAndLegalize, OptimizeForTarget
from tessera_tvm.registry import BuildContext, get_pass

from . import tile_programs as programs


def verify(mod, config):
    cfg = load_config(config)
    return get_pass("tessera.VerifyBarrierSupport").factory(BuildContext(cfg, cfg.tvm_target()))(mod)


def test_alloc_barrier_exists_in_tilelang():
    func = programs.copy_with_barrier(1024)
    scopes = []

    def visit(node):
        if isinstance(node, tvm.tirx.SBlock):
            scopes.extend(buffer.scope() for buffer in node.alloc_buffers)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    assert "shared.barrier" in scopes


@pytest.mark.parametrize("config", ["hopper", "ampere"])
def test_kernel_without_barriers_passes_unchanged(config):
    mod = tvm.IRModule({"main": programs.matmul(256, 256, 256, 128, 128, 32)})
    tvm.ir.assert_structural_equal(verify(mod, config), mod)


def test_barrier_on_hopper_passes_unchanged():
    mod = tvm.IRModule({"main": programs.copy_with_barrier(1024)})
    tvm.ir.assert_structural_equal(verify(mod, "hopper"), mod)
    OptimizeForTarget(LowerAndLegalize(mod, "hopper"), "hopper")  # and lowers


def test_barrier_on_ampere_is_rejected_with_the_fix():
    mod = tvm.IRModule({"main": programs.copy_with_barrier(1024)})
    lowered = LowerAndLegalize(mod, "ampere")
    with pytest.raises(
        LoweringError,
        match=re.escape(
            "kernel 'main' allocates hardware barriers (bar) with T.alloc_barrier, which needs hardware "
            "barriers (sm_90 or later), but target 'ampere' (sm_80) has none (hardware.mbarrier is false); "
            "use T.sync_threads() or named barriers on this target"
        ),
    ):
        OptimizeForTarget(lowered, "ampere")
