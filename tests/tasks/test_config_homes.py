"""One home per value: a value the runs use is written in one place, so that no copy can drift.

- A task class's Python default is its task YAML's value. For every `_target_` node under `task:`
  in each conf/task/<name>.yaml (discovered from the folder, nothing lists the tasks) whose class is
  the project's (tasks.*, attnlab.*), every constructor argument with a Python default that the
  YAML names must have that default as its YAML value (arguments the YAML does not name are the
  data's: test_task_configs.py). An interpolated YAML value is followed through the file's own
  `task:` node (`max_length: ${task.data.max_length}` -> `task.data.max_length: 64`, chains too)
  and compared there. A value the task's node does not hold itself (`${seed}`, `${model}`,
  `${paths.data_dir}/...`, `${probe.n_train}`: other configs' keys, which other groups and files
  change) and a `_target_` node (the scheduler's partial) leave the default nothing to agree with:
  the class must take no default for that argument.
- Model configs (conf/model/*.yaml) hold their own values only, no interpolation: a task's
  defaults for the schemes' options are written into the `model` node by the task's own config
  (docs/architecture.md, "Hydra composition").
- conf/train.yaml and conf/eval.yaml write no key alike: what they share is conf/common.yaml.
"""

from __future__ import annotations

import re

import pytest
from helpers.paths import CONF
from helpers.signatures import constructor_parameters, target_nodes
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

TASKS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
REFERENCE = re.compile(r"\$\{([\w.]+)\}")  # a whole value that is one key of the config


class NoHome(str):
    """Why a YAML value is not a value of the task's file (the class must then have no default)."""


def yaml_value(raw: DictConfig, node: DictConfig, key: str):
    """The value the task's file gives `node[key]`: followed through `${task.a.b}` references
    within the file's `task:` node; a `NoHome` when that node does not hold it itself."""
    seen = []
    while OmegaConf.is_interpolation(node, key):
        text = node._get_node(key)._value()
        match = REFERENCE.fullmatch(text)
        if not match or match.group(1) in seen or not match.group(1).startswith("task."):
            return NoHome(text)
        seen.append(match.group(1))
        parent, _, key = match.group(1).rpartition(".")
        node = OmegaConf.select(raw, parent, default=None) if parent else raw
        if not isinstance(node, DictConfig) or key not in node:
            return NoHome(f"{text} (not in the task's file)")
    value = node._get_node(key)
    if isinstance(value, DictConfig) and "_target_" in value:
        return NoHome(f"a {value._target_} node")
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
        if "${" in repr(value):
            return NoHome(repr(value))
        return value
    return node[key]


def plain(value):
    """Tuples as lists (a Python default (0.8, 0.1, 0.1) is the YAML's [0.8, 0.1, 0.1])."""
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def same(default, value) -> bool:
    default, value = plain(default), plain(value)
    if isinstance(default, bool) or isinstance(value, bool):
        return type(default) is type(value) and default == value
    if isinstance(default, list) and isinstance(value, list):
        return len(default) == len(value) and all(same(d, v) for d, v in zip(default, value))
    return default == value


def differences(task: str) -> list[str]:
    raw = OmegaConf.load(CONF / "task" / f"{task}.yaml")
    found = []
    for key, node in target_nodes(raw.task):
        target = get_object(node._target_)
        if not target.__module__.startswith(("tasks.", "attnlab.")):
            continue  # torch's optimizers: their own defaults
        for name, param in constructor_parameters(target).items():
            if param.default is param.empty or name not in node:
                continue  # no default, or a value the data give (test_task_configs.py)
            value = yaml_value(raw, node, name)
            where = f"{key}.{name} ({node._target_})"
            if isinstance(value, NoHome):
                found.append(f"{where}: the YAML gives {value}, so the class must take no default "
                             f"(it has {param.default!r})")
            elif not same(param.default, value):
                found.append(f"{where}: Python default {param.default!r}, YAML {value!r}")
    return found


@pytest.mark.parametrize("task", TASKS)
def test_a_task_classs_defaults_are_its_yamls_values(task):
    found = differences(task)
    assert not found, (f"conf/task/{task}.yaml and its classes disagree (the YAML is what runs: "
                       f"align the Python default with it, or remove the default):\n  "
                       + "\n  ".join(found))


def interpolations(node) -> list[str]:
    if isinstance(node, DictConfig):
        return [s for k in node for s in (
            [node._get_node(k)._value()] if OmegaConf.is_interpolation(node, k)
            else interpolations(node.get(k)))]
    if isinstance(node, ListConfig):
        return [s for i in range(len(node)) for s in (
            [node._get_node(i)._value()] if OmegaConf.is_interpolation(node, i)
            else interpolations(node[i]))]
    return []


@pytest.mark.parametrize("model", MODELS)
def test_a_model_config_holds_its_own_values_only(model):
    """A model config that read `task.*` (or any other key) would be a second mechanism beside
    the task's own `model:` node, and would hide which file a run's value came from."""
    found = interpolations(OmegaConf.load(CONF / "model" / f"{model}.yaml"))
    assert not found, (f"conf/model/{model}.yaml reads {found}; a task sets its defaults for a "
                       f"scheme's options in its own `model:` node (docs/architecture.md)")


def written(node: dict, prefix: str = "") -> dict[str, object]:
    """{dotted key: value} of a config's own leaves, as written."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out |= written(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_train_and_eval_configs_write_no_value_twice():
    train, evaluate = (written(OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml")))
                       for name in ("train", "eval"))
    train.pop("defaults"), evaluate.pop("defaults")
    twice = sorted(k for k in set(train) & set(evaluate) if train[k] == evaluate[k])
    assert not twice, (f"conf/train.yaml and conf/eval.yaml both write {twice}: move them to "
                       f"conf/common.yaml")
    for name in ("train", "eval"):
        assert "common" in OmegaConf.load(CONF / f"{name}.yaml").defaults, name
