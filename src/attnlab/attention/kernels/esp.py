"""ESPFormer's weights (Shahbazi et al., ICML 2025): the math shared by the scheme's reference
(`schemes/esp.py`) and the chunked path ("chunked", `esp_weights_chunked`).

For slice l (a direction theta_l: by default the d coordinate axes, as in the authors' code),
the scaled queries x = q / sqrt(d) and keys y = k / sqrt(d) (the authors' `q * self.scale`)
are projected, x_l = x theta_l, and
soft-sorted (SoftSort, Prillo & Eisenschlos 2020): P_l[r, i] = softmax_i(-(x_li - x_l(r))^2 / t),
x_l(r) the r-th largest valid value, t = `softsort_tau`. The slice's plan is

    G_l = P_u,l^T M P_v,l                                          (S_q, S_k)

with M[r, s] = n_q |[r/n_q, (r+1)/n_q) & [s/n_k, (s+1)/n_k)| the quantile overlap of the two
sorted valid sets (the identity when n_q = n_k; n_q, n_k the valid counts of the example). With
`hard` the soft sorts are straight-through: their values are the sort permutations (then G_l is
an exact transport plan: valid rows sum to 1, valid columns to n_q / n_k), their gradients the
soft sorts'. The plans are mixed by the cost they pay,

    A = sum_l w_l G_l,   w = softmax_l(-tau <C, G_l>),   C_ij = |x_i - y_j|_2,

no Sinkhorn iteration. Padded queries and keys have no rank: their rows and columns are 0.

`esp_weights_chunked` computes A over blocks of slices (never all L plans at once): one pass for
the costs <C, G_l>, one for the mixture; its backward recomputes the plans block by block.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

# elements of one block of plans (slices x B x H x S_q x S_k) in the chunked path
CHUNK_ELEMENTS = 1 << 22


@functools.lru_cache(maxsize=16)
def _directions(slices: int, d: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(slices, d, generator=g, dtype=torch.float64)
    return theta / theta.norm(dim=-1, keepdim=True)


def directions(slices: int | None, d: int, seed: int, like: Tensor) -> Tensor | None:
    """(L, d) fixed unit directions (`slices` random ones drawn from `seed`); None: the axes."""
    if slices is None:
        return None
    return _directions(slices, d, seed).to(device=like.device, dtype=like.dtype)


def num_slices(slices: int | None, d: int) -> int:
    return d if slices is None else slices


def scaled(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """q / sqrt(d), k / sqrt(d) in float32 (float64 stays), as the authors' `q * self.scale`."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5
    return q.to(dtype) * scale, k.to(dtype) * scale


def valid_of(mask: Tensor | None, batch: int, length: int, device) -> Tensor:
    """(B, S) bool, True = valid (from a padding mask, True = padding)."""
    if mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    return ~mask


def overlap(valid_q: Tensor, valid_k: Tensor, dtype: torch.dtype) -> Tensor:
    """M (B, 1, 1, S_q, S_k): M[r, s] = n_q |[r/n_q, (r+1)/n_q) & [s/n_k, (s+1)/n_k)| over the
    ranks of the valid queries (r < n_q) and keys (s < n_k); 0 beyond. Computed on integers:
    the identity exactly when n_q = n_k."""
    nq = valid_q.sum(-1).to(torch.float64)[:, None, None]
    nk = valid_k.sum(-1).to(torch.float64)[:, None, None]
    r = torch.arange(valid_q.shape[-1], device=valid_q.device, dtype=torch.float64)[None, :, None]
    s = torch.arange(valid_k.shape[-1], device=valid_q.device, dtype=torch.float64)[None, None, :]
    inter = (torch.minimum((r + 1) * nk, (s + 1) * nq) - torch.maximum(r * nk, s * nq)).clamp(min=0)
    inter = inter * ((r < nq) & (s < nk))
    m = inter / nk.clamp(min=1)
    return m.to(dtype)[:, None, None]


def project(x: Tensor, theta: Tensor | None, lo: int, hi: int) -> Tensor:
    """Slices lo..hi of x (B, H, S, d): (B, H, hi - lo, S)."""
    if theta is None:
        return x[..., lo:hi].transpose(-1, -2)
    return (x @ theta[lo:hi].T).transpose(-1, -2)


def soft_sort(x: Tensor, valid: Tensor, tau: float, hard: bool) -> Tensor:
    """P (B, H, L, S rank, S element) of x (B, H, L, S): rank r (the r-th largest valid value)
    takes softmax_i(-(x_i - x_(r))^2 / tau) over the valid elements i; ranks >= n and padded
    elements are 0. `hard`: the sort permutation's values with the soft sort's gradient."""
    v = valid[:, None, None, :]  # (B, 1, 1, S)
    n = valid.sum(-1)[:, None, None, None]  # (B, 1, 1, 1)
    ranked = torch.arange(x.shape[-1], device=x.device)[None, None, None, :] < n  # rank r valid
    filled = torch.where(v, x, torch.full_like(x, float("-inf")))
    top, order = filled.sort(dim=-1, descending=True, stable=True)
    top = torch.where(ranked, top, torch.zeros_like(top))
    logits = -(x[..., None, :] - top[..., :, None]).square() / tau
    pair = ranked[..., :, None] & v[..., None, :]
    logits = logits.masked_fill(~pair, float("-inf"))
    m = logits.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(logits - m)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    if not hard:
        return p
    perm = torch.zeros_like(p).scatter_(-1, order[..., None], 1.0) * ranked[..., None]
    return perm + (p - p.detach())


def plans(x: Tensor, y: Tensor, valid_q: Tensor, valid_k: Tensor, m: Tensor,
          theta: Tensor | None, lo: int, hi: int, softsort_tau: float, hard: bool) -> Tensor:
    """G_l = P_u,l^T M P_v,l for slices lo..hi: (B, H, hi - lo, S_q, S_k)."""
    pu = soft_sort(project(x, theta, lo, hi), valid_q, softsort_tau, hard)
    pv = soft_sort(project(y, theta, lo, hi), valid_k, softsort_tau, hard)
    if x.shape[-2] == y.shape[-2] and bool((valid_q == valid_k).all()):
        return pu.transpose(-1, -2) @ pv  # M is the identity on the valid ranks (pu, pv 0 beyond)
    return pu.transpose(-1, -2) @ (m @ pv)


def cost(x: Tensor, y: Tensor, valid_q: Tensor, valid_k: Tensor) -> Tensor:
    """C (B, H, S_q, S_k) = |x_i - y_j|_2, 0 on padded pairs (computed directly, not by the
    |x|^2 + |y|^2 - 2 x.y expansion, which loses the small distances)."""
    c = torch.cdist(x, y, compute_mode="donot_use_mm_for_euclid_dist")
    pair = valid_q[:, None, :, None] & valid_k[:, None, None, :]
    return c * pair


def esp_weights(q: Tensor, k: Tensor, key_padding_mask: Tensor | None,
                query_padding_mask: Tensor | None, options) -> Tensor:
    """The materialized reference: all L plans at once (L x S_q x S_k per head), autograd;
    float32 even under autocast (sorts and costs in bf16 break the doubly stochastic sums)."""
    with torch.autocast(device_type=q.device.type, enabled=False):
        return _esp_weights(q, k, key_padding_mask, query_padding_mask, options)


def _esp_weights(q: Tensor, k: Tensor, key_padding_mask: Tensor | None,
                 query_padding_mask: Tensor | None, options) -> Tensor:
    x, y = scaled(q, k)
    B, _, S_q, d = x.shape
    vq = valid_of(query_padding_mask, B, S_q, x.device)
    vk = valid_of(key_padding_mask, B, y.shape[-2], x.device)
    theta = directions(options.slices, d, options.seed, x)
    L = num_slices(options.slices, d)
    g = plans(x, y, vq, vk, overlap(vq, vk, x.dtype), theta, 0, L, options.softsort_tau, options.hard)
    paid = (g * cost(x, y, vq, vk)[:, :, None]).sum((-1, -2))  # (B, H, L)
    w = torch.softmax(-options.tau * paid, dim=-1)
    return (w[..., None, None] * g).sum(2)


class _ChunkedESP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, vq, vk, theta, options, chunk):
        L = num_slices(options.slices, x.shape[-1])
        m = overlap(vq, vk, x.dtype)
        c = cost(x, y, vq, vk)
        blocks = [(lo, min(lo + chunk, L)) for lo in range(0, L, chunk)]
        args = (vq, vk, m, theta)
        kw = {"softsort_tau": options.softsort_tau, "hard": options.hard}
        kept = {}
        paid = []
        for lo, hi in blocks:  # pass 1: what each plan pays
            g = plans(x, y, *args, lo, hi, **kw)
            paid.append((g * c[:, :, None]).sum((-1, -2)))
            if len(blocks) == 1:
                kept[lo] = g
        w = torch.softmax(-options.tau * torch.cat(paid, -1), dim=-1)
        out = torch.zeros_like(c)
        for lo, hi in blocks:  # pass 2: the mixture
            g = kept.pop(lo, None)
            g = plans(x, y, *args, lo, hi, **kw) if g is None else g
            out += (w[:, :, lo:hi, None, None] * g).sum(2)
        ctx.save_for_backward(x, y, vq, vk, w)
        ctx.theta, ctx.options, ctx.blocks = theta, options, blocks
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, y, vq, vk, w = ctx.saved_tensors
        options, blocks = ctx.options, ctx.blocks
        m = overlap(vq, vk, x.dtype)
        args = (vq, vk, m, ctx.theta)
        kw = {"softsort_tau": options.softsort_tau, "hard": options.hard}
        with torch.no_grad():  # dL/dw_l = <grad, G_l>, then dL/d(paid_l)
            gw = torch.cat([(plans(x, y, *args, lo, hi, **kw) * grad[:, :, None]).sum((-1, -2))
                            for lo, hi in blocks], -1)
            dpaid = -options.tau * w * (gw - (w * gw).sum(-1, keepdim=True))
            c = cost(x, y, vq, vk)
        xd, yd = x.detach().requires_grad_(), y.detach().requires_grad_()
        dc = torch.zeros_like(c)
        with torch.enable_grad():
            for lo, hi in blocks:  # dL/dG_l = w_l grad + dpaid_l C
                g = plans(xd, yd, *args, lo, hi, **kw)
                dg = w[:, :, lo:hi, None, None] * grad[:, :, None] + dpaid[:, :, lo:hi, None, None] * c[:, :, None]
                g.backward(dg)
                dc += (dpaid[:, :, lo:hi, None, None] * g.detach()).sum(2)
            if options.tau != 0.0:
                cost(xd, yd, vq, vk).backward(dc)
        gx = xd.grad if xd.grad is not None else torch.zeros_like(x)
        gy = yd.grad if yd.grad is not None else torch.zeros_like(y)
        return gx, gy, None, None, None, None, None


def esp_weights_chunked(q: Tensor, k: Tensor, key_padding_mask: Tensor | None,
                        query_padding_mask: Tensor | None, options,
                        chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """`esp_weights` computed over blocks of slices, each block of plans at most about
    `chunk_elements` elements (one slice at least): memory of a few (B, H, S_q, S_k) tensors."""
    x, y = scaled(q, k)
    B, H, S_q, d = x.shape
    vq = valid_of(query_padding_mask, B, S_q, x.device)
    vk = valid_of(key_padding_mask, B, y.shape[-2], x.device)
    theta = directions(options.slices, d, options.seed, x)
    L = num_slices(options.slices, d)
    chunk = max(1, min(L, chunk_elements // max(1, B * H * S_q * y.shape[-2])))
    return _ChunkedESP.apply(x, y, vq, vk, theta, options, chunk)
