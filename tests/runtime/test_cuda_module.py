"""A kernel compiled for Hopper as one tvm-ffi library: its launches read out of TileLang's host code,
built here with g++ against the CUDA headers (no GPU), loaded in a fresh process, run where a GPU is.

Without a GPU the library must still load (the driver is opened on the first call) and every
wrong call must be an error that names the argument or says that there is no CUDA driver. The gpu
tests compare with torch: fp16 inputs, fp32 accumulation, fp16 outputs (1e-2 relative, what the
frontend's GPU tests allow for 128-term fp16 dot products).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera.module import module_plan
from tessera_tvm._tvm import tvm_ffi_paths
from tessera_tvm.target.cuda.module import device_launches, entry_source

from .test_tsr import _driver_present

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (cubins) and the CUDA headers")

SHAPES = {"M": 256, "N": 256, "K": 128}


@ts.kernel
def linear(
    x: Tensor["M", "K", ts.f16], w: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.relu(ops.matmul(x, w) + b)


@ts.kernel
def scores(x: Tensor["M", "K", ts.f16], w: Tensor["K", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.softmax(ops.matmul(x, w))  # two device kernels, an intermediate between them


@pytest.fixture(scope="module")
def compiled():
    return ts.compile(linear, target="hopper", shapes=SHAPES)


@pytest.fixture(scope="module")
def library(compiled, tmp_path_factory):
    return compiled.build_module(tmp_path_factory.mktemp("linear"))


def test_the_launch_is_read_from_the_host_code(compiled):
    (device,) = compiled._require_instance("test").devices
    lowered = device.lowered
    (launch,) = device_launches(lowered)
    (meta,) = lowered.metadata
    assert launch.function == meta["name"]
    assert list(launch.grid) == meta["launch"]["grid"] and list(launch.block) == meta["launch"]["block"]
    assert launch.smem_bytes == meta["launch"]["smem_bytes"] > 48 * 1024  # needs the attribute raised
    order = lowered._program_order
    kinds = {kind for kind, _ in launch.params}
    assert kinds <= {"tensormap", "pointer"}
    # Hopper loads the GEMM's operands through TMA: one descriptor each for x and w, innermost dim first.
    described = {order[m.buffer]: m for m in launch.tensormaps}
    assert set(described) == {"x", "w"}
    x, w = described["x"], described["w"]
    assert x.dims == (SHAPES["K"], SHAPES["M"]) and x.strides == (SHAPES["K"] * 2,)
    assert w.dims == (SHAPES["N"], SHAPES["K"]) and w.strides == (SHAPES["N"] * 2,)
    assert x.data_type == w.data_type == 6  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    pointers = {order[i] for kind, i in launch.params if kind == "pointer"}
    assert pointers == {"b", "out"}


def test_an_intermediate_is_allocated_and_freed_in_stream_order(tmp_path):
    compiled = ts.compile(scores, target="hopper", shapes=SHAPES)
    plan = module_plan(compiled._require_instance("test"))
    assert plan.device == "cuda" and [t.shape for t in plan.intermediates] == [(256, 256)]
    gemm, softmax = plan.calls
    assert gemm.args[-1] == softmax.args[0] == plan.intermediates[0].name
    source = entry_source([plan])
    assert source.count("cuMemAllocAsync(&scratch.pointers") == 1
    assert source.index(f"// {gemm.kernel}:") < source.index(f"// {softmax.kernel}:")  # launched in order
    library = compiled.build_module(tmp_path)
    assert library.is_file() and (tmp_path / "binary0.cubin").is_file() and (tmp_path / "binary1.cubin").is_file()


_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tvm_ffi

    f = tvm_ffi.load_module(sys.argv[1])["linear"]
    x = np.zeros((256, 128), np.float16)
    try:
        f(*[tvm_ffi.from_dlpack(a) for a in (x, np.zeros((128, 256), np.float16), np.zeros(256, np.float16),
                                              np.zeros((256, 256), np.float16))])
    except Exception as exc:
        print(type(exc).__name__, exc)
    try:
        f(tvm_ffi.from_dlpack(x))
    except Exception as exc:
        print(type(exc).__name__, exc)
    """
)


def test_the_library_loads_in_a_fresh_process_and_refuses_host_memory(library):
    run = subprocess.run([sys.executable, "-c", _CHILD, str(library)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "ValueError linear: argument x is on device type 1; this library runs on an NVIDIA GPU (kDLCUDA)"
    assert lines[1] == "TypeError linear: takes 4 tensors (x, w, b, out), got 1"


_C_CALLER = textwrap.dedent(
    r"""
    #include <dlfcn.h>
    #include <stdio.h>
    #include <string.h>
    #include <dlpack/dlpack.h>
    #include <tvm/ffi/c_api.h>

    /* Calls the entry with tensors that claim to be on CUDA device 0 (never dereferenced here). */
    int main(int argc, char** argv) {
      void* lib = dlopen(argv[1], RTLD_NOW);
      if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
      TVMFFISafeCallType entry = (TVMFFISafeCallType)dlsym(lib, "__tvm_ffi_linear");
      int64_t sx[] = {256, 128}, sw[] = {128, 256}, sb[] = {256}, so[] = {256, 256};
      int64_t* shapes[] = {sx, sw, sb, so};
      int ndims[] = {2, 2, 1, 2};
      DLTensor t[4];
      TVMFFIAny args[4];
      for (int i = 0; i < 4; ++i) {
        memset(&t[i], 0, sizeof(t[i]));
        t[i].data = (void*)(0x7f0000000000ull + (unsigned long long)i * 0x100000ull);
        t[i].device.device_type = kDLCUDA;
        t[i].ndim = ndims[i];
        t[i].dtype.code = kDLFloat; t[i].dtype.bits = 16; t[i].dtype.lanes = 1;
        t[i].shape = shapes[i];
        memset(&args[i], 0, sizeof(args[i]));
        args[i].type_index = kTVMFFIDLTensorPtr;
        args[i].v_ptr = &t[i];
      }
      int cases = argc > 2 ? 2 : 1;
      for (int c = 0; c < cases; ++c) {
        if (c == 1) t[3].device.device_id = 1;  /* out on another GPU */
        TVMFFIAny result;
        memset(&result, 0, sizeof(result));
        int rc = entry(NULL, args, 4, &result);
        TVMFFIObjectHandle error = NULL;
        TVMFFIErrorMoveFromRaised(&error);
        if (error) {
          TVMFFIErrorCell* cell = (TVMFFIErrorCell*)((char*)error + sizeof(TVMFFIObject));  /* C: no inline helper */
          printf("%d %.*s: %.*s\n", rc, (int)cell->kind.size, cell->kind.data, (int)cell->message.size, cell->message.data);
          TVMFFIObjectDecRef(error);
        } else {
          printf("%d\n", rc);
        }
      }
      return 0;
    }
    """
)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.skipif(_driver_present(), reason="checks the machine without a CUDA driver")
def test_a_c_caller_without_a_driver_gets_an_error_not_a_crash(library, tmp_path):
    include, dlpack, lib = tvm_ffi_paths()
    (tmp_path / "caller.c").write_text(_C_CALLER)
    subprocess.run(
        ["gcc", "-std=c11", "-Wall", "-Werror", f"-I{include}", f"-I{dlpack}", "caller.c", "-o", "caller",
         f"-L{lib}", "-ltvm_ffi", f"-Wl,-rpath,{lib}", "-ldl"],
        cwd=tmp_path, check=True, capture_output=True, text=True,
    )  # fmt: skip
    run = subprocess.run([str(tmp_path / "caller"), str(library), "both"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    no_driver, other_gpu = run.stdout.splitlines()
    assert no_driver.startswith("-1 RuntimeError: linear: no CUDA driver here (libcuda.so.1 does not load)")
    assert other_gpu == "-1 ValueError: linear: arguments x and out are on CUDA devices 0 and 1; put them on one"


def test_the_exported_bundle_says_it_runs_on_cuda(compiled, tmp_path):
    paths = compiled.export(tmp_path / "bundle")
    meta = json.loads(paths["metadata"].read_text())
    assert meta["target"] == "hopper" and meta["abi"]["entry"] == "__tvm_ffi_linear"
    assert [a["name"] for a in meta["arguments"]] == ["x", "w", "b", "out"]
    assert "memory of one CUDA device" in paths["header"].read_text()
    assert b"\ndevice cuda\n" in paths["image"].read_bytes()[:4096]


EXAMPLES = {
    "linear": {"M": 256, "N": 256, "K": 128},
    "softmax": {"M": 128, "N": 256},
    "layer_norm": {"M": 128, "N": 256},
    "flash_attention": {"B": 1, "H": 4, "H_kv": 2, "S": 256, "D": 64},
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_every_example_kernel_builds_a_library_whose_launches_match_its_metadata(example, tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / f"{example}.py"
    spec = importlib.util.spec_from_file_location(f"example_{example}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    compiled = ts.compile(getattr(module, example), target="hopper", shapes=EXAMPLES[example])
    plan = module_plan(compiled._require_instance("test"))
    metadata = [m for dk in compiled._require_instance("test").devices for m in dk.lowered.metadata]
    launches = [launch for call in plan.calls for launch in call.launches]
    assert [launch.function for launch in launches] == [m["name"] for m in metadata]
    for launch, meta in zip(launches, metadata, strict=True):
        assert [list(launch.grid), list(launch.block)] == [meta["launch"]["grid"], meta["launch"]["block"]]
        assert launch.smem_bytes == meta["launch"].get("smem_bytes", 0)
    paths = compiled.export(tmp_path)
    assert json.loads(paths["metadata"].read_text())["device"] == "cuda"


def test_rocm_says_it_builds_no_library_yet(tmp_path):
    compiled = ts.compile(linear, target="rocm", shapes=SHAPES)
    with pytest.raises(ts.NotRunnableError, match=r"not supported for rocm \(HIP\) yet"):
        compiled.build_module(tmp_path)


@pytest.mark.gpu
def test_the_library_runs_on_torch_cuda_tensors(library):
    import torch
    import tvm_ffi

    torch.manual_seed(0)
    x = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    w = torch.randn(128, 256, device="cuda", dtype=torch.float16) / 8
    b = torch.randn(256, device="cuda", dtype=torch.float16)
    out = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    tvm_ffi.load_module(str(library))["linear"](x, w, b, out)
    torch.cuda.synchronize()
    expected = torch.relu(x.float() @ w.float() + b.float()).half()
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_two_kernels_with_an_intermediate_run_on_the_gpu(tmp_path):
    import torch
    import tvm_ffi

    library = ts.compile(scores, target="hopper", shapes=SHAPES).build_module(tmp_path)
    x = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    w = torch.randn(128, 256, device="cuda", dtype=torch.float16) / 8
    out = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    tvm_ffi.load_module(str(library))["scores"](x, w, out)
    torch.cuda.synchronize()
    expected = torch.softmax((x.float() @ w.float()).half().float(), dim=1).half()
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-3)


def test_one_cuda_library_holds_a_kernel_per_set_of_dims(compiled, tmp_path):
    library = compiled.build_module(tmp_path, shapes=[{"M": 128}, {"M": 256}])
    source = (tmp_path / "linear.entry.cc").read_text()
    assert "namespace v0 {  // linear for M=128, K=128, N=256" in source and "namespace v1 {" in source
    assert sorted(p.name for p in tmp_path.glob("*.cubin")) == ["binary0.cubin", "binary1.cubin"]
    run = subprocess.run([sys.executable, "-c", _CHILD, str(library)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "runs on an NVIDIA GPU" in run.stdout  # the M=256 variant's checks, reached through the entry


def test_ts_compile_calls_run_the_same_library_built_into_the_cache(compiled, tmp_path, monkeypatch):
    import torch

    instance = compiled._require_instance("test")
    function, plan = instance.gpu_entry
    assert instance.gpu_entry[0] is function  # built and loaded once per instance
    assert [t.name for t in plan.inputs] == ["x", "w", "b"]
    with pytest.raises(ValueError, match="argument x is on device type 1; this library runs on an NVIDIA GPU"):
        function(torch.zeros(256, 128, dtype=torch.float16), *[torch.zeros(1)] * 3)
