"""`AttentionSpec`: the attention scheme and its options, as chosen by `model=` in Hydra.

Every task builds its attention modules from one spec (the composed `model` config group), and
decides itself *where* the spec applies; everything else stays `unas`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from attnlab.errors import ConfigError

# Schemes that `attend` implements.
SCHEMES = ("unas", "dnas", "hnas", "sinkhorn")
# Schemes that pass attention logits from layer to layer of a stack (attention/cascade.py): they
# need their module (MultiHeadAttention), so `attend` does not offer them. Their logits are then
# normalized by `normalization` (unas by default).
CASCADE_SCHEMES = ("coda", "realformer")
# Schemes that normalize over queries: they see every query, so they cannot sit in a decoder.
QUERY_NORMALIZED = ("dnas", "hnas", "sinkhorn")
# What a cascade scheme may normalize its logits with.
CASCADE_NORMALIZATIONS = ("unas", "dnas", "hnas")


@dataclass
class AttentionSpec:
    scheme: str = "unas"
    # HNAS: initial u (weight of DNAS) and whether u is per head or shared by the heads of a layer.
    hybrid_init: float = 0.5
    hybrid_per: str = "head"
    # Sinkhorn: number of alternating normalizations, queries first (1 == dnas).
    n_iter: int = 1
    # How the weights are normalized: the scheme itself for unas/dnas/hnas/sinkhorn; for a cascade
    # scheme (coda, realformer) one of CASCADE_NORMALIZATIONS applied to its logits (default unas).
    normalization: str | None = None
    # Options of schemes added later (CODA, RealFormer, ...), kept as a plain dict.
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scheme = str(self.scheme).lower()
        if self.scheme not in SCHEMES + CASCADE_SCHEMES:
            raise ConfigError(
                f"unknown attention scheme {self.scheme!r}; choose one of "
                f"{', '.join(SCHEMES + CASCADE_SCHEMES)} (e.g. model=hnas)"
            )
        self._check_normalization()
        if not 0.0 <= float(self.hybrid_init) <= 1.0:
            raise ConfigError(
                f"model.hybrid_init={self.hybrid_init} is outside [0, 1]; u is the weight of DNAS "
                f"in HNAS, e.g. model.hybrid_init=0.5"
            )
        if self.hybrid_per not in ("head", "layer"):
            raise ConfigError(
                f"model.hybrid_per={self.hybrid_per!r}; use 'head' (one u per head) or 'layer'"
            )
        if int(self.n_iter) < 1:
            raise ConfigError(f"model.n_iter={self.n_iter} must be >= 1 (1 equals dnas)")
        self.hybrid_init = float(self.hybrid_init)
        self.n_iter = int(self.n_iter)

    def _check_normalization(self) -> None:
        norm = None if self.normalization is None else str(self.normalization).lower()
        if self.scheme not in CASCADE_SCHEMES:
            if norm not in (None, self.scheme):
                raise ConfigError(
                    f"model.normalization={norm} only applies to cascade schemes "
                    f"({', '.join(CASCADE_SCHEMES)}); model={self.scheme} normalizes as {self.scheme}"
                )
            self.normalization = self.scheme
        elif norm is None:
            self.normalization = "unas"
        elif norm not in CASCADE_NORMALIZATIONS:
            raise ConfigError(
                f"model.normalization={norm}: {self.scheme} normalizes its logits with one of "
                f"{', '.join(CASCADE_NORMALIZATIONS)} (dnas/hnas in encoders only)"
            )
        else:
            self.normalization = norm

    @property
    def normalizes_over_queries(self) -> bool:
        return self.normalization in QUERY_NORMALIZED

    @property
    def cascades(self) -> bool:
        """True for schemes whose logits flow from layer to layer (coda, realformer)."""
        return self.scheme in CASCADE_SCHEMES

    def for_decoder(self, fallback: AttentionSpec | Mapping[str, Any] | str = "unas") -> AttentionSpec:
        """The spec for the decoder of a task that applies this spec to its encoder.

        Normalization schemes (dnas/hnas/sinkhorn) stay in the encoder: the decoder gets `fallback`
        (the task's decoder attention, unas). Cascade schemes (coda, realformer) replace a UNAS
        fallback, as they run in every stack of the papers' Transformers, unless
        `model.decoder=false`; their decoder copy normalizes with UNAS (query normalization would
        leak the future).
        """
        fallback = AttentionSpec.from_config(fallback)
        if self.cascades and bool(self.options.get("decoder", True)) and fallback.scheme == "unas":
            return replace(self, normalization="unas", options=dict(self.options))
        return fallback

    @classmethod
    def from_config(cls, cfg: AttentionSpec | Mapping[str, Any] | str | None) -> AttentionSpec:
        """Build from a spec, a scheme name, or a (Dict)Config such as the composed `model` group.

        Keys that are not fields (e.g. `name`, a display name for output dirs) are ignored;
        unknown option keys of later schemes go to `options`.
        """
        if cfg is None:
            return cls()
        if isinstance(cls, type) and isinstance(cfg, cls):
            return cfg
        if isinstance(cfg, str):
            return cls(scheme=cfg)
        try:  # OmegaConf DictConfig -> plain dict, resolving interpolations
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:  # pragma: no cover - omegaconf is a dependency
            pass
        data = dict(cfg)
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        # `callbacks`: training rules a model config brings along (e.g. model=repulsive), which
        # the runner instantiates; they are not options of the attention scheme.
        ignored = ("name", "_target_", "callbacks")
        extra = {k: v for k, v in data.items() if k not in names and k not in ignored}
        if extra:
            kwargs["options"] = {**extra, **dict(kwargs.get("options") or {})}
        return cls(**kwargs)

    def to_dict(self) -> dict:
        return asdict(self)
