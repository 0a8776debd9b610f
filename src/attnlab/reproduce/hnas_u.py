"""Claim: HNAS learns its mix of DNAS and UNAS per layer (DNAS paper, Figs. 3-5: vqa, mlm, headline).

HNAS weights `u * DNAS + (1 - u) * UNAS` with a trainable `u` per layer and head. One HNAS model
per task whose card enters this claim (first seed); `u` per attention module at the end of
training comes from metrics.json (`hnas_u`), its trajectory from each run's `hnas_u.png` (copied
beside the report).

Verdict (our rule, stated because the figures show trajectories, not a threshold): holds when, in
every task run, `u` moves away from its initial value (by > 0.05 in some layer) and the layers end
at different mixes (spread of the layer means > 0.05).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.reproduce.plan import Plan, Run
from attnlab.reproduce.results import HOLDS, NOT_AT_SCALE, ClaimResult, Results, not_run

NAME = "hnas_u"
TITLE = "HNAS u per layer"
PAPER = "DNAS paper, Figs. 3-5"
CLAIM = "the learned u differs from layer to layer: each layer settles on its own mix of DNAS and UNAS"
MOVED, SPREAD = 0.05, 0.05


def runs(plan: Plan) -> list[Run]:
    return [Run(task, "hnas", plan.seeds[0], extra) for task, extra in plan.claim_variants(NAME)]


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
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def evaluate(plan: Plan, results: Results, out_dir: Path) -> ClaimResult:
    per_task, rows, notes, figures, checks = {}, [], [], [], []
    for task, extra in plan.claim_variants(NAME):
        run, name = Run(task, "hnas", plan.seeds[0], extra), plan.label(task, extra)
        if plan.skip_reason(task):
            notes.append(f"- {name}: not run ({plan.skip_reason(task)})")
            continue
        record = results.get(run)
        if record is None or not record.get("hnas_u"):
            notes.append(f"- {name}: {results.error(run) or 'no HNAS module'}")
            continue
        layers = list(record["hnas_u"].values())
        init = initial_u(record)
        per_task[name] = (layers, init)
        means = [sum(u) / len(u) for u in layers]
        moved = init is not None and max(abs(m - init) for m in means) > MOVED
        spread = max(means) - min(means)
        checks.append(moved and spread > SPREAD)
        rows.append(f"| {name} | {init} | " + ", ".join(f"{m:.3f}" for m in means) + f" | {spread:.3f} |")
        png = Path(record["run_dir"]) / "hnas_u.png"
        if png.is_file():
            figure = f"hnas_u_{name.replace(':', '_')}.png"
            shutil.copy(png, out_dir / figure)
            figures.append(figure)
    if not per_task:
        return not_run(NAME, TITLE, PAPER, CLAIM, "no HNAS run finished; " + " ".join(notes))
    figures.insert(0, plot(per_task, out_dir / "hnas_u_layers.png").name)
    table = ["| task | initial u | final u per layer (mean over heads) | spread |", "|---|---|---|---|", *rows]
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER, paper=CLAIM,
        ours="; ".join(f"{t}: " + ", ".join(f"{sum(u) / len(u):.2f}" for u in layers) for t, (layers, _) in per_task.items()),
        setting="; ".join(plan.setting_text(t) for t in dict.fromkeys(n.split(":")[0] for n in per_task)), seeds=str(plan.seeds[0]),
        verdict=HOLDS if all(checks) else NOT_AT_SCALE, details="\n".join(table + [""] + notes), figures=figures,
    )
