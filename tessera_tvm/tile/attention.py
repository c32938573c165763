"""Flash-attention forward tile programs: causal or not, grouped-query, masked edges.

One block owns ``block_m`` query rows of one (batch, head) and walks the keys in steps of
``block_n``, keeping fp32 running row maxima and sums (online softmax) and rescaling the fp32
output accumulator as the maximum grows; the output is divided by the sum once at the end.
Query head ``h`` reads kv head ``h // (H // H_kv)``.

Masking: a score is -inf where the key is past ``S_kv`` or, with ``causal``, after the query's
diagonal (``key <= query + causal_offset``); with causal masking a block stops at the last key
block any of its queries can see. A row that has seen only -inf keeps a zero sum and gets a zero
output (no NaN). GPU tiles read past the ``S_q`` / ``S_kv`` edges through TileLang copies, which
zero-fill them, and the final copy is predicated; the CPU kernel clamps its loops to the edges.

GPU: Q, K and V tiles in shared memory, ``T.gemm`` for Q K^T and P V into fragments, scores in the
log2 domain (``exp2``), a pipelined key loop. CPU: Q K^T and P V on the packed GEMM micro-kernel of
tessera/cpu_gemm.h, the online softmax over contiguous queries (vectorised, tessera_expf).
"""

from __future__ import annotations

from .._tvm import T, named, pointer_buffer, prim_func
from .common import LOG2E, all_of, cpu_exp_nonpositive, declare_params, element_offset, lowest, to_compute
from .gemm import cpu_gemm, cpu_pack, cpu_pack_elements, cpu_pack_suffix
from .schedule import TileSchedule
from .specs import AttentionSpec

ACC = "float32"


def _roles(spec: AttentionSpec) -> tuple[str, ...]:
    """The kernel's buffers in parameter order: Q, K, V, the bias if any, O."""
    return ("q", "k", "v", *(("bias",) if spec.bias is not None else ()), "out")


def _bias_value(spec: AttentionSpec, io, batch, head, query, key, *, clamp: bool = True):
    """The bias of score (batch, head, query, key), in the accumulator's dtype (``clamp``: see
    :meth:`AttentionSpec.bias_index`)."""
    return to_compute(io.bias[spec.bias_index(batch, head, query, key, clamp=clamp)], ACC)


def _biased(spec: AttentionSpec, io, score, batch, head, query, key, factor: float = 1.0):
    """``score`` plus the bias of (batch, head, query, key) times ``factor`` (no bias: ``score``)."""
    if spec.bias is None:
        return score
    value = _bias_value(spec, io, batch, head, query, key)
    return score + (value * factor if factor != 1.0 else value)


def _visible(spec: AttentionSpec, query, key):
    """Whether ``query`` attends to ``key``."""
    if spec.causal:
        return all_of(key < spec.S_kv, key <= query + spec.causal_offset)
    return key < spec.S_kv


def _key_blocks(spec: AttentionSpec, first_query, block_m: int, block_n: int):
    """How many key blocks the queries ``first_query .. first_query + block_m - 1`` can see."""
    all_blocks = T.ceildiv(spec.S_kv, block_n)
    if not spec.causal:
        return all_blocks
    last_visible = first_query + block_m + spec.causal_offset  # one past the last key the block sees
    blocks = T.min(all_blocks, T.ceildiv(last_visible, block_n))
    offset = spec.causal_offset
    return blocks if isinstance(offset, int) and offset >= 0 else T.max(0, blocks)


def _safe_max(row_max):
    """The running max, with 0 for rows that have seen only masked keys (avoids -inf - -inf)."""
    return T.if_then_else(row_max == lowest(ACC), T.cast(0, ACC), row_max)


def _alloc_probs(block_m: int, block_n: int, dtype: str):
    """The P tile fed to the P @ V gemm: registers, or shared memory for fp32 (tf32) inputs, whose
    operand layout differs from the accumulator layout P is computed in."""
    if dtype == "float32":
        return T.alloc_shared((block_m, block_n), dtype)
    return T.alloc_fragment((block_m, block_n), dtype)


def _gpu_buffers(spec: AttentionSpec, s: TileSchedule) -> tuple:
    """The GPU programs' buffers: the Q, K and V tiles in shared memory; the scores, P, the output
    accumulator and the per-row statistics (running max, the previous max, the rescale factor, this
    step's sum, the running sum) in registers."""
    block_m, block_n, D, dtype = s.block_m, s.block_n, spec.D, spec.dtype_in
    tiles = [
        named(T.alloc_shared((rows, D), dtype), name)
        for rows, name in ((block_m, "Q_s"), (block_n, "K_s"), (block_n, "V_s"))
    ]
    scores = named(T.alloc_fragment((block_m, block_n), ACC), "scores")
    probs = named(_alloc_probs(block_m, block_n, dtype), "probs")
    acc = named(T.alloc_fragment((block_m, D), ACC), "acc")
    rows = [
        named(T.alloc_fragment((block_m,), ACC), n) for n in ("row_max", "prev_max", "rescale", "step_sum", "row_sum")
    ]
    return (*tiles, scores, probs, acc, *rows)


def attention_gpu_program(spec: AttentionSpec, s: TileSchedule):
    """The flash-attention tile program of a thread-block target (CUDA, HIP)."""
    if s.overlap:
        return _attention_gpu_overlapped(spec, s)
    block_m, block_n, D = s.block_m, s.block_n, spec.D
    scale_log2 = spec.scale * LOG2E  # exp(x * scale) == exp2(x * scale * log2(e))
    groups = spec.groups
    params = spec.params()

    @prim_func
    def main():
        io = declare_params(params, _roles(spec))
        with T.Kernel(T.ceildiv(spec.S_q, block_m), spec.H, spec.B, threads=s.threads) as (bx, head, batch):
            Q_s, K_s, V_s, scores, probs, acc, row_max, prev_max, rescale, step_sum, row_sum = _gpu_buffers(spec, s)
            kv_head = head // groups
            T.copy(io.q[batch, head, bx * block_m, 0], Q_s)
            T.fill(acc, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, lowest(ACC))
            for kb in T.Pipelined(_key_blocks(spec, bx * block_m, block_m, block_n), num_stages=s.stages):
                T.copy(io.k[batch, kv_head, kb * block_n, 0], K_s)
                T.clear(scores)
                T.gemm(Q_s, K_s, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_m, block_n):  # the bias in the log2 domain too
                    scores[i, j] = T.if_then_else(
                        _visible(spec, bx * block_m + i, kb * block_n + j),
                        _biased(
                            spec, io, scores[i, j] * scale_log2, batch, head, bx * block_m + i, kb * block_n + j, LOG2E
                        ),
                        lowest(ACC),
                    )
                T.copy(row_max, prev_max)
                T.reduce_max(scores, row_max, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    rescale[i] = T.exp2(prev_max[i] - _safe_max(row_max[i]))
                for i, j in T.Parallel(block_m, block_n):
                    scores[i, j] = T.exp2(scores[i, j] - _safe_max(row_max[i]))
                T.reduce_sum(scores, step_sum, dim=1)
                for i in T.Parallel(block_m):
                    row_sum[i] = row_sum[i] * rescale[i] + step_sum[i]
                T.copy(scores, probs)
                for i, j in T.Parallel(block_m, D):
                    acc[i, j] *= rescale[i]
                T.copy(io.v[batch, kv_head, kb * block_n, 0], V_s)
                T.gemm(probs, V_s, acc, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_m, D):
                acc[i, j] = T.if_then_else(row_sum[i] == 0, T.cast(0, ACC), acc[i, j] / row_sum[i])
            T.copy(acc, io.out[batch, head, bx * block_m, 0])

    return main


def _attention_gpu_overlapped(spec: AttentionSpec, s: TileSchedule):
    """The GPU program with FlashAttention-3's intra-warpgroup overlap (Hopper's asynchronous
    wgmma), software-pipelined by hand: iteration ``kb`` issues Q K^T of key block ``kb`` and P V of
    block ``kb - 1`` without waiting, then waits for the first and computes block ``kb``'s softmax
    while the tensor cores still run the second. TileLang's warp-specialised pipeline (the TMA
    producer warp group) drops ``T.Pipelined``'s ``order``/``stage`` annotations and cannot copy into
    its staged buffers outside the loop, so the overlap is written out here, as one loop of
    ``n + 1`` iterations without branches: iteration 0's P V multiplies P = 0, and iteration ``n``
    reads block ``n - 1`` again with every score masked, which leaves max, sum and O as they were.

    P waits in f32 in ``scores`` until P V of the previous block has read ``probs``. Scores start at
    0 (visible) or -inf (masked) and the Q K^T GEMM accumulates onto them, so masking costs no pass
    of its own; without a bias the scale is folded into the exponent (``exp2(x * c - m * c)``, one
    FFMA per score) instead of a multiply pass.
    """
    block_m, block_n, D = s.block_m, s.block_n, spec.D
    groups = spec.groups
    params = spec.params()
    # Scores stay unscaled (the max is taken before scaling, which a positive scale keeps) unless a
    # bias must be added in the log2 domain first.
    folded = spec.bias is None and spec.scale > 0
    factor = spec.scale * LOG2E if folded else 1.0

    def exponent(x, row_max):
        return x * factor - _safe_max(row_max) * factor if folded else x - _safe_max(row_max)

    @prim_func
    def main():
        io = declare_params(params, _roles(spec))
        with T.Kernel(T.ceildiv(spec.S_q, block_m), spec.H, spec.B, threads=s.threads) as (bx, head, batch):
            Q_s, K_s, V_s, scores, probs, acc, row_max, prev_max, rescale, step_sum, row_sum = _gpu_buffers(spec, s)
            held = T.alloc_local((1,), spec.dtype_in)
            kv_head = head // groups
            n_blocks = _key_blocks(spec, bx * block_m, block_m, block_n)
            T.copy(io.q[batch, head, bx * block_m, 0], Q_s)
            T.fill(acc, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, lowest(ACC))
            T.fill(rescale, 1)
            T.fill(probs, 0)
            for kb in T.Pipelined(n_blocks + 1, num_stages=s.stages):
                # issue Q K^T of block kb (iteration n: block n - 1 again, all masked) ...
                T.copy(io.k[batch, kv_head, T.max(T.min(kb, n_blocks - 1), 0) * block_n, 0], K_s)
                for i, j in T.Parallel(block_m, block_n):
                    scores[i, j] = T.if_then_else(
                        all_of(kb < n_blocks, _visible(spec, bx * block_m + i, kb * block_n + j)),
                        T.cast(0, ACC),
                        lowest(ACC),
                    )
                T.wgmma_gemm(Q_s, K_s, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                # ... and P V of block kb - 1 (iteration 0: P = 0), O first rescaled to block kb - 1's max
                for i, j in T.Parallel(block_m, D):
                    acc[i, j] *= rescale[i]
                T.copy(io.v[batch, kv_head, T.max(kb - 1, 0) * block_n, 0], V_s)
                T.wgmma_gemm(probs, V_s, acc, policy=T.GemmWarpPolicy.FullRow)
                # block kb's softmax while P V runs
                T.wait_wgmma(1)
                T.warpgroup_fence_operand(scores, 0, block_m * block_n // s.threads)  # no read of S above the wait
                held[0] = K_s[0, 0]  # K's last use: its stage is released after the wait, not at the issue
                if not folded:  # scale (and bias) into the log2 domain first
                    for i, j in T.Parallel(block_m, block_n):
                        scores[i, j] = _biased(
                            spec,
                            io,
                            scores[i, j] * (spec.scale * LOG2E),
                            batch,
                            head,
                            bx * block_m + i,
                            kb * block_n + j,  # iteration n's keys are past the end: clamped
                            LOG2E,
                        )
                T.copy(row_max, prev_max)
                T.reduce_max(scores, row_max, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    rescale[i] = T.exp2(exponent(prev_max[i], row_max[i]))
                for i, j in T.Parallel(block_m, block_n):
                    scores[i, j] = T.exp2(exponent(scores[i, j], row_max[i]))
                T.reduce_sum(scores, step_sum, dim=1)
                for i in T.Parallel(block_m):
                    row_sum[i] = row_sum[i] * rescale[i] + step_sum[i]
                T.wait_wgmma(0)
                T.warpgroup_fence_operand(acc, 0, block_m * D // s.threads)  # nor of O (registers per thread)
                held[0] = V_s[0, 0]  # V's last use, likewise
                T.copy(scores, probs)
            for i, j in T.Parallel(block_m, D):
                acc[i, j] = T.if_then_else(row_sum[i] == 0, T.cast(0, ACC), acc[i, j] / row_sum[i])
            T.copy(acc, io.out[batch, head, bx * block_m, 0])

    return main


def attention_cpu_program(spec: AttentionSpec, s: TileSchedule):
    """The attention tile program of the CPU: packed panels and the micro-kernel (serial loops without it)."""
    if cpu_pack_suffix(spec.dtype_in) is None:
        return _attention_cpu_loops(spec, s)
    return _attention_cpu_packed(spec, s)


def _masked(spec: AttentionSpec, score, query, key):
    """``score`` where ``query`` sees ``key``, else -inf (keys past S_kv are outside the loops)."""
    if spec.causal:
        return T.if_then_else(key <= query + spec.causal_offset, score, lowest(ACC))
    return score


@T.macro
def _scale_and_max(scores, new_max, keys, block_m, scale, mask, bias):
    """``scores`` (S^T, keys x queries) times ``scale`` (plus the bias), and each query's running max
    over them; ``mask``: (spec, first query, first key) of a block that needs the causal mask, else
    None; ``bias``: (spec, io, batch, head, first query, first key) of a kernel with a bias, else None."""
    for j in T.serial(keys):
        for i in T.serial(block_m):
            if mask is None:
                scores[j, i] = _bias_term(bias, scores[j, i] * scale, i, j)
            else:
                scores[j, i] = _masked(mask[0], _bias_term(bias, scores[j, i] * scale, i, j), mask[1] + i, mask[2] + j)
            new_max[i] = T.max(new_max[i], scores[j, i])


@T.macro
def _max_of_scaled(scores, new_max, keys, block_m, scale):
    """Each query's running max over ``scale`` times its raw scores (``scale > 0``), which stay raw."""
    for j in T.serial(keys):
        for i in T.serial(block_m):
            new_max[i] = T.max(new_max[i], scores[j, i] * scale)


@T.macro
def _online_softmax(scores, row_max, new_max, rescale, row_sum, acc, keys, rows, block_m, D, factor):
    """One key block of the online softmax: the accumulator and the row sums rescaled to the new
    running max, then ``scores`` (S^T) replaced by their exponentials ``exp(factor * s - max)`` (``s
    - max`` where ``factor`` is None: scores already scaled), summed per query. Every exponent is <= 0."""
    for i in T.serial(block_m):
        rescale[i] = cpu_exp_nonpositive(row_max[i] - _safe_max(new_max[i]))
        row_max[i] = new_max[i]
        row_sum[i] = row_sum[i] * rescale[i]
        new_max[i] = _safe_max(row_max[i])  # the exponentials' offset
    for i in T.serial(rows):
        for d in T.serial(D):
            acc[i, d] = acc[i, d] * rescale[i]
    for j in T.serial(keys):
        for i in T.serial(block_m):
            if factor is None:
                scores[j, i] = cpu_exp_nonpositive(scores[j, i] - new_max[i])
            else:
                scores[j, i] = cpu_exp_nonpositive(scores[j, i] * factor - new_max[i])
            row_sum[i] += scores[j, i]


def _bias_term(bias, score, i, j):
    """``score`` of query ``i``, key ``j`` of the block plus its bias (``bias`` as _scale_and_max's,
    or a local ``[keys, queries]`` copy of the block's bias)."""
    if bias is None:
        return score
    if not isinstance(bias, tuple):
        return score + bias[j, i]
    spec, io, batch, head, first_query, first_key = bias
    return _biased(spec, io, score, batch, head, first_query + i, first_key + j)


def _bias_varies_in_both(spec: AttentionSpec) -> bool:
    """Whether the bias has both a query and a key dim: read down its columns (S^T's order), it
    would stop g++ vectorising the scores over the queries, so each block copies it transposed."""
    return spec.bias is not None and not any(isinstance(d, int) and d == 1 for d in spec.bias[2:])


def _attention_cpu_packed(spec: AttentionSpec, s: TileSchedule):
    """CPU flash attention on the packed GEMM micro-kernel (tessera/cpu_gemm.h).

    Scores are computed transposed, ``S^T = K Q^T`` (keys x queries), so that the row statistics
    (max, sum) and the exponentials run over contiguous queries, each query an independent lane that
    g++ vectorises; ``O += P V`` reads P through the transposed-operand strides of the packing. Q is
    packed once per query block; exponentials by the inline ``tessera_expf_nonpositive`` (every
    exponent is a score minus its row's max), the scale folded into them where no mask or bias has to
    be added to the scaled scores first.

    K and V (``kv_packs_per_head``): with 0, a block owns one query block of one head and packs each
    key block's K and V into stack panels as it reaches it, so every query block of a head packs them
    again; with n, a block owns every n-th query block of each query head that reads one kv head, and
    first packs every key block those queries see, once, into the thread's workspace
    (``tessera_cpu_workspace``): a key block's K panel, then its V panel.
    """
    block_m, block_n, D = s.block_m, s.block_n, spec.D
    params = spec.params()
    k_elems, q_elems = cpu_pack_elements(block_n, block_m, D)  # S^T = K Q^T: A = K block, B = Q^T
    p_elems, v_elems = cpu_pack_elements(block_m, D, block_n)  # O += P V: A = P, B = V block
    transposed_bias = _bias_varies_in_both(spec)
    packs = s.kv_packs_per_head
    query_blocks = T.ceildiv(spec.S_q, block_m)

    def block_buffers():
        """The block's stack arrays: O, S^T (then P^T), packed Q^T and P, the row statistics (running
        max, this step's max, rescale factor, running sum) and the block's bias, transposed."""
        return (
            T.alloc_local((block_m, D), ACC),
            T.alloc_local((block_n, block_m), ACC),
            T.alloc_local((q_elems,), ACC),
            T.alloc_local((p_elems,), ACC),
            T.alloc_local((block_m,), ACC),
            T.alloc_local((block_m,), ACC),
            T.alloc_local((block_m,), ACC),
            T.alloc_local((block_m,), ACC),
            T.alloc_local((block_n, block_m) if transposed_bias else (1,), ACC),
        )

    if packs == 0:

        @prim_func
        def main():
            io = declare_params(params, _roles(spec))
            with T.Kernel(query_blocks, spec.H, spec.B) as (bx, head, batch):
                buffers = block_buffers()
                k_pack = T.alloc_local((k_elems,), ACC)
                v_pack = T.alloc_local((v_elems,), ACC)
                _cpu_query_block(
                    spec, s, io, buffers, batch, head, head // spec.groups, bx * block_m, (k_pack, v_pack), None
                )

        return main

    panel = k_elems + v_elems  # the workspace's floats per key block

    @prim_func
    def main():
        io = declare_params(params, _roles(spec))
        with T.Kernel(packs, spec.H_kv, spec.B) as (piece, kv_head, batch):
            buffers = block_buffers()
            owned = T.ceildiv(query_blocks - piece, packs)  # query blocks piece, piece + packs, ...
            if owned > 0:
                # Every query block of the piece sees at most the keys its last one sees.
                key_blocks = _key_blocks(spec, (piece + (owned - 1) * packs) * block_m, block_m, block_n)
                workspace = (key_blocks * panel, panel, k_elems)
                for kb in T.serial(key_blocks):
                    kv = _workspace_panels(workspace, kb)
                    _pack_k(spec, io, T.address_of(kv[0]), batch, kv_head, kb, block_n)
                    _pack_v(spec, io, T.address_of(kv[k_elems]), batch, kv_head, kb, block_n)
                for g in T.serial(spec.groups):
                    for i in T.serial(owned):
                        _cpu_query_block(
                            spec,
                            s,
                            io,
                            buffers,
                            batch,
                            kv_head * spec.groups + g,
                            kv_head,
                            (piece + i * packs) * block_m,
                            None,
                            workspace,
                        )

    return main


def _pack_k(spec: AttentionSpec, io, panel, batch, kv_head, kb, block_n: int):
    """Key block ``kb`` of K as the A operand of S^T = K Q^T, into ``panel`` (an address)."""
    keys = T.min(block_n, spec.S_kv - kb * block_n)
    first = element_offset(io.k, (batch, kv_head, kb * block_n, 0))
    return cpu_pack("a", cpu_pack_suffix(spec.dtype_in), panel, io.k.data, first, spec.D, 1, keys, spec.D)


def _pack_v(spec: AttentionSpec, io, panel, batch, kv_head, kb, block_n: int):
    """Key block ``kb`` of V as the B operand of O += P V, into ``panel`` (an address)."""
    keys = T.min(block_n, spec.S_kv - kb * block_n)
    first = element_offset(io.v, (batch, kv_head, kb * block_n, 0))
    return cpu_pack("b", cpu_pack_suffix(spec.dtype_in), panel, io.v.data, first, spec.D, 1, spec.D, keys)


def _workspace_panels(workspace, kb):
    """A buffer over key block ``kb``'s K and V panels in the thread's workspace (``workspace``: its
    floats, floats per key block, floats of a K panel; the V panel follows the K panel)."""
    floats, panel, _ = workspace
    address = T.call_extern("handle", "tessera_cpu_workspace", T.cast(floats, "int64"), T.cast(kb * panel, "int64"))
    return pointer_buffer(address, (panel,), ACC)


@T.macro
def _cpu_query_block(spec, s, io, buffers, batch, head, kv_head, first_query, panels, workspace):
    """The ``block_m`` queries from ``first_query`` of (``batch``, ``head``) over their keys, into O.
    K and V: ``panels``, (K panel, V panel) stack arrays that each key block is packed into here, or
    ``workspace`` (see :func:`_workspace_panels`), the thread's workspace holding every key block
    packed already."""
    block_m, block_n, D = s.block_m, s.block_n, spec.D
    scale = spec.scale
    acc, scores, q_pack, p_pack, row_max, new_max, rescale, row_sum, bias_t = buffers
    transposed_bias = _bias_varies_in_both(spec)
    rows = T.min(block_m, spec.S_q - first_query)
    for i in T.serial(block_m):
        row_max[i] = lowest(ACC)
        row_sum[i] = T.cast(0, ACC)
    if transposed_bias:  # lanes past the last query read zeros, not stale values
        T.clear(bias_t)
    # (Loops, not T.clear: TileLang unrolls a clear's rows, and tl.StorageRewrite then failed on 224
    # rows of scores inside the per-head form's query loop.)
    for i in T.serial(block_m):
        for d in T.serial(D):
            acc[i, d] = T.cast(0, ACC)
    # The GEMM of each key block writes its first `rows` queries only: the lanes past them (the last
    # block of queries) are computed too and never stored; finite values from the start.
    for j in T.serial(block_n):
        for i in T.serial(block_m):
            scores[j, i] = T.cast(0, ACC)
    # Q^T as the B operand of S^T = K Q^T: element (d, query i) is Q[i, d].
    cpu_pack(
        "b",
        cpu_pack_suffix(spec.dtype_in),
        T.address_of(q_pack[0]),
        io.q.data,
        element_offset(io.q, (batch, head, first_query, 0)),
        1,
        D,
        rows,
        D,
    )
    for kb in T.serial(_key_blocks(spec, first_query, block_m, block_n)):
        keys = T.min(block_n, spec.S_kv - kb * block_n)
        if workspace is None:  # K and V panels on the stack, packed here
            k_panel, v_panel = panels
            v_at = 0
            _pack_k(spec, io, T.address_of(k_panel[0]), batch, kv_head, kb, block_n)
        else:  # both in one buffer over the workspace's panels of key block kb
            k_panel = _workspace_panels(workspace, kb)
            v_panel = k_panel
            v_at = workspace[2]
        cpu_gemm(scores, block_m, k_panel, q_pack, keys, rows, D, overwrite=True)
        for i in T.serial(block_m):
            new_max[i] = row_max[i]
        # Only key blocks that reach past the block's first query need the mask; a select in the
        # loop stops g++ vectorising it (causal ran at 86% of full attention's time).
        bias = None if spec.bias is None else (spec, io, batch, head, first_query, kb * block_n)
        if transposed_bias:  # the block's bias transposed, rows in order (contiguous reads)
            for i in T.serial(rows):
                for j in T.serial(keys):
                    bias_t[j, i] = _bias_value(spec, io, batch, head, first_query + i, kb * block_n + j, clamp=False)
            bias = bias_t
        softmax = (scores, row_max, new_max, rescale, row_sum, acc, keys, rows, block_m, D)
        if spec.causal and (kb + 1) * block_n - 1 > first_query + spec.causal_offset:
            _scale_and_max(scores, new_max, keys, block_m, scale, (spec, first_query, kb * block_n), bias)
            _online_softmax(*softmax, None)
        elif bias is None and scale > 0:  # the scale goes into the exponentials: one pass less
            _max_of_scaled(scores, new_max, keys, block_m, scale)
            _online_softmax(*softmax, scale)
        else:
            _scale_and_max(scores, new_max, keys, block_m, scale, None, bias)
            _online_softmax(*softmax, None)
        # P (queries x keys) as the A operand: element (i, key j) is P^T[j, i].
        cpu_pack("a", "f32", T.address_of(p_pack[0]), T.address_of(scores[0, 0]), 0, 1, block_m, rows, keys)
        if workspace is None:
            _pack_v(spec, io, T.address_of(v_panel[0]), batch, kv_head, kb, block_n)
        cpu_gemm(acc, D, p_pack, T.address_of(v_panel[v_at]), rows, D, keys)
    for i in T.serial(rows):
        for d in T.serial(D):
            io.out[batch, head, first_query + i, d] = T.cast(
                T.if_then_else(row_sum[i] == 0, T.cast(0, ACC), acc[i, d] / row_sum[i]), spec.dtype_out
            )


def _attention_cpu_loops(spec: AttentionSpec, s: TileSchedule):
    """Serial loops, for input dtypes the packing routines do not read."""
    block_m, block_n, D = s.block_m, s.block_n, spec.D
    scale = spec.scale
    groups = spec.groups
    params = spec.params()

    @prim_func
    def main():
        io = declare_params(params, _roles(spec))
        with T.Kernel(T.ceildiv(spec.S_q, block_m), spec.H, spec.B) as (bx, head, batch):
            acc = T.alloc_local((block_m, D), ACC)
            scores = T.alloc_local((block_m, block_n), ACC)
            row_max = T.alloc_local((block_m,), ACC)
            new_max = T.alloc_local((block_m,), ACC)
            rescale = T.alloc_local((block_m,), ACC)
            row_sum = T.alloc_local((block_m,), ACC)
            kv_head = head // groups
            rows = T.min(block_m, spec.S_q - bx * block_m)
            for i in T.serial(rows):
                row_max[i] = lowest(ACC)
                row_sum[i] = T.cast(0, ACC)
                for d in T.serial(D):
                    acc[i, d] = T.cast(0, ACC)
            for kb in T.serial(_key_blocks(spec, bx * block_m, block_m, block_n)):
                for i in T.serial(rows):
                    for j in T.serial(T.min(block_n, spec.S_kv - kb * block_n)):
                        scores[i, j] = T.cast(0, ACC)
                        for d in T.serial(D):
                            scores[i, j] += to_compute(io.q[batch, head, bx * block_m + i, d], ACC) * to_compute(
                                io.k[batch, kv_head, kb * block_n + j, d], ACC
                            )
                        scores[i, j] = T.if_then_else(
                            _visible(spec, bx * block_m + i, kb * block_n + j),
                            _biased(spec, io, scores[i, j] * scale, batch, head, bx * block_m + i, kb * block_n + j),
                            lowest(ACC),
                        )
                    new_max[i] = row_max[i]
                    for j in T.serial(T.min(block_n, spec.S_kv - kb * block_n)):
                        new_max[i] = T.max(new_max[i], scores[i, j])
                    rescale[i] = T.exp(row_max[i] - _safe_max(new_max[i]))
                    row_max[i] = new_max[i]
                    row_sum[i] = row_sum[i] * rescale[i]
                    for d in T.serial(D):
                        acc[i, d] = acc[i, d] * rescale[i]
                    for j in T.serial(T.min(block_n, spec.S_kv - kb * block_n)):
                        scores[i, j] = T.exp(scores[i, j] - _safe_max(row_max[i]))
                        row_sum[i] += scores[i, j]
                        for d in T.serial(D):
                            acc[i, d] += scores[i, j] * to_compute(io.v[batch, kv_head, kb * block_n + j, d], ACC)
            for i in T.serial(rows):
                for d in T.serial(D):
                    io.out[batch, head, bx * block_m + i, d] = T.cast(
                        T.if_then_else(row_sum[i] == 0, T.cast(0, ACC), acc[i, d] / row_sum[i]), spec.dtype_out
                    )

    return main
