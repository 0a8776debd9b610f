"""The Triton DNAS / HNAS kernels as torch ops, so that `torch.compile` traces through them.

`attnlab::triton_query_normalized_forward` and `attnlab::triton_query_normalized_backward`
(named apart from the fused C++ kernel's `attnlab::query_normalized_*`) are
`torch.library.custom_op`s: opaque to the compiler, with fake implementations (output shapes
and strides) and the forward's autograd formula registered here, so a compiled model keeps one
graph through them. The backward op refuses to be differentiated (double backward) with one
error naming the way out. `query_normalized_attend_triton` (here: the launchers in
`triton_query_normalized.py` never import this module) is what the fast path calls.

(No `from __future__ import annotations` here: custom_op reads the annotations as types.)
"""


import torch
from torch import Tensor

from attnlab.attention.kernels import dropout
from attnlab.attention.kernels import triton_query_normalized as tq


def _host_args(u_bh, keep_mask, seed):
    """u_bh contiguous (the kernels index it by b * H + h; an expanded u has stride 0), the
    seed as an int (a CPU tensor: reading it does not synchronize)."""
    return (None if u_bh is None else u_bh.contiguous()), keep_mask, (
        None if seed is None else int(seed))


@torch.library.custom_op("attnlab::triton_query_normalized_forward", mutates_args=())
def query_normalized_forward(
    q: Tensor, k: Tensor, v: Tensor, u_bh: Tensor | None, key_padding_mask: Tensor | None,
    query_padding_mask: Tensor | None, keep_mask: Tensor | None, seed: Tensor | None,
    dropout_p: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, c, lse_d, lse_u, o_d, o_u): the output and what the backward needs (DNAS: the last
    three are empty)."""
    q, k, v = (tq._last_contiguous(t) for t in (q, k, v))
    u_bh, keep_mask, seed = _host_args(u_bh, keep_mask, seed)
    return tq.forward(q, k, v, u_bh, key_padding_mask, query_padding_mask, dropout_p, seed,
                      keep_mask)


@query_normalized_forward.register_fake
def _(q, k, v, u_bh, key_padding_mask, query_padding_mask, keep_mask, seed, dropout_p):
    B, H, M, _ = q.shape
    N, DV = k.shape[2], v.shape[3]
    f32 = {"device": q.device, "dtype": torch.float32}
    hybrid = u_bh is not None
    return (tq.new_output(q, DV), q.new_empty(B, H, N, dtype=torch.float32),
            q.new_empty(B, H, M, dtype=torch.float32),
            q.new_empty((B, H, M) if hybrid else (0,), **f32),
            q.new_empty((B, H, M, DV) if hybrid else (0,), **f32),
            q.new_empty((B, H, M, DV) if hybrid else (0,), **f32))


@torch.library.custom_op("attnlab::triton_query_normalized_backward", mutates_args=())
def query_normalized_backward(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, u_bh: Tensor | None, c: Tensor,
    lse_d: Tensor, delta_d: Tensor, lse_u: Tensor, delta_u: Tensor,
    key_padding_mask: Tensor | None, query_padding_mask: Tensor | None,
    keep_mask: Tensor | None, seed: Tensor | None, dropout_p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the forward op, given the output gradient and the row sums delta."""
    q, k, v, grad = (tq._last_contiguous(t) for t in (q, k, v, grad))
    u_bh, keep_mask, seed = _host_args(u_bh, keep_mask, seed)
    return tq.backward(grad, q, k, v, u_bh, c, lse_d, delta_d.contiguous(), lse_u,
                       delta_u.contiguous(), key_padding_mask, query_padding_mask, dropout_p,
                       seed, keep_mask)


@query_normalized_backward.register_fake
def _(grad, q, k, v, *rest):
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    q, k, v, u_bh, kpm, qpm, keep_mask, seed, dropout_p = inputs
    out, c, lse_d, lse_u, o_d, o_u = output
    ctx.hybrid = u_bh is not None
    ctx.dropout_p = dropout_p
    # DNAS: delta_i = g_i . out_i from its output; HNAS: from each branch's (dropped) output
    ctx.save_for_backward(q, k, v, u_bh, kpm, qpm, keep_mask, seed, c, lse_d, lse_u, o_d, o_u,
                          None if ctx.hybrid else out)


def _backward(ctx, grad, *unused):
    q, k, v, u_bh, kpm, qpm, keep_mask, seed, c, lse_d, lse_u, o_d, o_u, out = ctx.saved_tensors
    g32 = grad.float()
    grad_u = None
    if ctx.hybrid:
        delta_d, delta_u = (g32 * o_d).sum(-1), (g32 * o_u).sum(-1)
        grad_u = (delta_d - delta_u).sum(-1)  # d out / du = out_dnas - out_unas (both dropped)
    else:
        delta_d = (g32 * out.float()).sum(-1)
        delta_u = lse_u  # unused (empty)
    dq, dk, dv = query_normalized_backward(grad.to(q.dtype), q, k, v, u_bh, c, lse_d, delta_d,
                                           lse_u, delta_u, kpm, qpm, keep_mask, seed,
                                           ctx.dropout_p)
    return dq, dk, dv, grad_u, None, None, None, None, None


query_normalized_forward.register_autograd(_backward, setup_context=_setup_context)

DOUBLE_BACKWARD = (
    "double backward through the Triton DNAS/HNAS kernels is not supported (their backward is "
    "not differentiable): take second derivatives on the reference instead, "
    "attnlab.attention.reference_attend(...)"
)


def _refuse_double_backward(ctx, *grads):
    raise RuntimeError(DOUBLE_BACKWARD)


query_normalized_backward.register_autograd(_refuse_double_backward,
                                            setup_context=lambda ctx, inputs, output: None)


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
) -> Tensor | None:
    """DNAS (u None) or HNAS output (B, H, S_q, d_v) in q's dtype, from the Triton kernels;
    None where they decline (`declines`: head dims over MAX_HEAD_DIM), logged once per reason.

    dropout_p > 0 drops the mixed weights with the counter-based mask of `seed` (drawn from
    torch's generator when None: `dropout.draw_seed_tensor`), or with `keep_mask` (bool
    (B, H, S_q, S_k), True = kept; a test hook) when given.
    """
    if not tq.available(q.device.type):
        raise RuntimeError(
            "the Triton DNAS/HNAS kernels need a CUDA (or CPU, interpreted) tensor and "
            "`pip install triton` (Linux)"
        )
    reason = tq.declines(q, k, v)
    if reason is not None:
        tq.log_decline(reason)
        return None

    dropout_p = float(dropout_p)
    B, H = q.shape[:2]
    u_bh = None if u is None else u.float().expand(B, H, 1, 1).reshape(B, H)
    seed_t = None
    if dropout_p > 0.0 and keep_mask is None:
        seed_t = (dropout.draw_seed_tensor() if seed is None
                  else torch.tensor(seed, dtype=torch.int64))
    keep = keep_mask if dropout_p > 0.0 else None
    return query_normalized_forward(
        q, k, v, u_bh, key_padding_mask, query_padding_mask, keep, seed_t, dropout_p)[0]
