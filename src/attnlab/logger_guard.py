"""A logger that fails (W&B dir not writable, disk full, a dead service) must not end the run.

`guard(loggers)` gives each logger a subclass of its own class (so every `isinstance` check in
Lightning and in attnlab.loggers still holds) whose methods catch any exception: the first one is
reported once as a warning, the logger is switched off, and training goes on with the others;
metrics.json and checkpoints do not depend on loggers. Calls on the logger's `experiment`
(W&B run, TensorBoard writer, which analysis callbacks use directly) are guarded the same way.
"""

from __future__ import annotations

import inspect
from typing import Any

from pytorch_lightning.loggers.logger import DummyExperiment
from pytorch_lightning.utilities import rank_zero_warn

# What Lightning (and the runner) call on a logger.
METHODS = ("log_metrics", "log_hyperparams", "log_graph", "save", "finalize", "after_save_checkpoint")
_CLASSES: dict[type, type] = {}


def guard(loggers: list) -> list:
    for logger in loggers:
        if not getattr(logger, "_attnlab_guarded", False):
            logger.__class__ = _guarded_class(type(logger))
    return loggers


def failed(logger) -> bool:
    return getattr(logger, "_attnlab_failure", None) is not None


def alive(loggers: list) -> list:
    return [logger for logger in loggers if not failed(logger)]


def _fail(logger, where: str, exc: Exception) -> None:
    logger._attnlab_failure = f"{where}: {type(exc).__name__}: {exc}"
    rank_zero_warn(f"[attnlab] logger {type(logger).__name__} failed in {where} ({type(exc).__name__}: {exc}); "
                   f"training goes on without it (metrics.json and checkpoints are still written)")


def _guarded_method(cls: type, name: str):
    original = getattr(cls, name)

    def method(self, *args, **kwargs):
        if failed(self):
            return None
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - whatever a logging backend raises
            _fail(self, name, exc)
            return None

    method.__name__ = name
    return method


class _GuardedExperiment:
    """The logger's experiment object, with its method calls guarded."""

    def __init__(self, experiment: Any, logger) -> None:
        self._experiment, self._logger = experiment, logger

    def __getattr__(self, name: str):
        value = getattr(self._experiment, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            if failed(self._logger):
                return None
            try:
                return value(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                _fail(self._logger, f"experiment.{name}", exc)
                return None

        return call


def _guarded_class(cls: type) -> type:
    if cls in _CLASSES:
        return _CLASSES[cls]
    namespace: dict[str, Any] = {"_attnlab_guarded": True, "_attnlab_failure": None}
    for name in METHODS:
        if hasattr(cls, name):
            namespace[name] = _guarded_method(cls, name)
    prop = inspect.getattr_static(cls, "experiment", None)
    if isinstance(prop, property):

        def experiment(self):
            if failed(self):
                return DummyExperiment()
            try:
                return _GuardedExperiment(prop.fget(self), self)
            except Exception as exc:  # noqa: BLE001
                _fail(self, "experiment", exc)
                return DummyExperiment()

        namespace["experiment"] = property(experiment)
    # the same __name__ (code that tests type(logger).__name__ still works); pickled by reference
    # to this module under a name of its own
    guarded = type(cls.__name__, (cls,), namespace)
    guarded.__module__, guarded.__qualname__ = __name__, f"Guarded{cls.__name__}"
    globals()[guarded.__qualname__] = guarded
    _CLASSES[cls] = guarded
    return guarded
