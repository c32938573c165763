"""A compiled Tessera kernel as one tvm-ffi module on an NVIDIA GPU: its cubins plus one entry.

The entry ``__tvm_ffi_<kernel>`` takes DLPack tensors on one CUDA device (torch CUDA tensors through
tvm-ffi, or DLTensor* from a C host), the kernel's inputs then its outputs, checks each one (device,
dtype, shape, strides) with an error that names it, and then does the host-side work TileLang's host
code does, from data read out of that host code when the kernel is built (:func:`device_launches`):
encode each TMA descriptor (``cuTensorMapEncodeTiled``), raise the function's dynamic shared memory
limit, and launch each device function (``cuLaunchKernel``) with its grid, block and shared memory
on the stream tvm-ffi's environment names for the device (torch's current stream when torch calls).
Intermediates are allocated and freed in stream order (``cuMemAllocAsync``).

The cubins are embedded in the library (``.incbin``) and loaded per device on first use; the CUDA
driver is opened at first call (``tessera/cuda_driver.h``), so the library loads anywhere and says
"no CUDA driver" where there is none. It needs tvm-ffi and the driver: no TVM runtime, so TVM,
tvm-ffi and the tsr C runtime load it alike. Building needs g++ and the CUDA headers, not a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ...errors import TesseraError
from ..module import (
    GpuLaunch,
    ModuleError,
    ModulePlan,
    TensorMap,
    dlpack_type,
    entry_dispatch,
    entry_helpers,
    entry_opening,
)
from ..toolchain import (
    atomic_output_dir,
    find_tool,
    require_tool,
    run_tool,
    untouched_on_failure,
    validate_artifact_name,
)

__all__ = [
    "build_module",
    "cuda_include_dir",
    "device_launches",
    "entry_source",
    "linked_module",
    "standalone_entry_source",
]

_TENSORMAP = "__tvm_tensormap_create_tiled"
_GRID = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
_BLOCK = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
_DYN_SMEM = "tirx.use_dyn_shared_memory"


def device_launches(lowered) -> tuple[GpuLaunch, ...]:
    """What the host code of a lowered CUDA module launches, in order, as data.

    Read from its host PrimFunc (after the packed-API lowering): each ``__tvm_tensormap_create_tiled``
    call becomes a :class:`TensorMap`, each call of a device function a :class:`GpuLaunch` whose
    pointers index the tile program's buffers (``lowered._program_order``). A host call this does not
    know, or a value only known at run time, is a :class:`ModuleError` naming it.
    """
    from ..._tvm import tvm

    tirx = tvm.tirx
    where = f"kernel {lowered.name}"
    devices = {gv.name_hint: f for gv, f in lowered.device_mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    hosts = [f for f in lowered.host_mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    if len(hosts) != 1:
        raise ModuleError(f"{where}: expected one host function, found {len(hosts)}")
    host = hosts[0]
    args_var = host.params[1]  # (self, args, num_args, result): the packed API
    lets: dict = {}
    calls: list = []

    def visit(node):
        if isinstance(node, (tirx.Bind, tirx.Let)):  # this TVM binds with Bind statements
            lets[node.var] = node.value
        elif isinstance(node, tirx.Call) and node.op.name == "tirx.tvm_call_packed":
            calls.append(node)

    tirx.stmt_functor.post_order_visit(host.body, visit)

    def arg_index(handle) -> int | None:  # the packed argument a tensor handle was read from
        found: list[int] = []

        def look(node):
            if isinstance(node, tirx.Call) and node.op.name == "tirx.tvm_struct_get" and node.args[0].same_as(args_var):
                found.append(int(node.args[1]))

        tirx.stmt_functor.post_order_visit(tirx.Evaluate(lets.get(handle, handle)), look)
        return found[0] if found else None

    def buffer_index(var) -> int:  # data var -> index of its tensor among the program's buffers
        value = lets.get(var)
        if (
            isinstance(value, tirx.Call)
            and value.op.name == "tirx.tvm_struct_get"
            and isinstance(value.args[0], tirx.Var)
        ):
            index = arg_index(value.args[0])
            if index is not None and index < len(lowered._program_order):
                return index
        raise ModuleError(f"{where}: the host passes {var} to the device, which is not one of the kernel's buffers")

    def const(value, what: str) -> int:
        if isinstance(value, tirx.IntImm):
            return int(value.value)
        raise ModuleError(f"{where}: {what} is {value}, known only at run time; the tvm-ffi module needs it constant")

    tensormaps: dict = {}  # descriptor var -> (TensorMap)
    launches = []
    for call in calls:
        callee = str(call.args[0].value)
        rest = list(call.args[1:])
        if callee == "__tvm_set_device":
            continue  # the entry enters the tensors' device itself
        if callee == _TENSORMAP:
            desc, data_type, rank = rest[0], const(rest[1], "a TMA data type"), const(rest[2], "a TMA rank")
            values = [const(v, f"TMA descriptor {desc} field {i}") for i, v in enumerate(rest[4:], 4)]
            if len(values) != 4 * rank + 4:
                raise ModuleError(f"{where}: TMA descriptor {desc} has {len(rest)} arguments for rank {rank}")
            dims, strides, box, elem = (tuple(values[i * rank : (i + 1) * rank]) for i in range(4))
            tensormaps[desc] = TensorMap(
                buffer_index(rest[3]), data_type, dims, strides[1:], box, elem, *values[4 * rank :]
            )
            continue
        device = devices.get(callee)
        if device is None:
            raise ModuleError(
                f"{where}: its host code calls {callee!r}, which the tvm-ffi module cannot do yet "
                f"(it encodes {_TENSORMAP} descriptors and launches device functions)"
            )
        tags = [str(t) for t in device.attrs.get("tirx.kernel_launch_params", [])]
        nparams = len(device.params)
        if len(rest) != nparams + len(tags):
            raise ModuleError(f"{where}: {callee} is called with {len(rest)} values for {nparams} parameters + {tags}")
        unknown = [t for t in tags if t not in (*_GRID, *_BLOCK, _DYN_SMEM)]
        if unknown:
            raise ModuleError(f"{where}: {callee} has launch parameters {unknown} the tvm-ffi module does not set yet")
        dims = {t: const(v, f"{callee}'s {t}") for t, v in zip(tags, rest[nparams:], strict=True)}
        maps: list[TensorMap] = []
        params: list[tuple[str, int]] = []
        for param, value in zip(device.params, rest[:nparams], strict=True):
            if value in tensormaps:
                params.append(("tensormap", len(maps)))
                maps.append(tensormaps[value])
            elif param.dtype == "handle":
                params.append(("pointer", buffer_index(value)))
            elif str(param.dtype) in ("int32", "int64"):
                params.append((str(param.dtype), const(value, f"{callee}'s parameter {param}")))
            else:
                raise ModuleError(f"{where}: {callee}'s parameter {param} has type {param.dtype}, not taken yet")
        launches.append(
            GpuLaunch(
                function=callee,
                params=tuple(params),
                grid=tuple(dims.get(t, 1) for t in _GRID),
                block=tuple(dims.get(t, 1) for t in _BLOCK),
                smem_bytes=dims.get(_DYN_SMEM, 0),
                tensormaps=tuple(maps),
            )
        )
    if not launches:
        raise ModuleError(f"{where}: its host code launches no device function")
    return tuple(launches)


def cuda_include_dir() -> Path:
    """The CUDA toolkit's include directory (where ``cuda.h`` is): ``CUDA_HOME``, ``CUDA_PATH``, next
    to nvcc, or ``/usr/local/cuda``."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = find_tool("nvcc")
    if nvcc is not None:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    candidates.append("/usr/local/cuda")
    for root in candidates:
        if root and (Path(root) / "include" / "cuda.h").is_file():
            return Path(root) / "include"
    raise TesseraError(
        "the CUDA toolkit's headers (cuda.h) were not found in CUDA_HOME, CUDA_PATH, next to nvcc or in "
        "/usr/local/cuda: install the CUDA toolkit or set CUDA_HOME to build CUDA tvm-ffi modules"
    )


def entry_source(plans: Sequence[ModulePlan], *, cubins: Sequence[bytes] | None = None) -> str:
    """The C++ of the CUDA entry ``__tvm_ffi_<name>``: one namespace per plan (``v<k>::Entry``, its
    cubins ``binary<i>.cubin`` beside the source, numbered across plans) and the entry that picks
    one by the arguments' shapes. Everything but the entry has internal linkage, so that the entries
    of several kernels link into one library.

    ``cubins`` (one per call, across plans), when given, are written into the source as string
    literals instead of ``.incbin`` of the files beside it: a source that needs no other file."""
    plans = list(plans)
    count = sum(len(plan.calls) for plan in plans)
    if cubins is not None and len(cubins) != count:
        raise ModuleError(f"{plans[0].name}: {len(cubins)} cubins given for {count} device kernels")
    name = plans[0].name
    lines = [f"// The tvm-ffi entry of Tessera kernel {name} on CUDA: checks its arguments, launches its kernels."]
    lines += entry_helpers("kDLCUDA", "an NVIDIA GPU").splitlines()
    lines += [
        "",
        "#include <tessera/cuda_driver.h>",
        "#include <tvm/ffi/extra/c_env_api.h>",
        "",
        "#include <cmath>",
        "#include <memory>",
        "#include <mutex>",
        "",
        "namespace cu = tessera::cuda;",
        "",
        "namespace {",
    ]
    first = 0
    for k, plan in enumerate(plans):
        embedded = None if cubins is None else cubins[first : first + len(plan.calls)]
        lines += ["", *_variant(plan, k, first, embedded)]
        first += len(plan.calls)
    lines += ["", "}  // namespace", "", *entry_dispatch(plans, lambda k: f"v{k}::Entry")]
    return "\n".join(lines)


def standalone_entry_source(plan: ModulePlan, cubins: Sequence[bytes]) -> str:
    """``plan``'s entry as one C++ source that compiles with no include flags and no file beside it:
    its cubins as literals, ``tessera/cuda_driver.h`` written into it and the toolkit's ``cuda.h``
    included by absolute path (tvm-ffi's headers are left to the compile, which has them). What a
    TVM ``CSourceModule`` carries into another TVM's ``export_library`` (issue #17)."""
    from ..cpu.build import RUNTIME_INCLUDE_DIR

    driver = (Path(RUNTIME_INCLUDE_DIR) / "tessera" / "cuda_driver.h").read_text(encoding="utf-8")
    cuda_h = cuda_include_dir() / "cuda.h"
    if "#include <cuda.h>" not in driver:
        raise ModuleError("tessera/cuda_driver.h no longer includes <cuda.h>; standalone_entry_source needs updating")
    driver = driver.replace("#include <cuda.h>", f'#include "{cuda_h}"')
    source = entry_source([plan], cubins=cubins)
    include = "#include <tessera/cuda_driver.h>"
    if include not in source:
        raise ModuleError(f"{plan.name}: the entry does not include {include}")
    return source.replace(include, f"// tessera/cuda_driver.h, written in\n{driver}")


def _variant(plan: ModulePlan, k: int, first: int, cubins: Sequence[bytes] | None = None) -> list[str]:
    """Namespace ``v<k>``: ``plan``'s embedded cubins (``binary<first + i>.cubin``, or ``cubins`` as
    literals), their functions loaded per device, and ``Entry``, which checks the arguments and
    launches them."""
    name = plan.name
    tensors = [*plan.inputs, *plan.outputs]
    if any(call.converts_in or call.converts_out for call in plan.calls):
        raise ModuleError(f"{name}: a CUDA kernel holds every dtype as it is; the plan asks for conversions")
    functions = [(first + i, launch) for i, call in enumerate(plan.calls) for launch in call.launches]
    names = [f'"{launch.function}"' for _, launch in functions]
    lines = [f"namespace v{k} {{  // {plan.name} for {', '.join(f'{a}={b}' for a, b in plan.bound) or 'its shapes'}"]
    for i in range(first, first + len(plan.calls)):  # each fused kernel's cubin, embedded as it is
        if cubins is not None:
            lines += _cubin_literal(f"tessera_cubin_{i}", cubins[i - first])
            continue
        lines += [
            "__asm__(",
            '    ".section .rodata\\n"',
            '    ".balign 64\\n"',
            f'    "tessera_cubin_{i}:\\n"',
            f'    ".incbin \\"binary{i}.cubin\\"\\n"',
            '    ".byte 0\\n"',
            '    ".previous\\n");',
            f'extern "C" const char tessera_cubin_{i}[] __asm__("tessera_cubin_{i}");',
        ]
    lines += [
        "",
        f"constexpr int kFunctions = {len(functions)};",
        "constexpr int kMaxDevices = 64;",
        f"const char* const kNames[kFunctions] = {{{', '.join(names)}}};",
        f"const char* const kBinaries[kFunctions] = {{{', '.join(f'tessera_cubin_{i}' for i, _ in functions)}}};",
        f"const unsigned kSmem[kFunctions] = {{{', '.join(str(launch.smem_bytes) for _, launch in functions)}}};",
        "",
        "// Each device's functions, loaded from the embedded cubins on first use there.",
        "struct Loaded {",
        "  std::once_flag once;",
        "  std::string error;",
        "  CUfunction functions[kFunctions] = {};",
        "};",
        "Loaded loaded[kMaxDevices];",
        "",
        "const std::string& Load(int device) {",
        "  Loaded& slot = loaded[device];",
        "  std::call_once(slot.once, [&slot] {",
        "    const cu::Driver& driver = cu::GetDriver();",
        "    CUmodule modules[kFunctions] = {};",
        "    for (int i = 0; i < kFunctions; ++i) {",
        "      CUresult status = CUDA_SUCCESS;",
        "      for (int j = 0; j < i && modules[i] == nullptr; ++j) {",
        "        if (kBinaries[j] == kBinaries[i]) modules[i] = modules[j];",
        "      }",
        "      if (modules[i] == nullptr && (status = driver.cuModuleLoadData(&modules[i], kBinaries[i])) != CUDA_SUCCESS) {",
        '        slot.error = cu::Describe("cuModuleLoadData", status);',
        "        return;",
        "      }",
        "      if ((status = driver.cuModuleGetFunction(&slot.functions[i], modules[i], kNames[i])) != CUDA_SUCCESS) {",
        '        slot.error = cu::Describe((std::string("cuModuleGetFunction ") + kNames[i]).c_str(), status);',
        "        return;",
        "      }",
        "      if (kSmem[i] > 48 * 1024) {  // above the default limit, a function must ask for its dynamic shared memory",
        "        status = driver.cuFuncSetAttribute(slot.functions[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,",
        "                                           static_cast<int>(kSmem[i]));",
        "        if (status != CUDA_SUCCESS) {",
        '          slot.error = cu::Describe("cuFuncSetAttribute (dynamic shared memory)", status);',
        "          return;",
        "        }",
        "      }",
        "    }",
        "  });",
        "  return slot.error;",
        "}",
        "",
        "// Frees the intermediates in stream order when the entry returns, however it returns.",
        "struct Scratch {",
        "  CUstream stream = nullptr;",
        "  CUdeviceptr pointers[16] = {};",
        "  int count = 0;",
        "  ~Scratch() {",
        "    for (int i = 0; i < count; ++i) cu::GetDriver().cuMemFreeAsync(pointers[i], stream);",
        "  }",
        "};",
        "",
        *entry_opening(plan, "Entry"),
    ]
    lead = tensors[0].name
    for t in tensors[1:]:
        lines += [
            f"  if (device_{t.name} != device_{lead}) {{",
            f'    return Fail("ValueError", "%s: arguments {lead} and {t.name} are on CUDA devices %d and %d; put them '
            f'on one", kernel, device_{lead}, device_{t.name});',
            "  }",
        ]
    lines += [
        f"  const int device = device_{lead};",
        "  if (device < 0 || device >= kMaxDevices) {",
        '    return Fail("ValueError", "%s: CUDA device %d is out of range", kernel, device);',
        "  }",
        "  cu::ContextGuard context;",
        "  std::string error = context.Enter(device);",
        "  if (error.empty()) error = Load(device);",
        '  if (!error.empty()) return Fail("RuntimeError", "%s: %s", kernel, error.c_str());',
        "  const cu::Driver& driver = cu::GetDriver();",
        "  CUstream stream = static_cast<CUstream>(TVMFFIEnvGetStream(kDLCUDA, device));",
        "  CUresult status = CUDA_SUCCESS;",
        "  Scratch scratch;",
        "  scratch.stream = stream;",
    ]
    if len(plan.intermediates) > 16:
        raise ModuleError(f"{name}: {len(plan.intermediates)} intermediates; the CUDA entry holds at most 16")
    for t in plan.intermediates:
        _, bits = dlpack_type(t, name)
        lines += [
            f"  if ((status = driver.cuMemAllocAsync(&scratch.pointers[scratch.count], {max(1, t.numel * bits // 8)}, "
            "stream)) != CUDA_SUCCESS) {",
            f'    return Fail("RuntimeError", "%s: %s", kernel, cu::Describe("cuMemAllocAsync ({t.name})", '
            "status).c_str());",
            "  }",
            f"  void* data_{t.name} = reinterpret_cast<void*>(scratch.pointers[scratch.count++]);",
        ]
    slot = 0
    for i, call in enumerate(plan.calls):
        for j, launch in enumerate(call.launches):
            lines += _launch_lines(call, launch, f"{i}_{j}", slot)
            slot += 1
    by_name = {t.name: t for t in tensors}
    for src, dst in plan.copies:
        _, bits = dlpack_type(by_name[src], name)
        lines += [
            f"  status = driver.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(data_{dst}), "
            f"reinterpret_cast<CUdeviceptr>(data_{src}), {by_name[src].numel * bits // 8}, stream);",
            "  if (status != CUDA_SUCCESS) {",
            '    return Fail("RuntimeError", "%s: %s", kernel, cu::Describe("cuMemcpyDtoDAsync", status).c_str());',
            "  }",
        ]
    lines += [
        "  result->type_index = kTVMFFINone;",
        "  result->v_int64 = 0;",
        "  return 0;",
        "}",
        f"}}  // namespace v{k}",
    ]
    return lines


def _cubin_literal(name: str, cubin: bytes) -> list[str]:
    """``cubin`` as a C++ array ``name`` (a string literal of ``\\xHH`` escapes, 64 bytes a line;
    the literal's own terminating zero follows it, as after an ``.incbin``)."""
    rows = ["".join(f"\\x{b:02x}" for b in cubin[i : i + 64]) for i in range(0, len(cubin), 64)]
    return [f"alignas(64) const char {name}[] =", *(f'    "{row}"' for row in rows or [""])] + [
        f"    ;  // {len(cubin)} bytes"
    ]


def _launch_lines(call, launch: GpuLaunch, tag: str, slot: int) -> list[str]:
    """Encode ``launch``'s TMA descriptors, then launch it."""
    lines = [f"  {{  // {call.kernel}: {launch.function}"]
    for k, tm in enumerate(launch.tensormaps):
        rank = len(tm.dims)

        def arr(kind: str, values) -> str:
            return f"{kind} [{max(1, len(values))}] = {{{', '.join(map(str, values)) or '0'}}}"

        lines += [
            f"    alignas(64) CUtensorMap map{k};",
            f"    const cuuint64_t dims{k}{arr('', tm.dims)};",
            f"    const cuuint64_t strides{k}{arr('', tm.strides)};",
            f"    const cuuint32_t box{k}{arr('', tm.box)};",
            f"    const cuuint32_t elem{k}{arr('', tm.element_strides)};",
            f"    status = driver.cuTensorMapEncodeTiled(&map{k}, static_cast<CUtensorMapDataType>({tm.data_type}), "
            f"{rank}, data_{call.args[tm.buffer]}, dims{k}, strides{k}, box{k}, elem{k}, "
            f"static_cast<CUtensorMapInterleave>({tm.interleave}), static_cast<CUtensorMapSwizzle>({tm.swizzle}), "
            f"static_cast<CUtensorMapL2promotion>({tm.l2_promotion}), "
            f"static_cast<CUtensorMapFloatOOBfill>({tm.oob_fill}));",
            "    if (status != CUDA_SUCCESS) {",
            f'      return Fail("RuntimeError", "%s: %s", kernel, cu::Describe("cuTensorMapEncodeTiled '
            f'({call.args[tm.buffer]})", status).c_str());',
            "    }",
        ]
    values = []
    for p, (kind, value) in enumerate(launch.params):
        if kind == "tensormap":
            values.append(f"&map{value}")
        elif kind == "pointer":
            lines.append(f"    void* param{p} = data_{call.args[value]};")
            values.append(f"&param{p}")
        else:
            ctype = "int32_t" if kind == "int32" else "int64_t"
            lines.append(f"    {ctype} param{p} = {value};")
            values.append(f"&param{p}")
    grid, block = launch.grid, launch.block
    lines += [
        f"    void* params[] = {{{', '.join(values) or 'nullptr'}}};",
        f"    status = driver.cuLaunchKernel(loaded[device].functions[{slot}], {grid[0]}, {grid[1]}, {grid[2]}, "
        f"{block[0]}, {block[1]}, {block[2]}, {launch.smem_bytes}, stream, params, nullptr);",
        "    if (status != CUDA_SUCCESS) {",
        f'      return Fail("RuntimeError", "%s: %s", kernel, cu::Describe("cuLaunchKernel ({launch.function})", '
        "status).c_str());",
        "    }",
        "  }",
    ]
    return lines


def build_module(
    plans: Sequence[ModulePlan], out_dir: str | os.PathLike[str], flags: Sequence[str] = (), timeout: float = 600
) -> Path:
    """Build ``plans`` (one kernel, one plan per set of dims) into ``out_dir/<name>.so``, the entry's
    source and cubins kept beside it.

    ``flags`` are the config's nvcc flags, which do not apply to this host build (g++ -O2). The
    files appear together only on success; a failing compile raises ``ToolchainError``."""
    from ..._tvm import tvm_ffi_paths
    from ..cpu.build import RUNTIME_INCLUDE_DIR

    plans = list(plans)
    name = plans[0].name
    validate_artifact_name(name)
    calls = [call for plan in plans for call in plan.calls]
    for call in calls:
        if not call.launches or call.binary is None or not Path(call.binary).is_file():
            raise ModuleError(
                f"{name}: device kernel {call.kernel} has no cubin to embed (nvcc was not on PATH when it was "
                "compiled?); compile again where nvcc is, or set TESSERA_NVCC"
            )
    source = entry_source(plans)
    cxx = require_tool("g++")
    include, dlpack, lib = tvm_ffi_paths()
    entry = f"{name}.entry.cc"
    command = [
        cxx, "-std=c++17", "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-fno-gnu-unique",
        f"-I{RUNTIME_INCLUDE_DIR}", f"-I{cuda_include_dir()}",
        f"-I{include}", f"-I{dlpack}", "-o", f"{name}.so", entry,
        f"-L{lib}", "-ltvm_ffi", f"-Wl,-rpath,{lib}", "-ldl",
    ]  # fmt: skip
    final_dir = Path(out_dir).absolute()
    with untouched_on_failure(final_dir), atomic_output_dir(final_dir) as staging:
        (staging / entry).write_text(source, encoding="utf-8")
        for i, call in enumerate(calls):
            (staging / f"binary{i}.cubin").write_bytes(Path(call.binary).read_bytes())
        run_tool(command, cwd=staging, timeout=timeout)
    return final_dir / f"{name}.so"


def linked_module(plan: ModulePlan, binaries: Sequence[str | os.PathLike[str]] = (), timeout: float = 600):
    """``plan``'s library built into the kernel cache (keyed by its entry and its cubins, so each
    instance pays the ~1 s of g++ once) and loaded: the tvm-ffi Function ts.compile's CUDA calls run.
    ``binaries`` are the cubins the plan's calls name (given for the cache key's sake)."""
    from ..._tvm import tvm_ffi, tvm_ffi_paths
    from ...kernel_store import cached_build

    cubins = [Path(call.binary).read_bytes() for call in plan.calls if call.binary is not None]
    parts = (entry_source([plan]), *cubins, *tvm_ffi_paths(), str(cuda_include_dir()))
    # Verified against its manifest before it is loaded (a damaged library would crash the process).
    final = cached_build(lambda directory: build_module([plan], directory, timeout=timeout), *parts, name=plan.name)
    return tvm_ffi.load_module(str(final / f"{plan.name}.so"))[plan.name]
