"""Ready-made W&B dashboards for attnlab runs: a saved workspace view and a per-sweep report.

    python -m attnlab.dashboards --entity E --project P [--group SWEEP] [--sweep-dir DIR] [--spec-only FILE]

Sections (every curve and bar grouped by `model.name`: mean and standard error over seeds):
metrics (from each task's `optimized_metric`: val curves, test bars, train/loss), HNAS `u` per
layer and head, explained away, head interaction, calibration. `--group` (a sweep's W&B group, the
name of its `outputs/multirun/<dir>`) restricts the view to that sweep and adds a report;
`--sweep-dir` takes the group, the tasks and the `attnlab.study.report` table from a local sweep dir.
Saving needs a W&B server (`wandb login`); `--spec-only FILE` writes the JSON without one.
Needs the optional extra: pip install 'attnlab[dashboards]' (wandb-workspaces).

The sections are data, not per-task code: `sections()` derives the metric panels from the tasks'
`optimized_metric` (their cards, conf/task/*.yaml, read by attnlab.cards), and the analysis panels
name the keys and key patterns the callbacks log. tests/test_wandb.py checks that a tiny offline run of every task logs them all.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from attnlab.cards import CONF_DIR, task_cards
from attnlab.errors import ConfigError

GROUP_BY = "model.name"  # config key the runs are grouped by (seeds of one model aggregate)
STEP = "trainer/global_step"  # Lightning's step metric, continuous across resumed fragments


@dataclass(frozen=True)
class Panel:
    kind: Literal["line", "bar", "histogram", "media", "table"]
    title: str
    keys: tuple[str, ...] = ()  # metric keys; media keys (media); the table's key (table)
    regex: str = ""  # line/histogram: every key matching it (W&B's metric_regex)


@dataclass(frozen=True)
class Section:
    name: str
    panels: tuple[Panel, ...]
    # which runs fill it: "" every run, "scheme parameters" schemes with parameters, "multihead" attention with >= 2 heads,
    # "classification" tasks whose forward gives class logits (not headline)
    needs: str = ""


# ----------------------------------------------------------------------------- what is shown
def task_metrics(conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """{task name: optimized_metric} of every task's card (conf/task/*.yaml)."""
    return {name: card.optimized_metric for name, card in task_cards(conf_dir).items()
            if card.optimized_metric not in ("", "None")}


def sections(tasks: dict[str, str]) -> list[Section]:
    """The dashboard for runs of `tasks` ({name: optimized_metric})."""
    by_metric: dict[str, list[str]] = {}
    for task, metric in sorted(tasks.items()):
        by_metric.setdefault(metric.split("/", 1)[-1], []).append(task)
    metric_panels = []
    for name, names in sorted(by_metric.items()):
        used_by = ", ".join(names)
        metric_panels += [Panel("line", f"val/{name} ({used_by})", (f"val/{name}",)),
                          Panel("bar", f"test/{name} ({used_by})", (f"test/{name}",))]
    metric_panels.append(Panel("line", "train/loss", ("train/loss",)))
    return [
        Section("Metrics: mean ± s.e. over seeds, by model", tuple(metric_panels)),
        Section("Scheme parameters per layer and head (HNAS u, a sink's b, ...)", (
            # <scheme>/<name>/layer{l}[/head{h}] (SchemeParameters): any scheme, none listed here
            # (not a stage's train/val/test keys of the same shape, StabilityMonitor's)
            Panel("line", "per layer (mean over heads)", regex=r"^(?!train/|val/|test/)[a-z0-9]+/[a-z0-9_]+/layer\d+$"),
            Panel("line", "per head", regex=r"^(?!train/|val/|test/)[a-z0-9]+/[a-z0-9_]+/layer\d+/head\d+$"),
        ), needs="scheme parameters"),
        Section("Explained away: total attention each key receives", (
            Panel("line", "share of keys with sum_i w_ij < 1e-8", regex=r"^explained_away/layer\d+/share_below_"),
            Panel("line", "min column sum x S (the DNAS lemma keeps it >= 1)",
                  regex=r"^explained_away/layer\d+/min_col_sum_times_S$"),
            Panel("histogram", "log sum_i w_ij per layer", regex=r"^explained_away/layer\d+/log_col_sum$"),
            Panel("media", "histograms with the 1e-8 and 1/S marks", ("explained_away/histograms",)),
        )),
        Section("Head interaction: diversity and importance", (
            Panel("line", "average JSD between heads (val)", ("val/avg_jsd",)),
            Panel("bar", "average JSD between heads (test)", ("test/avg_jsd",)),
            Panel("line", "head distance (val)", ("val/head_distance",)),
            Panel("bar", "head distance (test)", ("test/head_distance",)),
            Panel("media", "JSD heatmaps", ("head_diversity/val/jsd_heatmaps", "head_diversity/test/jsd_heatmaps")),
            Panel("bar", "metric drop when one head is masked", ("head_importance/mean_drop", "head_importance/max_drop")),
            Panel("table", "head importance", ("head_importance/table",)),
            Panel("media", "head importance map", ("head_importance/plot",)),
        ), needs="multihead"),
        Section("Training stability", (
            Panel("line", "gradient norm", ("train/grad_norm",)),
            Panel("line", "loss spikes so far (loss > 2x the running median)", ("train/loss_spikes",)),
            Panel("line", "largest attention logit per layer", regex=r"^train/max_attn_logit/layer\d+$"),
            Panel("line", "attention entropy per head", regex=r"^train/attn_entropy/layer\d+/head\d+$"),
        )),
        Section("Sinks and outliers (end of test)", (
            Panel("bar", "sink rate (eps 0.3) and kurtosis", ("diagnostics/sink_rate", "diagnostics/kurtosis")),
            Panel("line", "sink rate per layer", regex=r"^diagnostics/layer\d+/sink_rate$"),
            Panel("histogram", "per-head weight on the sink key", regex=r"^diagnostics/layer\d+/sink_importance_hist$"),
            Panel("media", "per layer", ("diagnostics/layers",)),
        )),
        Section("Calibration", (
            Panel("line", "ECE and overconfidence error (val)", ("val/ece", "val/oe")),
            Panel("bar", "ECE and overconfidence error (test)", ("test/ece", "test/oe")),
            Panel("media", "reliability diagrams", ("calibration/val/reliability", "calibration/test/reliability")),
        ), needs="classification"),
    ]


# ----------------------------------------------------------------------------- wandb-workspaces
def _workspaces():
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
        from wandb_workspaces import expr
    except ImportError:
        raise ConfigError("attnlab.dashboards needs wandb-workspaces: pip install 'attnlab[dashboards]'") from None
    return wr, ws, expr


def _stable_id(*parts: str) -> str:
    # W&B gives panels random ids; fixed ones keep the spec the same from one build to the next
    return hashlib.sha1("/".join(parts).encode()).hexdigest()[:12]


def to_panels(section: Section) -> list:
    wr, _, _ = _workspaces()
    grouped = {"groupby": wr.Config(GROUP_BY), "groupby_aggfunc": "mean", "groupby_rangefunc": "stderr"}
    out = []
    for p in section.panels:
        if p.kind == "line":
            panel = wr.LinePlot(title=p.title, x=STEP, y=list(p.keys), metric_regex=p.regex or None, **grouped)
        elif p.kind == "histogram":  # a logged Histogram over steps: a heatmap per run
            panel = wr.LinePlot(title=p.title, x=STEP, metric_regex=p.regex)
        elif p.kind == "bar":
            panel = wr.BarPlot(title=p.title, metrics=list(p.keys), orientation="v", **grouped)
        elif p.kind == "media":
            panel = wr.MediaBrowser(title=p.title, media_keys=list(p.keys), gallery_axis="run")
        else:
            panel = wr.WeavePanelSummaryTable(table_name=p.keys[0], layout=wr.Layout(w=16, h=8))
        object.__setattr__(panel, "_id", _stable_id(section.name, p.title))
        out.append(panel)
    return out


def group_filter(group: str) -> str:
    return f"Group = {json.dumps(group)}"


def build_workspace(entity: str, project: str, tasks: dict[str, str], group: str | None = None):
    _, ws, expr = _workspaces()
    return ws.Workspace(
        entity=entity, project=project, name=f"attnlab {group}" if group else "attnlab",
        sections=[ws.Section(name=s.name, panels=to_panels(s), is_open=True,
                             panel_settings=ws.SectionPanelSettings(x_axis=STEP)) for s in sections(tasks)],
        settings=ws.WorkspaceSettings(x_axis=STEP),
        runset_settings=ws.RunsetSettings(groupby=[expr.Config(GROUP_BY)],
                                          filters=group_filter(group) if group else ""),
    )


def build_report(entity: str, project: str, tasks: dict[str, str], group: str, table: str = "",
                 offline: bool = False):
    """The sweep's report. `offline`: run sets without the project (looking up its id needs a server)."""
    wr, _, _ = _workspaces()
    where = {} if offline else {"entity": entity, "project": project}
    blocks = [wr.P(f"Sweep {group}: every job of `outputs/multirun/{group}`, grouped by {GROUP_BY} "
                   f"(mean ± standard error over seeds).")]
    if table:
        blocks += [wr.H2("python -m attnlab.report"), wr.MarkdownBlock(text=table)]
    for s in sections(tasks):
        runset = wr.Runset(**where, name=group, filters=group_filter(group), groupby=[f"config.{GROUP_BY}"])
        object.__setattr__(runset, "_id", _stable_id("runset", s.name))
        blocks += [wr.H2(s.name), wr.PanelGrid(runsets=[runset], panels=to_panels(s))]
    return wr.Report(entity=entity, project=project, title=f"attnlab sweep {group}"[:128],
                     description="Built by python -m attnlab.dashboards", blocks=blocks)


def spec(entity: str, project: str, tasks: dict[str, str], group: str | None = None, table: str = "") -> dict:
    """The JSON that saving sends (the report's run sets without the project's server-side id)."""
    out = {"workspace": json.loads(build_workspace(entity, project, tasks, group)._to_model()
                                   .spec.model_dump_json(by_alias=True, exclude_none=True))}
    if group:
        report = build_report(entity, project, tasks, group, table, offline=True)._to_model()
        out["report"] = json.loads(report.spec.model_dump_json(by_alias=True, exclude_none=True))
    return out


def save(entity: str, project: str, tasks: dict[str, str], group: str | None = None, table: str = "") -> list[str]:
    """Save the workspace view (and the sweep's report) to the W&B server; returns their URLs."""
    workspace = build_workspace(entity, project, tasks, group).save()
    urls = [workspace.url]
    if group:
        urls.append(build_report(entity, project, tasks, group, table).save().url)
    return urls


# ----------------------------------------------------------------------------- command line
def sweep_contents(sweep_dir: Path) -> tuple[dict[str, str], str]:
    """{task: optimized_metric} of a local sweep's jobs, and its attnlab.study.report table."""
    from attnlab.study import report

    jobs = report.load_jobs(sweep_dir)
    tasks = {j["task"]: j["optimized_metric"] for j in jobs if j.get("status") == "ok" and j.get("optimized_metric")}
    if not tasks:
        raise ConfigError(f"--sweep-dir {sweep_dir}: no finished job (metrics.json with status ok); "
                          f"pass a dir of python train.py -m ...")
    return tasks, report.markdown(*report.build_table(jobs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.dashboards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--project", default="attnlab", help="W&B project (default: attnlab)")
    parser.add_argument("--group", help="a sweep's W&B group (its outputs/multirun/<dir> name)")
    parser.add_argument("--sweep-dir", type=Path, help="a local sweep dir: group, tasks and report table from it")
    parser.add_argument("--tasks", nargs="*", help="tasks whose metrics to show (default: every conf/task/*.yaml)")
    parser.add_argument("--spec-only", type=Path, metavar="FILE", help="write the JSON here; no server needed")
    args = parser.parse_args(argv)
    try:
        tasks, table, group = task_metrics(), "", args.group
        if not tasks and args.sweep_dir is None:
            raise ConfigError(f"no task config under {CONF_DIR / 'task'}: run from the attnlab checkout "
                              f"(or set ATTNLAB_ROOT to it), or pass --sweep-dir")
        if args.sweep_dir is not None:
            tasks, table = sweep_contents(args.sweep_dir)
            group = group or args.sweep_dir.resolve().name
        if args.tasks:
            unknown = sorted(set(args.tasks) - set(tasks))
            if unknown:
                raise ConfigError(f"--tasks {' '.join(unknown)}: unknown; choose from {', '.join(sorted(tasks))}")
            tasks = {t: tasks[t] for t in args.tasks}
        if args.spec_only is not None:
            args.spec_only.write_text(json.dumps(spec(args.entity, args.project, tasks, group, table), indent=1))
            print(f"dashboard spec written to {args.spec_only}")
            return 0
        for url in save(args.entity, args.project, tasks, group, table):
            print(url)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
