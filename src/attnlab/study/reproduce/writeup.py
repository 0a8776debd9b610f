"""REPORT.md (summary table, then one section per claim with its figures) and its W&B copy."""

from __future__ import annotations

import os
from pathlib import Path

from attnlab.study.evidence import ClaimResult


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def verdict_text(c: ClaimResult) -> str:
    """`**holds**`, `**contradicted**`, or `**not tested**: <reason>`."""
    return f"**{c.verdict}**" + (f": {c.reason}" if c.reason else "")


def summary_table(claims: list[ClaimResult]) -> str:
    lines = ["| claim | paper | ours | setting | seeds | verdict |", "|---|---|---|---|---|---|"]
    for c in claims:
        lines.append(f"| {_cell(c.title)} ({_cell(c.source)}) | {_cell(c.paper)} | {_cell(c.ours)} | "
                     f"{_cell(c.setting)} | {_cell(c.seeds)} | {_cell(verdict_text(c))} |")
    return "\n".join(lines)


def write_report(out_dir: Path, claims: list[ClaimResult], meta: dict, runs_table: str = "") -> Path:
    """REPORT.md; `runs_table`: every run against its trivial baseline (Results.runs_table)."""
    lines = [
        "# attnlab: the papers' claims, reproduced",
        "",
        f"`{meta['command']}`: mode **{meta['mode']}**, commit {meta['commit']}, {meta['started']}",
        (f"machine: {meta['machine']}; load average {meta['load_before']} before, {meta['load_after']} after; "
         f"{meta['jobs']} sweep(s) side by side; {meta.get('trained', '?')} run(s) trained, "
         f"{meta.get('reused', '?')} reused; wall time {meta['wall_s'] / 60:.1f} min"),
        "",
        ("Verdicts: *holds* (the evidence says so at the stated power), *contradicted* (it says the "
         "opposite), *not tested* with its reason (not run; underpowered, with the interval; or the "
         "mechanism never engaged, with the diagnostic that shows it). A run that did not beat its task's "
         "trivial baseline enters no verdict and is listed (*Did the runs learn?* at the end). Each run's "
         "own directory (metrics.json, checkpoints, PNGs) is under `runs/`."),
        "",
        summary_table(claims),
        "",
    ]
    for c in claims:
        lines += [f"## {c.title} ({c.source})", "", f"- paper: {c.paper}", f"- ours: {c.ours}",
                  f"- setting: {c.setting}", f"- seeds: {c.seeds}", f"- verdict: {verdict_text(c)}", ""]
        if c.details:
            lines += [c.details, ""]
        lines += [f"![{name}]({name})" for name in c.figures] + [""]
    if runs_table:
        lines += ["## Did the runs learn?", "",
                  ("Each run's optimized metric against its task's trivial baseline (the task card's "
                   "`baseline`: majority class, unigram, lead, ...). A run that does not beat it by "
                   "`attnlab.study.learned.did_learn`'s margin stayed on its first plateau: the claims "
                   "above treat it as failed and draw no verdict from it."), "", runs_table, ""]
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(lines))
    return path


def log_to_wandb(out_dir: Path, claims: list[ClaimResult], meta: dict) -> str | None:
    """One W&B run (offline unless WANDB_MODE=online) with the claims' table, the figures and
    REPORT.md; returns its directory."""
    import wandb

    mode = "online" if os.environ.get("WANDB_MODE", "").lower() == "online" else "offline"
    run = wandb.init(project="attnlab", job_type="reproduce", name=f"reproduce-{out_dir.name}", dir=str(out_dir),
                     mode=mode, config={k: v for k, v in meta.items() if k != "command"})
    columns = ["claim", "source", "paper", "ours", "setting", "seeds", "verdict", "reason"]
    rows = [[c.title, c.source, c.paper, c.ours, c.setting, c.seeds, c.verdict, c.reason] for c in claims]
    run.log({"reproduce/claims": wandb.Table(columns=columns, data=rows)})
    for c in claims:
        for name in c.figures:
            run.log({f"reproduce/{c.name}/{Path(name).stem}": wandb.Image(str(out_dir / name))})
    run.save(str(out_dir / "REPORT.md"), base_path=str(out_dir))
    run_dir = str(Path(run.dir).parent)
    run.finish()
    return run_dir
