"""Cascade schemes: attention logits that flow from layer to layer of a stack.

- `coda` (Zheng et al. 2021, "Cascaded Head-colliding Attention"): the logits are latent,
  `z^l = mu^l + eps` with `eps ~ N(0, I)` in training and `z^l = mu^l` in evaluation, where

      mu^l = C^l + sigma^l(Z^{l-1} + C^l) [+ Z^{l-1}]      C^l = Q K^T / sqrt(d)

  and `sigma^l` is a small MLP per layer applied across the head axis ((B, H, T, S) moved to
  (B, T, S, H)): Linear(H, alpha H), LeakyReLU(0.2), Linear(alpha H, alpha H), LeakyReLU(0.2),
  Linear(alpha H, H) (`alpha` default 4, `mlp_layers` hidden layers, default 2). The outer
  residual `+ Z^{l-1}` is what the published code does (`prev_residual=true`, the default: it
  makes sigma a residual block over `Z^{l-1} + C^l`); `prev_residual=false` drops it.
  The first layer of a stack has no previous logits: `mu^1 = C^1` (so with the noise off it is
  exactly UNAS). `cascade=false` is the paper's `coda_cs` ablation: noise, no cascade.
- `realformer` (He et al. 2020): deterministic residual between adjacent layers' logits,
  `z^l = C^l + z^{l-1}`.

The logits are then normalized by `spec.normalization` (unas by default; dnas/hnas allowed in
encoders, the decoder guard of MultiHeadAttention refuses them in decoders).

Stacks: consecutive `TransformerEncoderLayer`s (or `TransformerDecoderLayer`s) in one
`nn.ModuleList` form a stack; their `self_attn` modules cascade among themselves, and so do
their `cross_attn` modules. The link is made when a layer is added to the list (a module
registration hook, see `_link_stacked_layers`), so tasks need no code for it; `link_stack` links
any other sequence of modules by hand. A MultiHeadAttention outside such a list (e.g. each VQA
fusion attention) is a stack of depth 1. The links and the logits in flight live on the modules
themselves (`module.cascade`, a `CascadeState`), never in global state: layer l leaves its logits
in its own slot and layer l+1 takes them, in the same forward pass. So every forward (training,
evaluation, beam search re-running the decoder on the whole prefix) cascades from scratch.

Masks are carried explicitly: padded or causally hidden positions enter the MLP as 0 and get
-inf logits afterwards, so they never receive weight, and nothing is ever NaN.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from attnlab.attention import reference
from attnlab.attention.functional import validate
from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError

# Options of each cascade scheme (conf/model/<name>.yaml) and their defaults.
_DEFAULTS = {
    "coda": {"cascade": True, "noise": True, "alpha": 4, "mlp_layers": 2, "prev_residual": True,
             "decoder": True},
    "realformer": {"cascade": True, "noise": False, "decoder": True},
}


@dataclass(frozen=True)
class CascadeOptions:
    kind: str  # coda | realformer
    cascade: bool = True  # pass the logits on to the next layer of the stack
    noise: bool = True  # training: z = mu + N(0, I)
    alpha: int = 4  # CODA's head MLP is alpha * H wide
    mlp_layers: int = 2  # hidden layers of the head MLP
    prev_residual: bool = True  # mu = C + sigma(Z_prev + C) + Z_prev (published code)
    decoder: bool = True  # tasks with a decoder also use the scheme there (AttentionSpec.for_decoder)

    @classmethod
    def from_spec(cls, spec: AttentionSpec) -> CascadeOptions:
        defaults = _DEFAULTS[spec.scheme]
        known = {f.name for f in fields(cls)} - {"kind"}
        given = dict(spec.options)
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ConfigError(
                f"model={spec.scheme} has no option {', '.join(unknown)}; its options are "
                f"{', '.join(sorted(defaults))} (see conf/model/{spec.scheme}.yaml)"
            )
        values = {**defaults, **given}
        for key in ("cascade", "noise", "prev_residual", "decoder"):
            if key in values and not isinstance(values[key], bool):
                raise ConfigError(f"model.{key}={values[key]!r} must be true or false")
        for key in ("alpha", "mlp_layers"):
            if key in values and (not isinstance(values[key], int) or values[key] < 1):
                raise ConfigError(f"model.{key}={values[key]!r} must be an integer >= 1")
        return cls(kind=spec.scheme, **{k: v for k, v in values.items() if k in known})

    @property
    def mixes_heads(self) -> bool:
        return self.kind == "coda" and self.cascade


class CascadeState:
    """What one cascade module knows: its options, the module before it in its stack (`source`),
    whether a module after it reads its logits (`feeds`), and those logits while in flight."""

    def __init__(self, options: CascadeOptions) -> None:
        self.options = options
        self.source: nn.Module | None = None
        self.feeds = False
        self.logits: Tensor | None = None

    def __repr__(self) -> str:  # keeps module printouts short
        return f"CascadeState({self.options.kind}, linked={self.source is not None})"


class HeadMixer(nn.Module):
    """CODA's sigma^l: an MLP over the head axis at every (query, key) position."""

    def __init__(self, num_heads: int, alpha: int = 4, hidden_layers: int = 2) -> None:
        super().__init__()
        dims = [num_heads] + [alpha * num_heads] * hidden_layers + [num_heads]
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i < len(dims) - 2:
                layers.append(nn.LeakyReLU(0.2))
        self.net = nn.Sequential(*layers)
        for m in self.net:  # the published initialization (tasks may re-initialize their Linears)
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight, gain=1 / math.sqrt(2))
                nn.init.zeros_(m.bias)

    def forward(self, logits: Tensor) -> Tensor:
        """(B, H, T, S) -> (B, H, T, S)."""
        weight = self.net[0].weight
        out = self.net(logits.movedim(1, -1).to(weight.dtype))
        return out.movedim(-1, 1).to(logits.dtype)


def make_state(spec: AttentionSpec) -> CascadeState | None:
    return CascadeState(CascadeOptions.from_spec(spec)) if spec.cascades else None


def link(previous: nn.Module, module: nn.Module) -> None:
    """Make `module` receive the logits of `previous` (the layer before it in its stack)."""
    a, b = getattr(previous, "cascade", None), getattr(module, "cascade", None)
    if a is None or b is None or not b.options.cascade:
        return
    if a.options.kind != b.options.kind:
        return  # different schemes in one stack do not cascade into each other
    if previous.num_heads != module.num_heads:
        raise ConfigError(
            f"{b.options.kind}: adjacent layers of a stack need the same number of heads to pass "
            f"logits on, got {previous.num_heads} and {module.num_heads}"
        )
    b.source = _Ref(previous)
    a.feeds = True
    if b.options.mixes_heads and getattr(module, "cascade_mixer", None) is None:
        module.cascade_mixer = HeadMixer(module.num_heads, b.options.alpha, b.options.mlp_layers)


def link_stack(modules: Iterable[nn.Module]) -> None:
    """Link a sequence of MultiHeadAttention modules into one cascade stack, in order."""
    for previous, module in itertools.pairwise(modules):
        link(previous, module)


class _Ref:
    """Points at the previous module without registering it as a submodule (it already is one
    elsewhere in the model); deepcopy maps it to the copied module with the rest of the model."""

    __slots__ = ("module",)

    def __init__(self, module: nn.Module) -> None:
        self.module = module


# ----------------------------------------------------------------------------- stacks, automatically
def _link_stacked_layers(parent: nn.Module, name: str, child: nn.Module) -> None:
    """Module registration hook: a layer appended to an nn.ModuleList after a layer of the same
    class continues that layer's stacks (attributes listed in the class's CASCADE_ATTRIBUTES).
    Returns None, so the child is registered unchanged."""
    attrs: Sequence[str] = getattr(type(child), "CASCADE_ATTRIBUTES", ())
    if not attrs or not isinstance(parent, nn.ModuleList) or not name.isdigit() or name == "0":
        return
    previous = parent._modules.get(str(int(name) - 1))
    if type(previous) is not type(child):
        return
    for attr in attrs:
        a, b = getattr(previous, attr, None), getattr(child, attr, None)
        if a is not None and b is not None:
            link(a, b)


_HOOK = torch.nn.modules.module.register_module_module_registration_hook(_link_stacked_layers)


# ----------------------------------------------------------------------------- the computation
def _previous_logits(module: nn.Module, shape: torch.Size) -> Tensor | None:
    state: CascadeState = module.cascade
    if state.source is None:
        return None
    source = state.source.module.cascade
    prev, source.logits = source.logits, None  # taken: the slot never outlives the forward
    if prev is None:
        raise ConfigError(
            f"{state.options.kind}: the previous layer of this attention's stack did not run before "
            f"it in this forward pass; the layers of a cascade stack must run in order (layer l "
            f"reads the logits of layer l-1)"
        )
    if prev.shape != shape:
        raise ConfigError(
            f"{state.options.kind}: the previous layer of this stack produced logits of shape "
            f"{tuple(prev.shape)} but this layer's are {tuple(shape)}; the layers of a stack must "
            f"attend over the same queries and keys"
        )
    return prev


def cascade_logits(
    scores: Tensor,
    previous: Tensor | None,
    valid: Tensor | None,
    options: CascadeOptions,
    mixer: nn.Module | None = None,
    training: bool = False,
) -> Tensor:
    """The logits z (finite everywhere, 0 at masked positions) from the scaled scores C of this
    layer (finite, 0 at masked positions) and the previous layer's z (or None)."""
    z = scores
    if previous is not None:
        if valid is not None:
            previous = previous.masked_fill(~valid, 0.0)
        if options.kind == "realformer":
            z = scores + previous
        elif mixer is not None:
            mixed = mixer(scores + previous)
            z = scores + mixed + previous if options.prev_residual else scores + mixed
    if options.noise and training:
        z = z + torch.randn_like(z)
    if valid is not None:
        z = z.masked_fill(~valid, 0.0)
    return z


def normalize(logits: Tensor, normalization: str, u: Tensor | None = None) -> Tensor:
    """Weights from -inf-masked logits: unas (over keys), dnas (queries, then keys) or hnas."""
    if normalization == "unas":
        return reference.safe_log_normalize(logits, dim=-1).exp()
    dnas = reference.sinkhorn_log_weights(logits, 1).exp()
    if normalization == "dnas":
        return dnas
    unas = reference.safe_log_normalize(logits, dim=-1).exp()
    u = u.to(logits.dtype)
    return u * dnas + (1 - u) * unas


def cascade_attend(
    module: nn.Module,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    causal: bool = False,
    u: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Output (B, H, S_q, d_v) and weights (B, H, S_q, S_k) of a cascade module's forward.

    Materializes the logits (the head MLP mixes heads elementwise); float32 inside, like the
    reference path, even under autocast.
    """
    spec: AttentionSpec = module.spec
    state: CascadeState = module.cascade
    # the same input checks as `attend` (shapes, masks, causal guard of the normalization)
    validate(q, k, v, spec.normalization, key_padding_mask, query_padding_mask,
             u if spec.normalization == "hnas" else None, 1, causal)
    batch, s_q, s_k = q.shape[0], q.shape[-2], k.shape[-2]
    valid = reference.valid_mask(batch, s_q, s_k, q.device, key_padding_mask, query_padding_mask, causal)
    scores = reference.masked_logits(q, k)  # float32 (float64 stays), unmasked
    if valid is not None:
        scores = scores.masked_fill(~valid, 0.0)
    previous = _previous_logits(module, scores.shape)
    with torch.autocast(device_type=q.device.type, enabled=False):
        z = cascade_logits(scores, previous, valid, state.options,
                           getattr(module, "cascade_mixer", None), module.training)
        if state.feeds:
            state.logits = z
        logits = z if valid is None else z.masked_fill(~valid, float("-inf"))
        weights = normalize(logits, spec.normalization, u)
        dropped = torch.nn.functional.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        out = torch.matmul(dropped, v.to(weights.dtype))
    return out.to(reference.output_dtype(v)), weights
