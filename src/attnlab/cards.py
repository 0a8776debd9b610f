"""Task cards: what the rest of the repository knows about a task, read from its own config.

A task is `tasks/<name>/` plus `conf/task/<name>.yaml`; the YAML's `task.card` node says what tests,
`attnlab.study.reproduce` and the dashboards need to know (tiny test settings, whether the forward gives
class logits, the override that gives it several heads, the claims it enters). Nothing else lists
tasks: they are discovered here, from `conf/task/*.yaml`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.errors import ConfigError

# the checkout's conf/ (train.py sets ATTNLAB_ROOT to its own folder)
CONF_DIR = Path(os.environ.get("ATTNLAB_ROOT", Path(__file__).resolve().parents[2])) / "conf"


@dataclass(frozen=True)
class Card:
    name: str
    optimized_metric: str
    monitor_mode: str
    # the scheme runs in causal attention: query-normalized schemes are refused
    causal: bool = False
    # the forward returns class logits and labels (calibration)
    classification: bool = False
    # overrides that give the attention the scheme applies to >= 2 heads
    multi_head: tuple[str, ...] = ()
    # the config key holding how many of the first attention modules are an encoder's
    encoder_layers: str | None = None
    # overrides that shrink the task to seconds; "{fixtures}" stands for tests/fixtures
    tiny: tuple[str, ...] = ()
    # attnlab.study.reproduce
    claims: tuple[str, ...] = ()
    in_quick: bool = False
    quick: tuple[str, ...] | None = None  # None: the generic quick settings; () none at all
    preset: str | None = None
    # the few metrics (besides optimized_metric) that attnlab.study.report and compare show by default
    metrics: tuple[str, ...] = ()
    # the metrics.json key of the task's trivial baseline (majority class, unigram, chance, lead)
    # on the same split as optimized_metric: a run that does not beat it "did not learn"
    baseline: str | None = None

    def tiny_overrides(self, fixtures: Path | str) -> list[str]:
        return [o.replace("{fixtures}", str(fixtures)) for o in self.tiny]


def read_card(path: Path) -> Card:
    """The card of one `conf/task/<name>.yaml` (read as written: nothing is resolved)."""
    raw = OmegaConf.load(path)
    task = raw.get("task") if "task" in raw else raw  # `@package _global_` or `@package task`
    if task is None or "name" not in task:
        raise ConfigError(f"{path} has no task.name: a task config starts with task: {{name: ...}}")
    card = OmegaConf.to_container(task.get("card") or OmegaConf.create(), resolve=False)  # none: defaults
    reproduce = card.pop("reproduce", None) or {}
    unknown = set(card) - {"classification", "multi_head", "encoder_layers", "tiny", "metrics",
                          "baseline"}
    unknown |= set(reproduce) - {"claims", "in_quick", "quick", "preset"}
    if unknown:
        raise ConfigError(f"{path}: task.card has unknown keys {sorted(unknown)}; see docs/tasks.md")
    return Card(
        name=str(task.name), optimized_metric=str(task.get("optimized_metric")),
        monitor_mode=str(task.get("monitor_mode", "max")), causal=bool(task.get("causal", False)),
        classification=bool(card.get("classification", False)),
        multi_head=tuple(card.get("multi_head") or ()), encoder_layers=card.get("encoder_layers"),
        tiny=tuple(card.get("tiny") or ()), claims=tuple(reproduce.get("claims") or ()),
        in_quick=bool(reproduce.get("in_quick", False)),
        quick=None if reproduce.get("quick") is None else tuple(reproduce.get("quick")),
        preset=reproduce.get("preset"), metrics=tuple(card.get("metrics") or ()),
        baseline=card.get("baseline"),
    )


def task_cards(conf_dir: Path | None = None) -> dict[str, Card]:
    """{name: card} of every `conf/task/*.yaml`, in name order."""
    folder = Path(conf_dir or CONF_DIR) / "task"
    cards = {}
    for path in sorted(folder.glob("*.yaml")):
        card = read_card(path)
        cards[card.name] = card
    return cards
