"""Differential attention (Ye et al., "Differential Transformer", ICLR 2025), as a head scheme.

Version 1 (microsoft/unilm, Diff-Transformer/multihead_diffattn.py): head h of d features splits
its query and key into halves of d/2, (Q1, Q2) and (K1, K2), and keeps its value whole:

    A_h   = N(Q1 K1^T / sqrt(d/2)) - lambda N(Q2 K2^T / sqrt(d/2))
    out_h = RMSNorm(A_h V_h) * (1 - lambda_init)
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init
    lambda_init = 0.8 - 0.6 exp(-0.3 l)      l = the layer's 0-based index in its stack

N is the spec's normalization (softmax, `unas`, as the paper; any registered one). As the
published code: lq1, lk1, lq2, lk2 are vectors of d/2 drawn N(0, 0.1^2), one set per layer
(`lambda_per=head`: one per head); the RMSNorm normalizes each head's d features (eps 1e-5) with
one weight of d shared by the heads. The paper's H differential heads have as many parameters as
2H ordinary ones: compare `model=diff` at H heads with a baseline at 2H (the published advice).

Version 2 (`version=2`, Diff-Transformer-V2/multihead_flashdiffv2.py): head h has two full-size
queries that share its key and value, the second from a projection of its own (`q2_proj`, E x E:
their `q_proj` doubled), and a token-wise lambda from the query input x:

    out_h = N(Q1 K^T / sqrt(d)) V - sigmoid(x W_lambda)_h N(Q2 K^T / sqrt(d)) V

with no norm and no rescaling (W_lambda: E x H, no bias).

The weights the analyses record are the effective A per head: rows sum to 1 - lambda (v1) or
1 - sigmoid(x W_lambda) (v2) and may be negative. `reported()`: {"lambda": (H,)} (v1: lambda; v2:
the mean sigmoid(x W_lambda) of the last forward).

Paths (`route`): in a module (`attend_heads`), as the published multihead_flashdiff_1/_2.py,
N(Q1 K1^T) V and N(Q2 K2^T) V are plain calls of the normalizer's own fast path, subtracted in
float32: no S x S map. On the CPU each map is one call over the whole value (UNAS: the row-wise
C++ kernel's softmax, which takes a value wider than the query); on a kernel of one head size
(flash, Triton, Flex) the value is split into pieces of the query's width, one call each. The maps
are materialized (`forward`, which returns them) where a call has no fast path, with attention
dropout, and when a recorder reads the weights (computed then, on demand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.reference import masked_logits, output_dtype
from attnlab.attention.schemes.base import Attended, DeferredWeights, Heads
from attnlab.attention.schemes.head_scheme import HeadScheme
from attnlab.attention.schemes.normalizer import Normalizer, apply_weights
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError

LAMBDA_STD = 0.1  # the published init of lq1, lk1, lq2, lk2
NORM_EPS = 1e-5  # the published RMSNorm's eps


def lambda_init_fn(layer_index: int) -> float:
    """0.8 - 0.6 exp(-0.3 l), l the 0-based layer index (the code's `depth`; the paper's l - 1)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


@dataclass(frozen=True)
class DiffOptions:
    version: int = 1  # 1: the ICLR paper; 2: Diff-Transformer-V2
    lambda_init: float | None = None  # v1; None: 0.8 - 0.6 exp(-0.3 layer_index)
    lambda_per: str = "layer"  # v1: one lambda per layer (published) or per head
    param_lr: float | None = None  # learning rate of the lambda vectors (None: the optimizer's)

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise ConfigError(f"model.version={self.version} must be 1 or 2")
        if self.lambda_per not in ("layer", "head"):
            raise ConfigError(f"model.lambda_per={self.lambda_per!r} must be layer or head")


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim, computed in float32 (as the published rms_norm.py)."""

    def __init__(self, dim: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float() if x.dtype != torch.float64 else x
        out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return out * self.weight.to(x.dtype)


class _DifferenceNorm(torch.autograd.Function):
    """v1's tail on the fast path, in float32 / float64: y = n w with n = D r, D = o1 - lambda o2
    (the two maps' outputs), r = 1 / sqrt(mean(D^2) + eps), w the norm's weight times
    (1 - lambda_init). Autograd through the composed ops would keep D, n and n w besides o1 and
    o2 (which the maps' kernels keep anyway); this keeps r alone and recomputes D: two
    (B, H, S, d) tensors the fewer at diff's peak. With dn = g w: dD = r (dn - n mean(dn n)),
    do1 = dD, do2 = -lambda dD, dlambda = -sum(dD o2), dw = sum of g n over the rows."""

    @staticmethod
    def forward(ctx, o1: Tensor, o2: Tensor, lam: Tensor, weight: Tensor, eps: float) -> Tensor:
        d = o1.addcmul(lam, o2, value=-1)
        r = torch.rsqrt(d.pow(2).mean(-1, keepdim=True).add_(eps))
        ctx.save_for_backward(o1, o2, lam, weight, r)
        return d.mul_(r).mul_(weight)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        o1, o2, lam, weight, r = ctx.saved_tensors
        n = o1.addcmul(lam, o2, value=-1).mul_(r)
        dweight = (grad * n).sum(dim=tuple(range(grad.dim() - 1)))
        dn = grad * weight
        dd = dn.sub_(n.mul_((dn * n).mean(-1, keepdim=True))).mul_(r)
        dlam = (dd * o2).sum_to_size(lam.shape).neg_()
        return dd, -lam * dd, dlam, dweight, None


@register
class DiffAttention(HeadScheme):
    name = "diff"
    Options = DiffOptions
    reported_labels: ClassVar[dict[str, str]] = {"lambda": "lambda (weight of the second map)"}

    def __init__(self, options: DiffOptions | None = None, num_heads: int = 1, head_dim: int = 2,
                 value_dim: int | None = None, embed_dim: int | None = None,
                 layer_index: int = 0, bias: bool = True) -> None:
        super().__init__(options, num_heads, head_dim, value_dim, embed_dim, layer_index, bias)
        self.version = self.options.version
        self.needs_query = self.version == 2
        if self.version == 1:
            if head_dim % 2:
                raise ConfigError(f"model=diff splits each head's query and key into halves, but the "
                                  f"head size is {head_dim} (odd); use an even embed_dim / heads")
            init = self.options.lambda_init
            self.lambda_init = lambda_init_fn(layer_index) if init is None else float(init)
            rows = num_heads if self.options.lambda_per == "head" else 1
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):  # its own parameters
                self.own(name, torch.randn(rows, head_dim // 2) * LAMBDA_STD)
            self.subln = RMSNorm(self.value_dim)
        else:
            # a bias as the module's q_proj has one (their doubled q_proj)
            self.q2_proj = nn.Linear(self.embed_dim, num_heads * head_dim, bias=self.projection_bias)
            self.lambda_proj = nn.Linear(self.embed_dim, num_heads, bias=False)
            self._lambda_mean: Tensor | None = None

    def extra_repr(self) -> str:
        init = f", lambda_init={self.lambda_init:.4f}" if self.version == 1 else ""
        return f"{super().extra_repr()}{init}"

    # -- lambda
    def lambda_full(self) -> Tensor:
        """v1: lambda (H,) or (1,), float32 at least."""
        dtype = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        l1 = torch.exp((self.lambda_q1 * self.lambda_k1).sum(-1).to(dtype))
        l2 = torch.exp((self.lambda_q2 * self.lambda_k2).sum(-1).to(dtype))
        return l1 - l2 + self.lambda_init

    def reported(self) -> dict[str, Tensor]:
        if self.version == 1:
            return {"lambda": self.lambda_full().detach().float().expand(self.num_heads).clone()}
        return {} if self._lambda_mean is None else {"lambda": self._lambda_mean}

    @property
    def query_key_groups(self) -> int:
        """The q.k products each head's features form, on which positions (RoPE, ALiBi:
        attnlab.attention.positions) act separately: version 1's two halves, version 2's one."""
        return 2 if self.version == 1 else 1

    # -- the computation
    def _pairs(self, q: Tensor, k: Tensor, query: Tensor | None):
        """The (query, key) pairs of the two maps: v1 the halves, v2 (q, k) and (Q2, k)."""
        if self.version == 1:
            half = q.shape[-1] // 2
            (q1, q2), (k1, k2) = q.split(half, -1), k.split(half, -1)
            return (q1, k1), (q2, k2)
        if query is None:
            raise ConfigError("model=diff model.version=2 takes its lambda and second query "
                              "from the attention's query input, which this attention does "
                              "not give (it calls attend_heads on its own heads); use version=1")
        b, s, _ = query.shape
        q2 = self.q2_proj(query).view(b, s, self.num_heads, -1).transpose(1, 2)
        return (q, k), (q2.to(q.dtype), k)

    def _lambda(self, query: Tensor | None, query_padding_mask: Tensor | None) -> Tensor:
        """The second map's weight, broadcast over (B, H, S_q, S_k): v1 (1, H or 1, 1, 1); v2
        sigmoid(x W_lambda) (B, H, S_q, 1), float32 at least (its mean is remembered)."""
        if self.version == 1:
            return self.lambda_full().view(1, -1, 1, 1)
        lam = self.lambda_proj(query)
        lam = torch.sigmoid(lam.to(torch.promote_types(lam.dtype, torch.float32))).transpose(1, 2)
        self._remember(lam.detach(), query_padding_mask)
        return lam.unsqueeze(-1)

    def _finish(self, out: Tensor) -> Tensor:
        """v1: the group norm and the (1 - lambda_init) rescaling; v2: nothing."""
        return self.subln(out) * (1.0 - self.lambda_init) if self.version == 1 else out

    def _fast_calls(self, normalizer: Normalizer, heads: Heads):
        """Per map, [(path, call)] of its plain calls where the normalizer has a fast path for
        all of them and there is no attention dropout (one dropout mask on the effective A, as
        the materialized weights have it); None otherwise. One call over the whole value where
        the path takes a value wider than the query (`any_value_width`: the C++ CPU kernels;
        UNAS's row-wise softmax); else the value is split into pieces of the query's width, one
        call each (as the published MultiheadFlashDiff2 does: ATen's flash kernel, like
        flash-attn, takes one head size for q, k and v, and would run its materialized math
        kernel), which computes each map's scores once per piece."""
        if heads.dropout_p:
            return None
        chosen = []
        with torch.autocast(device_type=heads.q.device.type, enabled=False):
            for qi, ki in self._pairs(heads.q, heads.k, heads.query):
                calls = [normalizer.call(qi, ki, vi, heads.key_padding_mask,
                                         heads.query_padding_mask, heads.causal,
                                         mask_cache=heads.mask_cache)
                         for vi in (heads.v, *heads.v.split(qi.shape[-1], -1))]
                whole = normalizer.choose(calls[0])
                pieces = ([(whole, calls[0])] if whole is not None and whole.any_value_width
                          else [(normalizer.choose(call), call) for call in calls[1:]])
                chosen.append(pieces)
        return None if any(path is None for pieces in chosen for path, _ in pieces) else chosen

    def route(self, normalizer: Normalizer, heads: Heads) -> str:
        """The normalizer's fast path that computes the maps' outputs (names joined by "+"
        where the calls take different ones), else "materialized"."""
        chosen = self._fast_calls(normalizer, heads)
        if chosen is None:
            return "materialized"
        return "+".join(dict.fromkeys(path.name for pieces in chosen for path, _ in pieces))

    def attend_heads(self, normalizer: Normalizer, heads: Heads) -> Attended:
        """N(Q1 K1^T) V - lambda N(Q2 K2^T) V from plain calls of the normalizer's fast path (its
        weights deferred to a recorder), then the v1 norm; else the materialized `forward`."""
        if heads.prev_logits is not None:
            return super().attend_heads(normalizer, heads)  # refuses it
        args = (normalizer, heads.q, heads.k, heads.v, heads.key_padding_mask,
                heads.query_padding_mask, heads.causal, heads.dropout_p, heads.query)
        chosen = self._fast_calls(normalizer, heads)
        if chosen is None:
            return super().attend_heads(normalizer, heads)
        with torch.autocast(device_type=heads.q.device.type, enabled=False):
            lam = self._lambda(heads.query, heads.query_padding_mask)
            # the difference in float32 at least (it cancels most of the two outputs); v1 on one
            # call per map: the difference and its norm as one autograd node (_DifferenceNorm)
            maps = [(path1(normalizer, call1).to(lam.dtype), path2(normalizer, call2).to(lam.dtype))
                    for (path1, call1), (path2, call2) in zip(*chosen)]
            dtype = output_dtype(heads.v)
            if self.version == 1 and len(maps) == 1 and lam.dtype == dtype:
                weight = self.subln.weight.to(dtype) * (1.0 - self.lambda_init)
                out = _DifferenceNorm.apply(*maps[0], lam, weight, self.subln.eps)
            else:
                out = torch.cat([o1.addcmul(lam, o2, value=-1) for o1, o2 in maps], -1)
                out = self._finish(out.to(dtype))
        return DeferredWeights(out, lambda: self(*args)[1])

    def forward(self, normalizer: Normalizer, q: Tensor, k: Tensor, v: Tensor,
                key_padding_mask: Tensor | None = None, query_padding_mask: Tensor | None = None,
                causal: bool = False, dropout_p: float = 0.0, query: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        """The materialized computation: (out, the effective weights A)."""
        with torch.autocast(device_type=q.device.type, enabled=False):
            (q1, k1), (q2, k2) = self._pairs(q, k, query)
            call = normalizer.call(q1, k1, v, key_padding_mask, query_padding_mask, causal)
            w1, w2 = (normalizer.weights(masked_logits(qi, ki, key_padding_mask, query_padding_mask,
                                                       causal), **call.inputs)
                      for qi, ki in ((q1, k1), (q2, k2)))
            weights = w1 - self._lambda(query, query_padding_mask).to(w1.dtype) * w2
            return self._finish(apply_weights(weights, v, dropout_p)), weights

    @torch.no_grad()
    def _remember(self, lam: Tensor, query_padding_mask: Tensor | None) -> None:
        rows = torch.ones_like(lam[:, 0]) if query_padding_mask is None else (~query_padding_mask).to(lam.dtype)
        count = rows.sum().clamp(min=1.0)
        self._lambda_mean = (lam * rows[:, None]).sum(dim=(0, 2)) / count
