"""The attention function registered with `transformers` (`AttentionInterface`) under the name
"attnlab", and the mask it is given (`AttentionMaskInterface`: HF's boolean SDPA mask).

HF calls `attnlab_attention(module, query, key, value, attention_mask, dropout=, scaling=, ...)`
with (B, H, S, d) heads from every attention module of a model whose implementation is
"attnlab". The scheme is not in the name: it is the `SchemeAttention` that `use_scheme` put on
the module (`module.attnlab`), so one registration serves every scheme and every model.

attnlab's schemes take key padding, not arbitrary masks: the 4-D mask HF builds (True / 0 =
attend) is turned back into key padding (a key no query may see), and checked to be exactly
that (plus the causal triangle in causal attention); any other pattern (sliding windows,
attention biases, packed sequences) is refused in one line rather than silently dropped.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError

IMPLEMENTATION = "attnlab"
ADAPTER = "attnlab"  # the child of each HF attention module holding its SchemeAttention


def key_padding_from_mask(mask: Tensor | None, batch: int, s_q: int, s_k: int,
                          causal: bool) -> Tensor | None:
    """(B, S_k) bool, True = padded key, from HF's 4-D mask (B, 1|H, S_q|1, S_k): bool with
    True = attend, or additive with 0 = attend and the dtype's minimum (or -inf) = masked."""
    if mask is None:
        return None
    if mask.dim() != 4:
        raise ConfigError(f"attnlab attention expects HF's 4-D attention mask, got shape "
                          f"{tuple(mask.shape)}; pass the model a 2-D attention_mask (1 = token)")
    if mask.dtype == torch.bool:
        blocked = ~mask
    else:
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if bool(((mask != 0) & ~blocked).any()):
            raise ConfigError("this model adds an attention bias to the scores (e.g. ALiBi or "
                              "relative positions); attnlab's schemes take key padding only, so "
                              "use a model without attention biases")
    blocked = blocked.expand(batch, blocked.shape[1], s_q, s_k)
    padded = blocked.all(dim=2).all(dim=1)  # (B, S_k): no query of any head may see it
    expected = padded[:, None, None, :]
    if causal:
        expected = expected | torch.ones(s_q, s_k, dtype=torch.bool, device=mask.device).triu(1)
    if not torch.equal(blocked, expected.expand_as(blocked)):
        raise ConfigError("this model's attention mask is not key padding"
                          f"{' plus the causal triangle' if causal else ''} (sliding window, packed "
                          "sequences or a custom mask?); attnlab's schemes take key padding only")
    return padded if bool(padded.any()) else None


def attnlab_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None, dropout: float = 0.0,
                      scaling: float | None = None, **_kwargs) -> tuple[Tensor, None]:
    """HF's attention-function signature: (B, H, S, d) in, ((B, S_q, H, d), None) out."""
    scheme = getattr(module, ADAPTER, None)
    if scheme is None:
        raise ConfigError(f"{type(module).__name__} runs attn_implementation='{IMPLEMENTATION}' "
                          f"but has no scheme; set it with attnlab.hf.use_scheme(model, 'unas')")
    if key.shape[1] != query.shape[1]:  # grouped-query attention: each key head serves a group
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling * math.sqrt(head_dim), 1.0, rel_tol=1e-9):
        query = query * (scaling * math.sqrt(head_dim))  # attnlab scales scores by 1/sqrt(d)
    batch, s_q, s_k = query.shape[0], query.shape[2], key.shape[2]
    causal = scheme.causal and s_q > 1
    if causal and s_q != s_k:
        raise ConfigError(f"attnlab attention runs causal attention on whole sequences (got "
                          f"{s_q} queries over {s_k} cached keys); decode one token at a time")
    padding = key_padding_from_mask(attention_mask, batch, s_q, s_k, causal)
    # In self-attention the padded queries are the padded keys (DNAS leaves them out of its
    # column sums); cross-attention does not know its queries' padding (over-queries schemes are
    # refused there by use_scheme).
    query_padding = padding if scheme.role != "cross" else None
    out = scheme(query, key, value, padding, query_padding, causal, dropout)
    return out.view(batch, s_q, scheme.num_heads, -1), None


def register() -> None:
    """Register the attention function and its mask with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, attnlab_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
