"""Every constructor argument of the classes the config instantiates, with the class's defaults.

So that `trainer.max_steps=40` or `callbacks.model_checkpoint.every_n_epochs=2` work without
Hydra's `+`, and `--help` and every run's `config.yaml` list them, each `_target_` class named in
`conf/trainer/`, `conf/callbacks/` and `conf/logger/` gets a config node `args/<ClassName>`
(its `_target_` plus every argument with a default: a default that is a dataclass, e.g.
RichProgressBar's `theme`, becomes a `_target_` node of its fields), generated from the
class's signature when the CLI starts (`register`). The group files pull them in under their
node (`- optional /args@model_checkpoint: ModelCheckpoint`) and set only what differs. `optional`:
a config composed without `register` (Hydra's compose API in a test) still composes, with only
the arguments the files list; call `register(conf_dir)` first to get them all.

Generated rather than written out: the nodes follow the installed Lightning version, and a
struct config still refuses a mistyped key (with a did-you-mean, see attnlab.errors).
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import get_class
from omegaconf import OmegaConf

GROUP = "args"
# Groups whose files name the classes to register.
SCANNED_GROUPS = ("trainer", "callbacks", "logger")
# Arguments left out: the runner passes the callbacks= and logger= groups to the Trainer; W&B
# warns about `anonymous` whenever it is passed, and `experiment` is a live object.
EXCLUDED = {"pytorch_lightning.Trainer": {"callbacks", "logger"},
            "pytorch_lightning.loggers.wandb.WandbLogger": {"anonymous", "experiment"}}


def signature_defaults(target: str) -> dict[str, Any]:
    """`_target_` and every keyword argument of `target` whose default YAML can hold."""
    cls = get_class(target)
    excluded = EXCLUDED.get(target, set())
    node: dict[str, Any] = {"_target_": target}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or name in excluded or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is param.empty:
            continue  # required: the group file (or the runner) gives it
        if _yaml_value(param.default):
            node[name] = list(param.default) if isinstance(param.default, tuple) else param.default
        elif _dataclass_node(param.default) is not None:  # callbacks.progress_bar.theme.metrics_format=.4f
            node[name] = _dataclass_node(param.default)
    return node


def _dataclass_node(value: Any) -> dict[str, Any] | None:
    """A dataclass instance as the `_target_` node that builds it again (None: not one, or a field
    YAML cannot hold)."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return None
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    if not all(_yaml_value(v) for v in fields.values()):
        return None
    cls = type(value)
    return {"_target_": f"{cls.__module__}.{cls.__qualname__}", **fields}


def _yaml_value(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_yaml_value(v) for v in value)
    return False


def targets(conf_dir: Path) -> list[str]:
    """Every `_target_` in the scanned groups' files (the trainer, callbacks and loggers)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str) and target not in found:
                found.append(target)
            for value in node.values():
                walk(value)

    for group in SCANNED_GROUPS:
        for path in sorted((Path(conf_dir) / group).glob("*.yaml")):
            walk(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
    return found


def register(conf_dir: Path) -> list[str]:
    """Store `args/<ClassName>` for every scanned target; returns the class names."""
    store = ConfigStore.instance()
    names = []
    for target in targets(conf_dir):
        name = target.rsplit(".", 1)[-1]
        store.store(group=GROUP, name=name, node=signature_defaults(target))
        names.append(name)
    return names
