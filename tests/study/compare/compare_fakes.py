"""Synthetic probe cards, plans and metrics.json records for the compare tests: nothing trains.

A record is shaped like the runner's (attnlab/runner.py `train`) for a probe run
(tasks/probe/module.py): test/acc with test/answers, val/acc_auc, the trivial baseline and the
shortcut on both splits, the explained-away and head-diversity diagnostics, the schemes' parameters (`scheme_params`).
"""

from __future__ import annotations

from pathlib import Path

from attnlab.study.compare.plan import COMMON, ComparePlan
from attnlab.study.compare.probes import Condition, ContrastSpec, Control, ProbeCard
from attnlab.study.evidence import Run
from attnlab.study.launch import run_overrides

REGISTERED = ["dnas", "hnas", "sinkhorn", "unas"]
BASELINE, SHORTCUT = 0.125, 0.3


def card(name: str = "p", family: str = "primary", *, lr: float = 3e-3,
         schemes: tuple[str, ...] = ("unas", "dnas", "hnas"),
         contrasts: tuple[tuple[str, str, str], ...] = (("dnas", "unas", "better"),
                                                        ("hnas", "unas", "equivalent")),
         min_effect: float = 0.05, margin: float = 0.03,
         positive: Control | None | str = "fall", negative: Control | None | str = "tie",
         sweep: dict | None = None, modes: dict | None = None, main: dict | None = None
         ) -> ProbeCard:
    if positive == "fall":
        positive = Control(("probe.options.a_queries=false",), "query competition", "fall",
                           ("dnas",))
    elif positive == "vanish":
        positive = Control(("probe.options.a_queries=false",), "query competition", "vanish")
    if negative == "tie":
        negative = Control(("probe.options.disjoint=true",), "a plain lookup")
    return ProbeCard(name=name, mechanism=f"the mechanism of {name}", family=family, lr=lr,
                     schemes=tuple(schemes),
                     contrasts=tuple(ContrastSpec(*c) for c in contrasts),
                     min_effect=min_effect, margin=margin, positive=positive, negative=negative,
                     sweep=dict(sweep or {}), mode_overrides=dict(modes or {}),
                     main=dict(main or {}))


def plan(*cards: ProbeCard, mode: str = "quick", registered=REGISTERED, **kw) -> ComparePlan:
    return ComparePlan(Path("/nowhere"), mode, {c.name: c for c in cards}, list(registered), **kw)


def condition(p: ComparePlan, probe: str, name: str) -> Condition:
    return next(c for c in p.conditions(p.cards[probe]) if c.name == name)


def metrics(acc: float, *, auc: float | None = None, answers: int = 256,
            baseline: float = BASELINE, shortcut: float | None = SHORTCUT,
            layers: tuple[float, ...] = (10.0,), jsd: float = 0.03) -> dict:
    out = {"train/loss": 1.0, "val/loss": 1.1, "val/acc": acc, "val/seq_acc": acc,
           "val/answers": float(answers), "val/acc_auc": acc - 0.05 if auc is None else auc,
           "val/baseline_acc": baseline, "val/avg_jsd": jsd, "val/head_distance": 0.8,
           "test/loss": 1.1, "test/acc": acc, "test/seq_acc": acc, "test/answers": float(answers),
           "test/baseline_acc": baseline, "test/avg_jsd": jsd, "test/head_distance": 0.7}
    if shortcut is not None:
        out |= {"val/shortcut_acc": shortcut, "test/shortcut_acc": shortcut}
    for i, col in enumerate(layers):
        out |= {f"explained_away/layer{i}/share_below_1e-08": 0.0,
                f"explained_away/layer{i}/min_col_sum": col / 20,
                f"explained_away/layer{i}/bound_1_over_S": 0.05,
                f"explained_away/layer{i}/min_col_sum_times_S": col,
                f"explained_away/layer{i}/entropy": 2.0 + i}
    return out


def record(run: Run, acc: float, *, scheme_params: dict | None = None, **kw) -> dict:
    """A finished run's metrics.json."""
    return {"status": "ok", "task": run.task, "model": run.model, "seed": run.seed,
            "overrides": run_overrides(run, COMMON), "optimized_metric": "val/acc",
            "optimized_value": acc, "metrics": metrics(acc, **kw),
            "scheme_params": scheme_params or {},
            "run_dir": f"/runs/{run.model}_seed{run.seed}", "wall_s": 1.0}


def failed(run: Run, error: str = "boom") -> dict:
    return {"status": "failed", "task": run.task, "model": run.model, "seed": run.seed,
            "overrides": run_overrides(run, COMMON), "metrics": {}, "error": error}


def records(p: ComparePlan, lrs: dict, values: dict, **kw) -> dict[Run, dict]:
    """{(probe, condition, scheme): [test/acc of seed 1, 2, ...] (None: a failed run)} as
    records of the runs at the chosen rates; a (acc, auc) pair gives the AUC too."""
    out = {}
    for (probe, name, scheme), accs in values.items():
        c = condition(p, probe, name)
        for seed, acc in enumerate(accs, 1):
            run = p.run(p.cards[probe], c, scheme, seed, lrs[(probe, scheme)].lr)
            if acc is None:
                out[run] = failed(run)
            elif isinstance(acc, tuple):
                out[run] = record(run, acc[0], auc=acc[1], **kw)
            else:
                out[run] = record(run, acc, **kw)
    return out
