"""The tsr* C runtime (seed 004 §3.5, §11.1): a C host runs an exported kernel without Python.

Both the runtime and the host are built with AddressSanitizer and UndefinedBehaviorSanitizer; the
host runs the seed's minimal flow on an exported GEMM+bias+ReLU and compares with a C reference
loop (float32 sums of 48 products: 1e-4 absolute), then feeds every kind of bad input and prints
the status and message of each. A sanitizer report or a crash fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest

from tessera.cli import main
from tessera_tvm._tvm import tvm_ffi_paths
from tessera_tvm.target.cpu.build import RUNTIME_INCLUDE_DIR
from tessera_tvm.target.tsr import build_runtime

from .test_export import C_COMMON, KERNEL

HOST = textwrap.dedent(
    r"""
    #include <math.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <dlpack/dlpack.h>
    #include <tessera/tsr.h>


    static void* read_file(const char* path, size_t* size) {
      FILE* f = fopen(path, "rb");
      if (!f) return NULL;
      fseek(f, 0, SEEK_END);
      *size = (size_t)ftell(f);
      fseek(f, 0, SEEK_SET);
      void* data = malloc(*size);
      if (fread(data, 1, *size, f) != *size) { free(data); data = NULL; }
      fclose(f);
      return data;
    }

    COMMON

    #define SHOW(what, call) do { tsr_status_t s_ = (call); printf("%s: %d %s\n", what, (int)s_, tsrGetLastError()); } while (0)

    int main(int argc, char** argv) {
      size_t size = 0;
      unsigned char* image = read_file(argv[1], &size);
      if (!image) { printf("cannot read %s\n", argv[1]); return 1; }

      /* The seed's minimal host flow. */
      tsr_context_t ctx;
      if (tsrCreateContext(&ctx) != TSR_SUCCESS) return 1;
      tsr_module_t mod = NULL;
      if (tsrLoadModule(ctx, image, size, &mod) != TSR_SUCCESS) { printf("load: %s\n", tsrGetLastError()); return 1; }
      tsr_kernel_t k;
      if (tsrGetKernel(mod, "linear_relu", &k) != TSR_SUCCESS) return 1;
      float *x, *w, *b, *out;
      if (tsrAlloc(ctx, sizeof(float) * M * K, TSR_ALLOC_HOST, (void**)&x) ||
          tsrAlloc(ctx, sizeof(float) * K * N, TSR_ALLOC_HOST, (void**)&w) ||
          tsrAlloc(ctx, sizeof(float) * N, TSR_ALLOC_HOST, (void**)&b) ||
          tsrAlloc(ctx, sizeof(float) * M * N, TSR_ALLOC_HOST, (void**)&out)) return 1;
      fill(x, w, b);
      int64_t sx[] = {M, K}, sw[] = {K, N}, sb[] = {N}, so[] = {M, N};
      DLTensor A = tensor(x, 2, sx), W = tensor(w, 2, sw), B = tensor(b, 1, sb), C = tensor(out, 2, so);
      void* args[] = {&A, &W, &B, &C};
      tsr_launch_t launch;
      memset(&launch, 0, sizeof(launch));
      tsr_stream_t stream = NULL;
      SHOW("launch", tsrLaunch(k, stream, launch, args, 4));
      printf("max error %s\n", max_error(x, w, b, out) < 1e-4 ? "ok" : "too large");

      /* Bad inputs: each a status and a message. */
      unsigned char* other = malloc(size);
      memcpy(other, image, size);
      other[4] = 4;  /* ABI major 4 */
      tsr_module_t bad = NULL;
      SHOW("abi", tsrLoadModule(ctx, other, size, &bad));
      SHOW("truncated", tsrLoadModule(ctx, image, size - 100, &bad));
      for (size_t i = 0; i < size; ++i) other[i] = (unsigned char)(i * 131 + 7);
      SHOW("garbage", tsrLoadModule(ctx, other, size, &bad));
      SHOW("short", tsrLoadModule(ctx, image, 16, &bad));
      uint64_t meta_len = 0;
      for (int i = 7; i >= 0; --i) meta_len = (meta_len << 8) | image[44 + i];
      memcpy(other, image, size);
      other[52 + meta_len + 8] ^= 0xff;  /* the library's ELF magic (caught by the digest first) */
      SHOW("corrupt", tsrLoadModule(ctx, other, size, &bad));
      free(other);
      tsr_kernel_t none;
      SHOW("unknown kernel", tsrGetKernel(mod, "softmax", &none));
      SHOW("nargs", tsrLaunch(k, NULL, launch, args, 3));
      SHOW("null args", tsrLaunch(k, NULL, launch, NULL, 4));
      void* holes[] = {&A, NULL, &B, &C};
      SHOW("null arg", tsrLaunch(k, NULL, launch, holes, 4));
      SHOW("null ctx out", tsrCreateContext(NULL));
      SHOW("null image", tsrLoadModule(ctx, NULL, size, &bad));
      int64_t wrong[] = {K + 1, N};
      DLTensor W2 = tensor(w, 2, wrong);
      void* misshapen[] = {&A, &W2, &B, &C};
      SHOW("shape", tsrLaunch(k, NULL, launch, misshapen, 4));
      DLTensor W16 = tensor(w, 2, sw);
      W16.dtype.bits = 16;
      void* half[] = {&A, &W16, &B, &C};
      SHOW("dtype", tsrLaunch(k, NULL, launch, half, 4));
      DLTensor W1 = tensor(w, 1, sw);
      void* flat[] = {&A, &W1, &B, &C};
      SHOW("dims", tsrLaunch(k, NULL, launch, flat, 4));
      tsr_launch_t odd = launch;
      odd.grid_x = 1000; odd.block_x = 7;
      SHOW("launch spec", tsrLaunch(k, NULL, odd, args, 4));
      SHOW("stream", tsrLaunch(k, (tsr_stream_t)&odd, launch, args, 4));
      size_t count = 0;
      SHOW("num args", tsrGetKernelNumArgs(k, &count));
      printf("count %zu\n", count);
      float* copy = NULL;
      SHOW("alloc copy", tsrAlloc(ctx, sizeof(float) * N, TSR_ALLOC_HOST, (void**)&copy));
      SHOW("memcpy", tsrMemcpy(ctx, copy, b, sizeof(float) * N));
      printf("copied %s\n", memcmp(copy, b, sizeof(float) * N) == 0 ? "same" : "different");
      SHOW("memcpy past end", tsrMemcpy(ctx, copy, b, sizeof(float) * N + 4));
      SHOW("flags", tsrAlloc(ctx, 16, 5, (void**)&copy));
      SHOW("device alloc", tsrAlloc(ctx, 16, TSR_ALLOC_DEVICE, (void**)&copy));
      tsr_stream_t made = NULL;
      SHOW("create stream", tsrCreateStream(ctx, &made));
      SHOW("sync", tsrSynchronize(ctx, NULL));
      SHOW("wrong kind", tsrGetKernel((tsr_module_t)ctx, "linear_relu", &none));
      SHOW("bad context device", tsrCreateContextOnDevice(-1, &ctx));
      if (argc > 2) {  /* a CUDA image: where there is no driver, a status that says so */
        size_t cuda_size = 0;
        unsigned char* cuda_image = read_file(argv[2], &cuda_size);
        SHOW("cuda image", tsrLoadModule(ctx, cuda_image, cuda_size, &bad));
        free(cuda_image);
      }
      SHOW("free", tsrFree(ctx, b));
      SHOW("double free", tsrFree(ctx, b));
      SHOW("foreign free", tsrFree(ctx, image));
      SHOW("destroy", tsrDestroyContext(ctx));
      SHOW("kernel after destroy", tsrLaunch(k, NULL, launch, args, 4));
      SHOW("module after destroy", tsrGetKernel(mod, "linear_relu", &none));
      SHOW("alloc after destroy", tsrAlloc(ctx, 16, TSR_ALLOC_HOST, (void**)&x));
      SHOW("destroy twice", tsrDestroyContext(ctx));
      /* A new context never takes a destroyed one's handle: the old handle stays dead. */
      tsr_context_t again;
      SHOW("create again", tsrCreateContext(&again));
      printf("same handle %s\n", again == ctx ? "yes" : "no");
      SHOW("old handle", tsrAlloc(ctx, 16, TSR_ALLOC_HOST, (void**)&x));
      SHOW("new handle", tsrAlloc(again, 16, TSR_ALLOC_HOST, (void**)&x));
      SHOW("destroy again", tsrDestroyContext(again));
      printf("abi %d\n", tsrGetAbiVersion());
      free(image);
      return 0;
    }
    """
).replace("COMMON", C_COMMON)


def _driver_present() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    root = tmp_path_factory.mktemp("tsr")
    (root / "linear_relu.py").write_text(KERNEL)
    assert main(["export", str(root / "linear_relu.py"), "--target", "cpu", "--out", str(root / "bundle")]) == 0
    return root / "bundle" / "linear_relu.tsrb"


@pytest.fixture(scope="module")
def sanitized_runtime(tmp_path_factory):
    """libtessera_rt.so with ASan + UBSan, built once for the module's tests (about 12 s)."""
    return build_runtime(tmp_path_factory.mktemp("rt"), sanitize=True)


SANITIZED_ENV = {"ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


def _build_host(source: str, runtime, tmp_path, name: str = "host"):
    """``source`` compiled with ASan + UBSan and linked against ``runtime``; the executable's path."""
    _, dlpack, _ = tvm_ffi_paths()
    (tmp_path / f"{name}.c").write_text(source)
    sanitize = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
    subprocess.run(
        ["gcc", "-std=c11", "-Wall", "-Werror", *sanitize, f"-I{RUNTIME_INCLUDE_DIR}", f"-I{dlpack}", f"{name}.c",
         "-o", name, str(runtime), f"-Wl,-rpath,{runtime.parent}", "-lm"],
        cwd=tmp_path, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return tmp_path / name


def _run_host(image, tmp_path, runtime, *extra) -> dict[str, str]:
    """Build the host with ASan + UBSan against ``runtime``, run it on ``image`` (and ``extra``)."""
    host = _build_host(HOST, runtime, tmp_path)
    command = [str(host), str(image), *map(str, extra)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **SANITIZED_ENV})
    assert run.returncode == 0 and "Sanitizer" not in run.stderr, run.stdout + run.stderr[-3000:]
    out = dict(line.split(": ", 1) for line in run.stdout.splitlines() if ": " in line)
    out["stdout"] = run.stdout
    return out


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_c_host_runs_the_seed_flow_and_every_bad_input_is_a_status(image, tmp_path, sanitized_runtime):
    out = _run_host(image, tmp_path, sanitized_runtime)
    stdout = out["stdout"]
    assert out["launch"] == "0 " and "max error ok" in stdout
    assert out["abi"] == "4 tsrLoadModule: the image needs ABI 4.0; this runtime has ABI 3.0"
    digest = "2 tsrLoadModule: the image does not match its SHA-256 (corrupt or edited)"
    assert out["truncated"].startswith(digest)
    assert out["garbage"].startswith("2 tsrLoadModule: not a Tessera image (no TSRB header)")
    assert out["short"] == "2 tsrLoadModule: the image is truncated (in its digest)"
    assert out["corrupt"].startswith(digest)
    assert out["unknown kernel"] == "5 tsrGetKernel: no kernel 'softmax' in the module; it has linear_relu"
    assert out["nargs"] == "2 tsrLaunch: linear_relu takes 4 arguments, got 3"
    assert out["null args"] == "2 tsrLaunch: args is NULL"
    assert out["null arg"] == "2 tsrLaunch: argument 1 (w) is NULL"
    assert out["null ctx out"] == "2 tsrCreateContext: ctx is NULL"
    assert out["null image"] == "2 tsrLoadModule: image or mod is NULL"
    assert out["shape"] == "2 tsrLaunch: ValueError: linear_relu: argument w has shape[0] = 49; expected 48"
    # the real dtypes, from the image's metadata, before the library is called
    assert out["dtype"] == "2 tsrLaunch: argument w has dtype float16; linear_relu expects float32"
    assert out["dims"] == "2 tsrLaunch: argument w has 1 dims; linear_relu expects 2"
    assert out["launch spec"].startswith(
        "2 tsrLaunch: launch spec grid [1000, 0, 0] block [7, 0, 0] smem 0 contradicts"
    )
    assert out["stream"].startswith("2 tsrLaunch: CPU kernels run on the default stream")
    assert out["free"] == "0 " and out["double free"].startswith("2 tsrFree: the pointer was not allocated")
    assert out["foreign free"].startswith("2 tsrFree: the pointer was not allocated")
    assert out["destroy"] == "0 "
    assert out["kernel after destroy"].startswith("2 tsrLaunch: not a live kernel")
    assert out["module after destroy"] == "2 tsrGetKernel: not a live module"
    assert out["alloc after destroy"] == "2 tsrAlloc: not a live context"
    assert out["destroy twice"].startswith("2 tsrDestroyContext: not a live context")
    assert "abi 3000" in stdout
    assert out["num args"] == "0 " and "count 4" in stdout
    assert out["memcpy"] == "0 " and "copied same" in stdout
    assert out["memcpy past end"] == "2 tsrMemcpy: 164 bytes run past the end of a tsrAlloc block"
    assert out["flags"] == "2 tsrAlloc: flags 5 is neither TSR_ALLOC_HOST nor TSR_ALLOC_DEVICE"
    assert out["wrong kind"] == "2 tsrGetKernel: not a live module"
    assert out["bad context device"] == "2 tsrCreateContextOnDevice: CUDA device -1 < 0"
    assert out["sync"] == "0 "
    assert out["create again"] == "0 " and "same handle no" in stdout
    assert out["old handle"] == "2 tsrAlloc: not a live context" and out["new handle"] == "0 "
    assert out["destroy again"] == "0 "
    if not _driver_present():  # CUDA work where there is no driver: a status that says so
        for what, call in (("device alloc", "tsrAlloc"), ("create stream", "tsrCreateStream")):
            assert out[what].startswith(f"7 {call}: ") and "no CUDA driver here" in out[what], out[what]


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nvcc") is None, reason="needs gcc and nvcc")
@pytest.mark.skipif(_driver_present(), reason="checks the machine without a CUDA driver (the gpu tests run it)")
def test_a_cuda_image_without_a_driver_is_a_status(image, tmp_path, sanitized_runtime):
    kernel = image.parent.parent / "linear_relu.py"
    assert main(["export", str(kernel), "--target", "hopper", "--shapes", "M=256,N=256,K=128",
                 "--out", str(tmp_path / "cuda")]) == 0  # fmt: skip
    out = _run_host(image, tmp_path, sanitized_runtime, tmp_path / "cuda" / "linear_relu.tsrb")
    assert out["cuda image"].startswith("7 tsrLoadModule: linear_relu runs on CUDA, and no CUDA driver here")


CUDA_HOST = textwrap.dedent(
    r"""
    #include <math.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <dlpack/dlpack.h>
    #include <tessera/tsr.h>

    enum { M = 256, K = 128, N = 256 };

    static DLTensor tensor(void* data, int ndim, int64_t* shape) {
      DLTensor t;
      memset(&t, 0, sizeof(t));
      t.data = data;
      t.device.device_type = kDLCUDA;
      t.ndim = ndim;
      t.dtype.code = kDLFloat; t.dtype.bits = 32; t.dtype.lanes = 1;
      t.shape = shape;
      return t;
    }

    /* each call is printed before it runs (stdout unbuffered): a crash shows the step it happened in */
    #define CHECK(call) do { printf("%s\n", #call); tsr_status_t s_ = (call); if (s_) { printf("%s: %d %s\n", #call, (int)s_, tsrGetLastError()); return 1; } } while (0)

    int main(int argc, char** argv) {
      setvbuf(stdout, NULL, _IONBF, 0);
      FILE* f = fopen(argv[1], "rb");
      fseek(f, 0, SEEK_END);
      size_t size = (size_t)ftell(f);
      fseek(f, 0, SEEK_SET);
      void* image = malloc(size);
      if (fread(image, 1, size, f) != size) return 1;
      fclose(f);
      static float x[M * K], w[K * N], b[N], out[M * N];
      for (int i = 0; i < M * K; ++i) x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
      for (int i = 0; i < K * N; ++i) w[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
      for (int i = 0; i < N; ++i) b[i] = (float)(i % 3) - 1.0f;

      tsr_context_t ctx; CHECK(tsrCreateContext(&ctx));
      tsr_module_t mod; CHECK(tsrLoadModule(ctx, image, size, &mod));
      tsr_kernel_t k; CHECK(tsrGetKernel(mod, "linear_relu", &k));
      void *dx, *dw, *db, *dout;
      CHECK(tsrAlloc(ctx, sizeof(x), TSR_ALLOC_DEVICE, &dx));
      CHECK(tsrAlloc(ctx, sizeof(w), TSR_ALLOC_DEVICE, &dw));
      CHECK(tsrAlloc(ctx, sizeof(b), TSR_ALLOC_DEVICE, &db));
      CHECK(tsrAlloc(ctx, sizeof(out), TSR_ALLOC_DEVICE, &dout));
      CHECK(tsrMemcpy(ctx, dx, x, sizeof(x)));
      CHECK(tsrMemcpy(ctx, dw, w, sizeof(w)));
      CHECK(tsrMemcpy(ctx, db, b, sizeof(b)));
      int64_t sx[] = {M, K}, sw[] = {K, N}, sb[] = {N}, so[] = {M, N};
      DLTensor A = tensor(dx, 2, sx), W = tensor(dw, 2, sw), B = tensor(db, 1, sb), C = tensor(dout, 2, so);
      void* args[] = {&A, &W, &B, &C};
      tsr_launch_t launch;
      memset(&launch, 0, sizeof(launch));
      tsr_stream_t stream; CHECK(tsrCreateStream(ctx, &stream));
      CHECK(tsrLaunch(k, stream, launch, args, 4));
      CHECK(tsrSynchronize(ctx, stream));
      CHECK(tsrMemcpy(ctx, out, dout, sizeof(out)));
      double worst = 0;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          float acc = b[j];
          for (int q = 0; q < K; ++q) acc += x[i * K + q] * w[q * N + j];
          acc = acc > 0 ? acc : 0;
          double d = fabs((double)acc - out[i * N + j]) / (1.0 + fabs((double)acc));
          worst = d > worst ? d : worst;
        }
      printf("max relative error %g\n", worst);
      CHECK(tsrDestroyContext(ctx));
      free(image);
      printf("done\n");
      return worst < 2e-2 ? 0 : 1;  /* a float32 GEMM may run in TF32 on the tensor cores */
    }
    """
)


def _run_cuda_host(image, tmp_path, env=None) -> subprocess.CompletedProcess:
    """Export linear_relu for hopper, build libtessera_rt with CUDA and CUDA_HOST, run it on the image."""
    kernel = image.parent.parent / "linear_relu.py"
    assert main(["export", str(kernel), "--target", "hopper", "--shapes", "M=256,N=256,K=128",
                 "--out", str(tmp_path / "cuda")]) == 0  # fmt: skip
    runtime = build_runtime(tmp_path / "rt", cuda=True)
    _, dlpack, _ = tvm_ffi_paths()
    (tmp_path / "host.c").write_text(CUDA_HOST)
    subprocess.run(
        ["gcc", "-std=c11", "-Wall", "-Werror", f"-I{RUNTIME_INCLUDE_DIR}", f"-I{dlpack}", "host.c", "-o", "host",
         str(runtime), f"-Wl,-rpath,{runtime.parent}", "-lm"],
        cwd=tmp_path, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return subprocess.run([str(tmp_path / "host"), str(tmp_path / "cuda" / "linear_relu.tsrb")],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip


@pytest.mark.gpu
def test_a_c_host_runs_a_cuda_image_on_the_gpu(image, tmp_path):
    run = _run_cuda_host(image, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]


# A stand-in libcuda.so.1: every call the runtime and the kernel library make succeeds, device memory
# is host memory, a launch is only recorded. It runs the host side of a CUDA image where no GPU is.
FAKE_LIBCUDA = textwrap.dedent(
    """\
    #include <stdint.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    typedef int CUresult;
    static int context_, module_, function_, stream_;
    CUresult cuInit(unsigned flags) { fprintf(stderr, "fake: cuInit\\n"); return 0; }
    CUresult cuGetErrorString(CUresult e, const char** s) { *s = "stand-in error"; return 0; }
    CUresult cuDeviceGet(int* d, int ordinal) { *d = ordinal; return 0; }
    CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
    CUresult cuDevicePrimaryCtxRetain(void** c, int d) { *c = &context_; return 0; }
    CUresult cuCtxPushCurrent_v2(void* c) { return 0; }
    CUresult cuCtxPopCurrent_v2(void** c) { if (c) *c = &context_; return 0; }
    CUresult cuCtxSynchronize(void) { return 0; }
    CUresult cuModuleLoadData(void** m, const void* image) { *m = &module_; return 0; }
    CUresult cuModuleGetFunction(void** f, void* m, const char* name) { *f = &function_; return 0; }
    CUresult cuFuncSetAttribute(void* f, int attribute, int value) { return 0; }
    CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned smem, void* stream, void** params, void** extra) {
      fprintf(stderr, "fake: launch grid %u %u %u block %u %u %u\\n", gx, gy, gz, bx, by, bz);
      return 0;
    }
    CUresult cuTensorMapEncodeTiled(void* map, int type, unsigned rank, void* address, const uint64_t* dims,
                                    const uint64_t* strides, const unsigned* box, const unsigned* element_strides,
                                    int interleave, int swizzle, int l2, int fill) {
      return ((uintptr_t)map) % 64 ? 1 : 0;  /* the driver wants 64-byte aligned descriptors */
    }
    CUresult cuMemAlloc_v2(uint64_t* p, size_t n) { *p = (uint64_t)(uintptr_t)calloc(1, n); return 0; }
    CUresult cuMemFree_v2(uint64_t p) { free((void*)(uintptr_t)p); return 0; }
    CUresult cuMemAllocAsync(uint64_t* p, size_t n, void* s) { return cuMemAlloc_v2(p, n); }
    CUresult cuMemFreeAsync(uint64_t p, void* s) { return cuMemFree_v2(p); }
    CUresult cuMemcpy(uint64_t d, uint64_t s, size_t n) { memcpy((void*)(uintptr_t)d, (void*)(uintptr_t)s, n); return 0; }
    CUresult cuMemcpyDtoDAsync_v2(uint64_t d, uint64_t s, size_t n, void* st) { return cuMemcpy(d, s, n); }
    CUresult cuStreamCreate(void** s, unsigned flags) { *s = &stream_; return 0; }
    CUresult cuStreamDestroy_v2(void* s) { return 0; }
    CUresult cuStreamSynchronize(void* s) { return 0; }
    """
)


@pytest.mark.nvcc  # the image embeds a cubin
def test_a_c_host_drives_a_cuda_image_through_a_stand_in_driver(image, tmp_path):
    # The host side of tsr + a CUDA kernel library, with no GPU: before 2026-11-26 the kernel library
    # found libtessera_rt's copy of std::call_once's helper for tessera/cuda_driver.h's driver table,
    # filled the runtime's table instead of its own, and segfaulted at the first launch (on an H200
    # and here alike).
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "fake_cuda.c").write_text(FAKE_LIBCUDA)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", "libcuda.so.1", "fake_cuda.c"], cwd=driver, check=True)
    env = {**os.environ, "LD_LIBRARY_PATH": f"{driver}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    run = _run_cuda_host(image, tmp_path, env=env)
    # launches do nothing here, so the host's result check fails (1); every call before it succeeded
    assert run.returncode == 1 and run.stdout.endswith("done\n"), run.stdout + run.stderr[-3000:]
    assert "tsrLaunch(k, stream, launch, args, 4)\n" in run.stdout and "max relative error" in run.stdout
    assert run.stderr.count("fake: cuInit") == 2  # the runtime's table and the kernel library's own
    assert run.stderr.count("fake: launch grid 1 2 1 block 384 1 1") == 1  # 128 x 256 blocks, 256 + 128 threads


# ============================================================================ issue #37, item 5: images are data

# Loads each image named on the command line (after the first, a valid one, that the mutation loop
# starts from) and launches what loads with the arguments linear_relu takes. argv: IMAGE SEED COUNT
# [IMAGES...]. Each case is printed before it runs, so a crash names it.
FUZZ_HOST = textwrap.dedent(
    r"""
    #include <math.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <dlpack/dlpack.h>
    #include <tessera/tsr.h>

    COMMON

    static unsigned char* read_all(const char* path, size_t* size) {
      FILE* f = fopen(path, "rb");
      if (!f) return NULL;
      fseek(f, 0, SEEK_END);
      *size = (size_t)ftell(f);
      fseek(f, 0, SEEK_SET);
      unsigned char* data = malloc(*size + 1);
      if (fread(data, 1, *size, f) != *size) { free(data); data = NULL; }
      fclose(f);
      return data;
    }

    static unsigned long long state;
    static unsigned long long next(void) {  /* xorshift64* */
      state ^= state >> 12; state ^= state << 25; state ^= state >> 27;
      return state * 2685821657736338717ULL;
    }

    static float x[M * K], w[K * N], b[N], out[M * N];

    /* 1 if it loaded (and was launched), 0 if refused */
    static int try_image(tsr_context_t ctx, const unsigned char* data, size_t size) {
      tsr_module_t mod = NULL;
      if (tsrLoadModule(ctx, data, size, &mod) != TSR_SUCCESS) return 0;
      tsr_kernel_t k;
      if (tsrGetKernel(mod, "linear_relu", &k) == TSR_SUCCESS) {
        int64_t sx[] = {M, K}, sw[] = {K, N}, sb[] = {N}, so[] = {M, N};
        DLTensor A = tensor(x, 2, sx), W = tensor(w, 2, sw), B = tensor(b, 1, sb), C = tensor(out, 2, so);
        void* args[] = {&A, &W, &B, &C};
        tsr_launch_t launch;
        memset(&launch, 0, sizeof(launch));
        tsr_status_t s = tsrLaunch(k, NULL, launch, args, 4);
        printf("  launch %d %s (max error %g)\n", (int)s, tsrGetLastError(), max_error(x, w, b, out));
      }
      tsrUnloadModule(mod);
      return 1;
    }

    int main(int argc, char** argv) {
      setvbuf(stdout, NULL, _IONBF, 0);
      size_t size = 0;
      unsigned char* image = read_all(argv[1], &size);
      if (!image || argc < 4) return 2;
      state = strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ULL + 1;
      long count = strtol(argv[3], NULL, 10);
      fill(x, w, b);
      tsr_context_t ctx;
      if (tsrCreateContext(&ctx) != TSR_SUCCESS) return 2;
      unsigned char* copy = malloc(size + 16);
      long tried = 0, loaded = 0;
      for (long i = 0; i < count; ++i) {
        size_t n = size;
        memcpy(copy, image, size);
        int kind = (int)(next() % 4);
        if (kind == 0) {  /* flip 1 to 8 bytes */
          int flips = 1 + (int)(next() % 8);
          for (int f = 0; f < flips; ++f) copy[next() % n] ^= (unsigned char)(1 + next() % 255);
        } else if (kind == 1) {  /* truncate */
          n = (size_t)(next() % size);
        } else if (kind == 2) {  /* insert a byte */
          size_t at = next() % (size + 1);
          memmove(copy + at + 1, copy + at, size - at);
          copy[at] = (unsigned char)next();
          n = size + 1;
        } else {  /* overwrite 8 bytes, mostly in the header and metadata (lengths, counts, names) */
          size_t limit = next() % 2 ? (size < 512 ? size : 512) : size;
          size_t at = next() % (limit > 8 ? limit - 8 : 1);
          unsigned long long v = next();
          memcpy(copy + at, &v, 8 <= size - at ? 8 : size - at);
        }
        if (n == size && memcmp(copy, image, size) == 0) continue;
        ++tried;
        printf("case %ld kind %d\n", i, kind);
        loaded += try_image(ctx, copy, n);
      }
      long resigned = 0, resigned_loaded = 0;
      for (int a = 4; a < argc; ++a) {
        size_t n = 0;
        unsigned char* data = read_all(argv[a], &n);
        if (!data) return 2;
        printf("image %s\n", argv[a]);
        ++resigned;
        resigned_loaded += try_image(ctx, data, n);
        free(data);
      }
      printf("mutated %ld loaded %ld\nresigned %ld loaded %ld\n", tried, loaded, resigned, resigned_loaded);
      tsrDestroyContext(ctx);
      free(copy);
      free(image);
      return 0;
    }
    """
).replace("COMMON", C_COMMON)


def _parts(image) -> tuple[str, bytes]:
    """The metadata text and the library of an exported image (found by content, whatever its layout)."""
    data = image.read_bytes()
    start = data.index(b"kernel ")
    end = data.index(b"\n", data.index(b"\nlaunch ", start) + 1) + 1
    return data[start:end].decode(), (image.parent / "linear_relu.so").read_bytes()


def _image(path, metadata: str, library: bytes):
    from tessera_tvm.target.tsr import write_image

    library_path = path.with_suffix(".so")
    library_path.write_bytes(library)
    return write_image(path, metadata, library_path)


def _mutated_metadata(metadata: str, rng) -> str:
    """``metadata`` with one line dropped, doubled or edited (numbers, names, the entry symbol)."""
    lines = metadata.splitlines()
    i = rng.randrange(len(lines))
    choice = rng.randrange(5)
    if choice == 0:
        del lines[i]
    elif choice == 1:
        lines.insert(i, lines[i])
    elif choice == 2:  # a number
        words = lines[i].split()
        spots = [j for j, word in enumerate(words) if word.lstrip("-").isdigit()] or [0]
        words[rng.choice(spots)] = str(rng.choice([0, 1, -1, 2, 3, 7, 16, 17, 255, 256, 1 << 31, -(1 << 40), 10**20]))
        lines[i] = " ".join(words)
    elif choice == 3:  # the entry symbol
        entry = rng.choice(["abort", "exit", "__tvm_ffi_nothing", "TVMFFIErrorSetRaisedFromCStr", "__tvm_ffi_"])
        lines[0] = " ".join(w if j != 2 else entry for j, w in enumerate(lines[0].split()))
    else:  # a word
        words = lines[i].split() or [""]
        words[rng.randrange(len(words))] = rng.choice(["", "cuda", "none", "x" * 300, "input", "\x01", "9" * 30])
        lines[i] = " ".join(words)
    return "\n".join(lines) + "\n"


def _fuzz_count(ci: int) -> int:
    from tests.robustness.fuzz import fuzz_settings

    return fuzz_settings(ci).max_examples


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_mutated_images_are_refused_and_resigned_ones_never_crash(image, tmp_path, sanitized_runtime):
    """The mutation driver: every changed image is refused by its digest before anything is mapped (of
    235 mutated images, 36 used to crash in dlopen, 24 in tsrLaunch, 2 ran with wrong numbers);
    metadata edited and signed again loads or not, and a launch is a status, never a crash.
    ``TESSERA_FUZZ_EXAMPLES=N`` runs 10 N mutations and N signed images, from a random seed."""
    import random

    mutations, signed = 10 * _fuzz_count(30), _fuzz_count(30)
    seed = 1 if not os.environ.get("TESSERA_FUZZ_EXAMPLES") else random.randrange(1 << 30)
    rng = random.Random(seed)
    metadata, library = _parts(image)
    images = [_image(tmp_path / f"signed{i}.tsrb", _mutated_metadata(metadata, rng), library) for i in range(signed)]
    host = _build_host(FUZZ_HOST, sanitized_runtime, tmp_path, "fuzz")
    command = [str(host), str(image), str(seed), str(mutations), *map(str, images)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, **SANITIZED_ENV})
    last = [line for line in run.stdout.splitlines() if line.startswith(("case", "image"))][-1:]
    assert run.returncode == 0 and "Sanitizer" not in run.stderr, f"seed {seed}, {last}: {run.stderr[-3000:]}"
    tried, loaded = map(int, run.stdout.split("mutated ")[1].split()[0:3:2])
    assert tried > 0.9 * mutations and loaded == 0, run.stdout[-2000:]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_the_entry_is_looked_up_in_the_images_own_library(image, tmp_path, sanitized_runtime):
    """dlsym on the library's handle also searches what it links: entry=abort used to abort the host.
    A signed image naming a symbol that its library does not define itself is refused."""
    metadata, library = _parts(image)
    name = metadata.split()[2]
    # a library that defines nothing itself and links one that defines the entry's name
    (tmp_path / "dep.c").write_text(f"int {name}(void* a, void* b, int c, void* d) {{ return 0; }}\n")
    (tmp_path / "shell.c").write_text("int shell_marker(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", "libdep.so", "dep.c"], cwd=tmp_path, check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", "shell.so", "shell.c", "-L.", "-ldep", "-Wl,--no-as-needed",
                    f"-Wl,-rpath,{tmp_path}"], cwd=tmp_path, check=True)  # fmt: skip
    cases = {
        "abort": _image(tmp_path / "abort.tsrb", metadata.replace(name, "abort", 1), library),
        "dependency": _image(tmp_path / "dep.tsrb", metadata, (tmp_path / "shell.so").read_bytes()),
    }
    host = _build_host(FUZZ_HOST, sanitized_runtime, tmp_path, "fuzz")
    for what, path in cases.items():
        run = subprocess.run([str(host), str(image), "0", "0", str(path)], capture_output=True, text=True,
                             timeout=120, env={**os.environ, **SANITIZED_ENV})  # fmt: skip
        assert run.returncode == 0 and "resigned 1 loaded 0" in run.stdout, (what, run.stdout, run.stderr[-2000:])
