"""The toolchain side of offload from upstream apache-tvm (tessera_tvm/relax/bridge.py), in
TileLang's TVM: upstream's TVMScript in, the partitioned module in upstream's dialect and the kernels'
C sources out. The upstream side runs in its own venv (tests/upstream/apache_tvm)."""

from __future__ import annotations

import io
import json

from tessera_tvm import tvm
from tessera_tvm.relax.bridge import PROTOCOL, from_upstream_text, offload_for_upstream, serve

# What apache-tvm 0.27 prints for a matmul + bias + GELU, then softmax, over a symbolic batch n.
UPSTREAM_TEXT = """# from typing import TypeVar
# from tvm.script import ir as I
# from tvm.script import relax as R

n = TypeVar("n")
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((n, 64), dtype="float32"), w: R.Tensor((64, 32), dtype="float32"), b: R.Tensor((32,), dtype="float32")) -> R.Tensor((n, 32), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((n, 32), dtype="float32") = R.matmul(x, w, out_dtype=None)
            lv1: R.Tensor((n, 32), dtype="float32") = R.add(lv, b)
            lv2: R.Tensor((n, 32), dtype="float32") = R.nn.gelu(lv1)
            gv: R.Tensor((n, 32), dtype="float32") = R.nn.softmax(lv2, axis=-1)
            R.output(gv)
        return gv
"""  # noqa: E501


def test_upstream_text_parses_with_its_symbolic_dims():
    mod = from_upstream_text(UPSTREAM_TEXT)
    (x, _, _) = mod["main"].params
    dim = x.struct_info.shape.values[0]
    assert isinstance(dim, tvm.tirx.Var) and str(dim.name) == "n"


def test_offload_answers_packed_calls_in_upstreams_dialect_and_the_kernels_c_sources():
    answer = offload_for_upstream(UPSTREAM_TEXT, "cpu")
    assert answer["kernels"] == ["tessera_matmul_add_gelu", "tessera_softmax"]
    text = answer["text"]
    # Each kernel call is a packed call of its symbol, with upstream's keyword; no PrimFunc is left.
    assert text.count("R.call_dps_packed(") == 2 and "out_ty=" in text and "out_sinfo" not in text
    assert '"tessera_matmul_add_gelu"' in text and "call_tir" not in text and "T.prim_func" not in text
    assert 'out_dtype="void"' not in text
    # The host source holds the entries the VM calls (TVM's calling convention); the device kernels
    # come as sources of their own, headers included by absolute path.
    host, *devices = answer["sources"]
    assert host["names"] == answer["kernels"]
    assert all(f"__tvm_ffi_{k}" in host["code"] for k in answer["kernels"])
    assert devices and all('#include "/' in d["code"] for d in devices)
    assert [o["ops"] for o in answer["report"]["offloaded"]] == ["matmul + add + gelu", "softmax"]
    assert "dynamic n ~ 64" in answer["report_text"]


def test_the_server_answers_each_line_and_turns_errors_into_answers():
    requests = [
        {"op": "hello"},
        {"op": "offload", "text": UPSTREAM_TEXT, "config": "hopper"},  # GPU configs: not yet
        {"op": "offload", "text": "this is not TVMScript", "config": "cpu"},
        {"op": "no such op"},
        {"op": "export_options", "config": "cpu"},
    ]
    out = io.StringIO()
    serve(io.StringIO("\n".join(json.dumps(r) for r in requests) + "\n"), out)
    hello, gpu, garbage, unknown, options = (json.loads(line) for line in out.getvalue().splitlines())
    assert hello["ok"] and hello["protocol"] == PROTOCOL
    assert not gpu["ok"] and "CPU config only" in gpu["error"]
    assert not garbage["ok"] and "could not parse" in garbage["error"]
    assert not unknown["ok"] and "unknown request" in unknown["error"]
    assert options["ok"] and "-fopenmp" in options["options"]


def test_a_module_with_nothing_to_offload_comes_back_without_kernels():
    text = """# from tvm.script import ir as I
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 8), dtype="int32")) -> R.Tensor((4, 8), dtype="int32"):
        with R.dataflow():
            gv: R.Tensor((4, 8), dtype="int32") = R.add(x, x)
            R.output(gv)
        return gv
"""
    answer = offload_for_upstream(text, "cpu")
    assert answer["kernels"] == [] and answer["sources"] == []
    assert "R.add(x, x)" in answer["text"] and "call_dps_packed" not in answer["text"]
    assert [r["op"] for r in answer["report"]["not_offloaded"]] == ["R.add"]
