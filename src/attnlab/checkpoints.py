"""Checkpoint files: written atomically, and checked before a run trusts them.

`AtomicCheckpointIO` (set in conf/trainer/default.yaml) writes each checkpoint to a hidden
`.<name>.partial` file in the checkpoint's own folder, fsyncs it and renames it over the old one:
a kill at any moment leaves either the previous complete file or the new one. (Lightning's
default goes through fsspec, which writes to the system temp dir and moves the file: a copy,
not a rename, when /tmp is another filesystem.)

**A checkpoint is data, not code** (attnlab.trust): what attnlab writes holds tensors and plain
containers only, so every load is `torch.load(weights_only=True)`; a checkpoint that needs
unpickling (one written before this, or by anyone else) is refused in one line naming
`trust_checkpoint=true`, the opt-in that loads it as before. A run's config is read only from the
checkpoint's own run folder (`<run>/checkpoints/x.ckpt` -> `<run>/config.yaml`), and what eval
builds of it passes `trust.check_targets` first.

`read` / `check_run` / `check_fits` turn a missing file, a directory, a truncated or corrupt file,
or a checkpoint of another task or model into one ConfigError/DataError naming the file.

Checkpoints and run configs written before the task modules took their network injected (commit
a62c79e and earlier) still load: `upgrade_state_dict` moves the weights from `model.*` to `net.*`,
and `upgrade_module_config` rebuilds a run's flat `task.module` node in today's nested layout and
gives an older config the arguments its task's classes no longer have defaults for.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
import yaml
from hydra.utils import get_object
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf

from attnlab.errors import ConfigError, DataError, require_file
from attnlab.files import atomic_write
from attnlab.trust import needs_unpickling, plain_data, untrusted_message

# the attribute that held a task module's network before it was injected as `net`
OLD_NETWORK_PREFIX = "model."


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        checkpoint = plain_data(checkpoint)  # loads with weights_only=True
        if "://" in str(path):  # remote storage: fsspec's own transaction
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        with atomic_write(path, partial=f".{path.name}.partial") as f:
            torch.save(checkpoint, f)


def read(path, key: str = "ckpt_path", trust: bool = False) -> dict:
    """The checkpoint (tensors memory-mapped, cheap), loaded weights-only, or one DataError naming
    what is wrong. `trust` (`trust_checkpoint=true`): unpickle what it holds, as torch.load did
    before weights_only, for a checkpoint from someone the user trusts."""
    path = require_file(path, key, example=f"{key}=outputs/<task>/<model>/<run>/checkpoints/last.ckpt")
    with open(path, "rb") as f:
        head = f.read(2)
    detail = "the file is empty" if not head else "neither a zip archive nor a pickle"
    # torch's zip format, memory-mapped (cheap) and else read (a damaged one says why), or a pickle
    attempts = (True, False) if head == b"PK" else (False,) if head[:1] == b"\x80" else ()
    for mmap in attempts:
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=not trust, mmap=mmap)
        except Exception as err:  # noqa: BLE001 - zip, pickle, EOF errors: all mean the same here
            if needs_unpickling(err):
                raise DataError(untrusted_message(path, key, err)) from None
            detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        else:
            detail = None
            break
    if detail is not None:
        raise DataError(
            f"{key}={path} is not a readable checkpoint (truncated or corrupt: {detail}); use "
            f"another one{_siblings(path)}"
        )
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise DataError(f"{key}={path} is not a Lightning checkpoint (no state_dict); give a .ckpt "
                        f"written by train.py{_siblings(path)}")
    return ckpt


# ----------------------------------------------------------------------------- resuming
def newest_last(root: Path) -> Path | None:
    """The newest `<root>/<run>/checkpoints/last.ckpt` (by modification time), or None."""
    found = sorted(Path(root).glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def resume_dir(new_run_dir: str, ckpt_path: str | None) -> str:
    """Hydra's run dir (conf/hydra/default.yaml: `${resume_dir:<a new run's dir>,${ckpt_path}}`):
    a run resumed from a checkpoint of a run folder (`<run>/checkpoints/x.ckpt`, or
    `ckpt_path=last`: the newest last.ckpt of the task and model, the new dir's siblings) runs in
    that folder, so that its log, checkpoints and metrics join the run's and no folder holding
    only `.hydra/` and a log is left behind; any other run gets `new_run_dir`."""
    if ckpt_path in (None, "", "None"):
        return new_run_dir
    ckpt = newest_last(Path(new_run_dir).parent) if str(ckpt_path) == "last" else Path(str(ckpt_path))
    if ckpt is not None and ckpt.parent.name == "checkpoints" and ckpt.is_file() \
            and (ckpt.parent.parent / "config.yaml").is_file():
        return str(ckpt.parent.parent)
    return new_run_dir


def resume_subdir(ckpt_path: str | None, now: str) -> str:
    """Where Hydra writes the invocation's configs: `.hydra`, and for a resume `.hydra/resume-<time>`
    (the run's own `.hydra` stays as the run began)."""
    return ".hydra" if ckpt_path in (None, "", "None") else f".hydra/resume-{now}"


def register_resolvers() -> None:
    """`resume_dir` and `resume_subdir` for the Hydra config (attnlab.cli registers them)."""
    OmegaConf.register_new_resolver("resume_dir", resume_dir, replace=True)
    OmegaConf.register_new_resolver("resume_subdir", resume_subdir, replace=True)


def _siblings(path: Path) -> str:
    others = sorted(p.name for p in path.parent.glob("*.ckpt") if p != path)
    return f", e.g. one of {', '.join(others)} in {path.parent}" if others else ""


def run_config_file(path) -> Path | None:
    """The config file of the run that wrote the checkpoint: its own run folder's
    (`<run>/checkpoints/x.ckpt` -> `<run>/config.yaml`, else Hydra's `<run>/.hydra/config.yaml`);
    None for a checkpoint outside a run's `checkpoints/` folder (no other folder is trusted to
    say how to build its model)."""
    path = Path(path)
    if path.parent.name != "checkpoints":
        return None
    return next((f for f in (path.parent.parent / "config.yaml", path.parent.parent / ".hydra" / "config.yaml")
                 if f.is_file()), None)


def run_config(path) -> Any | None:
    """The composed config of the run that wrote the checkpoint (`run_config_file`), as data:
    before building anything of it, `check_targets`."""
    file = run_config_file(path)
    return None if file is None else OmegaConf.load(file)


def task_argument(argv: list[str]) -> list[str]:
    """`["task=<name>"]` for `eval.py ckpt_path=<run>/checkpoints/x.ckpt ...` given without `task=`:
    Hydra composes eval.yaml's default task before anyone reads the checkpoint, so an override of
    a key only the checkpoint's task has (`task.eval_lengths=[1,4]` of task=lm) would not compose.
    The task is the name in the checkpoint's own run config; [] when that is unknown (then
    `evaluate` says what is wrong with the checkpoint) or when task= is given."""
    if any(a.split("=", 1)[0].lstrip("+~") == "task" for a in argv):
        return []
    paths = [a.split("=", 1)[1] for a in argv if a.startswith("ckpt_path=")]
    if len(paths) != 1 or "," in paths[0]:
        return []
    file = run_config_file(paths[0])
    try:
        name = None if file is None else OmegaConf.select(OmegaConf.load(file), "task.name")
    except (OSError, ValueError, yaml.YAMLError):  # unreadable: evaluate reports it in one line
        return []
    return [f"task={name}"] if isinstance(name, str) and name.isidentifier() else []


def origin(path, ckpt: dict) -> dict[str, str]:
    """task and model names of the run that wrote the checkpoint, as far as they are known."""
    found: dict[str, str] = {}
    saved = run_config(path)
    if saved is not None:
        found = {k: str(OmegaConf.select(saved, f"{k}.name")) for k in ("task", "model")
                 if OmegaConf.select(saved, f"{k}.name") is not None}
    attention = (ckpt.get("hyper_parameters") or {}).get("attention")
    if "model" not in found and hasattr(attention, "get") and attention.get("name"):
        found["model"] = str(attention.get("name"))
    return found


def check_run(path, ckpt: dict, task: str, model: str) -> None:
    """Resuming needs a checkpoint of the same task and model."""
    theirs = origin(path, ckpt)
    ours = {"task": task, "model": model}
    if any(theirs.get(k, ours[k]) != ours[k] for k in ours):
        was = " ".join(f"{k}={v}" for k, v in theirs.items())
        raise ConfigError(
            f"ckpt_path={path} is a checkpoint of {was}, this run is task={task} model={model}; "
            f"resume it with {was}, or start without ckpt_path"
        )


def check_fits(path, ckpt: dict, module: torch.nn.Module) -> None:
    """The checkpoint's weights must be this module's: same names, same shapes."""
    theirs, ours = upgrade_state_dict(ckpt["state_dict"]), module.state_dict()
    missing = [k for k in ours if k not in theirs]
    unexpected = [k for k in theirs if k not in ours]
    reshaped = [k for k in ours if k in theirs and tuple(theirs[k].shape) != tuple(ours[k].shape)]
    if not (missing or unexpected or reshaped):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} of this model's weights are not in it (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} of its weights are not in this model (e.g. {unexpected[0]})")
    if reshaped:
        k = reshaped[0]
        parts.append(f"{len(reshaped)} have another shape (e.g. {k}: {tuple(theirs[k].shape)} there, "
                     f"{tuple(ours[k].shape)} here)")
    was = " ".join(f"{k}={v}" for k, v in origin(path, ckpt).items())
    raise ConfigError(
        f"ckpt_path={path} does not fit this model: {'; '.join(parts)}; resume with the task and "
        f"model options it was trained with{f' ({was})' if was else ''}, or start without ckpt_path"
    )


# ----------------------------------------------------------------------------- older layouts
def upgrade_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A task module's weights under today's names: `model.*` (the network as the module built it
    itself) becomes `net.*` (the injected network). Today's checkpoints are returned as they are."""
    if not any(k.startswith(OLD_NETWORK_PREFIX) for k in state_dict):
        return state_dict
    return {("net." + k[len(OLD_NETWORK_PREFIX):] if k.startswith(OLD_NETWORK_PREFIX) else k): v
            for k, v in state_dict.items()}


def upgrade_module_config(saved: DictConfig, conf_dir: Path) -> DictConfig:
    """A run config whose `task.module` is flat (before the injected network and optimizer)
    rebuilt in today's layout: the task's current module node (conf/task/<name>.yaml) with every
    option set from the old option of the same name (`lr` -> `optimizer.lr`, `d_model` ->
    `net.d_model`, ...), resolved against the old run's config. A `task.module.hybrid_lr` (the
    learning rate of HNAS's u before every scheme had `model.param_lr`) is dropped: evaluation
    does not train. Then `fill_required_arguments`. Today's configs pass unchanged."""
    return fill_required_arguments(_upgrade_flat_module(saved, conf_dir), conf_dir)


def _upgrade_flat_module(saved: DictConfig, conf_dir: Path) -> DictConfig:
    module = OmegaConf.select(saved, "task.module")
    if module is not None and "hybrid_lr" in module:
        saved = OmegaConf.create(OmegaConf.to_container(saved, resolve=False))
        del saved.task.module["hybrid_lr"]
        module = saved.task.module
    if module is None or "net" in module:
        return saved
    path = Path(conf_dir) / "task" / f"{saved.task.name}.yaml"
    current = OmegaConf.select(OmegaConf.load(require_file(path, "task")), "task.module")
    if current is None or "net" not in current:
        return saved
    set_by_name(current, OmegaConf.to_container(module, resolve=True))
    upgraded = OmegaConf.create(OmegaConf.to_container(saved, resolve=False))
    upgraded.task.module = current
    upgraded.task.module = OmegaConf.create(OmegaConf.to_container(upgraded.task.module, resolve=True))
    return upgraded


def fill_required_arguments(saved: DictConfig, conf_dir: Path) -> DictConfig:
    """A run config from before its task's YAML named an argument that the task's classes take no
    default for today (the YAML is the home of its value: headline's layer style, `activation`,
    `positions`, ..., was the network's defaults until d1d4fbb): the argument from today's
    conf/task/<name>.yaml, which is the value the run was built with. What the saved config
    names, and every config that names all its classes' arguments, passes unchanged."""
    path = Path(conf_dir) / "task" / f"{OmegaConf.select(saved, 'task.name')}.yaml"
    if OmegaConf.select(saved, "task") is None or not path.is_file():
        return saved
    current = OmegaConf.select(OmegaConf.load(path), "task")
    fills = {}
    for key, node in _target_nodes(saved.task, "task"):
        today = OmegaConf.select(current, key.partition(".")[2], default=None) if current else None
        if not isinstance(today, DictConfig) or today.get("_target_") != node._target_:
            continue
        for name in _required_arguments(str(node._target_)):
            if name not in node and name in today:
                fills[f"{key}.{name}"] = today._get_node(name)._value()
    if not fills:
        return saved
    filled = OmegaConf.create(OmegaConf.to_container(saved, resolve=False))
    for key, value in fills.items():
        OmegaConf.update(filled, key, value, merge=False)
    return filled


def _target_nodes(node, key: str):
    """(key, node) of every `_target_` node under `node` (interpolations not followed)."""
    if isinstance(node, DictConfig):
        if "_target_" in node:
            yield key, node
        for name in node:
            if not OmegaConf.is_interpolation(node, name):
                yield from _target_nodes(node.get(name), f"{key}.{name}")


def _required_arguments(target: str) -> set[str]:
    """The named arguments without a default of a class (and of its bases where it passes
    **kwargs on) or a function; none when it cannot be imported (building it will say why)."""
    try:
        obj = get_object(target)
    except (ImportError, ValueError, AttributeError):
        return set()
    required: set[str] = set()
    for owner in obj.__mro__ if isinstance(obj, type) else (obj,):
        if isinstance(obj, type) and "__init__" not in vars(owner):
            continue
        params = inspect.signature(owner.__init__ if isinstance(obj, type) else owner).parameters
        required |= {n for n, p in params.items() if n != "self" and p.default is p.empty
                     and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return required


def set_by_name(node: DictConfig, options: dict) -> set[str]:
    """Set every option of a module node (its own, and its injected parts': net, optimizer,
    scheduler) from the flat `options` of the same name; returns the names it used."""
    used = set()
    for key in list(node.keys()):
        child = node._get_node(key)
        if isinstance(child, DictConfig) and "_target_" in child:
            used |= set_by_name(child, options)  # net, optimizer, scheduler: their options by name
        elif key in options and not key.startswith("_"):
            node[key] = options[key]
            used.add(key)
    return used
