"""DNAS / HNAS on CUDA: the Triton kernels of `_triton_kernels.py` and their autograd wrapper.

`triton` is imported on first use only, so CPU-only installs (and macOS, where it is not
installed) still import attnlab; `available()` says whether this path can run. Under
`TRITON_INTERPRET=1` (set before the first use) the same kernels run on CPU tensors, which is
how the tests check them on machines without a GPU.

Inputs may be bf16, fp16 or fp32 (the dot products take them as they are, accumulating in fp32;
every normalization is float32); the output has the input dtype. Memory beyond the inputs and
outputs is O(S) per head: c, dc, the row LSEs and row sums, and for HNAS the two branch outputs.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
from torch import Tensor

from attnlab.attention.kernels import dropout


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def available(device_type: str) -> bool:
    """True where the kernels can run: CUDA with triton installed (or CPU under the interpreter)."""
    if not installed():
        return False
    return device_type == "cuda" or (device_type == "cpu" and interpreting())


@functools.cache
def _kernels():
    from attnlab.attention.kernels import _triton_kernels

    return _triton_kernels


# Tile size under the interpreter, where each tile operation costs ~1 ms of Python whatever its
# size: few, large tiles are fast (tests lower it to cover the loops over several blocks).
INTERPRET_BLOCK = 64


def _blocks(d: int, d_v: int, kernel: str) -> dict:
    """Tile sizes per kernel: BLOCK_M query rows, BLOCK_N key rows; the program owns the
    first-named side of its kernel and loops over the other. On the GPU these are untuned
    (the Triton tutorial's shapes; the backward loops over 32 rows at a time, its programs
    holding three (64 x d) accumulators): not measured, no GPU was available."""
    block_d = max(16, 1 << (d - 1).bit_length())
    block_dv = max(16, 1 << (d_v - 1).bit_length())
    dims = {"BLOCK_D": block_d, "BLOCK_DV": block_dv}
    if interpreting():
        return {"BLOCK_M": INTERPRET_BLOCK, "BLOCK_N": INTERPRET_BLOCK, **dims}
    inner = 32 if kernel != "forward" or max(block_d, block_dv) > 64 else 64
    tiles = {"column": (64, 64), "forward": (64, inner), "backward_kv": (inner, 64),
             "backward_q": (64, inner)}[kernel]
    return {"BLOCK_M": tiles[0], "BLOCK_N": tiles[1], **dims, "num_warps": 4, "num_stages": 2}


def _flags(q: Tensor) -> dict:
    precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return {"CAST": interpreting() and q.dtype == torch.bfloat16, "PRECISION": precision}


def _strides(*tensors: Tensor) -> list[int]:
    return [s for t in tensors for s in (t.stride(0), t.stride(1), t.stride(2))]


def _masks(key_padding_mask, query_padding_mask, dummy):
    def as_bytes(mask):
        return dummy if mask is None else mask.contiguous().view(torch.uint8)

    return (as_bytes(key_padding_mask), as_bytes(query_padding_mask),
            {"HAS_KPM": key_padding_mask is not None, "HAS_QPM": query_padding_mask is not None})


def _dropout_args(dropout_p, seed, keep_mask, dummy):
    seed_lo, seed_hi = dropout.seed_halves(seed or 0)
    keep = dummy if keep_mask is None else keep_mask.contiguous().view(torch.uint8)
    args = {"seed_lo": seed_lo, "seed_hi": seed_hi, "threshold": dropout.threshold(dropout_p),
            "inv_keep": 1.0 / (1.0 - dropout_p)}
    return keep, args, {"DROPOUT": dropout_p > 0.0, "HAS_KEEP": keep_mask is not None}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def column_lse(q: Tensor, k: Tensor, query_padding_mask: Tensor | None = None) -> Tensor:
    """c (B, H, S_k) float32: logsumexp over valid queries of the scores (0 without any)."""
    B, H, M, D = q.shape
    N = k.shape[2]
    c = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    dummy = c
    _, qpm, flags = _masks(None, query_padding_mask, dummy)
    cfg = _blocks(D, D, "column")
    grid = (_cdiv(N, cfg["BLOCK_N"]), B * H)
    _kernels()._column_lse[grid](
        q, k, qpm, c, *_strides(q, k), H, M, N, D, D**-0.5, HAS_QPM=flags["HAS_QPM"],
        **_flags(q), **cfg,
    )
    return c


def _forward(q, k, v, u_bh, key_padding_mask, query_padding_mask, dropout_p, seed, keep_mask):
    B, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    hybrid = u_bh is not None
    c = column_lse(q, k, query_padding_mask)
    # (B, S_q, H, d_v) memory seen as (B, H, S_q, d_v): merging the heads afterwards is a view
    out = torch.empty(B, M, H, DV, device=q.device, dtype=q.dtype).transpose(1, 2)
    f32 = {"device": q.device, "dtype": torch.float32}
    lse_d = torch.empty(B, H, M, **f32)
    lse_u = torch.empty(B, H, M, **f32) if hybrid else lse_d
    o_d = torch.empty(B, H, M, DV, **f32) if hybrid else lse_d
    o_u = torch.empty(B, H, M, DV, **f32) if hybrid else lse_d
    kpm, qpm, mask_flags = _masks(key_padding_mask, query_padding_mask, c)
    keep, drop_args, drop_flags = _dropout_args(dropout_p, seed, keep_mask, c)
    cfg = _blocks(D, DV, "forward")
    grid = (_cdiv(M, cfg["BLOCK_M"]), B * H)
    _kernels()._forward[grid](
        q, k, v, c, c if u_bh is None else u_bh, kpm, qpm, keep, out, o_d, o_u, lse_d, lse_u,
        *_strides(q, k, v, out), H, M, N, D, DV, D**-0.5, **drop_args, HYBRID=hybrid,
        **mask_flags, **drop_flags, **_flags(q), **cfg,
    )
    return out, c, lse_d, (lse_u, o_d, o_u) if hybrid else None


def _backward(grad, q, k, v, u_bh, c, lse_d, delta_d, hybrid_state, key_padding_mask,
              query_padding_mask, dropout_p, seed, keep_mask):
    B, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    lse_u, delta_u = hybrid_state if hybrid_state is not None else (lse_d, delta_d)
    dq = torch.empty(B, H, M, D, device=q.device, dtype=q.dtype)
    dk = torch.empty(B, H, N, D, device=q.device, dtype=k.dtype)
    dv = torch.empty(B, H, N, DV, device=q.device, dtype=v.dtype)
    dc = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    kpm, qpm, mask_flags = _masks(key_padding_mask, query_padding_mask, c)
    keep, drop_args, drop_flags = _dropout_args(dropout_p, seed, keep_mask, c)
    common = dict(H=H, M=M, N=N, D=D, DV=DV, scale=D**-0.5, **drop_args,
                  HYBRID=hybrid_state is not None, **mask_flags, **drop_flags, **_flags(q))
    u = c if u_bh is None else u_bh
    kern = _kernels()
    # keys: dK, dV and dc, each program owning its keys (no atomics)
    kv_cfg = _blocks(D, DV, "backward_kv")
    kern._backward_kv[(_cdiv(N, kv_cfg["BLOCK_N"]), B * H)](
        q, k, v, grad, c, u, kpm, qpm, keep, lse_d, lse_u, delta_d, delta_u, dk, dv, dc,
        *_strides(q, k, v, grad), **common, **kv_cfg,
    )
    # queries: dQ, which needs every dc_j
    cfg = _blocks(D, DV, "backward_q")
    kern._backward_q[(_cdiv(M, cfg["BLOCK_M"]), B * H)](
        q, k, v, grad, c, dc, u, kpm, qpm, keep, lse_d, lse_u, delta_d, delta_u, dq,
        *_strides(q, k, v, grad), **common, **cfg,
    )
    return dq, dk, dv


def _last_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _TritonQueryNormalized(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, u, key_padding_mask, query_padding_mask, dropout_p, seed, keep_mask):
        q, k, v = (_last_contiguous(t) for t in (q, k, v))
        u_bh = None
        if u is not None:
            u_bh = u.detach().float().expand(q.shape[0], q.shape[1], 1, 1)
            u_bh = u_bh.reshape(q.shape[0], q.shape[1]).contiguous()
        out, c, lse_d, hybrid = _forward(q, k, v, u_bh, key_padding_mask, query_padding_mask,
                                         dropout_p, seed, keep_mask)
        # DNAS: D_i = g_i . out_i from its output; HNAS: from each branch's (dropped) output
        branches = (out,) if hybrid is None else hybrid
        ctx.save_for_backward(q, k, v, u_bh, c, lse_d, key_padding_mask, query_padding_mask,
                              keep_mask, *branches)
        ctx.options = (dropout_p, seed, None if u is None else u.shape)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, u_bh, c, lse_d, kpm, qpm, keep_mask, *branches = ctx.saved_tensors
        dropout_p, seed, u_shape = ctx.options
        grad = _last_contiguous(grad.to(q.dtype))
        g32 = grad.float()
        grad_u = hybrid_state = None
        if u_shape is None:
            delta_d = (g32 * branches[0].float()).sum(-1)
        else:
            lse_u, o_d, o_u = branches
            delta_d, delta_u = (g32 * o_d).sum(-1), (g32 * o_u).sum(-1).contiguous()
            hybrid_state = (lse_u, delta_u)
            if ctx.needs_input_grad[3]:  # d out / du = out_dnas - out_unas (both dropped)
                grad_u = (delta_d - delta_u).sum(-1)[..., None, None].sum_to_size(u_shape)
        dq, dk, dv = _backward(grad, q, k, v, u_bh, c, lse_d, delta_d.contiguous(), hybrid_state,
                               kpm, qpm, dropout_p, seed, keep_mask)
        return dq, dk, dv, grad_u, None, None, None, None, None


def query_normalized_attend_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    keep_mask: Tensor | None = None,
    seed: int | None = None,
) -> Tensor:
    """DNAS (u None) or HNAS output (B, H, S_q, d_v) in q's dtype, from the Triton kernels.

    dropout_p > 0 drops the mixed weights with the counter-based mask of `seed` (drawn from
    torch's generator when None), or with `keep_mask` (bool (B, H, S_q, S_k), True = kept; a
    test hook) when given.
    """
    if not available(q.device.type):
        raise RuntimeError(
            "the Triton DNAS/HNAS kernels need a CUDA tensor and `pip install triton` (Linux), "
            "or TRITON_INTERPRET=1 set before their first use to run them on the CPU"
        )
    dropout_p = float(dropout_p)
    if dropout_p > 0.0 and keep_mask is None and seed is None:
        seed = dropout.draw_seed()
    keep_mask = keep_mask if dropout_p > 0.0 else None
    return _TritonQueryNormalized.apply(q, k, v, u, key_padding_mask, query_padding_mask,
                                        dropout_p, seed, keep_mask)
