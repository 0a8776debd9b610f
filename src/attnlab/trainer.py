"""The Lightning Trainer of a run, an eval or a calibration pass, from the config's `trainer`
node (one place: train.py's runner, eval.py's evaluation and diagnose all build it here)."""

from __future__ import annotations

import hydra
import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from omegaconf import DictConfig

from attnlab.errors import ConfigError, trainer_key, user_error_message


def build_trainer(cfg: DictConfig, **kwargs) -> pl.Trainer:
    """The Trainer; Lightning's own ValueErrors about its arguments are configuration errors."""
    try:
        return hydra.utils.instantiate(cfg.trainer, **kwargs)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, (ValueError, TypeError)) and user_error_message(exc) is None:
            overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
            raise ConfigError(f"{trainer_key(str(exc.__cause__), overrides)}: {exc.__cause__}") from exc
        raise
