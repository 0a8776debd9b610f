"""What the reproduction reads back: each run's metrics.json record, judged against its task's
trivial baseline (a run that did not learn is handed to the claims as failed, and listed).

`explained_away(record)` is the one place that reads the ExplainedAway callback's per-layer
scalars: from metrics.json when the callback logs them through `pl_module.log` (issue 12), else
from the CSV logger's metrics.csv in the run dir (the last validation that has them).
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from attnlab.cards import Card
from attnlab.study.evidence import Run
from attnlab.study.reproduce.learning import Learning, judge, runs_table


class Results:
    """The metrics.json records of the runs, by Run; failures keep their error.

    With the task cards, a finished run that did not beat its task's trivial baseline is handed
    to the claims as failed ("did not learn ..."), so that no verdict rests on it."""

    def __init__(self, cards: dict[str, Card] | None = None) -> None:
        self.records: dict[Run, dict] = {}
        self.cards = cards or {}

    def add(self, run: Run, record: dict) -> None:
        self.records[run] = record

    def learning(self, run: Run) -> Learning | None:
        """The learning judgement of a finished run of a task with a card, else None."""
        record = self.records.get(run)
        if not record or record.get("status") != "ok" or run.task not in self.cards:
            return None
        return judge(record, self.cards[run.task])

    def get(self, run: Run) -> dict | None:
        """The record of a run that finished (status ok) and learned, else None."""
        record = self.records.get(run)
        if not record or record.get("status") != "ok":
            return None
        learning = self.learning(run)
        return record if learning is None or learning.learned else None

    def error(self, run: Run) -> str | None:
        record = self.records.get(run)
        if record is None:
            return "not run"
        if record.get("status") != "ok":
            return str(record.get("error", "failed"))
        learning = self.learning(run)
        return None if learning is None or learning.learned else f"did not learn: {learning.text()}"

    def runs_table(self) -> str:
        """Markdown: every finished run with its metric against its trivial baseline."""
        rows = [(run_name(run), j) for run in self.records if (j := self.learning(run)) is not None]
        return runs_table(rows) if rows else ""

    def metric(self, run: Run, key: str) -> float:
        record = self.get(run)
        value = (record or {}).get("metrics", {}).get(key)
        return math.nan if value is None else float(value)


def run_name(run: Run) -> str:
    """`mlm/unas seed 1`, with the run's extra overrides."""
    return " ".join([f"{run.task}/{run.model} seed {run.seed}", *run.extra])


_LAYER_KEY = re.compile(r"^explained_away/layer(\d+)/(share_below_[^/]+|min_col_sum|bound_1_over_S|"
                        r"min_col_sum_times_S|entropy|unassigned_mass|sink_mass|log_col_sum/q\d+)$")
# runs written before the rename log `sink_mass` for what is now `unassigned_mass`
_RENAMED = {"sink_mass": "unassigned_mass"}


def explained_away(record: dict) -> dict[int, dict[str, float]]:
    """Per attention layer: share_below_<threshold>, min_col_sum, bound_1_over_S,
    min_col_sum_times_S, entropy (mean attention entropy in nats, where the callback logs it),
    unassigned_mass (mean 1 - row sum, where logged; an older run's `sink_mass`) and
    the log column-sum quantiles log_col_sum/qNN when the CSV has them."""
    found = _collect(record.get("metrics", {}).items())
    if found:
        return found
    path = Path(record.get("run_dir", "")) / "csv" / "metrics.csv"
    if not path.is_file():
        return {}
    last: dict[str, float] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            last.update({k: float(v) for k, v in row.items() if k and v not in (None, "") and _LAYER_KEY.match(k)})
    return _collect(last.items())


def _collect(items) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for key, value in items:
        match = _LAYER_KEY.match(key)
        if match:
            name = "share_below" if match.group(2).startswith("share_below") else match.group(2)
            name = _RENAMED.get(name, name)
            out.setdefault(int(match.group(1)), {})[name] = float(value)
    return dict(sorted(out.items()))
