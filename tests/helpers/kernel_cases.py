"""Shared inputs and references for the attention kernel tests (test_attention_kernels.py,
test_triton_kernels.py, test_attention_fuzz.py)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.attention import attention_weights


def padded_problem(S_q, S_k, d, d_v=None, B=4, H=1, dtype=torch.float32, seed=0, scale=1.0):
    """q, k, v, u and masks (True = padding) over B (<= 4) batch items: 0 partial padding of
    keys and queries, 1 none, 2 every key padded (rows without keys), 3 every query padded."""
    g = torch.Generator().manual_seed(seed)
    d_v = d_v or d
    q = torch.randn(B, H, S_q, d, generator=g) * scale
    k = torch.randn(B, H, S_k, d, generator=g) * scale
    v = torch.randn(B, H, S_k, d_v, generator=g)
    u = torch.rand(1, H, 1, 1, generator=g)
    kpm = torch.zeros(4, S_k, dtype=torch.bool)
    qpm = torch.zeros(4, S_q, dtype=torch.bool)
    kpm[0] = torch.rand(S_k, generator=g) < 0.3
    qpm[0] = torch.rand(S_q, generator=g) < 0.3
    kpm[0, 0] = False
    qpm[0, -1] = S_q > 1
    kpm[2] = True
    qpm[3] = True
    return [t.to(dtype) for t in (q, k, v, u)] + [kpm[:B], qpm[:B]]


def reference_out(q, k, v, scheme, kpm, qpm, u=None, keep=None, p=0.0, n_iter=1):
    """The reference output in float64; dropout with the explicit keep mask `keep`."""
    q, k, v = (t.double() for t in (q, k, v))
    u = None if u is None else u.double()
    w = attention_weights(q, k, scheme, kpm, qpm, u=u if scheme == "hnas" else None, n_iter=n_iter)
    if keep is not None:
        w = w * keep / (1 - p)
    return w @ v


def out_and_grads(fn, tensors, g_out):
    """fn() and the gradients of <fn(), g_out> with respect to `tensors`."""
    out = fn()
    return (out, *torch.autograd.grad((out.double() * g_out.double()).sum(), tensors))


def leaf(*tensors, dtype=None):
    return [t.detach().to(dtype or t.dtype).requires_grad_() for t in tensors]


class RecordShapes(TorchDispatchMode):
    """Records the largest tensor any op makes (an S x S one gives a fast path away)."""
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out
