"""What TVM users get wrong with Tessera, each a clear error or a default that is fast anyway.

- ``tvm.compile`` without ``tir_pipeline=``: TVM's default TIR pipeline meets TileLang's tile
  programs and fails deep inside ("Unknown device id in current IR"); it must say how to compile.
- A plain ``relax.VirtualMachine(executable, tvm.cpu())`` compiles the kernels without options (-O0,
  ~20x slower); the kernel sources carry the config's -O/-march as pragmas for that compile.
- Partitioning after ``LegalizeOps`` finds nothing to offload; it must say where to partition.
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tvm import tvm
from tessera_tvm.errors import TesseraError
from tessera_tvm.relax import partition_for_tessera

from .models import block_inputs, block_module, block_reference


def test_compiling_without_tesseras_tir_pipeline_says_how():
    mod, _ = block_module("float32")
    partitioned, report = partition_for_tessera(mod, "cpu")
    with pytest.raises(Exception, match=r"compiled with TVM's default TIR pipeline, which cannot lower them") as info:
        tvm.compile(partitioned, report.target)
    assert "tir_pipeline=report.tir_pipeline) ('tessera.cpu' here)" in str(info.value)
    assert "Unknown device id" not in str(info.value)


def test_a_plain_vm_compiles_the_kernels_optimised(cpu_block):
    built, params = cpu_block
    for source in built.kernel_sources().values():
        guard = source.index("!defined(__OPTIMIZE__)")  # only for a compile without -O
        assert source.index('#pragma GCC optimize("O3")') > guard
        assert '#pragma GCC target("arch=' in source  # -march=native, resolved to this CPU's name
    vm = tvm.relax.VirtualMachine(built.executable, tvm.cpu())  # TVM's jit: no compiler options
    arrays = block_inputs(params)
    out = vm["forward"](*[tvm.runtime.tensor(a) for a in arrays])
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    np.testing.assert_allclose(out, block_reference(*arrays), rtol=1e-4, atol=1e-4)


def test_partitioning_a_legalized_module_says_where_to_partition():
    mod, _ = block_module("float32")
    legalized = tvm.relax.transform.LegalizeOps()(mod)
    with pytest.raises(TesseraError, match=r"already legalized .*: attention, layer_norm, matmul.*before "
                       r"relax.transform.LegalizeOps"):  # fmt: skip
        partition_for_tessera(legalized, "cpu")


def test_a_grouped_query_attention_left_to_tvm_is_flagged():
    # TVM's own lowering of R.nn.attention pairs query head h with KV head h % H_kv (torch: h // 2
    # here), so a GQA attention Tessera does not take (here: V's head dim differs from Q's and K's)
    # gets a warning.
    relax = tvm.relax
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorStructInfo((1, 8, 4, 16), "float32"))
    k = relax.Var("k", relax.TensorStructInfo((1, 8, 2, 16), "float32"))
    v = relax.Var("v", relax.TensorStructInfo((1, 8, 2, 32), "float32"))
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.attention(q, k, v))
        bb.emit_func_output(out)
    with pytest.warns(UserWarning, match=r"pairs query head h with KV head h % H_kv"):
        _, report = partition_for_tessera(bb.get(), "cpu")
    (row,) = [r for r in report.not_offloaded if r.op.startswith("R.nn.attention")]
    assert "results will differ from torch's" in row.reason
