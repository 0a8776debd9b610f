"""Which claims there are: the library's own, and each task's own, named by the task's card.

A library claim is a module of this package (`LIBRARY`, in report order); the tasks that enter it
list its name in their card (`task.card.reproduce.claims: [explaining_away, ...]`). A claim that
only one task can make lives in that task (e.g. `tasks/vqa/claim.py`) and its card lists the
module's import path (`tasks.vqa.claim`): it is imported by name here, at run time, so that no
import runs from the library into `tasks/`. A task's claim is reported right after the library
claim its card lists before it. Each claim module has NAME, TITLE, PAPER, CLAIM, `runs(plan)` and
`evaluate(plan, results, out_dir)`; one that plans its seeds from a pilot (the length claims) also
has `more_runs(plan, results)`: the runs it asks for once the first ones are in.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from attnlab.cards import Card, task_cards
from attnlab.errors import ConfigError

LIBRARY = ("mode_collapse", "explaining_away", "hnas_u", "coda_diversity", "repulsive_diversity",
           "length_ssmax", "length_stickbreaking", "length_gate", "sinks_softpick", "sinks_gate",
           "lowbit_kurtosis")


def is_task_claim(entry: str) -> bool:
    """A card's claims entry that is a module path (tasks.<name>.claim), not a library claim."""
    return "." in entry


def claim_order(cards: dict[str, Card]) -> list[str]:
    """Library claim names and task claim module paths, in report order."""
    order = list(LIBRARY)
    for card in cards.values():
        for i, entry in enumerate(card.claims):
            if not is_task_claim(entry):
                if entry not in LIBRARY:
                    raise ConfigError(f"conf/task/{card.name}.yaml: task.card.reproduce.claims names "
                                      f"{entry!r}, no claim; use one of {', '.join(LIBRARY)} or a "
                                      f"task's claim module such as tasks.{card.name}.claim")
                continue
            if entry in order:
                continue
            before = [order.index(e) for e in card.claims[:i] if e in order]
            order.insert(max(before, default=len(order) - 1) + 1, entry)
    return order


def load(entry: str) -> ModuleType:
    if not is_task_claim(entry):
        return importlib.import_module(f"attnlab.study.reproduce.{entry}")
    try:
        return importlib.import_module(entry)
    except ModuleNotFoundError as err:
        raise ConfigError(f"a task card names the claim module {entry!r}, which cannot be imported "
                          f"({err}); fix task.card.reproduce.claims or add that module") from None


def claims(conf_dir: Path | str | None = None) -> dict[str, ModuleType]:
    """{claim name: its module}, in report order, for the tasks of `conf_dir` (default: the
    checkout's conf/)."""
    found: dict[str, ModuleType] = {}
    for module in (load(entry) for entry in claim_order(task_cards(conf_dir))):
        if module.NAME in found:
            raise ConfigError(f"{module.__name__} and {found[module.NAME].__name__} are both the claim "
                              f"{module.NAME!r}; rename one (its NAME)")
        found[module.NAME] = module
    return found
