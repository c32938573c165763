"""tessera export: the AOT bundle (tvm-ffi library, C header, metadata.json), used from C.

The C host follows seed 004 §11.1's shape over tvm-ffi's C ABI (the tsr* runtime is not built yet):
it loads nothing dynamically, links the exported library, packs DLTensors as TVMFFIAny arguments,
calls the entry and compares with a C reference loop (float32 sums of 48 products: 1e-4 absolute).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tessera.cli import main
from tessera_tvm._tvm import tvm_ffi_paths

KERNEL = textwrap.dedent(
    """
    import tessera as ts
    from tessera import Tensor, ops

    SHAPES = {"M": 32, "K": 48, "N": 40}

    @ts.kernel
    def linear_relu(x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        return ops.relu(ops.matmul(x, w) + b)
    """
)

#: C shared by both hosts: the GEMM+bias+ReLU's sizes, a float32 CPU DLTensor over ``data``, its
#: deterministic inputs, and the largest |relu(x @ w + b) - out| against a C reference loop.
C_COMMON = textwrap.dedent(
    """
    enum { M = 32, K = 48, N = 40 };

    static DLTensor tensor(float* data, int ndim, int64_t* shape) {
      DLTensor t;
      memset(&t, 0, sizeof(t));
      t.data = data;
      t.device.device_type = kDLCPU;
      t.ndim = ndim;
      t.dtype.code = kDLFloat;
      t.dtype.bits = 32;
      t.dtype.lanes = 1;
      t.shape = shape;
      return t;
    }

    static void fill(float* x, float* w, float* b) {
      for (int i = 0; i < M * K; ++i) x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
      for (int i = 0; i < K * N; ++i) w[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
      for (int i = 0; i < N; ++i) b[i] = (float)(i % 3) - 1.0f;
    }

    static double max_error(const float* x, const float* w, const float* b, const float* out) {
      double worst = 0;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          float acc = b[j];
          for (int k = 0; k < K; ++k) acc += x[i * K + k] * w[k * N + j];
          acc = acc > 0 ? acc : 0;
          double d = fabs((double)acc - out[i * N + j]);
          worst = d > worst ? d : worst;
        }
      return worst;
    }
    """
)

HOST = textwrap.dedent(
    r"""
    #include <math.h>
    #include <stdio.h>
    #include <string.h>
    #include "linear_relu.h"

    COMMON

    static float x[M * K], w[K * N], b[N], out[M * N];

    static const char* last_error(void) {
      static char text[512];
      TVMFFIObjectHandle error = NULL;
      TVMFFIErrorMoveFromRaised(&error);
      if (error == NULL) return "(no error)";
      TVMFFIErrorCell* cell = (TVMFFIErrorCell*)((char*)error + sizeof(TVMFFIObject));
      snprintf(text, sizeof(text), "%.*s: %.*s", (int)cell->kind.size, cell->kind.data, (int)cell->message.size,
               cell->message.data);
      TVMFFIObjectDecRef(error);
      return text;
    }

    int main(void) {
      fill(x, w, b);
      int64_t sx[] = {M, K}, sw[] = {K, N}, sb[] = {N}, so[] = {M, N};
      DLTensor tx = tensor(x, 2, sx), tw = tensor(w, 2, sw), tb = tensor(b, 1, sb), to = tensor(out, 2, so);
      DLTensor* ptrs[] = {&tx, &tw, &tb, &to};
      TVMFFIAny args[TESSERA_LINEAR_RELU_NUM_ARGS], result;
      memset(args, 0, sizeof(args));
      memset(&result, 0, sizeof(result));
      for (int i = 0; i < TESSERA_LINEAR_RELU_NUM_ARGS; ++i) {
        args[i].type_index = kTVMFFIDLTensorPtr;
        args[i].v_ptr = ptrs[i];
      }
      if (__tvm_ffi_linear_relu(NULL, args, TESSERA_LINEAR_RELU_NUM_ARGS, &result) != 0) {
        printf("call failed: %s\n", last_error());
        return 1;
      }
      double worst = max_error(x, w, b, out);
      printf("max error %g\n", worst);
      int64_t bad[] = {K + 1, N};
      DLTensor tbad = tensor(w, 2, bad);
      args[1].v_ptr = &tbad;
      if (__tvm_ffi_linear_relu(NULL, args, TESSERA_LINEAR_RELU_NUM_ARGS, &result) == 0) return 2;
      printf("bad shape: %s\n", last_error());
      if (__tvm_ffi_linear_relu(NULL, args, 3, &result) == 0) return 3;
      printf("bad nargs: %s\n", last_error());
      return worst < 1e-4 ? 0 : 4;
    }
    """
).replace("COMMON", C_COMMON)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    (root / "linear_relu.py").write_text(KERNEL)
    out = root / "bundle"
    assert main(["export", str(root / "linear_relu.py"), "--target", "cpu", "--out", str(out)]) == 0
    return out


def test_the_bundle_holds_library_header_and_metadata(bundle):
    assert sorted(p.name for p in bundle.iterdir()) == [
        "fused_matmul_add_relu.cpp",  # the device kernel's C source, built into the library
        "linear_relu.entry.cc",  # the tvm-ffi entry
        "linear_relu.h",
        "linear_relu.so",
        "linear_relu.tsrb",  # the image the tsr* C runtime loads
        "metadata.json",
    ]
    meta = json.loads((bundle / "metadata.json").read_text())
    assert meta["abi"] == {
        "kind": "tvm-ffi",
        "entry": "__tvm_ffi_linear_relu",
        "library": "linear_relu.so",
        "header": "linear_relu.h",
        "image": "linear_relu.tsrb",
        "tsr_abi": "3.0",
    }
    assert meta["shapes"] == {"M": 32, "K": 48, "N": 40}
    assert meta["arguments"] == [
        {"name": "x", "role": "input", "dtype": "float32", "shape": [32, 48]},
        {"name": "w", "role": "input", "dtype": "float32", "shape": [48, 40]},
        {"name": "b", "role": "input", "dtype": "float32", "shape": [40]},
        {"name": "out", "role": "output", "dtype": "float32", "shape": [32, 40]},
    ]
    (kernel,) = meta["kernels"]
    assert kernel["name"] == "fused_matmul_add_relu_kernel" and {"tile", "resources", "launch"} <= set(kernel)
    # The work of one run, computed at compile time (the metrics' rates come from it).
    assert kernel["flops"] == 2 * 32 * 48 * 40
    assert kernel["bytes"] == 4 * (32 * 48 + 48 * 40 + 40 + 32 * 40)
    header = (bundle / "linear_relu.h").read_text()
    assert (
        "int __tvm_ffi_linear_relu(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);" in header
    )
    assert "args[1]  w    float32 [48, 40]  input" in header
    # The entry includes only the headers it uses: one kernel, no intermediates, no fp8 (<memory> and
    # <cmath> took 3/4 of an entry's compile, which every first call of a kernel waits for).
    includes = re.findall(r"^#include (.+)$", (bundle / "linear_relu.entry.cc").read_text(), re.M)
    assert includes == ["<tvm/ffi/c_api.h>", "<cstdarg>", "<cstdint>", "<cstdio>", "<cstring>"], includes


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_c_program_runs_the_exported_kernel(bundle, tmp_path):
    include, dlpack, lib = tvm_ffi_paths()
    (tmp_path / "host.c").write_text(HOST)
    exe = tmp_path / "host"
    subprocess.run(
        ["gcc", "-std=c11", "-O1", "-Wall", "-Werror", f"-I{bundle}", f"-I{include}", f"-I{dlpack}", "host.c",
         "-o", str(exe), str(bundle / "linear_relu.so"), f"-L{lib}", "-ltvm_ffi", f"-Wl,-rpath,{lib}", "-lm"],
        cwd=tmp_path, check=True, capture_output=True, text=True,
    )  # fmt: skip
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("max error ")
    assert lines[1] == "bad shape: ValueError: linear_relu: argument w has shape[0] = 49; expected 48"
    assert lines[2].startswith("bad nargs: TypeError:") and "4" in lines[2]


def test_export_needs_every_dim_bound(tmp_path, capsys):
    (tmp_path / "k.py").write_text(KERNEL.replace('SHAPES = {"M": 32, "K": 48, "N": 40}', "SHAPES = {}"))
    assert main(["export", str(tmp_path / "k.py"), "--out", str(tmp_path / "out"), "--shapes", "M=4"]) == 2
    assert "bind every dim of linear_relu; K, N not given" in capsys.readouterr().err
    assert not Path(tmp_path / "out").exists()


def test_repeated_shapes_export_one_library_for_each_set_of_dims(tmp_path, capsys):
    (tmp_path / "k.py").write_text(KERNEL)
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "k.py"), "--out", str(out), "--shapes", "M=16", "--shapes", "M=64"]) == 0
    assert "(M=16, K=48, N=40 | M=64, K=48, N=40) exported" in capsys.readouterr().out
    meta = json.loads((out / "metadata.json").read_text())
    assert [v["shapes"]["M"] for v in meta["variants"]] == [16, 64]
    assert [v["arguments"][0]["shape"] for v in meta["variants"]] == [[16, 48], [64, 48]]
    header = (out / "linear_relu.h").read_text()
    assert "args[0]  x    float32 [?, 48]  input" in header and "Built for M=16,K=48,N=40 | M=64,K=48,N=40" in header
    image = (out / "linear_relu.tsrb").read_bytes()
    assert b"arg 0 x input 2 32 2 -1 48\n" in image and b"launch none\n" in image
