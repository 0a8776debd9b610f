"""Claim: HNAS learns its mix of DNAS and UNAS per layer (DNAS paper, Figs. 3-5: vqa, mlm, headline).

HNAS weights `u * DNAS + (1 - u) * UNAS` with a trainable `u` per layer and head. The paper's
statement: each layer settles on its own mix (u differs from layer to layer). One HNAS model per
task whose card enters this claim (first seed) at each of two learning rates of u (U_LRS: the
optimizer's own rate, `model.param_lr=null`, and 0.05, the hand-set rate the tasks' CPU defaults use),
because how far u moves in a short run is mostly its learning rate's doing; `u` per attention
module at the end of training comes from metrics.json (`scheme_params.hnas_u`).

Per learned run: u moved (a layer's mean over heads ended > MOVED from its initial value) and the
layers' spread (max - min of the layer means). Verdict: *holds* when, at both rates, every task
run moved and its layers spread by > SPREAD; *contradicted* when, at both rates, every run moved
but no task's layers spread (one mix everywhere); *not tested* otherwise, saying which: u did
not move at a rate (the mechanism never engaged), the spread appears at one rate only (the
hand-set rate decides it), or no run learned.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.figures import save_png
from attnlab.study.evidence import (
    CONTRADICTED,
    HOLDS,
    NOT_TESTED,
    ClaimResult,
    Run,
    not_tested,
    scheme_params,
)

NAME = "hnas_u"
TITLE = "HNAS u per layer"
PAPER = "DNAS paper, Figs. 3-5"
CLAIM = "the learned u differs from layer to layer: each layer settles on its own mix of DNAS and UNAS"
MOVED, SPREAD = 0.05, 0.05
U_LRS = ("null", "0.05")  # u's own learning rate: the optimizer's, and the tasks' hand-set one


def _run(plan, task: str, extra: tuple[str, ...], u_lr: str) -> Run:
    return plan.run(task, "hnas", plan.seeds[0], (*extra, f"model.param_lr={u_lr}"))


def runs(plan) -> list[Run]:
    return [_run(plan, task, extra, u_lr) for task, extra in plan.claim_variants(NAME)
            for u_lr in U_LRS]


def initial_u(record: dict) -> float | None:
    config = Path(record.get("run_dir", "")) / "config.yaml"
    return OmegaConf.select(OmegaConf.load(config), "model.hybrid_init") if config.is_file() else None


def plot(per_task: dict[str, tuple[list[list[float]], float | None]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(per_task), figsize=(3.2 * len(per_task), 3), squeeze=False,
                             constrained_layout=True)
    for ax, (task, (layers, init)) in zip(axes[0], per_task.items()):
        means = [sum(u) / len(u) for u in layers]
        ax.bar(range(len(layers)), means, color="tab:blue", alpha=0.6, label="layer mean")
        for l, u in enumerate(layers):
            ax.scatter([l] * len(u), u, s=8, color="k", zorder=3)
        if init is not None:
            ax.axhline(init, color="tab:red", ls="--", lw=1, label="initial u")
        ax.set_ylim(0, 1)
        ax.set_xticks(range(len(layers)))
        ax.set_xlabel("attention layer")
        ax.set_title(f"{task}: u (1 = DNAS, 0 = UNAS)", fontsize=9)
    axes[0][0].set_ylabel("u after training (dots: heads)")
    axes[0][0].legend(fontsize=7)
    return save_png(fig, path, dpi=100)


def measure(plan, results, out_dir: Path):
    """Per u learning rate: {task: (layers' u, initial u, moved, spread)}; rows; notes; figures."""
    per_rate: dict[str, dict] = {u_lr: {} for u_lr in U_LRS}
    rows, notes, figures = [], [], []
    for task, extra in plan.claim_variants(NAME):
        name = plan.label(task, extra)
        if plan.skip_reason(task):
            notes.append(f"- {name}: not run ({plan.skip_reason(task)})")
            continue
        for u_lr in U_LRS:
            run = _run(plan, task, extra, u_lr)
            record = results.get(run)
            u = scheme_params(record or {}).get("hnas_u")
            if record is None or not u:
                notes.append(f"- {name}, u lr {u_lr}: {results.error(run) or 'no HNAS module'}")
                continue
            layers = list(u.values())
            init = initial_u(record)
            means = [sum(u) / len(u) for u in layers]
            moved = init is not None and max(abs(m - init) for m in means) > MOVED
            spread = max(means) - min(means)
            per_rate[u_lr][name] = (layers, init, moved, spread)
            rows.append(f"| {name} | {u_lr} | {init} | " + ", ".join(f"{m:.3f}" for m in means)
                        + f" | {'yes' if moved else 'no'} | {spread:.3f} |")
            png = Path(record["run_dir"]) / "hnas_u.png"
            if png.is_file():
                figures.append(f"hnas_u_{name.replace(':', '_')}_lr{u_lr}.png")
                shutil.copy(png, out_dir / figures[-1])
    return per_rate, rows, notes, figures


def judge(per_rate: dict[str, dict]) -> tuple[str, str]:
    """(verdict, reason) from {u lr: {task: (layers, init, moved, spread)}} (module docstring)."""
    if not any(per_rate.values()):
        return NOT_TESTED, "no HNAS run finished and learned"
    tasks = set.intersection(*(set(runs) for runs in per_rate.values()))
    if not tasks:
        return NOT_TESTED, "no task has a learned HNAS run at both u learning rates"
    moved = {u_lr: all(per_rate[u_lr][t][2] for t in tasks) for u_lr in per_rate}
    spread = {u_lr: all(per_rate[u_lr][t][3] > SPREAD for t in tasks) for u_lr in per_rate}
    flat = {u_lr: not any(per_rate[u_lr][t][3] > SPREAD for t in tasks) for u_lr in per_rate}
    if not all(moved.values()):
        still = [u_lr for u_lr, m in moved.items() if not m]
        return NOT_TESTED, (f"mechanism not engaged: u stayed within {MOVED} of its start in some "
                            f"task at u learning rate {', '.join(still)}")
    if all(spread.values()):
        return HOLDS, ""
    if all(flat.values()):
        return CONTRADICTED, ""
    return NOT_TESTED, ("u's learning rate decides it: the layers spread by > "
                        f"{SPREAD} in every task at u lr " + (", ".join(r for r, s in spread.items() if s) or "none")
                        + " and not at " + ", ".join(r for r, s in spread.items() if not s))


def evaluate(plan, results, out_dir: Path) -> ClaimResult:
    out_dir = Path(out_dir)
    per_rate, rows, notes, figures = measure(plan, results, out_dir)
    verdict, reason = judge(per_rate)
    if not any(per_rate.values()):
        return not_tested(NAME, TITLE, PAPER, CLAIM, reason, details="\n".join(notes))
    best = max(per_rate, key=lambda r: len(per_rate[r]))
    figures.insert(0, plot({t: v[:2] for t, v in per_rate[best].items()},
                           out_dir / "hnas_u_layers.png").name)
    table = ["| task | u lr | initial u | final u per layer (mean over heads) | moved | spread |",
             "|---|---|---|---|---|---|", *rows]
    ours = "; ".join(f"u lr {u_lr}: " + ", ".join(
        f"{t} " + "/".join(f"{sum(u) / len(u):.2f}" for u in v[0]) for t, v in runs.items())
        for u_lr, runs in per_rate.items() if runs)
    tasks = dict.fromkeys(t.split(":")[0] for runs in per_rate.values() for t in runs)
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER, paper=CLAIM, ours=ours,
        setting="; ".join(plan.setting_text(t) for t in tasks) + "; model.param_lr in "
                + ", ".join(U_LRS),
        seeds=str(plan.seeds[0]), verdict=verdict, reason=reason,
        details="\n".join(table + [""] + notes), figures=figures)
