"""What `eval.py` does: a checkpoint's module rebuilt from its run's config and scored on its test
(or val) split, full precision or quantized (`quant=`, attnlab.quantization). `python -m
attnlab.diagnose` rebuilds a checkpoint the same way (`load_checkpoint_module`)."""

from __future__ import annotations

import re
from pathlib import Path

import hydra
import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from attnlab import checkpoints, quantization, trust
from attnlab.cards import CONF_DIR
from attnlab.config_schema import check_accelerator, validate
from attnlab.errors import ConfigError, user_error_message
from attnlab.run_record import print_summary, scheme_params, to_float_dict, write_json
from attnlab.task_module import build_module
from attnlab.trainer import build_trainer

_TASK_REFERENCE = re.compile(r"\$\{task\.([\w.]+)\}")


def apply_task_overrides(task_cfg: DictConfig, dotted: list[str], conf_dir: Path) -> DictConfig:
    """eval.py's `task.*` overrides on a run's saved task config. That config was saved resolved,
    so a node that read an overridden key when the run was built (`datamodule.eval_lengths:
    ${task.eval_lengths}`) holds the run's value: every node that today's conf/task/<name>.yaml
    fills from an overridden key takes its new value too (unless given itself)."""
    merged = OmegaConf.merge(task_cfg, OmegaConf.from_dotlist([o[len("task."):] for o in dotted]))
    given = {o[len("task."):].split("=", 1)[0] for o in dotted}
    path = Path(conf_dir) / "task" / f"{merged.get('name')}.yaml"
    today = OmegaConf.select(OmegaConf.load(path), "task") if path.is_file() else None
    for key, source in _task_references(today):
        if source in given and key not in given:
            OmegaConf.update(merged, key, OmegaConf.select(merged, source), merge=False)
    return merged


def _task_references(node, prefix: str = ""):
    """(key, task key it reads) of every value `${task.<key>}` under a task node."""
    if not isinstance(node, DictConfig):
        return
    for name in node:
        if OmegaConf.is_interpolation(node, name):
            match = _TASK_REFERENCE.fullmatch(str(node._get_node(name)._value()))
            if match:
                yield f"{prefix}{name}", match.group(1)
        else:
            yield from _task_references(node.get(name), f"{prefix}{name}.")


def load_checkpoint_module(cfg: DictConfig):
    """(module with the checkpoint's weights, its datamodule set up, the task config) of an eval
    config's `ckpt_path`; task and model come from its run's config."""
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise ConfigError("ckpt_path is required: python eval.py "
                          "ckpt_path=outputs/<task>/<model>/<run>/checkpoints/last.ckpt")
    validate(cfg)
    check_accelerator(cfg)
    ckpt = Path(str(cfg.ckpt_path))
    # exists, is a file, not truncated, data only (trust_checkpoint=true: unpickled as it comes)
    checkpoint = checkpoints.read(ckpt, trust=bool(cfg.get("trust_checkpoint", False)))
    saved = checkpoints.run_config(ckpt)  # its own run folder's config, as data
    if saved is not None:  # what will be built of it (its task) must be attnlab's to build
        trust.check_targets(saved, checkpoints.run_config_file(ckpt), node="task")
    if saved is None:  # this invocation's task config (task=<its task>), overrides applied
        task_cfg = OmegaConf.create(OmegaConf.to_container(cfg.task, resolve=True))
    else:  # a run from before the injected network has its flat task.module upgraded
        task_cfg = checkpoints.upgrade_module_config(saved, CONF_DIR).task
    if saved is not None and HydraConfig.initialized():  # dotted overrides of task.* still apply
        dotted = [o for o in HydraConfig.get().overrides.task if o.startswith("task.")]
        if dotted:
            task_cfg = apply_task_overrides(task_cfg, dotted, CONF_DIR)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    # the module as the run built it (its config, the data's sizes), then the checkpoint's weights
    datamodule = hydra.utils.instantiate(task_cfg.datamodule)
    datamodule.prepare_data()
    datamodule.setup("fit")
    try:
        module = build_module(task_cfg.module, datamodule.model_kwargs())
        module.on_load_checkpoint(checkpoint)
        module.load_state_dict(checkpoint["state_dict"])
    except Exception as err:  # another task's checkpoint: other weights, or other options
        if user_error_message(err) is not None:
            raise
        raise ConfigError(
            f"ckpt_path={ckpt} cannot be loaded as {task_cfg.module._target_.rsplit('.', 1)[-1]} "
            f"(task={task_cfg.name}): {type(err).__name__}: {str(err).splitlines()[0]}; give "
            f"task=<its task> or keep the checkpoint inside its run dir (next to config.yaml)"
        ) from err
    return module, datamodule, task_cfg


def quantized_eval(cfg: DictConfig, low_bit, module, datamodule, score, full: dict) -> dict:
    """`quant=<scheme>` (attnlab.quantization): swap the linears, calibrate their input ranges on
    `quant_options.calibration_batches` training batches in the order of `seed`, score again.
    The record's metrics become the quantized ones; `full_precision` and `drop` (full precision
    minus quantized, per metric: positive is a lower score) sit beside them."""
    options = cfg.get("quant_options") or {}
    per_channel = bool(options.get("per_channel", False))
    layers = quantization.quantize(module, low_bit, per_channel)
    batches = int(options.get("calibration_batches", 16))
    if low_bit.activation_bits is not None:
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        calibration = build_trainer(cfg, logger=False, callbacks=[], limit_val_batches=batches,
                                    enable_progress_bar=False, enable_model_summary=False)
        calibration.validate(module, dataloaders=datamodule.train_dataloader(), verbose=False)
        quantization.fix_ranges(layers)
    quantized = score()
    return {"metrics": quantized, "full_precision": full,
            "drop": {k: full[k] - v for k, v in quantized.items() if k in full},
            "quant": {"scheme": low_bit.name, "per_channel": per_channel, "layers": len(layers),
                      "calibration_batches": batches if low_bit.activation_bits else 0}}


def quantized_test(cfg: DictConfig, low_bit, module, datamodule, full: dict) -> dict:
    """train.py's `quant=<scheme>`: after its test, the tested weights quantized (as eval.py does)
    and the test split scored again, its files (predictions, PNGs) in <run>/quant-<scheme>/. The
    metrics to add: `<metric>@<scheme>` (quantized) and `<metric>@<scheme>/drop` (full precision
    minus quantized) for each test metric."""
    root = Path(cfg.paths.output_dir) / f"quant-{low_bit.name}"
    root.mkdir(parents=True, exist_ok=True)

    def score() -> dict:
        trainer = build_trainer(cfg, logger=False, callbacks=[], default_root_dir=str(root),
                                enable_checkpointing=False)
        return to_float_dict((trainer.test(module, datamodule=datamodule, verbose=False) or [{}])[0])

    tested = {k: v for k, v in full.items() if k.startswith("test/")}
    q = quantized_eval(cfg, low_bit, module, datamodule, score, tested)
    return {**{f"{k}@{low_bit.name}": v for k, v in q["metrics"].items()},
            **{f"{k}@{low_bit.name}/drop": v for k, v in q["drop"].items()}}


def evaluate(cfg: DictConfig) -> dict:
    """Evaluate a checkpoint on the test (or val) split; task and model come from its run's config."""
    low_bit = quantization.scheme(cfg.get("quant"))  # before any work: a bad name is one line
    module, datamodule, task_cfg = load_checkpoint_module(cfg)
    ckpt = Path(str(cfg.ckpt_path))

    def score() -> dict:
        trainer = build_trainer(cfg, logger=False, callbacks=[])
        if cfg.split == "val":
            results = trainer.validate(module, datamodule=datamodule)
        else:
            results = trainer.test(module, datamodule=datamodule)
        return to_float_dict(results[0] if results else {})

    metrics = score()
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "status": "ok", "ckpt_path": str(ckpt), "split": cfg.split, "task": task_cfg.name,
        "metrics": metrics, "scheme_params": scheme_params(module), "run_dir": str(out_dir),
    }
    if low_bit is not None:  # the same split again, quantized; the full-precision numbers kept
        record.update(quantized_eval(cfg, low_bit, module, datamodule, score, metrics))
    write_json(out_dir / "eval_metrics.json", record)
    print_summary(f"eval {ckpt}", record)
    return record
