"""A file a user hands attnlab is data, never code.

- What a checkpoint holds: tensors and plain containers only (`plain_data`, applied by
  `checkpoints.AtomicCheckpointIO` to everything it writes), so every load is
  `torch.load(weights_only=True)`, which unpickles no Python object and so runs nothing from the
  file; a file that needs unpickling is refused in one line naming `trust_checkpoint=true`
  (`needs_unpickling`, `untrusted_message`).
- What a run config read from disk may build: `check_targets` refuses, before anything is built,
  a `_target_` that is not a class of attnlab, its tasks, torch's optimizers and schedulers or
  Lightning, or a function of the LR schedules (`ALLOWED_PACKAGES`, `ALLOWED_FUNCTIONS`).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from attnlab.errors import ConfigError

# what torch.load(weights_only=True) reads as it is
_PLAIN = (torch.Tensor, str, bytes, int, float, bool, type(None), torch.dtype, torch.device)


def plain_data(value: Any) -> Any:
    """`value` as tensors and plain containers (dict, list, tuple, numbers, strings, None), which
    `torch.load(weights_only=True)` reads: a config (DictConfig) as a dict, a partial (the
    optimizer Hydra built) as its config node {"_target_": ..., "_partial_": true, ...}, numpy
    values as tensors or numbers, a function or class as {"_target_": its name}, anything else
    as its repr. Copy on write: a container that holds plain data only is returned as it is (a
    state dict keeps its type and its `_metadata`)."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return plain_data(OmegaConf.to_container(value, resolve=True))
    if isinstance(value, functools.partial):
        node: dict[str, Any] = {"_target_": _dotted(value.func), "_partial_": True}
        if value.args:
            node["_args_"] = plain_data(list(value.args))
        return {**node, **plain_data(dict(value.keywords))}
    if isinstance(value, dict):
        items = {k: plain_data(v) for k, v in value.items()}
        if type(value) in (dict, OrderedDict) and all(items[k] is value[k] for k in value):
            return value
        copy = OrderedDict(items) if isinstance(value, OrderedDict) else items
        if hasattr(value, "_metadata"):  # a module's state dict: the versions its loading reads
            copy._metadata = value._metadata
        return copy
    if isinstance(value, (list, tuple)):
        items = [plain_data(v) for v in value]
        if type(value) in (list, tuple) and all(a is b for a, b in zip(items, value)):
            return value
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if callable(value) and hasattr(value, "__qualname__"):
        return {"_target_": _dotted(value)}
    return repr(value)


def _dotted(obj: Any) -> str:
    """`module.QualName` of a function or class (a Hydra partial records the one it resolved)."""
    resolved = getattr(obj, "_hydra_resolved_from", None)
    return str(resolved) if resolved else f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"


def needs_unpickling(err: BaseException) -> bool:
    """The error of `torch.load(weights_only=True)` on a file that holds Python objects."""
    return "Weights only load failed" in str(err)


def untrusted_message(path, key: str, err: BaseException) -> str:
    found = re.search(r"GLOBAL ([\w.]+)", str(err)) or re.search(r"global: ([\w.]+)", str(err))
    what = f" ({found.group(1)})" if found else ""
    return (f"{key}={path} holds pickled Python objects{what}, and loading them would run code from "
            f"the file; attnlab's own checkpoints hold tensors and plain data only. If you trust "
            f"whoever wrote it, load it with trust_checkpoint=true")


# what a run config read from a checkpoint's folder may instantiate: classes of attnlab and its
# tasks (models, data, callbacks, the rest of a run), of torch's and pytorch_optimizer's (LAMB)
# optimizers and schedulers, and of Lightning (trainer, callbacks, loggers, plugins); functions
# only of these modules (the LR schedules, FSDP's wrap policy)
ALLOWED_PACKAGES = ("attnlab.", "tasks.", "torch.optim.", "pytorch_optimizer.", "pytorch_lightning.",
                    "lightning.pytorch.", "lightning_fabric.")
ALLOWED_FUNCTIONS = ("tasks.common.optim.", "attnlab.fsdp.")


def check_targets(config: DictConfig, where, node: str | None = None) -> None:
    """Every `_target_` of a config read from disk (or of its `node`, what will be built of it:
    eval builds the run's `task`) must be one attnlab runs: a class of `ALLOWED_PACKAGES`, or a
    function of `ALLOWED_FUNCTIONS`; anything else (a stranger's `torch.load`, `os.system`, a
    file-writing helper) is refused in one line naming the key, before any is built."""
    try:
        plain = OmegaConf.to_container(config, resolve=True)
    except Exception as err:  # noqa: BLE001 - an interpolation it cannot resolve: not ours either
        raise ConfigError(f"{where}: cannot be read as a run's config ({type(err).__name__}: "
                          f"{str(err).splitlines()[0]}); use the config the run wrote") from None
    if node is not None:
        plain = {node: plain.get(node)} if isinstance(plain, dict) else {}
    for key, target in _targets(plain, ""):
        ok = target.startswith(ALLOWED_PACKAGES)
        if ok:
            try:
                obj = get_object(target)  # imports its module: one of the allowed packages'
            except (ImportError, AttributeError, ValueError):  # building it will say it does not exist
                continue
            ok = isinstance(obj, type) or (inspect.isfunction(obj) and target.startswith(ALLOWED_FUNCTIONS))
        if not ok:
            raise ConfigError(
                f"{where}: {key.lstrip('.')}._target_={target} is not a class attnlab builds (its "
                f"models, data, callbacks; torch optimizers and schedulers; Lightning's parts), so "
                f"this config is not run: use the config the run wrote, or pass task=<its task> "
                f"with the checkpoint outside its run folder")


def _targets(node: Any, key: str):
    """(key, target) of every `_target_` in plain containers (dicts and lists, all levels)."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield key, str(node["_target_"])
        for name, child in node.items():
            yield from _targets(child, f"{key}.{name}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _targets(child, f"{key}[{i}]")
