"""Every bad input ends in one clear line and exit code 2 (tests/helpers/error_cases.py lists them,
and the table of docs/errors.md shows what each prints).

The CLI entry runs in this process (tests/conftest.py: run_app): Hydra, attnlab.cli and the
runner as the shell would run them, without paying the imports of a new process per case. A few
real subprocess runs prove the same end to end.
"""

import errno
import os

import pytest
import torch
from helpers.cards import TINY
from helpers.cli import QUIET, run_app, run_cli
from helpers.error_cases import CASES, ERRORS_DOC, Payload, doc_row, make_files, run_case, shown
from helpers.paths import ROOT


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    make_files(tmp)
    return tmp


@pytest.fixture(scope="module")
def env(bad_files, data_dir):
    return {"ATTNLAB_OUTPUTS": str(bad_files / "outputs"), "ATTNLAB_DATA": str(data_dir),
            "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_bad_input_is_one_clear_line(case, bad_files, env):
    if case.cpu_only and torch.cuda.is_available():
        pytest.skip("a machine with a CUDA GPU takes it")
    result = run_case(case, bad_files, env, run_app, QUIET, TINY)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.code == 2, (result.code, result.stderr[-3000:])
    assert len(errors) == 1, result.stderr
    assert case.names.replace("{tmp}", str(bad_files)) in errors[0]
    assert "Traceback" not in result.stderr
    # docs/errors.md shows exactly this line (PYTHONPATH=tests python -m helpers.error_cases)
    assert doc_row(case, shown(errors[0], bad_files)) in ERRORS_DOC.read_text(), errors[0]


def test_a_crafted_checkpoint_or_run_config_runs_nothing(bad_files, env):
    """A pickle payload given to train.py or eval.py, and a clean checkpoint whose run config
    would load it (`_target_: torch.load`, weights_only: false): one line each, and the payload's
    command never ran."""
    for case in CASES:
        if "payload" in str(case.args) or "foreign_run" in str(case.args):
            assert run_case(case, bad_files, env, run_app, QUIET, TINY).code == 2, case.what
    assert not (bad_files / "ran_code").exists()
    import pickle

    pickle.loads(pickle.dumps(Payload(bad_files / "unpickled")))  # the payload is real: it runs
    assert (bad_files / "unpickled").exists()


class DiskAnswering:
    """`os` as attnlab.files sees it on a full (ENOSPC) or read-only (EROFS) disk: every fsync of
    a file it writes fails, with no file name (as the write's own error has none)."""

    def __init__(self, error: int) -> None:
        self.error = error

    def fsync(self, fd) -> None:
        raise OSError(self.error, os.strerror(self.error))

    def __getattr__(self, name):
        return getattr(os, name)


@pytest.mark.parametrize(("error", "fix"), [
    (errno.ENOSPC, ("No space left on device; free space there, or write the run elsewhere: "
                    "paths.output_dir=<a folder with room> (every run: paths.log_dir=<a folder with room>)")),
    (errno.EROFS, ("Read-only file system; write the run elsewhere: paths.output_dir=<a writable "
                   "folder> (every run: paths.log_dir=<a writable folder>)")),
], ids=["full", "read-only"])
def test_a_full_or_read_only_disk_is_one_line(error, fix, env, monkeypatch, tmp_path):
    """A checkpoint that cannot be written: one line naming the file and the fix, exit 2."""
    from attnlab import files

    monkeypatch.setattr(files, "os", DiskAnswering(error))
    result = run_app(["task=probe", *TINY["probe"], *QUIET, f"paths.output_dir={tmp_path}"], env)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.code == 2 and len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(f"error: {tmp_path / 'checkpoints'}/") and errors[0].endswith(fix)
    assert "Traceback" not in result.stderr


def test_enough_cases():
    assert len(CASES) >= 30


def test_full_error_shows_the_traceback(bad_files, env):
    result = run_app(["task.module.optimizer.lr=-1", *QUIET], {**env, "HYDRA_FULL_ERROR": "1"})
    assert result.code != 2 and "Traceback" in result.stderr and "ConfigError" in result.stderr


def test_a_bug_keeps_its_traceback_and_exit_code_1(bad_files, env, monkeypatch):
    from attnlab import runner

    def broken(cfg):
        raise KeyError("a bug, not the user's fault")

    monkeypatch.setattr(runner, "validate", broken)
    result = run_app(QUIET, env)
    assert result.code == 1 and "Traceback" in result.stderr and "KeyError" in result.stderr


def test_trainer_callback_and_logger_arguments_need_no_plus(bad_files, env):
    """Any Lightning Trainer argument (and callback / logger argument) is a plain override, and
    --help lists them with Lightning's defaults."""
    result = run_app(["--cfg", "job", "trainer.max_steps=40", "trainer.limit_val_batches=0.5",
                      "trainer.val_check_interval=0.25", "trainer.accumulate_grad_batches=2",
                      "callbacks.model_checkpoint.every_n_epochs=2", "callbacks.progress_bar.refresh_rate=5",
                      "logger=tensorboard", "logger.tensorboard.log_graph=true"], env)
    assert result.code == 0, result.stderr
    for line in ("max_steps: 40", "limit_val_batches: 0.5", "val_check_interval: 0.25",
                 "accumulate_grad_batches: 2", "every_n_epochs: 2", "refresh_rate: 5", "log_graph: true"):
        assert line in result.stdout, line
    help_text = run_app(["--help"], env).stdout
    for line in ("max_steps: -1", "limit_train_batches: null", "reload_dataloaders_every_n_epochs: 0",
                 "save_top_k: 1", "every_n_train_steps: 100"):
        assert line in help_text, line
    # Hydra's own groups too: the launchers and sweepers a sweep may pick
    (launchers,) = [x for x in help_text.splitlines() if x.startswith("hydra/launcher: ")]
    assert {"basic", "joblib", "submitit_local"} <= set(launchers.split(": ")[1].split(", "))
    assert any(x.startswith("hydra/sweeper: ") and "optuna" in x for x in help_text.splitlines())


@pytest.mark.parametrize("enabled", [True, False])
def test_enable_progress_bar_false_works_as_typed(enabled):
    """Lightning refuses `enable_progress_bar=False` beside a progress bar callback: the runner
    leaves the bar out instead, so the standard option works as users type it."""
    import pytorch_lightning as pl
    from helpers.paths import CONF
    from omegaconf import OmegaConf

    from attnlab.runner import build_callbacks

    callbacks = OmegaConf.load(CONF / "callbacks" / "default.yaml")
    cfg = OmegaConf.create({"trainer": {"enable_progress_bar": enabled}, "callbacks": {
        "progress_bar": {"_target_": "pytorch_lightning.callbacks.RichProgressBar"},
        "lr_monitor": {"_target_": "pytorch_lightning.callbacks.LearningRateMonitor"}}})
    assert "progress_bar" in callbacks  # the default callbacks have the bar
    callbacks = build_callbacks(cfg)
    bars = [c for c in callbacks if isinstance(c, pl.callbacks.ProgressBar)]
    assert len(bars) == (1 if enabled else 0) and len(callbacks) == 1 + len(bars)
    pl.Trainer(enable_progress_bar=enabled, callbacks=callbacks, logger=False)  # accepted


def test_every_instantiated_node_lists_all_its_arguments(bad_files, env):
    """config_args: each _target_ node of trainer/callbacks/logger holds every argument of its
    class (a dataclass default as a node of its own: the progress bar's theme), but the few
    config_args.EXCLUDED leaves out and docs/running.md names; and that config builds."""
    import inspect

    from hydra.utils import get_class, instantiate
    from omegaconf import OmegaConf

    from attnlab.config_args import EXCLUDED

    result = run_app(["--cfg", "job", "logger=many", "callbacks.progress_bar.theme.metrics_format=.5f"], env)
    cfg = OmegaConf.create(result.stdout)
    nodes = [cfg.trainer, *cfg.callbacks.values(), *cfg.logger.values()]
    for node in nodes:
        params = inspect.signature(get_class(node._target_).__init__).parameters.values()
        left_out = EXCLUDED.get(node._target_, set())
        expected = {p.name for p in params if p.name != "self" and p.name not in left_out
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        assert expected <= set(node), (node._target_, expected - set(node))
    assert instantiate(cfg.callbacks.progress_bar).theme.metrics_format == ".5f"


def test_real_process_exit_code_and_one_line(bad_files, data_dir, tmp_path):
    """The same end to end in a new process, for the corrupt checkpoint of issue 18."""
    proc = run_cli([f"ckpt_path={bad_files}/corrupt.ckpt", *QUIET], tmp_path, data_dir, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and f"{bad_files}/corrupt.ckpt" in lines[-1]
    assert "Traceback" not in proc.stderr


# every task; every preset with its task (named <task>_...); the other groups' options
CONFIGS = [[f"task={p.stem}"] for p in sorted((ROOT / "conf" / "task").glob("*.yaml"))] + [
    [f"task={p.stem.split('_')[0]}", f"experiment={p.stem}"]
    for p in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))] + [
    ["hardware=ddp_cpu", "logger=many", "callbacks=minimal", "debug=overfit"], ["hardware=fsdp"], ["hardware=fsdp_cpu"]]


PRESETS = sorted((ROOT / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_preset_selects_its_task(preset, tmp_path):
    """`experiment=<task>_...` alone composes onto its own task (not onto the default vqa)."""
    from hydra import compose, initialize_config_dir

    from attnlab import config_args

    config_args.register(ROOT / "conf")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={preset.stem}", f"paths.output_dir={tmp_path}"])
    assert cfg.task.name == preset.stem.split("_")[0]


@pytest.mark.parametrize("overrides", CONFIGS, ids=[" ".join(c) for c in CONFIGS])
def test_every_shipped_config_passes_validation(overrides, tmp_path):
    """No false alarms: the configs the project ships are valid (every task, preset, group)."""
    from hydra import compose, initialize_config_dir

    from attnlab import config_args
    from attnlab.config_schema import validate

    config_args.register(ROOT / "conf")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"paths.output_dir={tmp_path}"])
    validate(cfg)
