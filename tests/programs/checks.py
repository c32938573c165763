"""GPU checks of the corpus programs: torch inputs, a run of the kernel, a torch reference.

Each ``*_check(...)`` returns ``check(kernel, device="cuda")`` for a :class:`Case`'s ``gpu`` field.
``kernel(*tensors)`` takes the tile program's buffers in order and writes its outputs in place. The
references compute in fp32 from the same (rounded) inputs; tolerances follow the output dtype and
the length of the sums. Where there is no GPU, ``check(torch_stand_in, device="cpu")`` checks the
check (tests/pipeline/test_corpus.py does, with a stand-in that is right and one that is wrong).
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: (atol, rtol) by output dtype, for sums of up to ~1e3 terms of inputs scaled to ~0.1-1.
TOLERANCES = {"float16": (1e-2, 1e-2), "bfloat16": (3e-2, 3e-2), "float32": (1e-3, 1e-3)}


def _torch():
    import torch

    return torch


def dtype_of(name: str):
    return getattr(_torch(), name)


def randn(generator, shape, dtype, device: str, scale: float = 1.0):
    """Seeded normal values times ``scale``, rounded to ``dtype`` (a name or a torch dtype; drawn on
    the CPU: one stream of numbers on every device)."""
    torch = _torch()
    dtype = dtype_of(dtype) if isinstance(dtype, str) else dtype
    return (torch.randn(*shape, generator=generator) * scale).to(dtype).to(device)


def seeded(seed: int = 0):
    return _torch().Generator().manual_seed(seed)


def close(got, expected, dtype: str, scale: float = 1.0) -> None:
    """``got`` (any dtype) against the fp32 ``expected``, at ``dtype``'s tolerance times ``scale``."""
    atol, rtol = TOLERANCES[dtype]
    _torch().testing.assert_close(got.float().cpu(), expected.float().cpu(), atol=atol * scale, rtol=rtol * scale)


def gemm_check(
    M: int,
    N: int,
    K: int,
    dtype: str = "float16",
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: str | None = None,
    accumulates: bool = False,
) -> Callable:
    """C = op(A) @ op(B); A stored (K, M) with ``trans_a``, B stored (N, K) with ``trans_b``. With
    ``accumulates`` the kernel adds into C (split-K and stream-K atomics): C starts at zero."""
    out_dtype = out_dtype or dtype

    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        a = randn(g, (K, M) if trans_a else (M, K), dtype, device, 0.1)
        b = randn(g, (N, K) if trans_b else (K, N), dtype, device, 0.1)
        c = torch.zeros(M, N, dtype=dtype_of(out_dtype), device=device)
        kernel(a, b, c)
        a32, b32 = a.float(), b.float()
        expected = (a32.T if trans_a else a32) @ (b32.T if trans_b else b32)
        close(c, expected, out_dtype if not accumulates else "float32")

    return check


def fp8_gemm_check(M: int, N: int, K: int) -> Callable:
    """C (bf16) = A @ B^T with e4m3 A (M, K) and B (N, K)."""

    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        a = randn(g, (M, K), "float32", device, 0.5).to(torch.float8_e4m3fn)
        b = randn(g, (N, K), "float32", device, 0.5).to(torch.float8_e4m3fn)
        c = torch.zeros(M, N, dtype=torch.bfloat16, device=device)
        kernel(a, b, c)
        close(c, a.float() @ b.float().T, "bfloat16", scale=2)

    return check


def dynamic_gemm_check(shapes, dtype: str = "float16") -> Callable:
    """A GEMM over symbolic M, N, K: one run per (M, N, K) of ``shapes``."""

    def check(kernel, device: str = "cuda") -> None:
        for m, n, k in shapes:
            gemm_check(m, n, k, dtype)(kernel, device)

    return check


def rms_norm_check(M: int, N: int, eps: float = 1e-6, dtype: str = "float16") -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        x, w = randn(g, (M, N), dtype, device), randn(g, (N,), dtype, device)
        y = torch.empty(M, N, dtype=dtype_of(dtype), device=device)
        kernel(x, w, y)
        x32 = x.float()
        close(y, x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float(), dtype)

    return check


def layer_norm_check(M: int, N: int, eps: float = 1e-5, dtype: str = "float16") -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        x = randn(g, (M, N), dtype, device) + 3  # rows off zero: a mean to remove
        w, b = randn(g, (N,), dtype, device), randn(g, (N,), dtype, device)
        y = torch.empty(M, N, dtype=dtype_of(dtype), device=device)
        kernel(x, w, b, y)
        expected = torch.nn.functional.layer_norm(x.float(), (N,), w.float(), b.float(), eps)
        close(y, expected, dtype, scale=2)

    return check


def softmax_check(M: int, N: int, dtype: str = "float16") -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        x = randn(seeded(), (M, N), dtype, device, 2.0)
        y = torch.empty(M, N, dtype=dtype_of(dtype), device=device)
        kernel(x, y)
        expected = torch.softmax(x.float(), dim=-1)
        torch.testing.assert_close(y.float().cpu(), expected.cpu(), atol=1e-5, rtol=1e-2)

    return check


def _attention(q, k, v, causal: bool):
    """softmax(q k^T / sqrt(d)) v in fp32 over (..., S, D) tensors."""
    torch = _torch()
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s_q, s_k = scores.shape[-2:]
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v.float()


def flash_fwd_check(B: int, H: int, S: int, D: int, causal: bool, dtype: str = "float16") -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        q, k, v = (randn(g, (B, H, S, D), dtype, device) for _ in range(3))
        out = torch.empty(B, H, S, D, dtype=dtype_of(dtype), device=device)
        kernel(q, k, v, out)
        close(out, _attention(q, k, v, causal), dtype)

    return check


def flash_bwd_check(B: int, H: int, S: int, D: int, causal: bool, dtype: str = "float16") -> Callable:
    """dQ (fp32, added into zeros), dK and dV from Q, K, V, dO, the forward's log-sum-exp (base 2,
    of the scaled scores) and Delta = rowsum(O * dO), against torch's autograd in fp32."""

    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        q, k, v, do = (randn(g, (B, H, S, D), dtype, device, 0.5) for _ in range(4))
        q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
        scores = q32 @ k32.transpose(-1, -2) / math.sqrt(D)
        if causal:
            mask = torch.ones(S, S, dtype=torch.bool, device=device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v32
        out.backward(do.float())
        lse = (torch.logsumexp(scores, dim=-1) / math.log(2)).detach().contiguous()
        delta = (out.detach() * do.float()).sum(-1).contiguous()
        dq = torch.zeros(B, H, S, D, dtype=torch.float32, device=device)
        dk, dv = (torch.empty(B, H, S, D, dtype=dtype_of(dtype), device=device) for _ in range(2))
        kernel(q, k, v, do, lse, delta, dq, dk, dv)
        for got, want in ((dq, q32.grad), (dk, k32.grad), (dv, v32.grad)):
            close(got, want, dtype, scale=3)

    return check


def gqa_decode_check(B: int, H: int, H_kv: int, S: int, D: int, num_split: int, dtype: str = "float16") -> Callable:
    """One query per sequence, K/V in (B, S, H_kv, D); query head h reads KV head h // (H // H_kv)."""

    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        q = randn(g, (B, H, D), dtype, device)
        k, v = (randn(g, (B, S, H_kv, D), dtype, device) for _ in range(2))
        o_part = torch.empty(B, H, num_split, D, dtype=torch.float32, device=device)
        lse_part = torch.empty(B, H, num_split, dtype=torch.float32, device=device)
        out = torch.empty(B, H, D, dtype=dtype_of(dtype), device=device)
        kernel(q, k, v, o_part, lse_part, out)
        heads = torch.arange(H, device=device) // (H // H_kv)
        k_h, v_h = (t.permute(0, 2, 1, 3)[:, heads] for t in (k, v))  # (B, H, S, D)
        expected = _attention(q[:, :, None, :], k_h, v_h, causal=False)[:, :, 0, :]
        close(out, expected, dtype)

    return check


def linear_attention_check(B: int, H: int, S: int, D: int, dtype: str = "float16") -> Callable:
    """O = tril(Q K^T) V (diagonal included), no scaling or normalisation."""

    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        q, k, v = (randn(g, (B, H, S, D), dtype, device, 0.1) for _ in range(3))
        out = torch.empty(B, H, S, D, dtype=dtype_of(dtype), device=device)
        kernel(q, k, v, out)
        scores = (q.float() @ k.float().transpose(-1, -2)).tril()
        close(out, scores @ v.float(), dtype)

    return check


def gemv_check(N: int, K: int, dtype: str = "float16") -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        w, x = randn(g, (N, K), dtype, device, 0.1), randn(g, (K,), dtype, device)
        y = torch.empty(N, dtype=dtype_of(dtype), device=device)
        kernel(w, x, y)
        close(y, w.float() @ x.float(), dtype)

    return check


def _int4_weights(generator, N: int, K: int, group: int, device: str):
    """Packed int4 weights (element 2j low nibble, 2j + 1 high; zero point 8), fp16 group scales,
    and the dequantised fp16 matrix they stand for."""
    torch = _torch()
    q = torch.randint(0, 16, (N, K), generator=generator, dtype=torch.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(device)
    scales = (torch.rand(N, K // group, generator=generator) * 0.09 + 0.01).half().to(device)
    dequant = (q.to(device).half() - 8) * scales.repeat_interleave(group, dim=1)  # fp16 math, as the kernels
    return packed, scales, dequant


def int4_gemv_check(N: int, K: int, group: int) -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        packed, scales, w = _int4_weights(g, N, K, group, device)
        x = randn(g, (K,), "float16", device, 0.1)
        y = torch.empty(N, dtype=torch.float16, device=device)
        kernel(packed, scales, x, y)
        close(y, w.float() @ x.float(), "float16")

    return check


def int4_gemm_check(M: int, N: int, K: int, group: int) -> Callable:
    """C = A @ dequant(Bq)^T."""

    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        a = randn(g, (M, K), "float16", device, 0.1)
        packed, scales, w = _int4_weights(g, N, K, group, device)
        c = torch.empty(M, N, dtype=torch.float16, device=device)
        kernel(a, packed, scales, c)
        close(c, a.float() @ w.float().T, "float16", scale=2)

    return check


def add_gelu_check(M: int, N: int, dtype: str = "float16") -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        x, r = randn(g, (M, N), dtype, device), randn(g, (M, N), dtype, device)
        y = torch.empty(M, N, dtype=dtype_of(dtype), device=device)
        kernel(x, r, y)
        close(y, torch.nn.functional.gelu(x.float() + r.float(), approximate="tanh"), dtype)

    return check


def masked_where_check(M: int, N: int) -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        mask = (torch.rand(M, N, generator=g) > 0.5).to(device)
        a = randn(g, (M, N), "float32", device)
        b = a + 10
        y = torch.zeros(M, N, device=device)
        kernel(mask, a, b, y)
        torch.testing.assert_close(y, torch.where(mask, a, b), atol=0, rtol=0)

    return check


def fp8_quant_check(M: int, N: int) -> Callable:
    """Per-row scale = max|x| / 448 and Q = e4m3(x / scale)."""

    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        x = randn(seeded(), (M, N), "float16", device, 3.0)
        q = torch.empty(M, N, dtype=torch.float8_e4m3fn, device=device)
        s = torch.empty(M, dtype=torch.float32, device=device)
        kernel(x, q, s)
        scale = x.float().abs().amax(-1).clamp_min(1e-4) / 448.0
        torch.testing.assert_close(s, scale, atol=0, rtol=1e-6)
        expected = (x.float() / scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        # e4m3 has 3 mantissa bits: a quotient that rounds differently moves one step (1/8 relative).
        torch.testing.assert_close(q.float(), expected.float(), atol=0, rtol=0.13)

    return check


def topk_check(M: int, N: int, k: int) -> Callable:
    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        x = randn(seeded(), (M, N), "float32", device)
        vals = torch.empty(M, k, device=device)
        idx = torch.empty(M, k, dtype=torch.int32, device=device)
        kernel(x, vals, idx)
        want = torch.topk(x, k, dim=-1)  # distinct random values: no ties
        torch.testing.assert_close(vals, want.values, atol=0, rtol=0)
        torch.testing.assert_close(idx.long(), want.indices, atol=0, rtol=0)

    return check


def conv2d_check(N: int, H: int, W: int, C: int, F: int, KH: int = 3, pad: int = 1) -> Callable:
    """NHWC 3x3 convolution, stride 1: out (N*H*W, F) from img (N, H, W, C) and wgt (KH*KW*C, F)
    laid out (kh, kw, c) row by row."""

    def check(kernel, device: str = "cuda") -> None:
        torch = _torch()
        g = seeded()
        img = randn(g, (N, H, W, C), "float16", device, 0.5)
        wgt = randn(g, (KH * KH * C, F), "float16", device, 0.1)
        out = torch.empty(N * H * W, F, dtype=torch.float16, device=device)
        kernel(img, wgt, out)
        weight = wgt.float().reshape(KH, KH, C, F).permute(3, 2, 0, 1)  # (F, C, KH, KW)
        conv = torch.nn.functional.conv2d(img.float().permute(0, 3, 1, 2), weight, padding=pad)
        close(out, conv.permute(0, 2, 3, 1).reshape(N * H * W, F), "float16")

    return check
