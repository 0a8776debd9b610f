"""REPORT.md (the table, the verdicts against UNAS, the diagnostics per probe), the heatmap PNG
and, with --wandb, a W&B run holding both."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from attnlab.compare.cells import HEAD_DIAGNOSTICS, LAYER_DIAGNOSTICS, Cell, Keys
from attnlab.compare.plan import BASELINE_SCHEME
from attnlab.comparison_stats import NO_DIFFERENCE

HEATMAP = "heatmap.png"
NOT_LEARNED = "did not learn"


def _num(x: float, sign: str = "") -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:{sign}.3f}"


def _mean_se(cell: Cell) -> str:
    mean, se = cell.mean_se
    return _num(mean) if not math.isfinite(se) else f"{mean:.3f} ± {se:.3f}"


def best_per_probe(cells: dict, probes: list[str], higher_is_better: bool) -> dict[str, set[str]]:
    """The schemes with the best mean on each probe, among the cells that learned (every one
    that ties with the best as the table shows it, to 3 decimals)."""
    best = {}
    for probe in probes:
        learned = [c for (p, _), c in cells.items() if p == probe and c.learned]
        if learned:
            pick = max if higher_is_better else min
            top = round(pick(c.mean_se[0] for c in learned), 3)
            best[probe] = {c.scheme for c in learned if round(c.mean_se[0], 3) == top}
    return best


def result_cell(cell: Cell | None, best: bool) -> str:
    if cell is None or cell.n == 0:
        return "failed" if cell and cell.failed else "—"
    if not cell.learned:
        return f"⚠ {NOT_LEARNED} ({cell.learned_seeds}/{cell.n})"
    text = _mean_se(cell)
    return f"**{text}**" if best else text


def verdict_cell(cell: Cell | None) -> str:
    if cell is None or cell.comparison is None:
        return f"— ({cell.untested_reason})" if cell and cell.untested_reason else "—"
    c = cell.comparison
    text = f"{c.difference:+.3f}, p_Holm {c.p_adjusted:.2g}" if math.isfinite(c.p_adjusted) else \
        f"{c.difference:+.3f}, {c.n} paired seed(s): no test"
    return f"**{c.verdict}** ({text})" if c.verdict != NO_DIFFERENCE else f"{c.verdict} ({text})"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def probe_baseline(cells: dict, probe: str) -> float:
    """The trivial baseline of a probe (mean over its runs: it is the same for every scheme)."""
    values = [c.baseline for (p, _), c in cells.items() if p == probe and math.isfinite(c.baseline)]
    return float(np.mean(values)) if values else math.nan


def tables(cells: dict, schemes: list[str], probes: list[str], keys: Keys) -> list[str]:
    best = best_per_probe(cells, probes, keys.higher_is_better)
    head, rule = _row("scheme", *probes), "|---|" + "---|" * len(probes)
    lines = [f"## {keys.metric}: mean ± standard error over seeds", "",
             (f"Best learned cell(s) per probe in bold. ⚠ {NOT_LEARNED} (k/n): only k of the n "
              f"runs beat the trivial baseline ({keys.baseline}); such a cell is not a result."),
             "",
             head, rule,
             _row("*trivial baseline*", *(_num(probe_baseline(cells, p)) for p in probes))]
    for scheme in schemes:
        lines.append(_row(scheme, *(result_cell(cells.get((p, scheme)), scheme in best.get(p, ()))
                                    for p in probes)))
    lines += ["", f"## Against {BASELINE_SCHEME}, paired by seed", "",
              (f"Difference of the means (scheme - {BASELINE_SCHEME}) on {keys.metric}, paired "
               "t-test, Holm-corrected across every tested cell (alpha 0.05). \"no difference "
               "detected\" says these seeds could not tell the schemes apart, not that they are "
               "equal."), "", head, rule]
    for scheme in schemes:
        if scheme != BASELINE_SCHEME:
            lines.append(_row(scheme, *(verdict_cell(cells.get((p, scheme))) for p in probes)))
    return lines + not_learned(cells, schemes, probes, keys)


def not_learned(cells: dict, schemes: list[str], probes: list[str], keys: Keys) -> list[str]:
    """The numbers behind each "did not learn", said as what they are: no result."""
    rows = [cells[p, s] for p in probes for s in schemes
            if (p, s) in cells and cells[p, s].n and not cells[p, s].learned]
    if not rows:
        return []
    lines = ["", f"## ⚠ Did not learn: {len(rows)} cell(s), no result", ""]
    for c in rows:
        lines.append(f"- {c.probe} / {c.scheme}: {keys.metric} {_mean_se(c)} against the baseline "
                     f"{_num(c.baseline)}; {c.learned_seeds} of {c.n} run(s) beat it")
    return lines


def _layers(values: list[float], fmt: str = ".3g") -> str:
    return " / ".join(f"{v:{fmt}}" for v in values) if values else "—"


def diagnostics_section(cells: dict, schemes: list[str], probe: str) -> list[str]:
    names = [*LAYER_DIAGNOSTICS, *HEAD_DIAGNOSTICS, "HNAS u"]
    lines = [f"### {probe}", "", _row("scheme", *names), "|---|" + "---|" * len(names)]
    for scheme in schemes:
        cell = cells.get((probe, scheme))
        if cell is not None:
            lines.append(_row(scheme, *(_layers(cell.diagnostics.get(n, [])) for n in names)))
    return [*lines, ""]


def heatmap(cells: dict, schemes: list[str], probes: list[str], keys: Keys, path: Path) -> Path:
    """schemes x probes, the colour the mean metric, each cell annotated (mean ± s.e.; cells that
    did not learn hatched and marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.full((len(schemes), len(probes)), np.nan)
    for i, scheme in enumerate(schemes):
        for j, probe in enumerate(probes):
            cell = cells.get((probe, scheme))
            if cell is not None and cell.n:
                grid[i, j] = cell.mean_se[0]
    fig, ax = plt.subplots(figsize=(max(5.0, 2.0 + 1.3 * len(probes)), 1.4 + 0.45 * len(schemes)))
    image = ax.imshow(grid, cmap="viridis" if keys.higher_is_better else "viridis_r", aspect="auto")
    fig.colorbar(image, ax=ax, label=keys.metric)
    ax.set_xticks(range(len(probes)), probes, rotation=30, ha="right")
    ax.set_yticks(range(len(schemes)), schemes)
    finite = grid[np.isfinite(grid)]
    middle = float(np.mean([finite.min(), finite.max()])) if finite.size else 0.0
    for i, scheme in enumerate(schemes):
        for j, probe in enumerate(probes):
            cell = cells.get((probe, scheme))
            if cell is None or not cell.n:
                continue
            mean, se = cell.mean_se
            text = f"{mean:.2f}" + ("" if not math.isfinite(se) else f"\n±{se:.2f}")
            if not cell.learned:
                text += "\nn.l."
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                                           color="grey"))
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if (mean < middle) == keys.higher_is_better else "black")
    ax.set_title(f"{keys.metric}, mean over seeds (n.l.: did not learn)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(out_dir: Path, cells: dict, schemes: list[str], probes: list[str], keys: Keys,
                 meta: dict) -> Path:
    m = meta
    lines = ["# attnlab compare: which scheme wins where", "",
             (f"`{m['command']}`: mode **{m['mode']}**, {m['seeds']} seed(s), "
              f"commit {m['commit']}, {m['started']}"),
             (f"machine: {m['machine']}; load average {m['load_before']} before, {m['load_after']} "
              f"after; up to {m['jobs']} sweep(s) side by side; {m['trained']} run(s) trained, "
              f"{m['reused']} reused; wall time {m['wall_s'] / 60:.1f} min"), "",
             *tables(cells, schemes, probes, keys), "", f"![heatmap]({HEATMAP})", "",
             "## Diagnostics (mean over the cell's runs; per layer: layer 0 / layer 1 / ...)", "",
             ("min col sum x S: the smallest attention column sum times the keys (1 = every key "
              "fully attended; near 0: a key explained away); share < 1e-8: keys whose column sum "
              "is below 1e-8; entropy: mean attention entropy (log S: uniform); head JSD / "
              "distance: how different the heads are; HNAS u: the learned mix (per layer, mean "
              "over heads)."), ""]
    for probe in probes:
        lines += diagnostics_section(cells, schemes, probe)
    failures = [(c.probe, c.scheme, e) for c in cells.values() for e in c.failed]
    if failures:
        lines += ["## Runs that did not finish", ""]
        lines += [f"- {probe} / {scheme}: {error}" for probe, scheme, error in failures] + [""]
    lines += ["Each run's directory (metrics.json, config.yaml, PNGs, csv/) is under `runs/`.", ""]
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(lines))
    return path


def log_to_wandb(out_dir: Path, cells: dict, keys: Keys, meta: dict) -> str:
    """One W&B run (offline unless WANDB_MODE=online) with the cells' table, the heatmap and
    REPORT.md; returns its directory."""
    import wandb

    mode = "online" if os.environ.get("WANDB_MODE", "").lower() == "online" else "offline"
    run = wandb.init(project="attnlab", job_type="compare", name=f"compare-{out_dir.name}",
                     dir=str(out_dir), mode=mode,
                     config={k: v for k, v in meta.items() if k != "command"})
    columns = ["probe", "scheme", keys.metric, "se", "seeds", "baseline", "learned", "verdict",
               "p_holm"]
    rows = []
    for c in cells.values():
        mean, se = c.mean_se
        comparison = c.comparison
        rows.append([c.probe, c.scheme, mean, se, c.n, c.baseline, c.learned,
                     comparison.verdict if comparison else c.untested_reason,
                     comparison.p_adjusted if comparison else math.nan])
    run.log({"compare/cells": wandb.Table(columns=columns, data=rows),
             "compare/heatmap": wandb.Image(str(out_dir / HEATMAP))})
    run.save(str(out_dir / "REPORT.md"), base_path=str(out_dir))
    run_dir = str(Path(run.dir).parent)
    run.finish()
    return run_dir
