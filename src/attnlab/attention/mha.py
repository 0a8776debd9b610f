"""`MultiHeadAttention`: projections + `attend` for any scheme, HNAS mix `u`, optional recording."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.attention import cascade
from attnlab.attention.functional import attend, attention_weights
from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError

# u is kept away from exactly 0 or 1 so that its logit (the trained parameter) stays finite.
_U_CLAMP = 1e-4


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch first: (B, S, E) in, (B, S_q, embed_dim or vdim) out.

    Head h uses rows [h*d:(h+1)*d] of the q/k/v projection weights (d = embed_dim // num_heads),
    the same grouping as BERT and torch.nn.MultiheadAttention, so weights map by name.

    `project_values=False` attends over the raw `value` features (no v_proj, no out_proj): the
    heads split vdim and the output has vdim features.

    Attention dropout (training only) drops attention weights; for hnas each scheme's weights
    separately (output = u * drop(pi_dnas) V + (1-u) * drop(pi_unas) V, same mask). The CPU
    flash kernel has no dropout, so with dropout > 0 in training attention runs on the exact
    materialized reference (O(S^2) memory, fine for the tasks' lengths); in eval, or with
    dropout 0, the fused path materializes nothing.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        spec: AttentionSpec | dict | str = "unas",
        dropout: float = 0.0,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        is_decoder: bool = False,
        project_values: bool = True,
    ) -> None:
        super().__init__()
        self.spec = AttentionSpec.from_config(spec)
        if is_decoder and self.spec.normalizes_over_queries:
            raise ConfigError(
                f"attention scheme {self.spec.scheme!r} cannot be used in a decoder: it normalizes "
                f"over queries, which mixes all target positions and leaks the future. Use "
                f"model=unas for decoder attention (the task keeps its decoder UNAS and applies "
                f"{self.spec.scheme} to encoder attention only)."
            )
        if embed_dim % num_heads:
            raise ConfigError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = kdim or embed_dim
        self.vdim = vdim or embed_dim
        self.dropout = float(dropout)
        self.is_decoder = is_decoder
        self.project_values = project_values
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias)
        if project_values:
            self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias)
            self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
            self.out_dim = embed_dim
        else:
            if self.vdim % num_heads:
                raise ConfigError(
                    f"project_values=False splits the raw values over heads, but vdim={self.vdim} "
                    f"is not divisible by num_heads={num_heads}"
                )
            self.v_proj = None
            self.out_proj = None
            self.out_dim = self.vdim
        if self.spec.normalization == "hnas":
            n = num_heads if self.spec.hybrid_per == "head" else 1
            u0 = min(max(self.spec.hybrid_init, _U_CLAMP), 1 - _U_CLAMP)
            self.hybrid_logit = nn.Parameter(torch.full((n,), math.log(u0 / (1 - u0))))
        else:
            self.hybrid_logit = None
        # coda / realformer: options, stack link and logits in flight (attention/cascade.py);
        # the role (encoder | decoder | cross) lets training rules pick stacks
        self.cascade = cascade.make_state(self.spec)
        self.role = "decoder" if is_decoder else "encoder"
        self.record = False
        self.recorded: dict | None = None

    @property
    def scheme(self) -> str:
        return self.spec.scheme

    @property
    def hybrid_u(self) -> Tensor | None:
        """u per head, detached, shape (H,), in [0, 1]; None if this module is not HNAS."""
        if self.hybrid_logit is None:
            return None
        return torch.sigmoid(self.hybrid_logit.detach()).expand(self.num_heads).clone()

    def _split(self, x: Tensor) -> Tensor:
        b, s, e = x.shape
        return x.view(b, s, self.num_heads, e // self.num_heads).transpose(1, 2)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        query_padding_mask: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        if key is None:  # self-attention
            key = query
            value = query if value is None else value
        elif value is None:
            value = key
        if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
            raise ConfigError(
                f"MultiHeadAttention takes batch-first (B, S, E) tensors, got query "
                f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        q = self._split(self.q_proj(query))
        k = self._split(self.k_proj(key))
        v = self._split(self.v_proj(value) if self.v_proj is not None else value)
        out = self.attend_heads(q, k, v, key_padding_mask, query_padding_mask, causal)
        out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], -1)
        return self.out_proj(out) if self.out_proj is not None else out

    def attend_heads(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None = None,
        query_padding_mask: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        """This module's scheme on projected, split heads: (B, H, S, d) in, (B, H, S_q, d_v) out.

        `forward` is projections + this + out_proj; incremental decoding calls it directly with
        cached keys/values, so every decoder-safe scheme (unas, coda, realformer) decodes step
        by step. Recording for analysis callbacks happens here.
        """
        u = None
        if self.hybrid_logit is not None:
            u = torch.sigmoid(self.hybrid_logit).view(1, -1, 1, 1)
        dropout_p = self.dropout if self.training else 0.0
        if self.cascade is not None:  # coda / realformer: materialized logits, see cascade.py
            out, weights = cascade.cascade_attend(
                self, q, k, v, key_padding_mask, query_padding_mask, causal, u, dropout_p
            )
            if self.record:
                self._store(weights.detach().float(), key_padding_mask, query_padding_mask, out)
            return out
        out = attend(
            q,
            k,
            v,
            scheme=self.spec.scheme,
            key_padding_mask=key_padding_mask,
            query_padding_mask=query_padding_mask,
            u=u,
            n_iter=self.spec.n_iter,
            causal=causal,
            dropout_p=dropout_p,
        )
        if self.record:
            self._record(q, k, u, key_padding_mask, query_padding_mask, causal, out)
        return out

    @torch.no_grad()
    def _record(self, q, k, u, key_padding_mask, query_padding_mask, causal, out) -> None:
        """Materialize this forward's weights for analysis callbacks (only when record=True)."""
        weights = attention_weights(
            q.detach(),
            k.detach(),
            scheme=self.spec.scheme,
            key_padding_mask=key_padding_mask,
            query_padding_mask=query_padding_mask,
            u=None if u is None else u.detach(),
            n_iter=self.spec.n_iter,
            causal=causal,
        ).float()
        self._store(weights, key_padding_mask, query_padding_mask, out)

    @torch.no_grad()
    def _store(self, weights, key_padding_mask, query_padding_mask, out) -> None:
        column_sums = weights.sum(dim=-2)  # (B, H, S_k): total weight each key receives
        if key_padding_mask is not None:
            masked = column_sums.masked_fill(key_padding_mask[:, None, :], float("inf"))
        else:
            masked = column_sums
        self.recorded = {
            "weights": weights,
            "key_padding_mask": key_padding_mask,
            "query_padding_mask": query_padding_mask,
            "column_sums": column_sums,
            "min_column_sum": masked.amin(dim=-1),  # (B, H), over valid keys (inf if none)
            "head_outputs": out.detach().float(),  # (B, H, S_q, d_v), before out_proj
        }


def attention_modules(model: nn.Module) -> list[tuple[str, MultiHeadAttention]]:
    """[(name, module)] for every MultiHeadAttention in `model`, in named_modules() order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
