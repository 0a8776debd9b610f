"""`AttentionSpec`: the attention scheme and its options, as chosen by `model=` in Hydra.

Every task builds its attention modules from one spec (the composed `model` config group), and
decides itself *where* the spec applies; everything else stays `unas`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from attnlab.errors import ConfigError

# Schemes that `attend` implements. Later schemes (coda, realformer) register here too.
SCHEMES = ("unas", "dnas", "hnas", "sinkhorn")
# Schemes that normalize over queries: they see every query, so they cannot sit in a decoder.
QUERY_NORMALIZED = ("dnas", "hnas", "sinkhorn")


@dataclass
class AttentionSpec:
    scheme: str = "unas"
    # HNAS: initial u (weight of DNAS) and whether u is per head or shared by the heads of a layer.
    hybrid_init: float = 0.5
    hybrid_per: str = "head"
    # Sinkhorn: number of alternating normalizations, queries first (1 == dnas).
    n_iter: int = 1
    # Options of schemes added later (CODA, RealFormer, ...), kept as a plain dict.
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scheme = str(self.scheme).lower()
        if self.scheme not in SCHEMES:
            raise ConfigError(
                f"unknown attention scheme {self.scheme!r}; choose one of {', '.join(SCHEMES)} "
                f"(e.g. model=hnas)"
            )
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

    @property
    def normalizes_over_queries(self) -> bool:
        return self.scheme in QUERY_NORMALIZED

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
        extra = {k: v for k, v in data.items() if k not in names and k not in ("name", "_target_")}
        if extra:
            kwargs["options"] = {**extra, **dict(kwargs.get("options") or {})}
        return cls(**kwargs)

    def to_dict(self) -> dict:
        return asdict(self)
