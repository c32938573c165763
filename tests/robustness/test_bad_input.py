# ruff: noqa: F821, F722  (Tensor["M", "K", ...] dims are strings, not names)
"""Bad input never crashes: malformed configs, kernels, arguments and schedules end in a TesseraError.

Every case must raise a ``tessera_tvm.TesseraError`` subclass (or the ``TypeError`` the API
documents for a non-kernel / non-path argument) whose message names the problem, never a
segfault, a leaked TVM internal error or a hang. Cases that could hang or crash the interpreter
(alias bombs, deep nesting, garbage bytes) run in a subprocess with a timeout.

The config format has no ``extends``/include mechanism (the only reference is
``lower_and_legalize: shared``, a fixed file), so there is no circular reference to test; an empty
pipeline and a pipeline naming unknown passes are tested instead.
"""

# No `from __future__ import annotations`: the kernels annotate with closure variables.

import os
import queue
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera_tvm.config import load_config
from tests.conftest import REPO

from .fuzz import count, fuzz_settings

#: Text that only a TVM/TileLang internal failure (not a Tessera error) would put in a message.
INTERNAL = (
    "InternalError",
    "Check failed",
    "TVMError",
    "Traceback (most recent call last)",
    "tvm/src/",
    "Segmentation fault",
    "core dumped",
)


def assert_clean(exc: BaseException, *words: str, types=(tessera_tvm.TesseraError,)) -> None:
    """``exc`` is one of ``types`` and its message names the problem (``words``) without TVM internals."""
    msg = str(exc)
    assert isinstance(exc, types), f"{type(exc).__module__}.{type(exc).__name__} leaked: {msg[:2000]}"
    for bad in INTERNAL:
        assert bad not in msg, f"TVM internals in the message ({bad!r}): {msg[:2000]}"
    for w in words:
        assert w.lower() in msg.lower(), f"message does not name {w!r}: {msg[:2000]}"


def raises_clean(fn, *words, types=(tessera_tvm.TesseraError,)):
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - any escape is judged by assert_clean
        assert_clean(exc, *words, types=types)
        return exc
    pytest.fail(f"no error raised (expected one naming {words})")


# In an interpreter of its own: load each config path read from stdin, print OK or the error's class and
# message. Any other exception ends the process (its traceback on stderr), as a crash or leak does.
_LOAD_SCRIPT = textwrap.dedent("""
    import sys, tessera_tvm
    print("READY", flush=True)
    for line in sys.stdin:
        try:
            tessera_tvm.load_config(line.rstrip("\\n"))
            print("RESULT OK", flush=True)
        except tessera_tvm.TesseraError as exc:
            print("RESULT TesseraError", type(exc).__name__, " ".join(str(exc).split()), flush=True)
""")


def _forward_lines(stream, lines: queue.Queue) -> None:
    """Each line of ``stream`` into ``lines``, then None when it ends (the process is gone)."""
    for line in stream:
        lines.put(line)
    lines.put(None)


class IsolatedLoader:
    """load_config in a process of its own (one per module: each start imports Tessera, ~3 s), so that a
    config that crashes, leaks an exception or hangs the loader fails its test and nothing else: the
    process is killed and the next case starts a fresh one."""

    def __init__(self):
        self.proc = None

    def _start(self):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LOAD_SCRIPT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=REPO,
        )  # fmt: skip
        self.lines = queue.Queue()
        threading.Thread(target=_forward_lines, args=(self.proc.stdout, self.lines), daemon=True).start()
        self._read(120, "start")

    def _read(self, timeout: float, what: str) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            pytest.fail(f"load_config({what}) hung for more than {timeout} s")
        if line is None:  # the process ended
            code = self.proc.wait()
            self.stderr.seek(0)
            err = self.stderr.read().decode(errors="replace")
            self.proc = None
            pytest.fail(f"load_config({what}) crashed or leaked (rc {code}): {err[-3000:]}")
        return line.rstrip("\n")

    def __call__(self, path, timeout: float = 60) -> str:
        """The RESULT line for ``path``."""
        if self.proc is None:
            self._start()
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        line = self._read(timeout, str(path))
        assert line.startswith("RESULT "), line
        for bad in INTERNAL:
            assert bad not in line, line
        return line

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def load_isolated():
    loader = IsolatedLoader()
    yield loader
    loader.stop()


# ============================================================================ configs

CPU = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())


def write_yaml(tmp_path, data, name="bad.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def with_change(path: str, value):
    """cpu.yaml with the value at ``path`` ("a/b/0") replaced (``value is KeyError``: removed)."""
    import copy

    data = copy.deepcopy(CPU)
    *parents, last = path.split("/")
    node = data
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is KeyError:
        del node[int(last) if isinstance(node, list) else last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


CONFIG_CASES = {
    # name: (data, words the message must contain)
    "name_not_a_string": (with_change("name", 5), ["name", "string"]),
    "target_is_a_list": (with_change("target", ["c"]), ["target", "mapping"]),
    "unknown_target_kind": (with_change("target/kind", "fpga"), ["target.kind", "fpga"]),
    "compiler_unknown": (with_change("codegen/compiler", "clang"), ["codegen.compiler", "clang"]),
    "flags_a_string": (with_change("codegen/flags", "-O3"), ["codegen.flags", "list"]),
    "flags_with_ints": (with_change("codegen/flags", ["-O3", 3]), ["codegen.flags"]),
    "resource_a_string": (
        with_change("resources/local_memory_per_kernel", "1 MiB"),
        ["resources.local_memory_per_kernel"],
    ),
    "resource_negative": (with_change("resources/local_memory_per_kernel", -1), ["resources.local_memory_per_kernel"]),
    "resource_bool": (with_change("resources/local_memory_per_kernel", True), ["resources.local_memory_per_kernel"]),
    "feature_not_bool": (with_change("features/cpu_atomics", "yes"), ["features.cpu_atomics"]),
    "unknown_feature": (with_change("features/warp_magic", True), ["warp_magic"]),
    "unknown_top_key": (with_change("pipelines", {}), ["pipelines", "unknown key"]),
    "unknown_pass": (with_change("pipeline/optimize_for_target/3", "tl.Simplfy"), ["tl.Simplfy", "tl.Simplify"]),
    "pass_arg_unknown": (with_change("pass_args/tl.VectorizeLoop", {"enable_vectorise": True}), ["enable_vectorise"]),
    "pass_arg_wrong_type": (
        with_change("pass_args/tl.VectorizeLoop", {"enable_vectorize": "on"}),
        ["enable_vectorize"],
    ),
    "pass_entry_a_number": (with_change("pipeline/optimize_for_target/0", 42), ["pipeline.optimize_for_target[0]"]),
    "pass_entry_without_pass": (with_change("pipeline/optimize_for_target/0", {"args": {}}), ["pass"]),
    "bad_when": (
        with_change("pipeline/optimize_for_target/0", {"pass": "tl.Simplify", "when": "sometimes"}),
        ["sometimes"],
    ),
    "pipeline_a_string": (with_change("pipeline/optimize_for_target", "tl.Simplify"), ["optimize_for_target", "list"]),
    "unknown_phase": (with_change("pipeline/optimise", []), ["optimise"]),
    "empty_pipeline": (
        {**CPU, "pipeline": {"lower_and_legalize": [], "optimize_for_target": [], "codegen_prep": []}, "pass_args": {}},
        ["pipeline", "empty"],
    ),
    "missing_pipeline": (with_change("pipeline", KeyError), ["pipeline", "missing"]),
    "missing_name": (with_change("name", KeyError), ["name", "missing"]),
    "pass_args_for_absent_pass": (with_change("pass_args/tirx.LowerTVMBuiltin", {}), ["tirx.LowerTVMBuiltin"]),
    "autotune_empty_list": (with_change("autotune/block_m", []), ["autotune.block_m"]),
    "schedule_typo": (with_change("schedule/blok_m", 64), ["schedule.blok_m", "did you mean 'block_m'"]),
    "schedule_zero_block": (with_change("schedule/block_n", 0), ["schedule.block_n", "int >= 1"]),
    "schedule_string_stages": (with_change("schedule/stages", "3"), ["schedule.stages", "'3'"]),
    "schedule_bad_mma": (with_change("schedule/mma", [16, 8]), ["schedule.mma", "[m, n, k]"]),
    "schedule_family_typo": (with_change("schedule/attention", {"blockm": 64}), ["schedule.attention.blockm"]),
    "schedule_unknown_family": (with_change("schedule/conv", {"block_m": 64}), ["schedule.conv", "unknown key"]),
    "tt_section_on_cpu": (with_change("tt", {"arch": "wormhole_b0"}), ["tt"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_malformed_config_is_a_config_error(tmp_path, case):
    data, words = CONFIG_CASES[case]
    path = write_yaml(tmp_path, data)
    exc = raises_clean(lambda: load_config(path), *words, types=(tessera_tvm.ConfigError,))
    assert str(path) in str(exc), f"the message does not name the file: {exc}"


TEXT_CASES = {
    "empty_file": (b"", "empty"),
    "only_a_comment": (b"# nothing\n", "empty"),
    "a_list": (b"- a\n- b\n", "mapping"),
    "a_scalar": (b"42\n", "mapping"),
    "tabs": (b"name:\tcpu\n\t- x\n", "YAML"),
    "unclosed_bracket": (b"name: cpu\ntarget: {kind: c\n", "YAML"),
    "duplicate_key": (b"name: cpu\nname: gpu\n", "twice"),
    "non_string_key": (b"[1, 2]: cpu\n", "keys must be strings"),
    "undefined_alias": (b"name: *nowhere\n", "YAML"),
    "not_utf8": (b"name: \xff\xfe cpu\n", "UTF-8"),
    "control_characters": (b"name: a\x07b\n", "YAML"),
    "nul_bytes": (b"\x00\x01\x02garbage", "YAML"),
    "deep_nesting": (b"[" * 5000 + b"]" * 5000, "nests too deeply"),
    "deep_mapping": (b"a: " + b"{b: " * 3000 + b"1" + b"}" * 3000, "nests too deeply"),
    # "Billion laughs": 9 levels of 9 aliases would expand to 9**9 values.
    "alias_bomb": (
        b"a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
        + b"".join(b"a%d: &a%d [%s]\n" % (i, i, b", ".join([b"*a%d" % (i - 1)] * 9)) for i in range(1, 10)),
        "aliases",
    ),
}


@pytest.mark.parametrize("case", sorted(TEXT_CASES))
def test_garbage_config_text_is_a_config_error(tmp_path, case, load_isolated):
    data, word = TEXT_CASES[case]
    path = tmp_path / "garbage.yaml"
    path.write_bytes(data)
    line = load_isolated(path, timeout=60)
    assert line.startswith("RESULT TesseraError ConfigError"), line
    assert word.lower() in line.lower() and str(path) in line, line


def test_unknown_config_name_and_missing_file():
    raises_clean(lambda: load_config("hoper"), "hoper", "hopper", types=(tessera_tvm.ConfigError,))
    raises_clean(lambda: load_config("/nonexistent/dir/x.yaml"), "no such file", types=(tessera_tvm.ConfigError,))
    raises_clean(lambda: load_config(os.fspath(REPO / "configs")), "configs", types=(tessera_tvm.ConfigError,))


#: Values of every YAML type, for replacing any part of a valid config.
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _paths(node, prefix=""):
    """Every path ("a/b/0") into ``node`` (mappings and lists)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        p = f"{prefix}/{k}" if prefix else str(k)
        yield p
        yield from _paths(v, p)


CPU_PATHS = sorted(_paths(CPU))


@fuzz_settings(ci=60)
@given(path=st.sampled_from(CPU_PATHS), value=yaml_values | st.just(KeyError))
def test_mutated_config_loads_or_fails_with_a_config_error(tmp_path_factory, path, value):
    count("bad input: mutated config")
    file = write_yaml(tmp_path_factory.mktemp("cfg"), with_change(path, value))
    try:
        load_config(file)
    except BaseException as exc:  # noqa: BLE001
        assert_clean(exc, types=(tessera_tvm.ConfigError,))
        assert str(file) in str(exc)


@fuzz_settings(ci=25)
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_random_bytes_as_config(tmp_path_factory, data):
    count("bad input: random config bytes")
    file = tmp_path_factory.mktemp("cfg") / "random.yaml"
    file.write_bytes(data)
    try:
        load_config(file)
    except BaseException as exc:  # noqa: BLE001
        assert_clean(exc, types=(tessera_tvm.ConfigError,))


# ============================================================================ kernels


def define(fn):
    return lambda: ts.kernel(fn)


def test_malformed_kernel_definitions():
    def no_annotation(x):
        return x

    def not_a_tensor(x: int):
        return x

    def rank0(x: Tensor[ts.f32]):
        return x

    def keyword_only(*, x: Tensor["M", ts.f32]):
        return x

    def no_params():
        return None

    def bad_string_annotation(x: "Tensor['M', nowhere]"):  # noqa: F821
        return x

    raises_clean(define(no_annotation), "no annotation", "x")
    raises_clean(define(not_a_tensor), "parameter x")
    raises_clean(lambda: ts.kernel(rank0), "rank 0")
    raises_clean(define(keyword_only), "keyword")
    raises_clean(define(no_params), "no tensors")
    raises_clean(define(bad_string_annotation), "annotations")
    raises_clean(lambda: ts.kernel(42), types=(TypeError,))
    raises_clean(lambda: ts.compile(lambda x: x), "ts.compile", types=(TypeError,))


def _trace_error(body, *params, words=(), shapes=None):
    """A kernel with ``params`` (name -> TensorType) whose body fails while tracing."""
    names = [f"p{i}" for i in range(len(params))]
    src = f"def k({', '.join(names)}):\n    return body({', '.join(names)})\n"
    env = {"body": body}
    exec(compile(src, __file__, "exec"), env)  # noqa: S102 - a kernel of any arity
    env["k"].__annotations__ = dict(zip(names, params, strict=True))
    kernel = ts.kernel(env["k"])
    exc = raises_clean(lambda: kernel.inspect_ir("graph", shapes=shapes), *words)
    assert isinstance(exc, ts.errors.KernelError), exc
    return exc


F32, F16, I32 = ts.f32, ts.f16, ts.int32
BODY_CASES = {
    "matmul_rank1": (lambda a, b: ops.matmul(a, b), [Tensor["K", F32], Tensor["K", "N", F32]], ["ops.matmul"]),
    "matmul_k_differs": (
        lambda a, b: ops.matmul(a, b),
        [Tensor["M", 64, F32], Tensor[32, "N", F32]],
        ["ops.matmul", "64", "32"],
    ),
    "matmul_mixed_dtypes": (
        lambda a, b: ops.matmul(a, b),
        [Tensor["M", "K", F32], Tensor["K", "N", F16]],
        ["ops.matmul"],
    ),
    "add_mixed_dtypes": (lambda a, b: a + b, [Tensor["M", "N", F32], Tensor["M", "N", F16]], ["f16"]),
    "broadcast_mismatch": (lambda a, b: a + b, [Tensor["M", 5, F32], Tensor[7, F32]], ["5", "7"]),
    "softmax_axis": (lambda a: ops.softmax(a, axis=2), [Tensor["M", "N", F32]], ["ops.softmax", "axis"]),
    "softmax_int": (lambda a: ops.softmax(a), [Tensor["M", "N", I32]], ["ops.softmax"]),
    "layer_norm_weight_shape": (
        lambda x, w: ops.layer_norm(x, w),
        [Tensor["M", 8, F32], Tensor[9, F32]],
        ["ops.layer_norm"],
    ),
    "attention_rank3": (
        lambda q, k, v: ops.flash_attention(q, k, v),
        [Tensor["B", "S", "D", F16]] * 3,
        ["ops.flash_attention"],
    ),
    "attention_heads": (
        lambda q, k, v: ops.flash_attention(q, k, v),
        [Tensor[1, 6, "S", 16, F16], Tensor[1, 4, "T", 16, F16], Tensor[1, 4, "T", 16, F16]],
        ["ops.flash_attention", "6", "4"],
    ),
    "returns_a_number": (lambda a: 3.0, [Tensor["M", F32]], ["returns"]),
    "eps_negative": (lambda a: ops.rms_norm(a, eps=-1.0), [Tensor["M", "N", F32]], ["eps"]),
    "cast_unknown_dtype": (lambda a: ops.cast(a, "float128"), [Tensor["M", F32]], ["float128"]),
}


@pytest.mark.parametrize("case", sorted(BODY_CASES))
def test_malformed_kernel_bodies_are_kernel_errors(case):
    body, params, words = BODY_CASES[case]
    exc = _trace_error(body, *params, words=words)
    assert os.path.basename(__file__) in str(exc), f"not reported at the user's file: {exc}"


@ts.kernel
def linear(A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]):
    return ops.relu(ops.matmul(A, W) + b)


@pytest.fixture(scope="module")
def cpu_linear():
    return ts.compile(linear, target="cpu")


def test_unbound_dims_and_bad_shapes_at_compile_time():
    raises_clean(lambda: ts.compile(linear, target="hopper", build=False), "M", "shapes=")
    raises_clean(lambda: ts.compile(linear, target="hopper", shapes={"M": 64}, build=False), "K", "N")
    raises_clean(lambda: ts.compile(linear, target="cpu", shapes={"Q": 3}), "Q")
    for value in (0, -4, 2.5, True, "64", None):
        raises_clean(lambda v=value: ts.compile(linear, target="cpu", shapes={"M": v}), "M")
    raises_clean(lambda: ts.compile(linear, target="no_such_target"), "no_such_target")
    raises_clean(lambda: ts.compile(linear, target="cpu", dump=["graph", "ptx"]), "ptx")


def test_bad_arguments_at_call_time(cpu_linear):
    a, w, b = np.ones((5, 3), np.float32), np.ones((3, 4), np.float32), np.ones(4, np.float32)
    raises_clean(lambda: cpu_linear(a, w), "takes 3 arrays")
    raises_clean(lambda: cpu_linear(a.tolist(), w, b), "argument A", "list")
    raises_clean(lambda: cpu_linear(a.astype(np.float64), w, b), "dtype float64")
    raises_clean(lambda: cpu_linear(a[None], w, b), "rank 3")
    raises_clean(lambda: cpu_linear(a, np.ones((4, 4), np.float32), b), "K")
    raises_clean(lambda: cpu_linear(a, w, np.ones(5, np.float32)), "N")
    raises_clean(lambda: cpu_linear(np.ones((0, 3), np.float32), w, b), "empty")
    with pytest.raises(ts.errors.NotRunnableError):
        ts.compile(linear, target="hopper", shapes={"M": 64, "N": 64, "K": 64}, build=False)(a, w, b)


def test_non_contiguous_arrays_are_read_correctly(cpu_linear):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((20, 14)).astype(np.float32)[::2, ::2]  # strided view, 10x7
    w = np.asfortranarray(rng.standard_normal((7, 9)).astype(np.float32))
    b = rng.standard_normal(18).astype(np.float32)[::2]
    assert not a.flags.c_contiguous and not w.flags.c_contiguous
    out = cpu_linear(a, w, b)
    np.testing.assert_allclose(out, linear.reference(a, w, b), rtol=1e-4, atol=1e-4)


dims = st.integers(1, 6)


@fuzz_settings(ci=40)
@given(
    shapes=st.lists(st.lists(dims, min_size=0, max_size=4), min_size=0, max_size=4),
    dtypes=st.lists(st.sampled_from(["float32", "float16", "float64", "int32", "object"]), min_size=4, max_size=4),
    as_list=st.integers(0, 4),
)
def test_random_wrong_arguments(cpu_linear, shapes, dtypes, as_list):
    """Random arrays that do not fit linear's annotations: an ArgumentError or ShapeError, never a crash."""
    count("bad input: call arguments")
    arrays = [np.ones(s, dtype=d) for s, d in zip(shapes, dtypes, strict=False)]
    if as_list < len(arrays):
        arrays[as_list] = arrays[as_list].tolist()
    fits = (
        len(arrays) == 3
        and all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in arrays)
        and [x.ndim for x in arrays] == [2, 2, 1]
    )
    if fits and arrays[0].shape[1] == arrays[1].shape[0] and arrays[1].shape[1] == arrays[2].shape[0]:
        return  # a valid call; the numerics fuzz covers those
    raises_clean(lambda: cpu_linear(*arrays))


# ============================================================================ schedules

schedule_values = st.one_of(
    st.integers(-3, 600), st.sampled_from([0, 1, 3, 7, 1 << 20]), st.just(True), st.just(2.5), st.just("64"), st.none()
)


@fuzz_settings(ci=12)
@given(
    target=st.sampled_from(["cpu", "hopper", "ampere"]),
    fields=st.dictionaries(
        st.sampled_from(
            [
                "block_m",
                "block_n",
                "block_k",
                "stages",
                "threads",
                "swizzle",
                "blockm",
                "fused_matmul_add_relu",
                "nothing",
            ]
        ),
        schedule_values,
        min_size=1,
        max_size=3,
    ),
)
def test_random_schedules_compile_or_fail_cleanly(target, fields):
    """A schedule override either compiles (sources) or raises a ScheduleError/ResourceError."""
    count("bad input: schedules")
    if "fused_matmul_add_relu" in fields:
        fields["fused_matmul_add_relu"] = {"block_m": fields["fused_matmul_add_relu"]}
    try:
        k = ts.compile(linear, target=target, shapes={"M": 100, "N": 72, "K": 40}, schedule=fields, build=False)
        assert k.source
    except BaseException as exc:  # noqa: BLE001
        assert_clean(exc, types=(ts.errors.ScheduleError, tessera_tvm.ResourceError))


def test_schedule_errors_name_the_field():
    def bad(schedule):
        return lambda: ts.compile(
            linear, target="hopper", shapes={"M": 128, "N": 128, "K": 128}, schedule=schedule, build=False
        )

    raises_clean(bad({"blockm": 64}), "blockm", "block_m")
    raises_clean(bad({"block_m": -1}), "block_m")
    raises_clean(bad({"block_m": "64"}), "block_m")
    raises_clean(bad({"block_m": 48}), "block_m")  # not a multiple of the wgmma M (64)
    raises_clean(bad({"fused_matmul_add_relu": 64}), "fused_matmul_add_relu")
    raises_clean(bad({"block_m": 256, "block_n": 256, "block_k": 256, "stages": 8}))  # shared memory


# ============================================================================ tessera_tvm.lower


def test_lower_rejects_what_is_not_a_program():
    for program in ("def main(): pass", None, 42, linear):
        raises_clean(lambda p=program: tessera_tvm.lower(p, "cpu", build=False), "PrimFunc")
    raises_clean(lambda: tessera_tvm.lower(None, "no_such_config"))
