"""What a run leaves behind besides its checkpoints: the record `train` and `evaluate` write into
the run dir (metrics.json, eval_metrics.json) and print as a summary, and the record a sweep's
job writes when it starts (status "running"), fails or is stopped (attnlab.runner; the study
drivers and attnlab.report read them back: attnlab.study.evidence).

A record: status, task, model, seed, overrides, the optimized metric and its best value, every
logged metric as a float, what the schemes report of their own parameters (`scheme_params`),
the run dir, the wall time, and the W&B run (`wandb_run`, `wandb_dir`, `wandb_offline`) when
there is one. Written atomically: the sweep's report may be reading it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from attnlab import diagnostics, wandb_runs
from attnlab.attention import scheme_values
from attnlab.files import atomic_write_text
from attnlab.fsdp import full_parameters


def scheme_params(module: torch.nn.Module) -> dict[str, dict[str, list[float]]]:
    """metrics.json's `scheme_params`: what the schemes report of their own parameters,
    {"hnas_u": {layer: [u per head]}, "sink_b": {...}}, rounded for reading."""
    with full_parameters(module):  # under FSDP each rank holds a shard of them
        reported = scheme_values(module)
    return {key: {layer: [round(float(x), 4) for x in values] for layer, values in layers.items()}
            for key, layers in reported.items()}


def wandb_run_info(loggers) -> dict:
    logger = wandb_runs.wandb_logger(loggers)
    if logger is None:
        return {}
    run = logger.experiment
    run_dir = Path(run.dir).parent  # .../wandb/offline-run-<time>-<id>
    return {"wandb_run": f"{run.project}/{run.id}", "wandb_dir": str(run_dir),
            "wandb_offline": bool(getattr(run.settings, "_offline", True))}


def to_float_dict(metrics: dict) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str))  # the report may be reading it


# a metric per bucket (test/loss@4/bucket2: lm's loss per position bucket): grids, not a row each
_BUCKET = re.compile(r"^(.+)/bucket(\d+)$")


def print_summary(title: str, record: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    full = record.get("full_precision")  # eval.py quant=<scheme>: beside the quantized numbers
    quant = record.get("quant", {}).get("scheme", "")
    table.add_column(f"value ({quant})" if full else "value", justify="right")
    if full:
        table.add_column("full precision", justify="right")
        table.add_column("drop", justify="right")
    buckets: dict[str, dict[int, float]] = {}
    for k, v in sorted(record.get("metrics", {}).items()):
        if not k.startswith(("test/", "val/")):
            continue
        match = _BUCKET.match(k)
        if match:
            buckets.setdefault(match.group(1), {})[int(match.group(2))] = v
        elif full:
            extra = [f"{full[k]:.4f}", f"{record['drop'][k]:+.4f}"] if k in full else ["", ""]
            table.add_row(k, f"{v:.4f}", *extra)
        else:
            table.add_row(k, f"{v:.4f}")
    console = Console()
    console.print(table)
    for grid in _bucket_grids(buckets):
        console.print(grid)
    outliers = diagnostics.table(record.get("metrics", {}))
    if outliers is not None:
        console.print(outliers)
    for key, layers in record.get("scheme_params", {}).items():
        for name, values in layers.items():
            console.print(f"{key}  {name}: {values}")
    console.print(f"run dir: {record['run_dir']}")
    if "wandb_run" in record:
        mode = "offline" if record.get("wandb_offline", True) else "online"
        console.print(f"W&B run ({mode}): {record['wandb_run']}  dir: {record['wandb_dir']}")
        if record.get("wandb_offline", True):  # every fragment of a resumed run, into one run
            console.print(f"  upload with: python -m attnlab.sync {record['run_dir']}")


def _bucket_grids(buckets: dict[str, dict[int, float]]) -> list:
    """A grid per metric family (test/loss@1, test/loss@2, ... -> test/loss): a row per bucket,
    a column per `@` suffix (lm: per window length), narrow enough for any terminal."""
    from rich.table import Table

    families: dict[str, dict[str, dict[int, float]]] = {}
    for name, row in buckets.items():
        family, _, suffix = name.rpartition("@") if "@" in name else (name, "", "")
        families.setdefault(family, {})[suffix] = row
    grids = []
    for family, columns in sorted(families.items()):
        order = sorted(columns, key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c))
        grid = Table(title=f"{family} per bucket", show_header=True, header_style="bold")
        grid.add_column("bucket", justify="right")
        for column in order:
            grid.add_column(f"@{column}" if column else family, justify="right")
        for b in range(max(max(row) for row in columns.values()) + 1):
            grid.add_row(str(b), *(f"{columns[c][b]:.4g}" if b in columns[c] else "" for c in order))
        grids.append(grid)
    return grids


def job_record(cfg: DictConfig, status: str, **extra) -> dict:
    return {
        "status": status, "task": cfg.task.name, "model": cfg.model.name, "seed": int(cfg.seed),
        "overrides": list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else [],
        "metrics": {}, **extra,
    }
