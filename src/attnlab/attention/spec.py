"""`AttentionSpec`: the attention scheme and its options, as chosen by `model=` in Hydra.

Every task builds its attention modules from one spec (the composed `model` config group) and
decides itself *where* the spec applies; everything else stays `unas`.

`model.scheme` names a registered scheme (attention/schemes/). A normalizer (unas, dnas, hnas,
sinkhorn, entmax, ...) is used as it is; a logit transform (coda, realformer) builds the logits
that `model.normalization` (unas by default, any registered normalizer) turns into weights; a
head scheme (diff) computes the heads' outputs from maps of that normalization.
`model.gate` (headwise | elementwise | null) adds an output gate to any of them (attention/gate.py).
The other keys are the schemes' options, each validated by its scheme's `Options`:
- keys of the transform go to the transform, the others to the normalizer; a key that both
  would take (CODA's and entmax's `alpha`) can reach the normalizer as `model.normalization_options`;
- keys that only *other* registered schemes take are ignored (a task may set `model.hybrid_init`
  for HNAS whatever the model is); keys no scheme knows are an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnlab.attention.gate import check_gate
from attnlab.attention.schemes import (
    HEAD_SCHEMES,
    TRANSFORMS,
    HeadScheme,
    LogitTransform,
    Normalizer,
    build_options,
    known_keys,
    names,
    normalizer_class,
)
from attnlab.attention.schemes.base import option_names
from attnlab.errors import ConfigError

# keys of the `model` group that are not scheme options (display name, training rules)
NOT_OPTIONS = ("name", "_target_", "callbacks")


class AttentionSpec:
    def __init__(self, scheme: str = "unas", normalization: str | None = None, decoder: bool = True,
                 normalization_options: Mapping[str, Any] | None = None, gate: str | None = None,
                 **options: Any) -> None:
        self.scheme = str(scheme).lower()
        # an output gate (attnlab.attention.gate) composes with every scheme: model.gate=headwise
        self.gate = check_gate(gate)
        # a head scheme (diff) computes the heads' outputs, with a normalization as a transform
        self.head_scheme: str | None = self.scheme if self.scheme in HEAD_SCHEMES else None
        if self.scheme in TRANSFORMS or self.head_scheme:
            self.transform: str | None = self.scheme if self.scheme in TRANSFORMS else None
            self.normalization = "unas" if normalization is None else str(normalization).lower()
        else:
            self.transform = None
            if self.scheme not in names():
                raise ConfigError(f"unknown attention scheme {self.scheme!r}; choose one of "
                                  f"{', '.join(names())} (e.g. model=hnas)")
            if normalization not in (None, self.scheme):
                raise ConfigError(
                    f"model.normalization={normalization} only applies to logit transforms "
                    f"({', '.join(sorted(TRANSFORMS))}) and head schemes ({', '.join(sorted(HEAD_SCHEMES))}); "
                    f"model={self.scheme} normalizes as itself"
                )
            self.normalization = self.scheme
        if not isinstance(decoder, bool):
            raise ConfigError(f"model.decoder={decoder!r} must be true or false")
        self.decoder = decoder
        norm_cls = self.normalizer_class
        structure = self.structure_class
        t_keys = option_names(structure.Options) if structure else ()
        n_keys = option_names(norm_cls.Options)
        unknown = sorted(set(options) - set(t_keys) - set(n_keys) - known_keys())
        if unknown:
            own = sorted({*t_keys, *n_keys, "decoder", "gate"} | ({"normalization"} if structure else set()))
            raise ConfigError(
                f"model={self.scheme} has no option {', '.join(unknown)}; its options are "
                f"{', '.join(own)} (see conf/model/{self.scheme}.yaml)"
            )
        t_opts = {k: v for k, v in options.items() if k in t_keys}
        n_opts = {k: v for k, v in options.items() if k in n_keys and k not in t_keys}
        n_opts.update(normalization_options or {})
        if self.transform:
            self.transform_options = build_options(self.transform, TRANSFORMS[self.transform].Options, t_opts)
        else:
            self.transform_options = None
        self.head_options = (build_options(self.head_scheme, structure.Options, t_opts)
                             if self.head_scheme else None)
        self.normalizer_options = build_options(self.normalization, norm_cls.Options, n_opts)
        self.options = {**t_opts, **{k: v for k, v in options.items() if k in n_opts}}
        self.normalization_options = dict(normalization_options or {})

    # -- what the scheme is
    @property
    def structure_class(self) -> type | None:
        """The transform's or head scheme's class (None for a plain normalizer)."""
        if self.transform:
            return TRANSFORMS[self.transform]
        return HEAD_SCHEMES[self.head_scheme] if self.head_scheme else None

    @property
    def normalizer_class(self) -> type[Normalizer]:
        try:
            return normalizer_class(self.normalization)
        except ConfigError:
            raise ConfigError(
                f"model.normalization={self.normalization}: {self.scheme}'s logits can be "
                f"normalized by a registered normalization: {', '.join(names())}"
            ) from None

    @property
    def normalizes_over_queries(self) -> bool:
        return self.normalizer_class.over_queries

    @property
    def causal_only(self) -> bool:
        """True when the scheme is defined for causal attention only: its normalizer
        (stickbreaking) or its logit transform (selective)."""
        structure = self.structure_class
        return self.normalizer_class.causal_only or bool(getattr(structure, "causal_only", False))

    @property
    def cascades(self) -> bool:
        """True when logits flow from layer to layer of a stack (coda, realformer)."""
        return self.transform is not None and self.build_transform(1, False).passes_logits

    def build_normalizer(self, num_heads: int | None = None) -> Normalizer:
        return self.normalizer_class(self.normalizer_options, num_heads)

    def build_transform(self, num_heads: int, receives_logits: bool) -> LogitTransform | None:
        if self.transform is None:
            return None
        return TRANSFORMS[self.transform](self.transform_options, num_heads, receives_logits)

    def build_head_scheme(self, num_heads: int, head_dim: int, value_dim: int | None = None,
                          embed_dim: int | None = None, layer_index: int = 0,
                          bias: bool = True) -> HeadScheme | None:
        if self.head_scheme is None:
            return None
        return HEAD_SCHEMES[self.head_scheme](self.head_options, num_heads, head_dim, value_dim,
                                              embed_dim, layer_index, bias)

    def for_decoder(self, fallback: AttentionSpec | Mapping[str, Any] | str = "unas") -> AttentionSpec:
        """The spec for the decoder of a task that applies this spec to its encoder.

        A scheme that normalizes over keys (unas, entmax, ...) is valid in a decoder and stays.
        A query-normalized one (dnas/hnas/sinkhorn) stays in the encoder and the decoder gets
        `fallback`. A logit transform (coda, realformer) runs in every stack of the papers'
        Transformers: its decoder copy normalizes with UNAS when its normalization is
        query-normalized. An explicit non-UNAS `fallback`, or `model.decoder=false`, wins.
        """
        fallback = AttentionSpec.from_config(fallback)
        if fallback.scheme != "unas" or not self.decoder:
            return fallback.with_gate(self.gate)
        if not self.normalizes_over_queries:
            return self
        if self.structure_class is not None:
            opts = {k: v for k, v in self.options.items() if k in option_names(self.structure_class.Options)}
            return AttentionSpec(self.scheme, normalization="unas", gate=self.gate, **opts)
        return fallback.with_gate(self.gate)

    def with_gate(self, gate: str | None) -> AttentionSpec:
        """This spec with the output gate `gate` where it has none (the gate is the model's,
        wherever its scheme goes: a decoder's fallback keeps the encoder's gate)."""
        if gate is None or self.gate is not None:
            return self
        return AttentionSpec.from_config({**self.to_dict(), "gate": gate})

    # -- conversions
    @classmethod
    def from_config(cls, cfg: AttentionSpec | Mapping[str, Any] | str | None) -> AttentionSpec:
        """Build from a spec, a scheme name, or a (Dict)Config such as the composed `model` group."""
        if cfg is None:
            return cls()
        if isinstance(cfg, cls):
            return cfg
        if isinstance(cfg, str):
            return cls(scheme=cfg)
        try:  # OmegaConf DictConfig -> plain dict, resolving interpolations
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:  # pragma: no cover - omegaconf is a dependency
            pass
        data = {k: v for k, v in dict(cfg).items() if k not in NOT_OPTIONS}
        return cls(**data)

    def to_dict(self) -> dict:
        """Plain dict that `from_config` turns back into this spec (for hparams)."""
        out: dict[str, Any] = {"scheme": self.scheme, **self.options, "decoder": self.decoder}
        if self.structure_class is not None:
            out["normalization"] = self.normalization
        if self.gate is not None:
            out["gate"] = self.gate
        if self.normalization_options:
            out["normalization_options"] = dict(self.normalization_options)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AttentionSpec) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "scheme")
        return f"AttentionSpec({self.scheme!r}{', ' + opts if opts else ''})"

