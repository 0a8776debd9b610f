"""A task's LightningModule built as train.py builds it, for tests that construct one directly."""

from __future__ import annotations

from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from attnlab.checkpoints import set_by_name
from attnlab.task_module import TaskModule, build_module
from helpers.paths import CONF


def task_module(task: str, attention: Any, data: dict | None = None, **options: Any) -> TaskModule:
    """conf/task/<task>.yaml's module node with `attention` as the network's scheme and each of
    `options` set by name wherever the node has it (`lr` -> optimizer.lr, `d_model` -> net.d_model),
    built with the data's sizes `data` (datamodule.model_kwargs()) and the options the node does not
    list (e.g. vocab_size), which go where the constructors take them. A dotted name is a key of
    the node: `**{"optimizer._target_": "pytorch_optimizer.Lamb"}`."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"task={task}", "logger=none"])
    node = OmegaConf.create(OmegaConf.to_container(cfg.task.module, resolve=True))
    node.net.attention = attention
    dotted = {k: v for k, v in options.items() if "." in k}  # e.g. "optimizer._target_"
    for key, value in dotted.items():
        OmegaConf.update(node, key, value)
    options = {k: v for k, v in options.items() if k not in dotted}
    used = set_by_name(node, options)
    return build_module(node, {**(data or {}), **{k: v for k, v in options.items() if k not in used}})
