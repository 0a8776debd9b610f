"""`MultiHeadAttention`: projections around the spec's scheme, read top to bottom: project and
split the heads, one attention step (the scheme's `attend_heads`), the output gate, merge the
heads, project out. Cascade logits are passed explicitly; recording on request."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnlab.attention.gate import OutputGate
from attnlab.attention.positions import SCHEMES as POSITIONS
from attnlab.attention.positions import AttentionPositions
from attnlab.attention.record import AttentionRecord
from attnlab.attention.schemes import Attended, Heads, module_name
from attnlab.attention.spec import AttentionSpec
from attnlab.attention.statistics import visible_pairs
from attnlab.errors import ConfigError

if TYPE_CHECKING:
    from attnlab.attention.kernels.flex import MaskCache
    from attnlab.attention.kv_cache import KeyValues

# parameter names of checkpoints written before the schemes owned their parameters
_RENAMED = {"hybrid_logit": "normalizer.hybrid_logit", "cascade_mixer.": "transform.mixer."}


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch first: (B, S, E) in, (B, S_q, embed_dim or vdim) out.

    Head h uses rows [h*d:(h+1)*d] of the q/k/v projection weights (d = embed_dim // num_heads),
    the same grouping as BERT and torch.nn.MultiheadAttention, so weights map by name.

    `project_values=False` attends over the raw `value` features (no v_proj, no out_proj): the
    heads split vdim and the output has vdim features.

    The scheme is `self.normalizer` (e.g. HNAS, which owns its `u`), after `self.transform` for
    cascade schemes (CODA, RealFormer); `self.head_scheme` (diff, else None) computes the heads'
    outputs from the normalizer's maps. `self.gate` (model.gate; None when off) multiplies each
    head's output by sigmoid(query W_g) before out_proj (with project_values=False, the heads'
    outputs as they leave the module). `layer_index` is this module's position in its cascade
    stack: from 1 on it must be given the previous layer's logits (`prev_logits`), which
    `forward(..., return_logits=True)` returns; `attnlab.attention.run_stack` threads them.

    Attention dropout (training only) drops the attention weights: inside the fused kernels for
    unas/dnas/hnas (CPU C++, CUDA Triton/SDPA), on the materialized reference for the others.

    `positions` (none | rope | alibi; attnlab.attention.positions) acts on q and k after the
    heads are split, at positions `start`, `start` + 1, ... given with each call (`forward`'s
    `start`, 0 for a full pass; `step`: the cache's length before the new position): keys are
    rotated / given their ALiBi features before they enter a cache. ALiBi biases causal
    self-attention only (a non-causal call is refused).
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
        layer_index: int = 0,
        positions: str = "none",
    ) -> None:
        super().__init__()
        self.spec = AttentionSpec.from_config(spec)
        if positions not in POSITIONS:
            raise ConfigError(f"MultiHeadAttention(positions={positions!r}); use one of "
                              f"{', '.join(POSITIONS)} (learned / sinusoidal positions are a model's "
                              f"embeddings, added before the layers)")
        if is_decoder and self.spec.normalizes_over_queries:
            raise ConfigError(
                f"attention normalization {self.spec.normalization!r} cannot be used in a decoder: "
                f"it normalizes over queries, which mixes all target positions and leaks the "
                f"future. Use a scheme that normalizes over keys (e.g. model=unas) for decoder "
                f"attention; tasks apply {self.spec.normalization} to encoder attention only."
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
        self.layer_index = int(layer_index)
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
        self.normalizer = self.spec.build_normalizer(num_heads)
        self.transform = self.spec.build_transform(num_heads, receives_logits=self.layer_index > 0)
        # a head scheme (diff) computes the heads' outputs itself, from the normalizer's maps
        self.head_scheme = self.spec.build_head_scheme(num_heads, self.head_dim,
                                                       self.out_dim // num_heads, embed_dim,
                                                       self.layer_index, bias)
        # the output gate (model.gate) gates each head's output, before the output projection
        # where there is one (VQA's fusion and classify's hops have none: it gates what they return)
        self.gate = (OutputGate(self.spec.gate, embed_dim, num_heads, self.out_dim // num_heads, bias)
                     if self.spec.gate is not None else None)
        self.positions = AttentionPositions(positions, num_heads, self._query_key_groups(positions))
        # the role (encoder | decoder | cross) lets training rules pick stacks
        self.role = "decoder" if is_decoder else "encoder"
        self._recorders: list = []  # open record_attention handles (attention/recording.py)

    @property
    def scheme(self) -> str:
        return self.spec.scheme

    def _query_key_groups(self, positions: str) -> int:
        """How many q.k products one head's features form (positions act on each): 1, or what a
        head scheme declares (diff v1: its two halves). A head scheme that declares nothing, or
        projects queries of its own (which the positions cannot reach), is refused."""
        scheme = self.head_scheme
        if positions == "none" or scheme is None:
            return 1
        if scheme.needs_query:
            raise ConfigError(f"model={scheme.name} (as configured) projects queries of its own, which "
                              f"positions={positions} cannot rotate or bias; use "
                              f"positions=learned|sinusoidal|none with it")
        groups = getattr(scheme, "query_key_groups", None)
        if groups is None:
            raise ConfigError(f"model={scheme.name} forms its heads' q.k products itself without saying "
                              f"how its features group into them (query_key_groups), so "
                              f"positions={positions} cannot act on them; use "
                              f"positions=learned|sinusoidal|none with it")
        return int(groups)

    def _split(self, x: Tensor) -> Tensor:
        b, s, e = x.shape
        return x.view(b, s, self.num_heads, e // self.num_heads).transpose(1, 2)

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, query_padding_mask: Tensor | None = None,
                causal: bool = False, prev_logits: Tensor | None = None, return_logits: bool = False,
                mask_cache: MaskCache | None = None, start: int = 0
                ) -> Tensor | tuple[Tensor, Tensor | None]:
        """Output (B, S_q, out_dim); with return_logits, also the logits this module passes on to
        the next layer of its cascade stack (None unless its scheme cascades). `mask_cache`: the
        FlexAttention block masks of this forward of the stack (`run_stack` passes one). `start`:
        the position of the first query and the first key (for `positions`)."""
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
        if self.positions.scheme == "alibi" and not causal:
            raise ConfigError("positions=alibi biases causal self-attention (-m (i - j) for keys "
                              "j <= i); this call is not causal: use positions=rope|none here")
        keys, values = self.keys_values(key, value, start)
        out, logits = self.attend_to(query, keys, values, key_padding_mask, query_padding_mask, causal,
                                     prev_logits, mask_cache, start)
        return (out, logits) if return_logits else out

    def keys_values(self, key: Tensor, value: Tensor | None = None, start: int = 0
                    ) -> tuple[Tensor, Tensor]:
        """The projected, split keys and values (B, H, S_k, d) of key (and value, default key)
        (B, S_k, E), the keys at positions start, start + 1, ... (rotated, or with their ALiBi
        features: d grows): what a cache keeps."""
        value = key if value is None else value
        projected = self.v_proj(value) if self.v_proj is not None else value
        return self.positions.key(self._split(self.k_proj(key)), start), self._split(projected)

    def attend_to(self, query: Tensor, keys: Tensor, values: Tensor,
                  key_padding_mask: Tensor | None = None, query_padding_mask: Tensor | None = None,
                  causal: bool = False, prev_logits: Tensor | None = None,
                  mask_cache: MaskCache | None = None, start: int = 0) -> tuple[Tensor, Tensor | None]:
        """query (B, S_q, E) at positions start, start + 1, ... attending to projected keys/values
        (`keys_values`): the output (B, S_q, out_dim) and the logits passed on in a cascade (or
        None)."""
        q = self.positions.query(self._split(self.q_proj(query)), start)
        out, logits = self.attend_heads(q, keys, values, key_padding_mask, query_padding_mask, causal,
                                        prev_logits, query=query, mask_cache=mask_cache)
        if self.gate is not None:
            out = self.gate(query, out, query_padding_mask)
        out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], -1)
        return (self.out_proj(out) if self.out_proj is not None else out), logits

    def attend_heads(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                     query_padding_mask: Tensor | None = None, causal: bool = False,
                     prev_logits: Tensor | None = None, query: Tensor | None = None,
                     mask_cache: MaskCache | None = None) -> tuple[Tensor, Tensor | None]:
        """This module's scheme on projected, split heads: (B, H, S, d) in, (B, H, S_q, d_v) out,
        and the logits passed on in a cascade (or None).

        One step, whatever the kind: the head scheme's or the transform's `attend_heads` with the
        normalizer, else the normalizer's own. `forward` is projections + this + out_proj
        (`keys_values` + `attend_to`); incremental decoding runs it on cached keys/values.
        Recording for analyses happens here. `query`, the query input (B, S_q, E), is for head
        schemes that project it (diff version 2).
        """
        heads = Heads(q, k, v, key_padding_mask, query_padding_mask, causal,
                      self.dropout if self.training else 0.0, prev_logits, query, mask_cache)
        structure = self.head_scheme if self.head_scheme is not None else self.transform
        if structure is None:
            attended = self.normalizer.attend_heads(heads)
        else:
            attended = structure.attend_heads(self.normalizer, heads)
        if self._recorders:
            self._record(heads, attended)
        return attended.out, attended.logits

    @torch.no_grad()
    def _record(self, heads: Heads, attended: Attended) -> None:
        recorders = [r for r in self._recorders if r.wants(self)]
        if not recorders:
            return
        weights = attended.weights
        if weights is None:
            weights = self.normalizer.attention_weights(heads.q, heads.k, heads.key_padding_mask,
                                                        heads.query_padding_mask, heads.causal)
        record = AttentionRecord(weights.detach().float(), heads.key_padding_mask,
                                 heads.query_padding_mask, attended.out.detach().float(),
                                 causal=bool(heads.causal), max_logit=_max_logit(heads))
        for recorder in recorders:
            recorder.receive(self, record)

    # -- incremental decoding (attnlab.attention.kv_cache)
    def can_step(self, carry_logits: bool = False) -> bool:
        """Whether `step` can run this attention one position at a time on cached keys/values:
        without a logit transform, or with a row-wise one when the caller carries the rows of
        logits from layer to layer (carry_logits=True)."""
        # a causal-only normalizer (stick-breaking) needs the query's position, which `step`
        # does not pass (it attends with the newest query as row 0): decoding re-runs the prefix
        if self.normalizer.causal_only:
            return False
        # a head scheme is row-wise: each query's output depends on its own row of weights
        return self.transform is None or (carry_logits and self.transform.row_wise)

    def step(self, x: Tensor, cache: KeyValues, prev_logits: Tensor | None = None,
             mask_cache: MaskCache | None = None) -> tuple[Tensor, Tensor | None]:
        """Causal self-attention of the newest position x (B, 1, E) over every cached one (its
        keys/values are added to `cache`): its output and, in a cascade, its row of logits
        (B, H, 1, t) for the next layer. Equals the last row of the causal forward (eval mode)."""
        if x.dim() != 3 or x.shape[1] != 1:
            raise ValueError(f"an incremental step takes the newest position only, (B, 1, E); got "
                             f"{tuple(x.shape)}: feed a prefix one position per step")
        position = cache.length  # the newest position's (explicit: the cache's length, not a hook's)
        keys, values = cache.append(*self.keys_values(x, start=position))
        # The newest position may see every cached one: causality holds without a mask.
        return self.attend_to(x, keys, values, prev_logits=prev_logits, mask_cache=mask_cache,
                              start=position)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for old, new in _RENAMED.items():
            for key in [k for k in state_dict if k.startswith(prefix + old)]:
                state_dict[prefix + new + key[len(prefix + old):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _max_logit(heads: Heads) -> Tensor:
    """(H,) the largest plain attention logit q.k / sqrt(d) per head over the pairs a valid query
    may attend to (Wortsman et al.'s attention-logit growth; before any scheme's own scaling)."""
    q, k = heads.q.float(), heads.k.float()
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    allowed = visible_pairs(logits.shape, heads.key_padding_mask, heads.query_padding_mask,
                            bool(heads.causal), logits.device)[:, None]
    return logits.masked_fill(~allowed, -math.inf).amax(dim=(0, 2, 3)).cpu()


def attention_modules(model: nn.Module) -> list[tuple[str, MultiHeadAttention]]:
    """[(name, module)] for every MultiHeadAttention in `model`, in named_modules() order."""
    return [(module_name(name), m) for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
