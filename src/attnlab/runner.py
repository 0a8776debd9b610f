"""What `train.py` does, without any task-specific code (`eval.py`: attnlab.evaluation).

The task config names a LightningDataModule and a LightningModule (`task.datamodule`,
`task.module`); sizes that only the data know (vocabulary, number of answers) come from
`datamodule.model_kwargs()`. Everything else is `hydra.utils.instantiate`. The record a run or
a sweep's job writes (metrics.json) and the summary it prints: attnlab.run_record.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from pytorch_lightning.utilities.exceptions import SIGTERMException

from attnlab import checkpoints, logger_guard, quantization, wandb_runs
from attnlab.attention import AttentionSpec
from attnlab.attention.schemes import fitting
from attnlab.callbacks import AfterTestAnalysis, StabilityMonitor
from attnlab.compiling import compile_net
from attnlab.config_schema import check_accelerator, validate
from attnlab.errors import (
    ConfigError,
    full_error,
    report,
    require_file,
    user_error_message,
)
from attnlab.evaluation import quantized_test
from attnlab.run_record import (
    job_record,
    print_summary,
    scheme_params,
    to_float_dict,
    wandb_run_info,
    write_json,
)
from attnlab.study.evidence import METRICS_FILE
from attnlab.task_module import build_module
from attnlab.trainer import build_trainer


# ----------------------------------------------------------------------------- building blocks
def is_multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # not inside a Hydra app (e.g. compose API in tests)
        return False


def build_callbacks(cfg: DictConfig) -> list[pl.Callback]:
    """Every `callbacks.<name>` node: the `callbacks=` group's, and the training rules a model
    config places there (conf/rules/, e.g. model=repulsive's callbacks.repulsive). With Lightning's
    own `trainer.enable_progress_bar=false` the progress bar is left out (Lightning would refuse
    the bar it was given: the option works as typed)."""
    callbacks = [hydra.utils.instantiate(conf) for conf in (cfg.get("callbacks") or {}).values()
                 if conf is not None and "_target_" in conf]
    if (cfg.get("trainer") or {}).get("enable_progress_bar", True) is False:
        callbacks = [c for c in callbacks if not isinstance(c, pl.callbacks.ProgressBar)]
    return callbacks


def build_loggers(cfg: DictConfig) -> list:
    loggers = []
    for conf in (cfg.get("logger") or {}).values():
        if conf is None or "_target_" not in conf:
            continue
        kwargs: dict[str, Any] = {}
        if wandb_runs.is_wandb(conf):
            # offline unless the user opted in; one run per job (its id kept in the run dir, so a
            # resumed job continues it), named model-task-seed, grouped by sweep
            group = Path(HydraConfig.get().sweep.dir).name if is_multirun() else f"{cfg.task.name}"
            kwargs = wandb_runs.logger_kwargs(cfg, conf, group)
        loggers.append(hydra.utils.instantiate(conf, **kwargs))
    return loggers


def check_scheme_fits_task(cfg: DictConfig) -> AttentionSpec:
    """The model's options are valid, a task whose scheme runs in causal attention
    (`task.causal: true`, e.g. a language model) is not given a query-normalized scheme, and
    one whose scheme runs in attention that is not causal is not given a causal-only one."""
    spec = AttentionSpec.from_config(cfg.model)
    if not cfg.task.get("causal", False) and spec.causal_only:
        raise ConfigError(
            f"task={cfg.task.name} applies the scheme to attention that is not causal, but "
            f"model={cfg.model.name} is defined for causal attention only. Use it in a causal task "
            f"(task=lm), or here one of {', '.join(f'model={n}' for n in fitting(causal=False))}"
        )
    if cfg.task.get("causal", False) and spec.normalizes_over_queries:
        raise ConfigError(
            f"task={cfg.task.name} applies the scheme to causal attention, but model={cfg.model.name} "
            f"normalizes over queries ({spec.normalization}): every position's weights would depend on "
            f"future positions. Use a scheme that normalizes over keys: "
            f"{', '.join(f'model={n}' for n in fitting(causal=True))}"
        )
    return spec


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    """`ckpt_path=last`: this run dir's last.ckpt, else the newest one of the same task and model."""
    ckpt = cfg.get("ckpt_path")
    if ckpt in (None, ""):
        return None
    if str(ckpt) != "last":
        if Path(ckpt).is_dir() and (Path(ckpt) / "checkpoints" / "last.ckpt").is_file():
            raise ConfigError(f"ckpt_path={ckpt} is a run directory, not a file; give its checkpoint, "
                              f"e.g. ckpt_path={Path(ckpt) / 'checkpoints' / 'last.ckpt'}")
        require_file(ckpt, "ckpt_path", example="ckpt_path=last")
        return str(ckpt)
    here = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    if here.is_file():
        return str(here)
    pattern_root = Path(cfg.paths.log_dir) / cfg.task.name / cfg.model.name
    found = checkpoints.newest_last(pattern_root)
    if found is None:
        raise ConfigError(
            f"ckpt_path=last: no last.ckpt under {pattern_root}/*/checkpoints/; "
            f"start without ckpt_path, or pass ckpt_path=<path to a .ckpt>"
        )
    return str(found)


def finish_wandb() -> None:
    """Close the W&B run so that the next multirun job starts its own."""
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish()
    except Exception as exc:  # noqa: BLE001 - never fail a run over logging shutdown
        print(f"[attnlab] wandb.finish failed: {exc}")


# ----------------------------------------------------------------------------- train
def train(cfg: DictConfig) -> dict:
    """Fit, then test the best checkpoint. Returns the record also written to metrics.json."""
    t0 = time.time()
    validate(cfg)  # every option, before any work: one clear ConfigError
    check_scheme_fits_task(cfg)  # the model group: the scheme's own options, and causal tasks
    check_accelerator(cfg)  # hardware=gpu on a machine without CUDA
    low_bit = quantization.scheme(cfg.get("quant"))  # quant=w3a3x: one line, before any work
    ckpt_path = resolve_ckpt_path(cfg) if cfg.get("train", True) else None
    trusted = bool(cfg.get("trust_checkpoint", False))  # unpickle a checkpoint's objects: opt-in
    checkpoint = None
    if ckpt_path:
        checkpoint = checkpoints.read(ckpt_path, trust=trusted)  # data only, a Lightning checkpoint
        checkpoints.check_run(ckpt_path, checkpoint, cfg.task.name, cfg.model.name)
    if ckpt_path and (Path(ckpt_path).parent.parent / "config.yaml").is_file():
        # a resumed run finishes in its own run dir: checkpoints, best-model tracking, PNGs and
        # metrics.json stay together (this invocation's Hydra dir keeps only its log)
        with open_dict(cfg):
            cfg.paths.output_dir = str(Path(ckpt_path).parent.parent)
        print(f"[attnlab] resuming {ckpt_path} in its run dir {cfg.paths.output_dir}")
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out_dir / "config.yaml", resolve=True)
    if is_multirun():  # the sweep report tells a killed job (still "running") from a finished one
        write_json(out_dir / METRICS_FILE, job_record(cfg, "running", pid=os.getpid(),
                                                          host=socket.gethostname()))
    pl.seed_everything(cfg.seed, workers=True, verbose=False)

    # The trainer first: Lightning checks its own arguments before any data work.
    callbacks = build_callbacks(cfg)
    # a logger that fails warns once and is dropped; the run goes on (attnlab.logger_guard)
    loggers = logger_guard.guard(build_loggers(cfg))
    # A resumed run skips the sanity check: its validation dataloader would draw from the RNG
    # restored from the checkpoint, and the run would no longer continue bit-for-bit.
    extra = {"num_sanity_val_steps": 0} if ckpt_path else {}
    trainer = build_trainer(cfg, callbacks=callbacks, logger=loggers or False, **extra)

    datamodule = hydra.utils.instantiate(cfg.task.datamodule)
    datamodule.prepare_data()
    datamodule.setup("fit")
    module = build_module(cfg.task.module, datamodule.model_kwargs())  # sizes into their nodes
    compile_net(module, cfg.get("compile", False))  # compile=true: torch.compile the network
    if checkpoint is not None:
        checkpoints.check_fits(ckpt_path, checkpoint, module)  # a checkpoint of another model
        del checkpoint
    for logger in loggers:  # the whole composed config, not only the module's hyper-parameters
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))

    val_score = None
    if cfg.get("train", True):
        # weights only: attnlab's checkpoints hold tensors and plain data (trust.plain_data)
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=not trusted)
        except SystemExit as exc:
            # Lightning answers Ctrl-C with its own exit(1) once PreemptionCheckpoint has written
            # last.ckpt: name it, so that run_job exits as a shell does on SIGINT (130). (SIGTERM
            # comes as SIGTERMException, itself a SystemExit: run_job handles it.)
            if trainer.interrupted and not isinstance(exc, SIGTERMException):
                raise KeyboardInterrupt from exc
            raise
        ckpt_cb = trainer.checkpoint_callback
        if ckpt_cb is not None and ckpt_cb.best_model_score is not None:
            val_score = float(ckpt_cb.best_model_score)
        elif cfg.optimized_metric in trainer.callback_metrics:
            val_score = float(trainer.callback_metrics[cfg.optimized_metric])
    metrics = to_float_dict(trainer.callback_metrics)

    if cfg.get("test", True):
        ckpt_cb = trainer.checkpoint_callback
        best = ckpt_cb.best_model_path if ckpt_cb is not None else ""
        if not best or trainer.fast_dev_run:
            best = None  # no checkpoint: test the weights as they are
        trainer.test(module, datamodule=datamodule, ckpt_path=best, weights_only=not trusted)
        metrics.update(to_float_dict(trainer.callback_metrics))
    wandb_runs.log_best_checkpoint(cfg, trainer, logger_guard.alive(loggers))  # logger.wandb.log_model=best
    # analyses that run their own evaluations on the final (tested) weights, e.g. HeadImportance
    for callback in callbacks:
        if isinstance(callback, AfterTestAnalysis):
            metrics.update(callback.after_test(trainer, module, datamodule, cfg.optimized_metric,
                                               cfg.task.monitor_mode))
    if low_bit is not None and cfg.get("test", True):  # last: it swaps the module's linears
        metrics.update(quantized_test(cfg, low_bit, module, datamodule, metrics))

    record = {
        "status": "ok",
        "task": cfg.task.name,
        "model": cfg.model.name,
        "seed": int(cfg.seed),
        "overrides": list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else [],
        "optimized_metric": cfg.optimized_metric,
        "optimized_value": val_score,
        "metrics": metrics,
        "scheme_params": scheme_params(module),
        "run_dir": str(out_dir),
        "wall_s": round(time.time() - t0, 1),
        **wandb_run_info(logger_guard.alive(loggers)),
    }
    for callback in callbacks:  # divergence and loss spikes: a result of the run (StabilityMonitor)
        if isinstance(callback, StabilityMonitor):
            record["stability"] = callback.summary()
    if trainer.is_global_zero:
        write_json(out_dir / METRICS_FILE, record)
        print_summary(f"{cfg.task.name} / {cfg.model.name} / seed {cfg.seed}", record)
    finish_wandb()
    return record


def run_job(fn, cfg: DictConfig) -> float | None:
    """Run one job with user-facing error handling.

    A configuration or data error (attnlab.errors.user_error_message) prints one line and exits
    with code 2. In a multirun a failing job is recorded in its metrics.json (status=failed) and
    the sweep goes on; a preempted or stopped one (SIGTERM: exit 143, Ctrl-C: 130) is recorded as
    interrupted.
    """
    try:
        record = fn(cfg)
        value = record.get("optimized_value")
        return None if value is None else float(value)
    except (SIGTERMException, KeyboardInterrupt) as exc:
        # preempted (SIGTERM) or stopped (Ctrl-C): PreemptionCheckpoint wrote last.ckpt when it
        # came during training; exit 128 + the signal's number, as a shell reports it (143, 130)
        finish_wandb()
        signal_name, code = ("SIGTERM", 143) if isinstance(exc, SIGTERMException) else ("SIGINT", 130)
        if is_multirun():
            write_json(Path(cfg.paths.output_dir) / METRICS_FILE,
                       job_record(cfg, "interrupted", error=f"{signal_name}: stopped (during training "
                                                             f"checkpoints/last.ckpt is written first); "
                                                             f"resume with ckpt_path=<it>"))
        raise SystemExit(code) from None
    except Exception as exc:
        finish_wandb()
        user_message = user_error_message(
            exc, HydraConfig.get().overrides.task if HydraConfig.initialized() else sys.argv[1:])
        message = user_message or f"{type(exc).__name__}: {exc}"
        if is_multirun():
            out_dir = Path(cfg.paths.output_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            write_json(out_dir / METRICS_FILE, job_record(
                cfg, "failed", error=message, traceback=traceback.format_exc()))
            print(f"[attnlab] job failed (recorded, sweep continues): {message}")
            return math.nan
        if user_message is not None and not full_error():
            report(user_message)
            raise SystemExit(2) from None
        raise
