# ruff: noqa: F821, F722  (Tensor["M", "K", ...] dims are strings, not names)
# No `from __future__ import annotations`: the kernels' annotations are evaluated at definition.
"""Sharding in one process: ts.shard's checks, the propagation rules, the collectives that
tessera.InsertCollectives places (or the error that says where a kernel must be split)."""

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera.errors import KernelError
from tessera_tvm.graph.collectives import Collective
from tessera_tvm.graph.kernels import kernel_spec
from tessera_tvm.graph.sharding import RankDependent, ShardingError

TP = ts.Mesh({"tp": 2})


@ts.kernel
def mlp(
    X: Tensor["M", "D", ts.f32], W1: Tensor["D", "F", ts.f32], b1: Tensor["F", ts.f32], W2: Tensor["F", "D", ts.f32]
) -> Tensor["M", "D", ts.f32]:
    return ops.matmul(ops.gelu(ops.matmul(X, W1) + b1), W2)


@ts.kernel
def mlp_residual(
    X: Tensor["M", "D", ts.f32], W1: Tensor["D", "F", ts.f32], W2: Tensor["F", "D", ts.f32]
) -> Tensor["M", "D", ts.f32]:
    return X + ops.matmul(ops.relu(ops.matmul(X, W1)), W2)


@ts.kernel
def norm_rows(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.rms_norm(x, w)


MEGATRON = {"W1": ts.Split("F"), "b1": ts.Split("F"), "W2": ts.Split("F")}


def _collectives(sharded):
    return sharded.collectives()


def test_column_then_row_parallel_mlp_needs_one_all_reduce_shown_in_the_graph_ir():
    sharded = ts.shard(mlp, TP, MEGATRON)
    assert _collectives(sharded) == [Collective("all_reduce", 0, "tp")]
    text = sharded.inspect_ir("graph")
    assert 'R.call_pure_packed("tessera.all_reduce", out, R.str("tp")' in text
    assert '"tessera.sharding": {"mesh": {"tp": 2}' in text


def test_outputs_left_split_need_a_reduce_scatter_or_nothing():
    rows = ts.shard(mlp, TP, MEGATRON, outputs=ts.Split("M"))
    assert _collectives(rows) == [Collective("reduce_scatter", 0, "tp", 0)]
    with pytest.raises(KernelError, match="dim F is split over 'tp' in some parameters but not in W2"):
        ts.shard(mlp, TP, {"W1": ts.Split("F"), "b1": ts.Split("F")})  # W2 replicated: F is split in W1 only


@ts.kernel
def column_only(X: Tensor["M", "D", ts.f32], W1: Tensor["D", "F", ts.f32]) -> Tensor["M", "F", ts.f32]:
    return ops.gelu(ops.matmul(X, W1))


def test_a_column_parallel_result_is_gathered_unless_it_may_stay_split():
    assert _collectives(ts.shard(column_only, TP, {"W1": ts.Split("F")})) == [Collective("all_gather", 0, "tp", 1)]
    assert _collectives(ts.shard(column_only, TP, {"W1": ts.Split("F")}, outputs=ts.Split("F"))) == []


def test_a_partial_sum_meeting_the_residual_is_all_reduced_inside_the_kernel():
    # column- then row-parallel: the second matmul is a partial sum; X is added to the whole sum, so
    # the all-reduce comes between the matmul and the add, which then is a kernel of its own
    sharded = ts.shard(mlp_residual, TP, {"W1": ts.Split("F"), "W2": ts.Split("F")})
    assert _collectives(sharded) == [Collective("all_reduce", -1, "tp", None, "matmul")]
    status = {r.name: r.status for r in sharded.graph().records}
    assert status["tessera.InsertCollectives"] == "ran (1 collective)"
    text = sharded.inspect_ir("graph")
    assert 'matmul1_all_reduce: R.Tensor((M, D), dtype="float32") = R.call_pure_packed("tessera.all_reduce"' in text
    assert "cls.fused_add(X, matmul1_all_reduce)" in text or "cls.add(X, matmul1_all_reduce)" in text


@ts.kernel
def contract_then_relu(X: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.relu(ops.matmul(X, W))


def test_a_partial_sum_entering_relu_is_summed_first_and_the_epilogue_is_not_fused():
    sharded = ts.shard(contract_then_relu, TP, {"X": ts.Split("K"), "W": ts.Split("K")})
    assert _collectives(sharded) == [Collective("all_reduce", -1, "tp", None, "matmul")]
    graph = sharded.graph()
    assert [g.family for g in graph.groups] == ["gemm", "elementwise"]  # relu after the sum, not in the GEMM


@ts.kernel
def split_rows_then_softmax(x: Tensor["M", "N", ts.f32], w: Tensor["N", "K", ts.f32]) -> Tensor["M", "K", ts.f32]:
    return ops.softmax(ops.matmul(x, w), axis=-1)


def test_a_softmax_over_a_split_row_gathers_the_row_between_the_kernels():
    sharded = ts.shard(split_rows_then_softmax, TP, {"w": ts.Split("K")})  # the softmax row is split
    assert _collectives(sharded) == [Collective("all_gather", -1, "tp", 1, "matmul")]
    text = sharded.inspect_ir("graph")
    assert 'matmul_all_gather: R.Tensor((M, K * 2), dtype="float32") = R.call_pure_packed("tessera.all_gather"' in text
    assert [g.family for g in sharded.graph().groups] == ["gemm", "softmax"]


def test_a_row_op_over_a_split_dim_gathers_its_input_and_over_rows_passes():
    gathered = _collectives(ts.shard(norm_rows, TP, {"x": ts.Split("N"), "w": ts.Split("N")}))
    assert gathered == [Collective("all_gather", -1, "tp", 1), Collective("all_gather", -1, "tp", 0)]  # x, then w
    assert [c.value_name for c in gathered] == ["x", "w"]  # parameters: gathered before the first kernel
    assert _collectives(ts.shard(norm_rows, TP, {"x": ts.Split("M")}, outputs=ts.Split("M"))) == []
    assert _collectives(ts.shard(norm_rows, TP, {"x": ts.Split("M")})) == [Collective("all_gather", 0, "tp", 0)]


def test_a_result_split_otherwise_than_it_comes_is_sliced_or_all_to_all():
    # whole on every rank: each keeps its piece, no communication
    assert _collectives(ts.shard(norm_rows, TP, {}, outputs=ts.Split("M"))) == [Collective("slice", 0, "tp", 0)]
    # split on the rows, wanted split on the columns: one all-to-all (each rank sends each its columns)
    resplit = ts.shard(norm_rows, TP, {"x": ts.Split("M")}, outputs=ts.Split("N"))
    assert _collectives(resplit) == [Collective("all_to_all", 0, "tp", 1, from_dim=0)]
    assert 'R.call_pure_packed("tessera.all_to_all", out, R.str("tp"), R.prim_value(1), R.prim_value(0)' in (
        resplit.inspect_ir("graph")
    )
    k = ts.compile(resplit, target="cpu", shapes={"M": 8, "N": 64})
    assert "sched.collective  all_to_all(output 0) over 'tp', dim 1 (split on dim 0 before) on torch" in (
        k.inspect_ir("sched")
    )


@ts.kernel
def sp_block(
    X: Tensor["S", "D", ts.f32], g: Tensor["D", ts.f32], W1: Tensor["D", "F", ts.f32], W2: Tensor["F", "D", ts.f32]
) -> Tensor["S", "D", ts.f32]:
    return X + ops.matmul(ops.gelu(ops.matmul(ops.rms_norm(X, g), W1)), W2)


SP = {"X": ts.Split("S"), "W1": ts.Split("F"), "W2": ts.Split("F")}


def test_sequence_parallel_block_all_gathers_then_reduce_scatters_inside_the_kernel():
    # Megatron sequence parallelism: the norm runs on each rank's rows; they are gathered for the
    # column-parallel matmul; the row-parallel partial sum is reduce-scattered onto the rows of the
    # residual, which stays split on S: no collective at the output
    sharded = ts.shard(sp_block, TP, SP, outputs=ts.Split("S"))
    assert _collectives(sharded) == [
        Collective("all_gather", -1, "tp", 0, "rms_norm"),
        Collective("reduce_scatter", -1, "tp", 0, "matmul"),
    ]
    text = sharded.inspect_ir("graph")
    assert 'R.Tensor((S * 2, D), dtype="float32") = R.call_pure_packed("tessera.all_gather"' in text
    assert 'R.Tensor((S * 2 // 2, D), dtype="float32") = R.call_pure_packed("tessera.reduce_scatter"' in text
    status = {r.name: r.status for r in sharded.graph().records}
    assert status["tessera.InsertCollectives"] == "ran (2 collectives)"
    # left replicated, the rows of the sum are gathered at the output instead
    whole = ts.shard(sp_block, TP, SP)
    assert _collectives(whole)[-1] == Collective("all_gather", 0, "tp", 0)


@ts.kernel
def attend(
    Q: Tensor["B", "H", "S", "E", ts.f32], K: Tensor["B", "H", "T", "E", ts.f32], V: Tensor["B", "H", "T", "E", ts.f32]
) -> Tensor["B", "H", "S", "E", ts.f32]:
    return ops.flash_attention(Q, K, V)


@ts.kernel
def attend_causal(
    Q: Tensor["B", "H", "S", "E", ts.f32], K: Tensor["B", "H", "S", "E", ts.f32], V: Tensor["B", "H", "S", "E", ts.f32]
) -> Tensor["B", "H", "S", "E", ts.f32]:
    return ops.flash_attention(Q, K, V, causal=True)


@ts.kernel
def attend_causal_cross(
    Q: Tensor["B", "H", "S", "E", ts.f32], K: Tensor["B", "H", "T", "E", ts.f32], V: Tensor["B", "H", "T", "E", ts.f32]
) -> Tensor["B", "H", "S", "E", ts.f32]:
    return ops.flash_attention(Q, K, V, causal=True)


def test_sequence_parallel_attention_gathers_keys_and_values():
    sharded = ts.shard(attend, TP, {"Q": ts.Split("S"), "K": ts.Split("T"), "V": ts.Split("T")}, outputs=ts.Split("S"))
    kinds = [(c.kind, c.output, c.dim, c.value_name) for c in _collectives(sharded)]
    assert kinds == [("all_gather", -1, 2, "K"), ("all_gather", -1, 2, "V")]  # on T, before the permutes; Q stays split
    assert [g.family for g in sharded.graph().groups] == ["attention"]  # the permutes still fused in


def test_causal_sequence_parallel_attention_reads_each_ranks_prefix_of_the_keys():
    mesh = ts.Mesh({"sp": 4})
    sharded = ts.shard(attend_causal, mesh, {n: ts.Split("S") for n in ("Q", "K", "V")}, outputs=ts.Split("S"))
    with pytest.raises(RankDependent, match="compiles per rank .* pass rank= to graph"):
        sharded.graph()  # the ranks' graphs differ: there is no graph of all of them
    with pytest.raises(RankDependent, match="compile it under torch.distributed"):
        ts.compile(sharded, target="cpu")  # no process group here, so no rank
    for rank in range(4):
        kinds = [(c.kind, c.dim, c.pieces) for c in sharded.collectives(rank=rank)]
        prefix = [("prefix", 2, rank + 1)] * 2 if rank < 3 else []  # the last rank reads all the keys
        assert kinds == [("all_gather", 2, None)] * 2 + prefix, (rank, kinds)
        graph = sharded.graph({"B": 1, "H": 2, "S": 64, "E": 16}, rank=rank)
        assert [g.family for g in graph.groups] == ["attention"]  # the prefix stays outside, the permutes in
        spec = kernel_spec(graph.groups[0], {"B": 1, "H": 2, "S": 16, "E": 16}).spec
        # rank r's 16 queries are 16r .. 16r + 15 of the 64: they see the keys up to 16r + i
        assert (spec.S_q, spec.S_kv, spec.causal_offset) == (16, 16 * (rank + 1), 16 * rank), (rank, spec)
    with pytest.raises(KernelError, match="rank is 4; expected 0 .. 3"):
        sharded.graph(rank=4)
    with pytest.raises(ShardingError, match=r"the keys' sequence \(T\) is not the queries' whole sequence"):
        ts.shard(attend_causal_cross, TP, {"Q": ts.Split("S"), "K": ts.Split("T"), "V": ts.Split("T")}).graph(rank=0)


def test_a_zigzag_sequence_split_balances_causal_attention_over_the_ranks():
    """Load-balanced context parallelism: rank r of 4 holds pieces r and 7 - r of 8, and computes each
    half of its queries against the keys up to its last query; every rank's two attentions cover
    the same share of the causal triangle."""
    zig = ts.Split("S", zigzag=True)
    sharded = ts.shard(attend_causal, ts.Mesh({"cp": 4}), dict.fromkeys("QKV", zig), outputs=zig)
    shares = []
    for rank in range(4):
        kinds = [(c.kind, c.dim, c.pieces) for c in sharded.collectives(rank=rank)]
        second = [] if rank == 0 else [("prefix", 2, 8 - rank)] * 2  # rank 0's second piece reads every key
        assert kinds == [("all_gather", 2, None)] * 2 + [("half", 2, 0)] + [("prefix", 2, rank + 1)] * 2 + [
            ("half", 2, 1)
        ] + second + [("concat", 2, None)], (rank, kinds)
        graph = sharded.graph({"B": 1, "H": 2, "S": 64, "E": 16}, rank=rank)
        assert [g.family for g in graph.groups] == ["attention", "attention"]
        specs = [kernel_spec(g, {"B": 1, "H": 2, "S": 16, "E": 16}).spec for g in graph.groups]
        # its queries are 8r .. 8r + 7 and 8(7 - r) .. 8(7 - r) + 7 of the 64
        got = [(s.S_q, s.S_kv, s.causal_offset) for s in specs]
        assert got == [(8, 8 * (rank + 1), 8 * rank), (8, 8 * (8 - rank), 8 * (7 - rank))], (rank, got)
        shares.append(sum(s.S_q * s.S_kv - s.S_q * (s.S_q - 1) // 2 for s in specs))  # scores computed
    assert len(set(shares)) == 1, shares  # the contiguous split's last rank computes 7x its first's
    assert "half(Q) over 'cp', dim 2, its second half" in "\n".join(
        c.text(c.value_name) for c in sharded.collectives(rank=1)
    )


def _attention_with_heads(heads: int, kv_heads: int):
    """Causal grouped-query attention with literal head counts (known to the graph)."""

    @ts.kernel
    def attend(
        Q: Tensor["B", heads, "S", "E", ts.f32],
        K: Tensor["B", kv_heads, "S", "E", ts.f32],
        V: Tensor["B", kv_heads, "S", "E", ts.f32],
    ) -> Tensor["B", heads, "S", "E", ts.f32]:
        return ops.flash_attention(Q, K, V, causal=True)

    return attend


def test_all_to_all_attention_resplits_the_sequence_on_the_heads():
    """attention='all_to_all' (DeepSpeed-Ulysses): one all-to-all each for Q, K and V (sequence to
    heads, before the permutes the attention kernel takes in), one back after its permute back; the
    attention sees the whole sequence for H / n heads, so a causal one needs no rank's coordinates."""
    seq = ts.Split("S")
    sharded = ts.shard(
        attend_causal, ts.Mesh({"sp": 4}), dict.fromkeys("QKV", seq), outputs=seq, attention="all_to_all"
    )
    kinds = [(c.kind, c.dim, c.from_dim, c.value_name, c.output) for c in _collectives(sharded)]
    assert kinds == [
        ("all_to_all", 1, 2, "Q", -1),
        ("all_to_all", 1, 2, "K", -1),
        ("all_to_all", 1, 2, "V", -1),
        ("all_to_all", 2, 1, "output 0", 0),
    ], kinds
    graph = sharded.graph({"B": 1, "H": 8, "S": 64, "E": 16})  # one graph: no rank= needed
    assert [g.family for g in graph.groups] == ["attention"]  # the permutes still fused in
    spec = kernel_spec(graph.groups[0], {"B": 1, "H": 8, "S": 16, "E": 16}).spec
    assert (spec.H, spec.S_q, spec.S_kv, spec.causal_offset) == (2, 64, 64, 0), spec
    assert 'R.call_pure_packed("tessera.all_to_all", Q, R.str("sp"), R.prim_value(1), R.prim_value(2)' in (
        sharded.inspect_ir("graph")
    )
    # wanted whole: the heads are gathered, not all-to-all'd back onto the sequence and gathered again
    whole = ts.shard(attend_causal, ts.Mesh({"sp": 4}), dict.fromkeys("QKV", seq), attention="all_to_all")
    assert [(c.kind, c.dim, c.value_name) for c in _collectives(whole)][3:] == [("all_gather", 1, "output 0")]
    assert 'R.str("sp"), R.prim_value(1), sinfo_args=(R.Tensor((B, H, S * 4, E)' in whole.inspect_ir("graph")

    # heads known in the graph are checked there (a symbolic H when the all-to-all runs: see ranks.py)
    six = ts.shard(_attention_with_heads(6, 6), ts.Mesh({"sp": 4}), dict.fromkeys("QKV", seq), attention="all_to_all")
    with pytest.raises(ShardingError, match=r"splits the heads over the 4 pieces of 'sp', and q has 6 heads"):
        six.graph()

    kv_heads = _attention_with_heads(8, 2)
    # 2 key/value heads over 4 pieces: each repeated twice in a row first, so each rank holds one
    few = ts.shard(kv_heads, ts.Mesh({"sp": 4}), dict.fromkeys("QKV", seq), attention="all_to_all")
    assert [(c.kind, c.dim, c.pieces, c.value_name) for c in _collectives(few)][:2] == [
        ("repeat", 1, 2, "K"),
        ("repeat", 1, 2, "V"),
    ]
    spec = kernel_spec(few.graph({"B": 1, "S": 64, "E": 16}).groups[0], {"B": 1, "S": 16, "E": 16}).spec
    assert (spec.H, spec.H_kv) == (2, 1), spec
    # 2 over 8 zigzag pieces: 4 times; 2 over 3 ranks cannot be
    zz = ts.shard(
        kv_heads, ts.Mesh({"sp": 4}), dict.fromkeys("QKV", ts.Split("S", zigzag=True)), attention="all_to_all"
    )
    assert [c.pieces for c in _collectives(zz) if c.kind == "repeat"] == [4, 4]
    three = ts.shard(kv_heads, ts.Mesh({"sp": 3}), dict.fromkeys("QKV", seq), attention="all_to_all")
    with pytest.raises(ShardingError, match=r"the 3 pieces of 'sp', and q has 8 heads"):
        three.graph()

    odd = ts.shard(_attention_with_heads(12, 3), ts.Mesh({"sp": 4}), dict.fromkeys("QKV", seq), attention="all_to_all")
    with pytest.raises(ShardingError, match=r"and k has 3 heads; give it a multiple .* \(or key/value heads that"):
        odd.graph()
    with pytest.raises(KernelError, match=r"ts.shard: attention is 'ring'; expected one of 'all_gather', 'all_to_all'"):
        ts.shard(attend_causal, TP, dict.fromkeys("QKV", seq), attention="ring")


def test_a_zigzag_split_is_checked_and_cuts_the_local_arrays():
    zig = ts.Split("S", zigzag=True)
    with pytest.raises(KernelError, match=r"ts.Split\('S'\): zigzag is 'yes'; expected True or False"):
        ts.Split("S", zigzag="yes")
    with pytest.raises(KernelError, match="Q is split zigzag over 'cp' but K is not"):
        ts.shard(attend_causal, ts.Mesh({"cp": 2}), {"Q": zig, "K": ts.Split("S"), "V": zig})
    with pytest.raises(KernelError, match="output 0 is split zigzag over 'tp' but no parameter is"):
        ts.shard(mlp, TP, MEGATRON, outputs=ts.Split("M", zigzag=True))
    sharded = ts.shard(attend_causal, ts.Mesh({"cp": 2}), dict.fromkeys("QKV", zig))
    with pytest.raises(KernelError, match=r"dim S = 6 does not split evenly over 'cp' \(2 ranks, 4 zigzag pieces\)"):
        sharded.local_shapes({"B": 1, "H": 1, "S": 6, "E": 4})
    assert sharded.local_shapes({"B": 1, "H": 1, "S": 8, "E": 4})["S"] == 4
    q = np.arange(8).reshape(1, 1, 8, 1)
    pieces = [sharded.local_arrays([q, q, q], rank)[0].ravel().tolist() for rank in (0, 1)]
    assert pieces == [[0, 1, 6, 7], [2, 3, 4, 5]]  # pieces 0 and 3, then 1 and 2, of 4
    import torch

    from tessera.distributed import unzigzag, zigzag_piece

    assert unzigzag([np.array(p) for p in pieces], 0).tolist() == list(range(8))
    parts = [zigzag_piece(torch.arange(8), 0, 2, c, True) for c in (0, 1)]  # torch tensors alike
    assert [p.tolist() for p in parts] == pieces and unzigzag(parts, 0).tolist() == list(range(8))
    assert zigzag_piece(np.arange(8), 0, 2, 1, False).tolist() == [4, 5, 6, 7]  # contiguous


@ts.kernel
def attend_alibi(
    Q: Tensor["B", "H", "S", "E", ts.f32],
    K: Tensor["B", "H", "S", "E", ts.f32],
    V: Tensor["B", "H", "S", "E", ts.f32],
    A: Tensor[1, "H", "S", "S", ts.f32],
) -> Tensor["B", "H", "S", "E", ts.f32]:
    return ops.flash_attention(Q, K, V, bias=A)


@ts.kernel
def attend_alibi_4(
    Q: Tensor["B", "H", "S", "E", ts.f32],
    K: Tensor["B", "H", "S", "E", ts.f32],
    V: Tensor["B", "H", "S", "E", ts.f32],
    A: Tensor[1, 4, "S", "S", ts.f32],
) -> Tensor["B", "H", "S", "E", ts.f32]:
    return ops.flash_attention(Q, K, V, bias=A)


@ts.kernel
def attend_padded(
    Q: Tensor["B", "H", "S", "E", ts.f32],
    K: Tensor["B", "H", "S", "E", ts.f32],
    V: Tensor["B", "H", "S", "E", ts.f32],
    M: Tensor["B", 1, 1, "S", ts.f32],
) -> Tensor["B", "H", "S", "E", ts.f32]:
    return ops.flash_attention(Q, K, V, bias=M)


def test_an_attention_bias_is_split_as_the_scores_are():
    heads = {n: ts.Split("H") for n in ("Q", "K", "V")}
    # split on its head dim as the queries are: nothing to do; broadcast over heads (a padding mask): whole
    assert [c.kind for c in _collectives(ts.shard(attend_alibi, TP, {**heads, "A": ts.Split("H")}))] == ["all_gather"]
    assert [c.kind for c in _collectives(ts.shard(attend_padded, TP, heads))] == ["all_gather"]
    # a whole bias over the heads (its head dim a literal) is cut to the rank's heads, no communication
    kinds = [(c.kind, c.dim, c.value_name) for c in _collectives(ts.shard(attend_alibi_4, TP, heads))]
    assert kinds == [("slice", 1, "A"), ("all_gather", 1, "output 0")], kinds
    # a padding mask split with the keys' sequence is gathered with them
    rows = ts.shard(attend_padded, TP, {n: ts.Split("S") for n in ("Q", "K", "V", "M")}, outputs=ts.Split("S"))
    assert [(c.kind, c.dim, c.value_name) for c in _collectives(rows)] == [
        ("all_gather", 2, "K"),
        ("all_gather", 2, "V"),
        ("all_gather", 3, "M"),
    ]


def test_shard_checks_its_arguments():
    with pytest.raises(KernelError, match="Q is not a parameter"):
        ts.shard(mlp, TP, {"Q": ts.Split("F")})
    with pytest.raises(KernelError, match="W1 has no dim 'Z'"):
        ts.shard(mlp, TP, {"W1": ts.Split("Z")})
    with pytest.raises(KernelError, match="split over 'dp', which is not an axis"):
        ts.shard(mlp, TP, {"W1": ts.Split("F", "dp")})
    with pytest.raises(KernelError, match="1 or 2 named axes"):
        ts.Mesh({})
    with pytest.raises(KernelError, match="dim F = 63 does not split evenly over 'tp'"):
        ts.shard(mlp, TP, MEGATRON).local_shapes({"M": 4, "D": 8, "F": 63})


def test_local_shapes_and_arrays_cut_the_split_dims():
    sharded = ts.shard(mlp, ts.Mesh({"dp": 2, "tp": 2}), {"X": ts.Split("M", "dp"), **MEGATRON})
    assert sharded.local_shapes({"M": 8, "D": 4, "F": 6}) == {"M": 4, "D": 4, "F": 3}
    arrays = [np.arange(np.prod(s)).reshape(s) for s in ((8, 4), (4, 6), (6,), (6, 4))]
    x, w1, b1, w2 = sharded.local_arrays(arrays, rank=3)  # coords dp=1, tp=1
    assert (x == arrays[0][4:]).all() and (w1 == arrays[1][:, 3:]).all()
    assert (b1 == arrays[2][3:]).all() and (w2 == arrays[3][3:]).all()
    assert sharded.mesh.group_ranks("tp") == [[0, 1], [2, 3]] and sharded.mesh.group_ranks("dp") == [[0, 2], [1, 3]]


def test_the_compiled_kernel_shows_its_collectives_and_needs_a_process_group():
    sharded = ts.shard(mlp, TP, MEGATRON)
    k = ts.compile(sharded, target="cpu", shapes={"M": 4, "D": 8, "F": 16})
    assert k.local.shapes == {"M": 4, "D": 8, "F": 8}  # each rank compiles its own shapes
    assert "sched.collective  all_reduce(output 0) over 'tp' on torch.distributed" in k.inspect_ir("sched")
    rng = np.random.default_rng(0)
    arrays = sharded.local_arrays(
        [rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (8, 16), (16,), (16, 8))], 0
    )
    with pytest.raises(
        ts.CollectiveError, match="runs under torch.distributed; call torch.distributed.init_process_group"
    ):
        k(*arrays)


def test_a_sharded_kernel_and_its_plain_kernel_at_the_same_local_shapes_are_two_compiles():
    """The compile cache keys a rank's kernel by its sharding too: the plain kernel at the local
    shapes has no collectives, and a contiguous and a zigzag split of one attention differ."""
    sharded = ts.shard(mlp_residual, TP, {"W1": ts.Split("F"), "W2": ts.Split("F")})
    ts.compile(sharded, target="cpu", shapes={"M": 4, "D": 8, "F": 16})  # built now: its shapes are bound
    plain = ts.compile(mlp_residual, target="cpu", shapes={"M": 4, "D": 8, "F": 8})
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (8, 8), (8, 8))]
    np.testing.assert_allclose(plain(*arrays), mlp_residual.reference(*arrays), rtol=1e-5, atol=1e-5)
    shapes = {"B": 1, "H": 2, "S": 32, "E": 16}
    split = {n: ts.Split("S") for n in "QKV"}
    zig = {n: ts.Split("S", zigzag=True) for n in "QKV"}
    graphs = [
        ts.shard(attend_causal, TP, s, outputs=o).local_kernel_for(1, shapes).graph({**shapes, "S": 16}).text()
        for s, o in ((split, ts.Split("S")), (zig, ts.Split("S", zigzag=True)))
    ]
    assert "tessera.half" in graphs[1] and "tessera.half" not in graphs[0]


def test_the_schedule_ir_names_an_all_reduce_inside_the_kernel():
    sharded = ts.shard(mlp_residual, TP, {"W1": ts.Split("F"), "W2": ts.Split("F")})
    k = ts.compile(sharded, target="cpu", shapes={"M": 4, "D": 8, "F": 16})
    text = k.inspect_ir("sched")
    assert "sched.collective  all_reduce(matmul's output) over 'tp' on torch.distributed (between the kernels" in text
