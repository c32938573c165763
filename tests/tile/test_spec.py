"""Kernel specs and tile schedules: parameter order, validation messages, config defaults, resources."""

from __future__ import annotations

import pytest

import tessera_tvm
from tessera_tvm import ResourceError
from tessera_tvm.tile import (
    AttentionSpec,
    Binary,
    Const,
    ElementwiseSpec,
    EpilogueOp,
    GemmSpec,
    Input,
    NormSpec,
    ReduceSpec,
    SoftmaxSpec,
    SpecError,
    TensorArg,
    TileSchedule,
    Unary,
    build_tile_program,
    smem_bytes,
    validate_schedule,
)

# Non-default parameter names throughout: the PrimFunc must keep the spec's names.
ONE_OF_EACH = {
    "gemm": GemmSpec(
        40,
        24,
        16,
        batch=(2,),
        batch_b=(),
        dtype_a="float16",
        name_a="x",
        name_b="w",
        name_out="y",
        epilogue=(
            EpilogueOp("bias", operand="b"),
            EpilogueOp("relu"),
            EpilogueOp("residual", operand="skip"),
            EpilogueOp("bias", operand="b"),
        ),
    ),
    "elementwise": ElementwiseSpec(
        (4, 8),
        (("lhs", (4, 8), "float32"), ("rhs", (8,), "bfloat16")),
        Binary("add", Input("lhs"), Unary("exp", Input("rhs"))),
        "float16",
        name_out="result",
    ),
    "reduce": ReduceSpec((4, 8, 3), (1, 2), "max", keepdims=True, dtype_in="float16", name_in="t", name_out="m"),
    "softmax": SoftmaxSpec((4, 8), 0, "bfloat16", "float32", name_in="logits", name_out="probs"),
    "norm": NormSpec(
        "layer_norm",
        (4, 8),
        has_bias=True,
        dtype_in="float16",
        dtype_weight="float32",
        name_in="h",
        name_weight="gamma",
        name_bias="beta",
        name_out="normed",
    ),
    "attention": AttentionSpec(
        1,
        4,
        2,
        16,
        32,
        16,
        True,
        dtype_in="float16",
        dtype_out="float32",
        name_q="q",
        name_k="k",
        name_v="v",
        name_out="o",
    ),
}


def test_gemm_params_are_inputs_then_epilogue_operands_then_output():
    spec = ONE_OF_EACH["gemm"]
    assert spec.params() == [
        TensorArg("x", (2, 40, 16), "float16"),
        TensorArg("w", (16, 24), "float16"),
        TensorArg("b", (24,), "float16"),  # listed once although the epilogue adds it twice
        TensorArg("skip", (2, 40, 24), "float16"),
        TensorArg("y", (2, 40, 24), "float16"),
    ]


def test_shapes_of_the_other_specs():
    assert ONE_OF_EACH["reduce"].outputs() == [TensorArg("m", (4, 1, 1), "float16")]
    assert ReduceSpec((4, 8), (0, 1), "sum").outputs()[0].shape == (1,)  # no rank-0 buffers
    assert [p.name for p in ONE_OF_EACH["norm"].params()] == ["h", "gamma", "beta", "normed"]
    assert ONE_OF_EACH["norm"].inputs()[1] == TensorArg("gamma", (8,), "float32")
    attention = ONE_OF_EACH["attention"]
    assert [p.shape for p in attention.params()] == [(1, 4, 16, 16), (1, 2, 32, 16), (1, 2, 32, 16), (1, 4, 16, 16)]
    assert attention.scale == pytest.approx(0.25) and attention.groups == 2


@pytest.mark.parametrize("target", ["c", "cuda", "hip"])
@pytest.mark.parametrize("family", sorted(ONE_OF_EACH))
def test_prim_func_parameters_follow_spec_params(family, target):
    spec = ONE_OF_EACH[family]
    func = build_tile_program(spec, None, target)
    buffers = [func.buffer_map[var] for var in func.params]
    assert [(b.name, tuple(int(d) for d in b.shape), str(b.dtype)) for b in buffers] == [
        tuple(p) for p in spec.params()
    ]
    assert str(func.attrs["global_symbol"]) == family


def test_name_sets_the_kernel_symbol():
    func = build_tile_program(ONE_OF_EACH["softmax"], None, "c", name="attn_probs")
    assert str(func.attrs["global_symbol"]) == "attn_probs"


def test_specs_are_hashable_and_fingerprints_are_stable():
    a = GemmSpec(8, 8, 8, dtype_a="float16")
    b = GemmSpec(8, 8, 8, dtype_a="float16", dtype_b="float16", dtype_out="float16", batch_a=(), batch_b=())
    assert a == b and hash(a) == hash(b) and a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != GemmSpec(8, 8, 9, dtype_a="float16").fingerprint()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: GemmSpec(0, 8, 8), r"GemmSpec: M is 0; expected a positive int"),
        (lambda: GemmSpec(8, 8, 8, dtype_a="float64"), r"dtype_a is 'float64'; expected one of float32, float16"),
        (lambda: GemmSpec(8, 8, 8, batch=(2, 3), batch_b=(4,)), r"batch_b \(4,\) does not broadcast to batch \(2, 3\)"),
        (lambda: GemmSpec(8, 8, 8, name_out="A"), r"parameter names must be distinct, \['A'\]"),
        (lambda: EpilogueOp("bias"), r"EpilogueOp\('bias'\): operand is None; expected a C identifier"),
        (lambda: EpilogueOp("scale"), r"needs a finite number value=\.\.\. \(scale: or \+-inf\), found None"),
        (
            lambda: EpilogueOp("min_scalar", value=float("inf")),
            r"min_scalar'\): needs a finite number value=\.\.\. \(scale: or \+-inf\), found inf",
        ),
        (lambda: EpilogueOp("scale", value=float("nan")), r"found nan"),
        (lambda: EpilogueOp("swish"), r"kind is 'swish'; expected one of bias, residual"),
        (
            lambda: ElementwiseSpec((4, 8), (("x", (3, 8), "float32"),), Input("x")),
            r"operand x of shape \(3, 8\) does not broadcast to \(4, 8\)",
        ),
        (
            lambda: ElementwiseSpec((4,), (("x", (4,), "float32"),), Binary("add", Input("x"), Input("z"))),
            r"expr reads Input\('z'\) but operands are \['x'\]",
        ),
        (lambda: Unary("cos", Const(1.0)), r"Unary: op is 'cos'; expected one of exp"),
        (lambda: ReduceSpec((2, 3, 4), (0, 2), "sum"), r"axis \(0, 2\) is not a run of consecutive axes"),
        (lambda: ReduceSpec((2, 3), 0, "prod"), r"kind is 'prod'; expected one of sum, max, mean"),
        (lambda: SoftmaxSpec((2, 3), 2), r"axis is 2; expected an int in \[-2, 1\] for a rank-2 tensor"),
        (lambda: NormSpec("layer_norm", (2, 3), axis=0), r"only the last axis \(1 or -1\) is normalised"),
        (lambda: AttentionSpec(1, 6, 4, 8, 8, 16), r"H=6 is not a multiple of H_kv=4"),
        (lambda: AttentionSpec(1, 4, 4, 8, 8, 16, causal_align="center"), r"causal_align is 'center'"),
        (lambda: TileSchedule(block_m=0), r"TileSchedule: block_m is 0; expected a positive int"),
        (lambda: TileSchedule().replace(block_q=3), r"unknown field\(s\) \['block_q'\]"),
    ],
)
def test_mistakes_are_reported_with_the_value_and_what_was_expected(make, message):
    with pytest.raises(SpecError, match=message):
        make()


def test_from_config_takes_the_configs_gemm_defaults():
    schedule = TileSchedule.from_config("hopper", "gemm")
    assert (schedule.block_m, schedule.block_n, schedule.block_k, schedule.stages, schedule.threads) == (
        128,
        256,
        64,
        4,
        256,
    )
    assert schedule.mma == (64, 256, 16)
    cpu = TileSchedule.from_config("cpu", "gemm")
    assert (cpu.block_m, cpu.block_n, cpu.block_k) == (224, 256, 128)  # for the packed micro-kernel
    assert TileSchedule(**schedule.as_dict()) == schedule


def test_cpu_gemm_blocks_are_even_and_spread_over_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)

    def blocks(M, N, K):
        s = TileSchedule.from_config("cpu", GemmSpec(M, N, K, dtype_a="float32"))
        return s.block_m, s.block_n

    # 1024 rows in 5 blocks of 210 (a multiple of the 14-row register tile), not 4 x 224 + 128.
    assert blocks(1024, 1024, 1024) == (210, 256)
    # 256 x 256 would be 2 blocks: 2 x 2 square blocks for 4 cores (each block packs its own panels:
    # square blocks pack the least).
    assert blocks(256, 256, 256) == (140, 128)
    # A few blocks per core come in a multiple of the cores: GPT-2's 128 x 768 projection was 3
    # blocks on 2 cores.
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert blocks(128, 768, 256) == (128, 192)  # 1 x 4
    # The MLP's 128 x 1024 -> 256 linear: 2 blocks of 128 x 128 (each packs half of B), not 64 x 256
    # (each packs all of it).
    assert blocks(128, 256, 1024) == (128, 128)
    assert blocks(1024, 1024, 1024) == (210, 256)  # 5 x 4: many blocks per core, as they were
    # Too little work to wake threads for: one block.
    assert blocks(64, 48, 32) == (64, 64)


def test_cpu_attention_query_blocks_are_spread_over_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)

    def block_m(B, H, S):
        return TileSchedule.from_config(
            "cpu", AttentionSpec(B, H, H, S, S, 64, causal=False, dtype_in="float32")
        ).block_m

    assert block_m(1, 8, 2048) == 192  # 11 x 8 blocks: enough for 8 cores
    # One head of 1024 queries: 6 blocks of 192 would leave 2 cores idle; 8 blocks of 128.
    assert block_m(1, 1, 1024) == 128
    # 1000 queries in 8 nearly equal blocks (a multiple of the micro-kernel's 32 columns), not 5 x 192 + 40.
    assert block_m(1, 1, 1000) == 128
    # Too few queries for 8 blocks of 32: as many as there are.
    assert block_m(1, 1, 100) == 32


def test_from_config_with_a_spec_shrinks_blocks_to_the_problem():
    small = TileSchedule.from_config("ampere", GemmSpec(20, 20, 20, dtype_a="float16"))
    assert (small.block_m, small.block_n, small.block_k) == (32, 32, 32)
    hopper = TileSchedule.from_config("hopper", GemmSpec(20, 20, 20, dtype_a="float16"))
    assert hopper.block_m == 64  # wgmma tiles are 64 rows
    rows = TileSchedule.from_config("cpu", SoftmaxSpec((3, 5), -1))
    assert (rows.block_m, rows.block_n) == (4, 8)


def test_from_config_fits_attention_to_the_targets_limits():
    big = AttentionSpec(1, 8, 2, 1024, 1024, 128, causal=False, dtype_in="float16")
    rocm = TileSchedule.from_config("rocm", big)
    assert smem_bytes(big, rocm) <= 65536 < smem_bytes(big, rocm.replace(stages=2))
    causal = AttentionSpec(1, 8, 2, 1024, 1024, 64, causal=True, dtype_in="float16")
    assert TileSchedule.from_config("ampere", causal).stages == 1  # see validate_schedule below
    assert TileSchedule.from_config("hopper", causal).stages == 2


def test_smem_bytes_counts_pipelined_tiles():
    spec = GemmSpec(1024, 1024, 1024, dtype_a="float16")
    schedule = TileSchedule(block_m=128, block_n=128, block_k=64, stages=3)
    assert smem_bytes(spec, schedule) == 3 * (128 * 64 + 64 * 128) * 2
    assert smem_bytes(spec, schedule, "c") == 0
    attention = AttentionSpec(1, 8, 8, 1024, 1024, 64, dtype_in="float16")
    assert smem_bytes(attention, TileSchedule(block_m=64, block_n=64, stages=2)) == 40960  # what TileLang allocates


def test_validate_schedule_rejects_what_the_target_cannot_hold():
    spec = GemmSpec(4096, 4096, 4096, dtype_a="float16")
    with pytest.raises(
        ResourceError,
        match=r"needs 131072 bytes of shared memory but target 'rocm' allows at most "
        r"65536; lower stages",
    ):
        validate_schedule(spec, TileSchedule(block_m=128, block_n=128, block_k=64, stages=4, threads=256), "rocm")
    with pytest.raises(SpecError, match=r"block_k is 24; the MMA instructions for float16 need a multiple of 16"):
        validate_schedule(spec, TileSchedule(block_m=128, block_n=128, block_k=24), "ampere")
    mixed = GemmSpec(256, 256, 256, dtype_a="float16", dtype_b="bfloat16")
    with pytest.raises(SpecError, match=r"dtype_a is float16 but dtype_b is bfloat16; GPU MMA instructions"):
        validate_schedule(mixed, TileSchedule.from_config("ampere", mixed), "ampere")
    with pytest.raises(SpecError, match=r"threads is 100; expected a multiple of 32"):
        validate_schedule(spec, TileSchedule(threads=100), "ampere")
    with pytest.raises(SpecError, match=r"block_m is 32; 'hopper' has wgmma, which needs a multiple of 64"):
        validate_schedule(spec, TileSchedule(block_m=32, block_n=128, block_k=64, mma=(64, 256, 16)), "hopper")
    causal = AttentionSpec(1, 8, 2, 1024, 1024, 64, causal=True, dtype_in="float16")
    with pytest.raises(SpecError, match=r"causal attention on 'ampere' .* needs stages=1"):
        validate_schedule(causal, TileSchedule(stages=2), "ampere")
    with pytest.raises(ResourceError, match=r"bytes of local arrays"):
        validate_schedule(spec, TileSchedule(block_m=1024, block_n=1024), "cpu")
    validate_schedule(spec, TileSchedule.from_config("hopper", spec), "hopper")


def test_build_tile_program_rejects_what_it_cannot_build():
    with pytest.raises(SpecError, match="is not a kernel spec"):
        build_tile_program(object(), TileSchedule(), "c")
    with pytest.raises(SpecError, match="expected a TileSchedule"):
        build_tile_program(ONE_OF_EACH["softmax"], {"block_m": 4}, "c")
    with pytest.raises(tessera_tvm.ConfigError, match="unknown target config"):
        build_tile_program(ONE_OF_EACH["softmax"], None, "tpu")


TINY = [
    GemmSpec(1, 1, 1, dtype_a="float16"),
    GemmSpec(1, 4096, 4096, dtype_a="bfloat16"),
    AttentionSpec(1, 1, 1, 1, 1, 16, True, dtype_in="float16"),
    AttentionSpec(1, 2, 1, 1, 513, 128, False, dtype_in="bfloat16"),
    AttentionSpec(1, 2, 2, 100, 100, 32, True, dtype_in="float32"),
    SoftmaxSpec((1, 1)),
    NormSpec("rms_norm", (1, 7)),
]


@pytest.mark.parametrize("target", ["hopper", "ampere", "rocm", "cpu"])
def test_from_config_gives_schedules_that_validate_for_tiny_problems(target):
    for spec in TINY:
        schedule = TileSchedule.from_config(target, spec)
        validate_schedule(spec, schedule, target)
        if spec.family == "attention" and target != "cpu":
            assert schedule.block_m >= 64  # 4 warps x 16 rows each


def test_validate_schedule_rejects_attention_rows_the_warps_cannot_share():
    spec = AttentionSpec(1, 2, 1, 1, 513, 128, False, dtype_in="bfloat16")
    with pytest.raises(SpecError, match=r"block_m is 32; attention gives each of the 4 warps whole rows of 16"):
        validate_schedule(spec, TileSchedule(block_m=32, block_n=64, threads=128), "ampere")


@pytest.mark.parametrize(
    "spec",
    [
        AttentionSpec(1, 2, 2, 40, 40, 16, False, dtype_in="float8_e4m3fn", dtype_out="float32"),
        GemmSpec(40, 30, 20, dtype_a="float8_e5m2", dtype_out="float32"),
    ],
    ids=["attention", "gemm"],
)
def test_fp8_on_the_cpu_is_refused_with_the_way_out(spec):
    # TVM's C codegen would fail later with "Cannot convert type float8_e4m3fn to C type".
    with pytest.raises(SpecError, match=r"parameter \w+ is float8_e\w+, which the CPU's C code cannot hold; pass fp8"):
        build_tile_program(spec, None, "c")
    assert build_tile_program(spec, None, "cuda") is not None  # GPUs take fp8 as it is
