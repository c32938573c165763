"""Flash-attention tile programs: CPU numerics (causal, GQA, edges), GPU artifacts."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm.tile import AttentionSpec, TileSchedule, build_tile_program, validate_schedule
from tessera_tvm.tile.base import SpecError

from .conftest import as64, assert_close, random_inputs, run_cpu


def reference(spec: AttentionSpec, arrays):
    q, k, v = (as64(arrays[n]) for n in ("Q", "K", "V"))
    k = np.repeat(k, spec.groups, axis=1)  # query head h reads kv head h // groups
    v = np.repeat(v, spec.groups, axis=1)
    scores = q @ np.swapaxes(k, -1, -2) * spec.scale
    if spec.bias is not None:  # broadcast over its dims of 1
        scores = scores + as64(arrays[spec.name_bias])
    if spec.causal:
        i = np.arange(spec.S_q)[:, None]
        j = np.arange(spec.S_kv)[None, :]
        scores = np.where(j <= i + spec.causal_offset, scores, -np.inf)
    row_max = scores.max(-1, keepdims=True)
    row_max = np.where(np.isinf(row_max), 0, row_max)  # rows that see no key
    p = np.exp(scores - row_max)
    total = p.sum(-1, keepdims=True)
    return np.where(total == 0, 0, (p @ v) / np.where(total == 0, 1, total))


# Small blocks: several query blocks and key blocks, partial ones at both edges.
SMALL = TileSchedule(block_m=16, block_n=16)

CASES = [
    # GQA (2 query heads per kv head), S_q != S_kv, neither a multiple of the block, not causal.
    (dict(B=2, H=4, H_kv=2, S_q=37, S_kv=53, D=16, causal=False), "float32"),
    # Causal multi-query attention (one kv head), fp16.
    (dict(B=1, H=3, H_kv=1, S_q=70, S_kv=70, D=8, causal=True), "float16"),
    # Causal aligned bottom-right with S_q > S_kv: the first queries see no key (zero rows).
    (dict(B=1, H=2, H_kv=2, S_q=40, S_kv=13, D=8, causal=True, causal_align="bottom_right"), "bfloat16"),
    # Causal top-left with S_q < S_kv and a user scale.
    (dict(B=1, H=2, H_kv=1, S_q=19, S_kv=45, D=12, causal=True, scale=0.3), "float32"),
    # One query, one key, one channel.
    (dict(B=1, H=1, H_kv=1, S_q=1, S_kv=1, D=1, causal=True), "float32"),
]


@pytest.mark.parametrize("args, dtype", CASES, ids=lambda v: str(v))
def test_cpu_attention(args, dtype, cpu_config, tmp_path):
    spec = AttentionSpec(**args, dtype_in=dtype)
    arrays = random_inputs(spec)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=SMALL)["O"]
    # The output is a convex combination of V rows: O(1) values, fp32 softmax statistics.
    assert_close(out, reference(spec, arrays), dtype)


def test_cpu_attention_default_schedule(cpu_config, tmp_path):
    spec = AttentionSpec(1, 2, 1, 100, 77, 32, True, dtype_in="float16", dtype_out="float32")
    arrays = random_inputs(spec, seed=1)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["O"]
    assert_close(out, reference(spec, arrays), "float16")


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_attention_with_whole_micro_kernel_tiles(causal, cpu_config, tmp_path):
    """Blocks of whole 14 x 32 register tiles (S^T = K Q^T: 56 keys x 64 queries), a realistic D,
    ragged sequence ends."""
    spec = AttentionSpec(1, 2, 1, 130, 150, 64, causal, dtype_in="bfloat16", dtype_out="float32")
    arrays = random_inputs(spec, seed=2)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=TileSchedule(block_m=64, block_n=56))["O"]
    assert_close(out, reference(spec, arrays), "float32", atol_scale=8.0)  # fp32 sums over 64 channels


def test_cpu_attention_source_uses_the_micro_kernel_and_vector_exp():
    spec = AttentionSpec(1, 2, 1, 100, 77, 32, True, dtype_in="float16")
    source = tessera_tvm.lower(build_tile_program(spec, None, "c"), "cpu", build=False).source
    calls = (
        "tessera_cpu_pack_b_f16(",
        "tessera_cpu_pack_a_f16(",
        "tessera_cpu_pack_a_f32(",
        "tessera_expf_nonpositive(",
    )
    for call in calls:
        assert call in source, call
    assert "tessera_cpu_gemm_set_f32((&(scores[0]))" in source  # S^T = K Q^T, written
    assert "tessera_cpu_gemm_f32((&(acc[0]))" in source  # O += P V
    assert "expf(" not in source  # no libm call


# ---------------------------------------------------------------------------------------------
# K and V packed once per kv head (kv_packs_per_head)
# ---------------------------------------------------------------------------------------------

PER_HEAD_CASES = [
    # GQA, causal bottom-right with S_q < S_kv (offset 16), ragged ends, fp16; two interleaved pieces
    # per kv head (3 query blocks: pieces of 2 and 1).
    (dict(B=2, H=4, H_kv=2, S_q=37, S_kv=53, D=16, causal=True, causal_align="bottom_right"), "float16", None, 2),
    # A bias with a query and a key dim (ALiBi-like: the transposed-bias path), causal top-left with
    # S_q > S_kv (the last queries see every key, the first ones few), bf16, MQA, once per head.
    (dict(B=1, H=3, H_kv=1, S_q=45, S_kv=29, D=8, causal=True), "bfloat16", "alibi", 1),
    # A padding mask ([B, 1, 1, S_kv], -inf keys); more pieces than query blocks (piece 2 owns none).
    (dict(B=2, H=2, H_kv=2, S_q=20, S_kv=40, D=12), "float32", "padding", 3),
]


def _with_bias(spec: AttentionSpec, arrays, kind: str | None):
    """``arrays`` with the bias of ``kind`` (every query keeps a key it can see)."""
    if kind is not None:
        bias = arrays[spec.name_bias].astype(np.float32) * 2
        bias[..., 3:7] = -np.inf
        arrays[spec.name_bias] = bias.astype(arrays[spec.name_bias].dtype)
    return arrays


@pytest.mark.parametrize("args, dtype, bias, packs", PER_HEAD_CASES, ids=lambda v: str(v))
def test_cpu_attention_packs_kv_once_per_head(args, dtype, bias, packs, cpu_config, tmp_path):
    shape = {"alibi": (1, args["H"], args["S_q"], args["S_kv"]), "padding": (args["B"], 1, 1, args["S_kv"])}
    spec = AttentionSpec(**args, dtype_in=dtype, bias=shape.get(bias))
    arrays = _with_bias(spec, random_inputs(spec, seed=3), bias)
    schedule = SMALL.replace(kv_packs_per_head=packs)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=schedule)["O"]
    assert_close(out, reference(spec, arrays), dtype)


@pytest.mark.parametrize(
    "shape, packs",
    [
        ((1, 8, 8, 2048), 1),  # 8 kv heads on 2 cores: a block per head, K and V packed once
        ((1, 8, 1, 2048), 2),  # one kv head: two pieces of interleaved query blocks
        ((2, 4, 2, 1000), 1),  # GQA: 4 kv heads, each block serves their 2 query heads
        ((1, 3, 3, 2048), 2),  # 3 blocks would leave a core idle a third of the time: 6 pieces
        ((1, 1, 1, 300), 0),  # two query blocks, one per core: no packing would serve two of them
        ((1, 1, 1, 100), 0),  # one query block of one head: nothing is packed twice
    ],
)
def test_cpu_attention_planner_packs_kv_once_where_every_core_gets_work(shape, packs, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    B, H, H_kv, S = shape
    spec = AttentionSpec(B, H, H_kv, S, S, 64, True, dtype_in="float32")
    schedule = TileSchedule.from_config("cpu", spec)
    assert schedule.kv_packs_per_head == packs
    script = build_tile_program(spec, schedule, "c").script()
    assert ("tessera_cpu_workspace" in script) == (packs > 0)


# ---------------------------------------------------------------------------------------------
# GPU targets: artifacts
# ---------------------------------------------------------------------------------------------

INSTRUCTIONS = {"hopper": ("wgmma", "tma_load"), "ampere": ("mma_sync", "cp_async"), "rocm": ("mfma",)}
GPU_CASES = {
    "plain": AttentionSpec(2, 8, 8, 1000, 1000, 64, False, dtype_in="float16"),
    "causal_gqa": AttentionSpec(2, 8, 2, 1000, 1000, 128, True, dtype_in="bfloat16"),
}


@pytest.mark.parametrize("target", sorted(INSTRUCTIONS))
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_attention_uses_the_targets_mma(case, target):
    spec = GPU_CASES[case]
    schedule = TileSchedule.from_config(target, spec)
    validate_schedule(spec, schedule, target)
    source = tessera_tvm.lower(build_tile_program(spec, schedule, target), target, build=False).source
    for instruction in INSTRUCTIONS[target]:
        assert instruction in source, f"{target}: {instruction} missing"
    assert "exp2" in source  # online softmax in the log2 domain


def test_gpu_attention_with_unaligned_lengths_lowers():
    spec = AttentionSpec(1, 4, 2, 37, 53, 64, True, dtype_in="float16", causal_align="bottom_right")
    for target in INSTRUCTIONS:
        assert (
            "attention_kernel" in tessera_tvm.lower(build_tile_program(spec, None, target), target, build=False).source
        )


@pytest.mark.nvcc
def test_hopper_causal_gqa_attention_builds_with_nvcc(tmp_path):
    spec = GPU_CASES["causal_gqa"]
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "hopper"), "hopper", out_dir=tmp_path)
    assert lowered.artifacts["cubin"].stat().st_size > 0
    assert "wgmma.mma_async" in lowered.artifacts["ptx"].read_text()


@pytest.mark.nvcc
@pytest.mark.parametrize("target", ["hopper", "ampere"])
def test_gpu_attention_with_a_bias_builds_with_nvcc(target, tmp_path):
    """A padding mask read from global memory, clamped at the ragged edges, scaled into the log2 domain."""
    spec = AttentionSpec(2, 4, 2, 100, 90, 64, True, dtype_in="bfloat16", bias=(2, 1, 1, 90))
    lowered = tessera_tvm.lower(build_tile_program(spec, None, target), target, out_dir=tmp_path)
    assert any(p.stat().st_size > 0 for name, p in lowered.artifacts.items() if name in ("cubin", "fatbin"))
    assert "bias[" in lowered.source and "blockIdx.z) * 90" in lowered.source  # [b, 0, 0, key]: batch * S_kv


def test_attention_spec_checks_its_bias():
    with pytest.raises(SpecError, match=r"bias \[2, 3, 10, 20\] has 3 for H; expected 4 or 1"):
        AttentionSpec(2, 4, 4, 10, 20, 32, bias=(2, 3, 10, 20))
    with pytest.raises(SpecError, match="bias dtype is int32; expected a float dtype"):
        AttentionSpec(2, 4, 4, 10, 20, 32, bias=(2, 1, 1, 20), dtype_bias="int32")
    spec = AttentionSpec(2, 4, 4, 10, 20, 32, dtype_in="bfloat16", bias=(1, 4, 10, 20))
    assert [p.name for p in spec.inputs()] == ["Q", "K", "V", "bias"] and spec.dtype_bias == "bfloat16"


@pytest.mark.parametrize("target", ["hopper", "ampere"])
def test_gpu_float32_attention_stages_probabilities_in_shared_memory(target):
    # tf32 MMA operands have another register layout than the fp32 accumulator P is computed in.
    spec = AttentionSpec(1, 2, 2, 100, 100, 32, True, dtype_in="float32")
    source = tessera_tvm.lower(build_tile_program(spec, None, target), target, build=False).source
    assert "mma_sync" in source  # tf32 (Hopper too: wgmma tf32 needs a K-major V)


# ---------------------------------------------------------------------------------------------
# Hopper: the overlapped key loop (schedule overlap=True)
# ---------------------------------------------------------------------------------------------

OVERLAP_CASES = {
    **GPU_CASES,
    "bottom_right_no_keys": AttentionSpec(1, 2, 2, 40, 13, 64, True, dtype_in="bfloat16", causal_align="bottom_right"),
    "bias": AttentionSpec(2, 4, 2, 100, 90, 64, True, dtype_in="bfloat16", bias=(2, 1, 1, 90)),
}


def _overlapped(spec: AttentionSpec) -> TileSchedule:
    from tessera_tvm.tile import settle_overlap

    schedule = TileSchedule.from_config("hopper", spec).replace(overlap=True)
    return settle_overlap(spec, schedule, tessera_tvm.load_config("hopper"), strict=True)


def _consumer_loop(source: str) -> list[str]:
    """The lines of the consumer warp groups' key loop (the second ``for (int kb`` loop: the first is
    the TMA producer's)."""
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith("for (int kb")]
    assert len(starts) == 2, starts
    depth, body = 0, []
    for line in lines[starts[1] :]:
        depth += line.count("{") - line.count("}")
        body.append(line.strip())
        if depth == 0:
            break
    return body


@pytest.mark.parametrize("case", sorted(OVERLAP_CASES))
def test_hopper_overlapped_attention_waits_for_each_wgmma_before_releasing_its_stage(case):
    """Q K^T of block kb and P V of block kb - 1 are issued without a wait, the softmax runs after
    ``wait_wgmma<1>`` (Q K^T done, P V still running), and a K or V stage goes back to the TMA
    producer only after the wait for the wgmma that reads it (released at the issue, the producer
    could overwrite a tile the tensor cores are still reading)."""
    spec = OVERLAP_CASES[case]
    source = tessera_tvm.lower(build_tile_program(spec, _overlapped(spec), "hopper"), "hopper", build=False).source
    loop = _consumer_loop(source)
    events = [
        e
        for line in loop
        for e in (
            ("issue" if "warpgroup_commit_batch" in line else None),
            ("wait1" if "wait_wgmma<1>" in line else None),
            ("wait0" if "wait_wgmma<0>" in line else None),
            ("release" if line.endswith("].arrive();") else None),
            ("exp2" if "exp2f(" in line else None),
        )
        if e
    ]
    order = [e for i, e in enumerate(events) if e != "exp2" or events[i - 1] != "exp2"]  # one per softmax pass
    assert order == ["issue", "issue", "wait1", "release", "exp2", "wait0", "release"], order
    # after each wait, the registers the wgmma wrote are fenced (every one of them, and no more), so
    # the compiler moves no read of them above the wait
    sizes = {name: int(n) for name, n in re.findall(r"float (scores|acc)\[(\d+)\];", source)}
    fenced = [
        (line.split("wait_wgmma<")[1][0], after)
        for line, after in zip(loop, loop[1:], strict=False)
        if "wait_wgmma<" in line
    ]
    assert fenced == [
        ("1", f"tl::warpgroup_fence_operand(reinterpret_cast<float*>(scores + 0), {sizes['scores']});"),
        ("0", f"tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc + 0), {sizes['acc']});"),
    ], (fenced, sizes)
    plain = tessera_tvm.lower(build_tile_program(spec, None, "hopper"), "hopper", build=False).source
    assert "wait_wgmma<1>" not in plain  # the default loop waits for each GEMM


def test_overlapped_attention_folds_the_scale_into_the_exponent_without_a_bias():
    def multiplies_by_scale(spec):
        source = tessera_tvm.lower(build_tile_program(spec, _overlapped(spec), "hopper"), "hopper", build=False).source
        loop = "\n".join(_consumer_loop(source))
        return loop.count("exp2f("), loop.count("1.803369e-01")  # scale * log2(e) for D = 64

    plain = AttentionSpec(1, 2, 2, 256, 256, 64, False, dtype_in="float16")
    biased = AttentionSpec(1, 2, 2, 256, 256, 64, False, dtype_in="float16", bias=(1, 1, 1, 256))
    assert multiplies_by_scale(plain)[1] >= 2  # in the exponents: exp2(x * c - m * c)
    # with a bias the scores are scaled first (x * c + bias * log2(e)), the exponents take them as they are
    assert multiplies_by_scale(biased)[1] == 1


@pytest.mark.nvcc
def test_hopper_overlapped_attention_builds_with_nvcc(tmp_path):
    spec = OVERLAP_CASES["causal_gqa"]
    lowered = tessera_tvm.lower(build_tile_program(spec, _overlapped(spec), "hopper"), "hopper", out_dir=tmp_path)
    assert lowered.artifacts["cubin"].stat().st_size > 0
    ptx = lowered.artifacts["ptx"].read_text()
    assert "wgmma.mma_async" in ptx and "wgmma.wait_group.sync.aligned 1" in ptx
