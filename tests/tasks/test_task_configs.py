"""Every argument of a task's own classes is in its config: each `_target_` node under `task.`
whose class is the project's (tasks.*, attnlab.*) lists every constructor argument, but those the
data give (`datamodule.model_kwargs()`), so no default hides in a signature where neither
`--help` nor the run's config.yaml shows it."""

import inspect

import hydra
import pytest
from helpers.cards import CARDS, TINY
from helpers.paths import CONF
from helpers.signatures import constructor_arguments, target_nodes
from hydra import compose, initialize_config_dir
from hydra.utils import get_object


def data_given(kwargs: dict) -> set[str]:
    """model_kwargs() keys: flat ones go to the module or its net, `{"net": {...}}` to the net."""
    return {k for k in kwargs if k != "net"} | set(kwargs.get("net", {}))


@pytest.mark.parametrize("task", sorted(CARDS))
def test_every_argument_of_a_tasks_classes_is_in_its_config(task, data_dir, one_thread):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"task={task}", "logger=none", f"paths.data_dir={data_dir}",
                                          *TINY[task]])
    datamodule = hydra.utils.instantiate(cfg.task.datamodule)
    datamodule.prepare_data()
    datamodule.setup("fit")
    given = data_given(datamodule.model_kwargs())
    for key, node in target_nodes(cfg.task):
        target = get_object(node._target_)
        if not target.__module__.startswith(("tasks.", "attnlab.")):
            continue  # torch's optimizers: their own documentation
        # a partial's arguments without a default are the call's: TaskModule gives the scheduler
        # its optimizer and total_steps
        at_call = {n for n, p in inspect.signature(target).parameters.items()
                   if p.default is p.empty} if node.get("_partial_") else set()
        missing = constructor_arguments(target) - set(node) - given - at_call
        assert not missing, f"{key} ({node._target_}): {sorted(missing)} in no config; add them to conf/task/{task}.yaml"
