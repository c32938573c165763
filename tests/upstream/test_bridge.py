"""The toolchain side of offload from upstream apache-tvm (tessera_tvm/relax/bridge.py), in
TileLang's TVM: upstream's TVMScript in, the partitioned module in upstream's dialect and the kernels'
C sources out. The upstream side runs in its own venv (tests/upstream/apache_tvm)."""

from __future__ import annotations

import functools
import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tvm_ffi

from tessera_tvm import TesseraError, tvm
from tessera_tvm._tvm import tvm_ffi_paths
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
        {"op": "offload", "text": UPSTREAM_TEXT, "config": "hopper"},  # a dynamic batch on a GPU
        {"op": "offload", "text": "this is not TVMScript", "config": "cpu"},
        {"op": "no such op"},
        {"op": "export_options", "config": "cpu"},
        {"op": "build_library", "config": "hopper", "output": "x.so", "files": [], "options": []},
        {"op": "build_library", "config": "cpu", "output": "x.so", "files": "a.c", "options": []},
    ]
    out = io.StringIO()
    serve(io.StringIO("\n".join(json.dumps(r) for r in requests) + "\n"), out)
    hello, gpu, garbage, unknown, options, cuda_build, bad_build = (
        json.loads(line) for line in out.getvalue().splitlines()
    )
    # A GPU config's library is upstream's own default compile; bad fields are an error answer.
    assert cuda_build["ok"] and cuda_build["built"] is False
    assert not bad_build["ok"] and "'files' and 'options' (lists of strings)" in bad_build["error"]
    assert hello["ok"] and hello["protocol"] == PROTOCOL
    assert not gpu["ok"] and "symbolic dims (A ['n', 64], C ['n', 32])" in gpu["error"]  # a GPU kernel: static shapes
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


# The same model at a fixed batch: what a GPU config takes.
STATIC_TEXT = UPSTREAM_TEXT.replace('n = TypeVar("n")\n', "").replace("(n, ", "(128, ")


@functools.cache
def _hopper_library(where: str) -> tuple[dict, Path]:
    """The hopper answer for STATIC_TEXT, its sources compiled into one library as upstream's
    ``export_library`` compiles them: g++ with tvm-ffi's headers and nothing else."""
    answer = offload_for_upstream(STATIC_TEXT, "hopper")
    out = Path(where)
    files = []
    for i, source in enumerate(answer["sources"]):
        files.append(out / f"kernel{i}.cc")
        files[-1].write_text(source["code"])
    include, dlpack, lib = tvm_ffi_paths()
    command = ["g++", "-std=c++17", "-shared", "-fPIC", "-O2", f"-I{include}", f"-I{dlpack}", "-o", str(out / "k.so")]
    subprocess.run([*command, *map(str, files), f"-L{lib}", "-ltvm_ffi"], check=True, capture_output=True, timeout=300)
    return answer, out / "k.so"


@pytest.fixture(scope="module")
def hopper(tmp_path_factory):
    return _hopper_library(str(tmp_path_factory.mktemp("hopper")))


@pytest.mark.nvcc
def test_a_cuda_config_answers_one_self_contained_source_per_kernel_that_link_into_one_library(hopper):
    answer, library = hopper
    assert answer["kernels"] == ["tessera_matmul_add_gelu", "tessera_softmax"]
    assert answer["text"].count("R.call_dps_packed(") == 2
    for kernel, source in zip(answer["kernels"], answer["sources"], strict=True):
        code = source["code"]
        assert source["names"] == [kernel] and f"int __tvm_ffi_{kernel}(" in code
        # Nothing beside it: the cubin is a literal (an ELF image), the driver table written in.
        assert ".incbin" not in code and "#include <tessera/" not in code and '"\\x7f\\x45\\x4c\\x46' in code
        assert re.search(r'#include "/\S+/cuda\.h"', code)
    # Both kernels' entries sit in one library (each source's helpers are its own), and each checks
    # where its arguments live before it touches the driver.
    for kernel, shapes in (("tessera_matmul_add_gelu", [(128, 64), (64, 32), (32,), (128, 32)]),
                           ("tessera_softmax", [(128, 32), (128, 32)])):  # fmt: skip
        entry = tvm_ffi.load_module(str(library))[kernel]
        host = [tvm_ffi.from_dlpack(np.zeros(s, np.float32)) for s in shapes]
        with pytest.raises(ValueError, match=f"{kernel}: argument .* this library runs on an NVIDIA GPU"):
            entry(*host)


def test_a_cuda_config_without_nvcc_says_the_cubins_are_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_NVCC", str(tmp_path / "no-nvcc"))  # nvcc named, and not there
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))  # no cubin from an earlier compile
    with pytest.raises(TesseraError, match="kernel tessera_matmul_add_gelu .* no cubin .*nvcc not on PATH"):
        offload_for_upstream(STATIC_TEXT, "hopper")


def test_configs_without_a_binary_to_carry_are_refused_by_name():
    with pytest.raises(TesseraError, match="config 'rocm' .*takes the CPU and CUDA configs"):
        offload_for_upstream(STATIC_TEXT, "rocm")


@pytest.mark.gpu
def test_the_carried_hopper_kernels_run_on_the_gpu_and_match_torch(hopper):
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("hopper cubins (sm_90a) run on an H100 or H200")
    _, library = hopper
    module = tvm_ffi.load_module(str(library))
    generator = torch.Generator(device="cuda").manual_seed(0)
    x, w, b = (torch.randn(*s, device="cuda", generator=generator) * 0.5 for s in ((128, 64), (64, 32), (32,)))
    hidden, out = torch.empty(128, 32, device="cuda"), torch.empty(128, 32, device="cuda")
    module["tessera_matmul_add_gelu"](x, w, b, hidden)
    module["tessera_softmax"](hidden, out)
    torch.cuda.synchronize()
    expected = torch.softmax(torch.nn.functional.gelu(x @ w + b), dim=-1)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=0)  # fp32 GEMMs may run in TF32
