"""attnlab.config_schema knows no task: its table holds only the option names tasks share, and a
task's own options are checked by the ranges its classes declare (`option_rules`). The errors
they give are cases of tests/e2e/test_cli_errors.py (VQA's max_boxes and glimpses, MLM's
mask_rate, the seq2seq beam_size)."""

import re

import pytest
from helpers.cards import CARDS
from helpers.paths import CONF, ROOT
from helpers.signatures import constructor_arguments
from hydra import compose, initialize_config_dir
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from attnlab import config_schema
from attnlab.errors import ConfigError


def targets(node) -> list:
    """The classes (or functions) of every `_target_` node under `node`."""
    if not isinstance(node, DictConfig):
        return []
    found = [get_object(node._target_)] if "_target_" in node else []
    for key in node:
        if not OmegaConf.is_interpolation(node, key):
            found += targets(node.get(key))
    return found


@pytest.fixture(scope="module")
def task_classes() -> dict[str, list]:
    """{task: the classes its composed config instantiates under task.}"""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return {task: targets(compose("train", overrides=[f"task={task}", "logger=none"]).task)
                for task in CARDS}


def test_the_shared_table_holds_only_names_several_tasks_take(task_classes):
    users = {task: set().union(*(constructor_arguments(c) for c in classes)) for task, classes in task_classes.items()}
    for patterns, _ in config_schema.TASK_RULES:
        for name in (p for p in patterns if not any(c in p for c in "*?[")):
            takers = sorted(t for t, names in users.items() if name in names)
            assert len(takers) >= 2, (f"{name}: an option of {takers} only; it belongs in that "
                                      f"task's class's option_rules, not in config_schema")


def test_every_option_rule_names_an_argument_of_its_class(task_classes):
    classes = {c for found in task_classes.values() for c in found}
    with_rules = [c for c in classes if getattr(c, "option_rules", None)]
    assert len(with_rules) >= 3  # VQA's datamodule and network, MLM's datamodule, the seq2seq module
    for cls in with_rules:
        assert set(cls.option_rules) <= constructor_arguments(cls), cls


def test_config_schema_names_no_task_nor_a_tasks_own_option(task_classes):
    source = (ROOT / "src" / "attnlab" / "config_schema.py").read_text()
    words = set(re.findall(r"[A-Za-z_]+", source))
    own = {n for found in task_classes.values() for c in found for n in getattr(c, "option_rules", {})}
    assert not (set(CARDS) | own) & words, (set(CARDS) | own) & words


def test_a_class_rule_fires_and_names_the_users_key(tmp_path):
    """The same check without the CLI: VQA's max_boxes, typed as task.max_boxes."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["task.max_boxes=0", "logger=none", f"paths.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^task\.max_boxes=0: expected an integer >= 1 .*task\.max_boxes=100$"):
        config_schema.validate(cfg)
    assert config_schema.task_rule("max_boxes") is None  # VQA's own: the library has no rule for it
