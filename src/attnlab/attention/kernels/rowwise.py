"""Fused CPU kernels of the row-wise schemes (sigmoid, sink, softpick: `csrc/rowwise.cpp`, built
into the fused kernel's library by `fused.load()`), and SSMax on the UNAS kernels. The same
kernel runs plain softmax (UNAS) where the value is wider than the query (diff's two maps of
half-width queries over the whole value), which ATen's CPU flash kernel refuses.

Every row of these schemes' weights depends on that row's scores alone, so the kernel runs as
flash attention does: the forward over blocks of queries against every key, the backward over
blocks of keys against every query (scores recomputed), no S_q x S_k tensor, exact gradients of
q, k, v and of the scheme's parameter (through a per-row input `beta`, (B, H, S_q): sigmoid's
bias, the sink's logit; autograd takes its gradient on to b). The math is in the C++ file.
Masks: bool (B, S), True = padding; causal: top-left aligned (row i sees keys j <= i), the
blocks above the diagonal skipped, not masked (about half the work at S_q = S_k).

SSMax needs no kernel of its own: softmax(c_h log(n_i) s_ij) is UNAS on q_i scaled by
c_h log(n_i) (n_i: the valid keys of row i), so it runs on whichever UNAS path serves the call
(SDPA's flash kernel, the fused kernel with padding or dropout), and autograd gives dq and dc.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.attention.kernels import fused

SIGMOID, SINK, SOFTPICK, SOFTMAX = 0, 1, 2, 3


def valid_keys(key_padding_mask: Tensor | None, causal: bool, s_q: int, s_k: int,
               device: torch.device) -> Tensor:
    """n_i, the number of valid keys of query row i, as float32 (B or 1, 1, S_q, 1) (a padded
    query's row counts the keys it would see)."""
    if key_padding_mask is None:
        counts = torch.full((1, s_k), float(s_k), device=device)
        if causal:
            counts = torch.arange(1, s_k + 1, device=device, dtype=torch.float32)[None]
    else:
        valid = (~key_padding_mask).float()
        counts = valid.cumsum(-1) if causal else valid.sum(-1, keepdim=True).expand(-1, s_k)
    if not causal:
        return counts[:, :1, None, None].expand(-1, 1, s_q, 1)
    # row i sees keys 0 .. min(i, S_k - 1)
    last = torch.arange(s_q, device=device).clamp(max=s_k - 1)
    return counts[:, last][:, None, :, None]


# The row-wise C++ kernel as `torch.library.custom_op`s (fake implementations, the forward's
# autograd formula), as fused.py's: torch.compile keeps one graph through them.
@torch.library.custom_op("attnlab::fused_rowwise_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, key_padding_mask: Tensor | None,
             query_padding_mask: Tensor | None, keep_mask: Tensor | None, seed: Tensor | None,
             kind: int, causal: bool, eps: float, dropout_p: float
             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out, r, c, idx): the output, the row log-normalizers, softpick's shifts and argmaxes."""
    return torch.ops.attnlab.rowwise_forward(
        q, k, v, kind, beta, key_padding_mask, query_padding_mask, causal, eps, dropout_p,
        0 if seed is None else int(seed), keep_mask)


@_forward.register_fake
def _(q, k, v, beta, key_padding_mask, query_padding_mask, keep_mask, seed, kind, causal, eps,
      dropout_p):
    B, H, M, _ = q.shape
    pick = kind == SOFTPICK
    out = q.new_empty(B, M, H, v.shape[-1]).transpose(1, 2)  # (B, S_q, H, d_v) memory, as C++'s
    c = q.new_empty(B, H, M) if pick else q.new_empty(0)
    idx = q.new_empty((B, H, M) if pick else (0, 0, 0), dtype=torch.int64)
    return out, q.new_empty(B, H, M), c, idx


@torch.library.custom_op("attnlab::fused_rowwise_backward", mutates_args=())
def _backward_op(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, r: Tensor,
                 beta: Tensor | None, key_padding_mask: Tensor | None,
                 query_padding_mask: Tensor | None, keep_mask: Tensor | None,
                 seed: Tensor | None, kind: int, causal: bool, dropout_p: float
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dbeta)."""
    return torch.ops.attnlab.rowwise_backward(
        grad, q, k, v, out, r, kind, beta, key_padding_mask, query_padding_mask, causal,
        dropout_p, 0 if seed is None else int(seed), keep_mask)


@_backward_op.register_fake
def _(grad, q, k, v, *rest):
    return fused._like(q), fused._like(k), fused._like(v), q.new_empty(q.shape[:3])


def _setup_context(ctx, inputs, output):
    q, k, v, beta, kpm, qpm, keep_mask, seed, kind, causal, eps, dropout_p = inputs
    out, r, c, idx = output
    ctx.save_for_backward(q, k, v, out, r, c, idx, beta, kpm, qpm, keep_mask, seed)
    ctx.options = (kind, causal, eps, dropout_p)


def _backward(ctx, grad, *unused):
    q, k, v, out, r, c, idx, beta, kpm, qpm, keep_mask, seed = ctx.saved_tensors
    kind, causal, eps, dropout_p = ctx.options
    grad = grad.to(q.dtype)
    dq, dk, dv, dbeta = _backward_op(grad, q, k, v, out, r, beta, kpm, qpm, keep_mask,
                                     seed, kind, causal, dropout_p)
    if kind == SOFTPICK:
        # the gradient through the shift c_i = max_j s_ij (when > 0), which the weights keep
        # through eps / L_i: d/dc_i = -eps D_i / L_i, to the score at the row's argmax
        L = torch.exp(r - c)  # r = c + log L
        D = (grad * out).sum(-1)
        coef = torch.where((c > 0) & torch.isfinite(r), -eps * D / L, torch.zeros_like(D))
        coef = coef * q.shape[-1] ** -0.5  # d s / d q = scale k
        at = idx[..., None].expand(-1, -1, -1, q.shape[-1])
        dq = dq + coef[..., None] * k.gather(2, at)
        dk = dk.scatter_add(2, at, coef[..., None] * q)
    return dq, dk, dv, (dbeta if beta is not None else None), *[None] * 8


_forward.register_autograd(_backward, setup_context=_setup_context)


def attend(q: Tensor, k: Tensor, v: Tensor, kind: int, beta: Tensor | None = None,
           key_padding_mask: Tensor | None = None, query_padding_mask: Tensor | None = None,
           causal: bool = False, eps: float = 0.0, dropout_p: float = 0.0, seed: int | None = None,
           keep_mask: Tensor | None = None) -> Tensor:
    """Output (B, H, S_q, d_v) of the row-wise kernel `kind` (SIGMOID, SINK, SOFTPICK, SOFTMAX) in q's
    dtype (float32 / float64); beta: (B, H, S_q)-broadcastable, finite (sigmoid: the bias;
    sink: the sink logit). Dropout as fused.query_normalized_attend."""
    B, H, M = q.shape[:3]
    if beta is not None:
        beta = beta.to(q.dtype).expand(B, H, M).contiguous()
    masks = [None if m is None else m.contiguous() for m in (key_padding_mask, query_padding_mask)]
    dropout_p = float(dropout_p)
    keep_mask = None if keep_mask is None or dropout_p == 0.0 else keep_mask.contiguous()
    return _forward(q, k, v, beta, *masks, keep_mask, fused.seed_tensor(dropout_p, seed, keep_mask),
                    kind, bool(causal), float(eps), dropout_p)[0]


def sigmoid_attend(q, k, v, bias: str = "log_n", b: Tensor | None = None, key_padding_mask=None,
                   query_padding_mask=None, causal=False, **kw) -> Tensor:
    """Sigmoid attention, bias "log_n" (-log n_i), "learned" (b, (B, H, 1, 1)-broadcastable) or
    "zero" (schemes/sigmoid.py)."""
    M, N = q.shape[2], k.shape[2]
    if bias == "log_n":
        n = valid_keys(key_padding_mask, causal, M, N, q.device).to(q.dtype)
        beta = -torch.log(n.clamp(min=1))[..., 0]
    elif bias == "learned":
        beta = b.to(q.dtype).reshape(*b.shape[:-2], 1) if b.dim() >= 2 else b.to(q.dtype)
    else:
        beta = torch.zeros((), dtype=q.dtype)
    return attend(q, k, v, SIGMOID, beta, key_padding_mask, query_padding_mask, causal, **kw)


def sink_attend(q, k, v, b: Tensor, key_padding_mask=None, query_padding_mask=None, causal=False,
                **kw) -> Tensor:
    """Softmax with a sink logit b ((B, H, 1, 1)-broadcastable) (schemes/sink.py)."""
    beta = b.to(q.dtype).reshape(*b.shape[:-2], 1) if b.dim() >= 2 else b.to(q.dtype)
    return attend(q, k, v, SINK, beta, key_padding_mask, query_padding_mask, causal, **kw)


def softpick_attend(q, k, v, eps: float, key_padding_mask=None, query_padding_mask=None,
                    causal=False, **kw) -> Tensor:
    """Softpick (schemes/softpick.py)."""
    return attend(q, k, v, SOFTPICK, None, key_padding_mask, query_padding_mask, causal, eps=eps,
                  **kw)


def softmax_attend(q, k, v, key_padding_mask=None, query_padding_mask=None, causal=False,
                   **kw) -> Tensor:
    """UNAS (schemes/unas.py): any value width, causal blocks skipped."""
    return attend(q, k, v, SOFTMAX, None, key_padding_mask, query_padding_mask, causal, **kw)


def ssmax_query(q: Tensor, c: Tensor, key_padding_mask: Tensor | None, causal: bool,
                s_k: int) -> Tensor:
    """q_i * c_h * log(n_i): UNAS on it is SSMax (a row of <= 1 valid key gets factor 0)."""
    n = valid_keys(key_padding_mask, causal, q.shape[-2], s_k, q.device).to(q.dtype)
    return q * (c.to(q.dtype) * torch.log(n.clamp(min=1)))


def available() -> bool:
    return fused.load()
