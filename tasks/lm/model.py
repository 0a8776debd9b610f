"""`TransformerLM`: a decoder-only Transformer built from the library's layers.

- A stack of `TransformerEncoderLayer(causal=True, layer_index=i)` in an `nn.ModuleList`, run with
  `run_stack` (so CODA and RealFormer cascade their logits from layer to layer), every
  self-attention with the `model=` scheme. Query-normalized schemes (DNAS, HNAS, Sinkhorn) cannot
  be causal: the layers refuse them (and the runner refuses them before any work, `task.causal`).
- Token embeddings scaled by sqrt(d) plus learned or sinusoidal positions, then dropout
  (fairseq's TransformerDecoder); or no positions at the input, with `positions=none` (causal
  attention alone tells positions apart), `rope` or `alibi` (inside every self-attention:
  attnlab.attention.positions). Learned positions stop at their table (`check_length` refuses
  more); the others extrapolate. The output layer is tied to the input embeddings, plain
  (`TiedEmbedding`) or adaptive (`AdaptiveEmbedding`, fairseq's transformer_lm_wiki103).
- Pre-LN (`norm_first=True`, with a final LayerNorm unless `final_norm=false`, as
  transformer_lm_wiki103 has none) or post-LN layers.

Incremental decoding (`start_decoding` / `decode_step` / `project`, the protocol of
`tasks.common.decoding.sample`): the library's key/value cache and layer steps
(`attnlab.attention.kv_cache`, `step_stack`); row-wise cascades (CODA, RealFormer) carry the newest
row of logits from layer to layer, as in the encoder-decoder. Other logit transforms re-run the
prefix at every step (`PrefixCache`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnlab.attention import (
    AttentionSpec,
    KVCache,
    PrefixCache,
    TransformerEncoderLayer,
    cacheable,
    run_stack,
    step_stack,
)
from attnlab.attention.positions import ALIBI_MAX_POSITIONS
from attnlab.errors import ConfigError
from tasks.lm.embeddings import AdaptiveEmbedding, TiedEmbedding, sinusoidal_positions

# added to the token embeddings (learned, sinusoidal) or acting inside attention (rope, alibi)
POSITIONS = ("learned", "sinusoidal", "none", "rope", "alibi")
EXTRAPOLATING = "none|sinusoidal|rope|alibi"


class TransformerLM(nn.Module):
    """`attention`: the `model=` config, in every self-attention. `max_positions` (null: the
    data's `block_size`) must cover the blocks: the learned table's size (the other `positions`
    take any length)."""

    def __init__(
        self,
        vocab_size: int,
        pad_id: int | None = None,
        *,
        # the defaults are conf/task/lm.yaml's; the scheme (the run's model) and the adaptive
        # softmax's cutoffs (ranks of the Debian vocabulary) have none
        attention: AttentionSpec | dict | str,
        d_model: int = 256,
        nhead: int = 4,
        num_layers: int = 4,
        dim_feedforward: int = 1024,
        dropout: float = 0.1,
        attention_dropout: float | None = 0.0,
        activation: str = "gelu",
        norm_first: bool = True,
        final_norm: bool | None = None,
        layer_norm_eps: float = 1e-5,
        max_positions: int | None = None,
        block_size: int | None = None,
        positions: str = "learned",
        scale_embedding: bool = True,
        adaptive_cutoffs: Sequence[int] | None,
        adaptive_factor: float = 4.0,
        adaptive_dropout: float = 0.0,
        token_order: Sequence[int] | None = None,
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        if positions not in POSITIONS:
            raise ConfigError(f"task.module.net.positions={positions!r}; use one of {', '.join(POSITIONS)}")
        spec = AttentionSpec.from_config(attention)
        self.max_positions = int(max_positions or block_size or 512)
        if block_size is not None and self.max_positions < block_size:
            raise ConfigError(f"task.module.net.max_positions={self.max_positions} < task.data.block_size={block_size}")
        self.positions = positions
        self.block_size = block_size
        self.checkpoint = checkpoint
        cutoffs = [int(c) for c in adaptive_cutoffs or ()]
        if any(c >= vocab_size for c in cutoffs):  # a small vocabulary (fixtures, your own text)
            print(f"[lm] adaptive cutoffs {cutoffs} reach past the vocabulary of {vocab_size}: "
                  f"using {[c for c in cutoffs if c < vocab_size] or 'none (one softmax)'}")
            cutoffs = [c for c in cutoffs if c < vocab_size]
        if cutoffs:
            self.embed = AdaptiveEmbedding(vocab_size, d_model, cutoffs, adaptive_factor,
                                           adaptive_dropout, pad_id, token_order)
        else:
            self.embed = TiedEmbedding(vocab_size, d_model, pad_id)
        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.position = None
        if positions == "learned":
            self.position = nn.Embedding(self.max_positions, d_model)
            nn.init.normal_(self.position.weight, std=d_model**-0.5)
        elif positions == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_positions(self.max_positions, d_model), persistent=False)
        inside = positions if positions in ("rope", "alibi") else "none"  # what attention does
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, spec=spec, activation=activation,
                                    norm_first=norm_first, layer_norm_eps=layer_norm_eps,
                                    attn_dropout=attention_dropout, causal=True, layer_index=i,
                                    positions=inside)
            for i in range(num_layers)
        )
        # Pre-LN leaves the residual stream unnormalized: a final LayerNorm, unless told otherwise.
        use_final_norm = norm_first if final_norm is None else final_norm
        self.final_norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if use_final_norm else nn.Identity()

    # -- the full pass ---------------------------------------------------------------------------

    def check_length(self, length: int, asked_by: str) -> None:
        """Raise a one-line ConfigError when the model cannot take `length` positions (learned:
        beyond its table; alibi: beyond its 65,536); `asked_by` names what asked (e.g.
        "task.eval_lengths=[8]")."""
        if self.positions == "learned" and length > self.max_positions:
            fits = (f"lengths <= {self.max_positions // self.block_size} ({self.max_positions} "
                    f"positions)" if self.block_size else f"at most {self.max_positions} positions")
            raise ConfigError(
                f"{asked_by} asks for {length} positions but positions=learned has a table of "
                f"{self.max_positions} and learned positions do not extrapolate; use "
                f"task.module.net.positions={EXTRAPOLATING}, or {fits}")
        if self.positions == "alibi" and length > ALIBI_MAX_POSITIONS:
            raise ConfigError(f"{asked_by} asks for {length} positions but positions=alibi takes at "
                              f"most {ALIBI_MAX_POSITIONS}; use shorter windows or positions=rope|none")

    def _positions(self, start: int, length: int) -> Tensor | None:
        """The embeddings added at positions start .. start + length - 1 (None: none added)."""
        self.check_length(start + length, "the input")
        if self.position is not None:
            return self.position.weight[start : start + length]
        if self.positions != "sinusoidal":
            return None
        if start + length > self.sinusoid.shape[0]:  # computed past the table: they extrapolate
            table = sinusoidal_positions(start + length, self.sinusoid.shape[1]).to(self.sinusoid)
            return table[start:]
        return self.sinusoid[start : start + length]

    def embed_tokens(self, ids: Tensor, start: int = 0) -> Tensor:
        x = self.embed(ids) * self.embed_scale
        positions = self._positions(start, ids.shape[1])
        return self.dropout(x if positions is None else x + positions)

    def forward(self, input_ids: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Hidden states (B, L, D) of every position (each sees itself and the positions before).

        padding_mask (B, L), True = padding (only at the end of a window, so causal attention keeps
        it away from real positions anyway; it is passed on so that analyses skip padded rows).
        """
        # the fused causal kernels serve unmasked input (under torch.compile the mask stays:
        # looking at its values would break the graph)
        if padding_mask is not None and not torch.compiler.is_compiling() and not bool(padding_mask.any()):
            padding_mask = None
        x = self.embed_tokens(input_ids)
        return self.final_norm(run_stack(self.layers, x, padding_mask, checkpoint=self.checkpoint))

    def logits(self, hidden: Tensor) -> Tensor:
        return self.embed.logits(hidden)

    def nll(self, hidden: Tensor, targets: Tensor) -> Tensor:
        return self.embed.nll(hidden, targets)

    # -- incremental decoding --------------------------------------------------------------------

    def start_decoding(self, cached: bool = True) -> KVCache | PrefixCache:
        """A key/value cache (cascades carried row by row); a prefix store for a transform that
        cannot be cached (or `cached=False`)."""
        return KVCache() if cached and cacheable(self.layers, cascades=True) else PrefixCache()

    def decode_step(self, token_ids: Tensor, cache: KVCache | PrefixCache) -> Tensor:
        """Hidden state (B, D) after feeding token_ids (B,) at the next position (eval mode).

        Equals `forward(prefix)[:, -1]` for the prefix fed so far, for every `positions` (tested):
        the step's position is the cache's length."""
        if isinstance(cache, PrefixCache):
            return self(cache.append(token_ids))[:, -1]
        x = self.embed_tokens(token_ids[:, None], start=cache.length)
        return self.final_norm(step_stack(self.layers, x, cache)[:, 0])

    def project(self, hidden: Tensor) -> Tensor:
        return self.logits(hidden)
