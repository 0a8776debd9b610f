"""Did a run learn? Its optimized metric against its task's trivial baseline (the card's `baseline`).

A run that does not beat the baseline (majority class, unigram, lead, ...) by `did_learn`'s margin
sits on its first plateau: whatever its attention statistics say, they are not a trained model's,
so no claim draws a verdict from it. `Results` asks `judge` for every run it hands to a claim and
hands such a run out as failed ("did not learn ..."); the report lists every run's judgement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlab.cards import Card
from attnlab.study.learned import did_learn


@dataclass(frozen=True)
class Learning:
    metric_key: str
    metric: float
    baseline_key: str | None  # None: the task's card names no baseline (nothing to judge by)
    baseline: float
    higher_is_better: bool

    @property
    def learned(self) -> bool:
        """A task without a baseline cannot be judged: its runs count as learned."""
        if self.baseline_key is None:
            return True
        return did_learn(self.metric, self.baseline, self.higher_is_better)

    def text(self) -> str:
        """`val/acc 0.039 vs baseline 0.040 (val/baseline_acc)`."""
        if self.baseline_key is None:
            return f"{self.metric_key} {_fmt(self.metric)} (no baseline on the task's card)"
        return f"{self.metric_key} {_fmt(self.metric)} vs baseline {_fmt(self.baseline)} ({self.baseline_key})"


def _fmt(value: float) -> str:
    return "missing" if not math.isfinite(value) else f"{value:.4g}"


def _value(metrics: dict, key: str | None) -> float:
    value = metrics.get(key) if key else None
    return math.nan if value is None else float(value)


def judge(record: dict, card: Card) -> Learning:
    """The learning judgement of one finished run's metrics.json record."""
    metrics = record.get("metrics", {})
    return Learning(card.optimized_metric, _value(metrics, card.optimized_metric), card.baseline,
                    _value(metrics, card.baseline), card.monitor_mode != "min")


def runs_table(rows: list[tuple[str, Learning]]) -> str:
    """Markdown: every finished run, its metric, its baseline and whether it learned."""
    lines = ["| run | metric | value | trivial baseline | learned |", "|---|---|---|---|---|"]
    for name, j in rows:
        baseline = "—" if j.baseline_key is None else f"{_fmt(j.baseline)} (`{j.baseline_key}`)"
        verdict = "yes" if j.learned else "**did not learn**"
        if j.baseline_key is None:
            verdict = "not judged"
        lines.append(f"| {name} | `{j.metric_key}` | {_fmt(j.metric)} | {baseline} | {verdict} |")
    return "\n".join(lines)
