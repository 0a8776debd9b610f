"""One W&B run per job, across resumes, and checkpoints as W&B artifacts.

- The W&B run id (and name, group) lives in the run dir (`wandb_run.json`), created with the run;
  a run resumed with `ckpt_path=...` finishes in that dir, reads them back and passes the id with
  `resume="allow"`.
  Offline, each process writes its own fragment `wandb/offline-run-<time>-<id>` with that id;
  `wandb sync` (0.31) given every fragment of a run uploads them into that one run, in order of
  start time, each continuing the steps of the previous one (`python -m attnlab.sync` does it).
- `logger.wandb.log_model=best` uploads the best checkpoint (with the run's config.yaml, so that
  `eval.py` can rebuild the task) as the artifact `model-<run id>`, aliases `best` and `latest`;
  offline it is stored with the run and uploaded by sync. `eval.py ckpt_path=wandb:<entity>/
  <project>/<artifact>:<alias>` downloads and evaluates one.
"""

from __future__ import annotations

import json
import os
import secrets
import string
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig
from pytorch_lightning.loggers import WandbLogger

from attnlab import console
from attnlab.errors import ConfigError
from attnlab.files import atomic_write

RUN_FILE = "wandb_run.json"
WANDB_PREFIX = "wandb:"
LOG_MODEL_CHOICES = (False, True, "all", "best")


def is_wandb(conf: DictConfig | None) -> bool:
    """A `logger.<name>` node that builds a W&B logger (its `_target_` class, or a subclass)."""
    if conf is None or not conf.get("_target_"):
        return False
    return issubclass(get_class(conf._target_), WandbLogger)


def wandb_logger(loggers: list) -> WandbLogger | None:
    """The run's W&B logger, found by type (logger_guard keeps each logger's class as a base)."""
    return next((logger for logger in loggers if isinstance(logger, WandbLogger)), None)


def job_run(run_dir: Path, name: str, group: str) -> dict[str, str]:
    """The job's W&B run {id, name, group}: read back from `run_dir`, or created there once.

    A resumed job keeps its id, and its name and group too (a sweep job resumed by a single
    `python train.py ... ckpt_path=...` stays in its sweep's group). Created atomically, so that
    every process of a DDP job that races here ends up with the same id."""
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        # W&B's id format: 8 characters of [a-z0-9]
        run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        with atomic_write(path, "w", keep_existing=True) as f:  # another process's first: theirs
            json.dump({"id": run_id, "name": name, "group": group}, f)
    return json.loads(path.read_text())


def logger_kwargs(cfg: DictConfig, conf: DictConfig, group: str) -> dict[str, Any]:
    """What the runner adds to `logger.wandb` for this job (the YAML's nulls are filled here)."""
    console.quiet_wandb()  # wandb's known-harmless messages, before wandb.init prints them
    kwargs: dict[str, Any] = {}
    offline = conf.get("offline", True)
    if os.environ.get("WANDB_MODE", "").lower() == "online":
        kwargs["offline"] = offline = False
    name = conf.get("name") or f"{cfg.model.name}-{cfg.task.name}-seed{cfg.seed}"
    group = conf.get("group") or group
    if conf.get("id") is None:  # one run per job, resumes included
        run = job_run(Path(cfg.paths.output_dir), name, group)
        name, group = run["name"], run["group"]
        kwargs.update(id=run["id"], resume="allow")
    kwargs.update(name=name, group=group)
    log_model = conf.get("log_model", False)
    if log_model not in LOG_MODEL_CHOICES:
        raise ConfigError(f"logger.wandb.log_model={log_model}: use false, best (the best checkpoint "
                          f"at the end, also offline), true or all (Lightning's upload, online only)")
    if log_model == "best":
        kwargs["log_model"] = False  # attnlab uploads it itself (log_best_checkpoint), offline too
    elif log_model and offline:
        raise ConfigError(f"logger.wandb.log_model={log_model} needs an online run (Lightning refuses it "
                          f"offline): use logger.wandb.log_model=best, which sync uploads later")
    os.environ.setdefault("WANDB_SILENT", "true")
    return kwargs


def log_best_checkpoint(cfg: DictConfig, trainer, loggers: list) -> None:
    """`logger.wandb.log_model=best`: the best checkpoint and the run's config as one artifact."""
    wants = any(is_wandb(c) and c.get("log_model") == "best"
                for c in (cfg.get("logger") or {}).values())
    ckpt_cb = trainer.checkpoint_callback
    if not wants or not trainer.is_global_zero or ckpt_cb is None or not ckpt_cb.best_model_path:
        return
    logger = wandb_logger(loggers)
    if logger is None:
        return
    run = logger.experiment
    score = None if ckpt_cb.best_model_score is None else float(ckpt_cb.best_model_score)
    import wandb

    best, run_dir = Path(ckpt_cb.best_model_path), Path(cfg.paths.output_dir)
    artifact = wandb.Artifact(f"model-{run.id}", type="model", metadata={
        "optimized_metric": cfg.optimized_metric, "score": score, "task": cfg.task.name,
        "model": cfg.model.name, "seed": int(cfg.seed), "checkpoint": best.name})
    # immutable: referenced in place, not copied to W&B's staging dir (checkpoints can be GBs)
    artifact.add_file(str(best), name=f"checkpoints/{best.name}", policy="immutable")
    artifact.add_file(str(run_dir / "config.yaml"), name="config.yaml", policy="immutable")
    run.log_artifact(artifact, aliases=["best", "latest"])
    print(f"[attnlab] best checkpoint logged as W&B artifact model-{run.id}:best")


def checkpoint_from_artifact(spec: str, download_root: Path) -> str:
    """`wandb:<entity>/<project>/<artifact>:<alias>` -> the path of its downloaded .ckpt."""
    name = spec[len(WANDB_PREFIX):]
    if name.count("/") != 2 or ":" not in name.rsplit("/", 1)[-1]:
        raise ConfigError(f"ckpt_path={spec}: write wandb:<entity>/<project>/<artifact>:<alias>, "
                          f"e.g. wandb:me/attnlab/model-1a2b3c4d:best")
    import wandb

    try:
        artifact = wandb.Api().artifact(name, type="model")
        root = Path(artifact.download(root=str(download_root / name.replace("/", "_").replace(":", "_"))))
    except Exception as exc:  # noqa: BLE001 - any W&B failure becomes one message with the fix
        raise ConfigError(f"ckpt_path={spec}: could not download the W&B artifact ({type(exc).__name__}: "
                          f"{exc}); it needs a W&B server: `wandb login` (WANDB_BASE_URL for a "
                          f"self-hosted one), or pass a local ckpt_path") from None
    ckpts = sorted(root.rglob("*.ckpt"))
    if len(ckpts) != 1:
        raise ConfigError(f"ckpt_path={spec}: the artifact holds {len(ckpts)} .ckpt files, expected one "
                          f"(artifacts written by logger.wandb.log_model=best hold one)")
    return str(ckpts[0])
