"""Faults a run survives: a failing logger, failed and killed sweep jobs, kill -9 mid-epoch and at
an epoch end (then ckpt_path=last reaches the uninterrupted run's metrics), a kill during a
checkpoint save, truncated data caches. Real processes are killed with SIGKILL
(tests/helpers/fault_injection.py) so that nothing gets a chance to clean up.
"""

import json
import math
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.cards import TINY
from helpers.cli import QUIET, metrics_files, run_cli, run_here
from helpers.paths import FIXTURES, ROOT

from attnlab import checkpoints, report
from attnlab.study.evidence import load_jobs

# tests/helpers on the path of the CLI processes, for fault_injection.KillAt / DiskFullLogger
FAULT_ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "helpers"), os.environ.get("PYTHONPATH", "")])}
RESUME = ["task=vqa", "model=hnas", "seed=7", *TINY["vqa"], *QUIET, "trainer.max_epochs=2",
          "callbacks.last_checkpoint.every_n_train_steps=2"]


def finished(outputs):
    records = [r for r in metrics_files(outputs) if r["status"] == "ok"]
    return max(records, key=lambda r: r["_dir"].stat().st_mtime)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    """The reference: the same run, never killed (shared by the two resume tests), in this
    process (helpers.cli.run_here: one thread, as the killed and resumed processes)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    run_here(RESUME, out, data_dir)
    return finished(out / "outputs")


@pytest.mark.parametrize("kill, mid_epoch", [
    ("+callbacks.kill.step=3", True),
    # at an epoch end: the simpler case, slow to keep the default suite short
    pytest.param("+callbacks.kill.epoch=1", False, marks=pytest.mark.slow),
], ids=["mid-epoch", "epoch-end"])
def test_kill_9_then_resume_reaches_the_same_metrics(kill, mid_epoch, uninterrupted, tmp_path, data_dir):
    killed = run_cli([*RESUME, "+callbacks.kill._target_=fault_injection.KillAt", kill], tmp_path, data_dir,
                     check=False, env=FAULT_ENV)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not list((tmp_path / "outputs").rglob("metrics.json"))
    (last,) = (tmp_path / "outputs").rglob("last.ckpt")
    state = torch.load(last, weights_only=True)
    position = state["callbacks"]["RngState"].get("position")
    if mid_epoch:  # saved at step 2 of epoch 0 (6 batches of 32): step 3 is lost and redone
        assert state["global_step"] == 2 and state["epoch"] == 0 and position == [0, 64]
    else:  # the epoch-end checkpoint of epoch 0
        assert state["epoch"] == 0 and position is None and state["global_step"] > 2
    steps_file = tmp_path / "steps.json"
    resumed = run_cli([*RESUME, "ckpt_path=last", "+callbacks.steps._target_=fault_injection.StepsRun",
                       f"+callbacks.steps.path={steps_file}"], tmp_path, data_dir, env=FAULT_ENV)
    assert "Restoring states from the checkpoint" in resumed.stdout + resumed.stderr
    assert "not resumable" not in resumed.stderr  # the sampler resumes mid-epoch (Lightning would restart it)
    record = finished(tmp_path / "outputs")
    # the resume ran in the killed run's folder (its configs in .hydra/resume-<time>): no other
    (run,) = [p for p in (tmp_path / "outputs").glob("*/*/*") if p.is_dir()]
    assert record["_dir"] == run and list(run.glob(".hydra/resume-*/overrides.yaml"))
    # training went on from the checkpoint: the resumed run wrote its last checkpoint at the
    # uninterrupted run's final step, and every metric (and u) is bit-for-bit the same (CPU)
    (final,) = [p for p in (tmp_path / "outputs").rglob("last.ckpt")]
    (reference,) = list(uninterrupted["_dir"].rglob("last.ckpt"))
    ends = [torch.load(p, weights_only=True) for p in (final, reference)]
    assert ends[0]["global_step"] == ends[1]["global_step"] > state["global_step"]
    # the resumed process started at the checkpoint's step and ran only the steps after it
    ran = json.loads(steps_file.read_text())
    assert ran["start"] == state["global_step"]
    assert ran["batches"] == 2 * 6 - state["global_step"]  # 2 epochs of 6 batches in all
    for a, b in zip(ends[0]["optimizer_states"][0]["state"].values(),
                    ends[1]["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a), "optimizer state differs"
    assert set(record["metrics"]) == set(uninterrupted["metrics"])
    differ = {k: (v, w) for k, v in record["metrics"].items()
              if (w := uninterrupted["metrics"][k]) != v and not (math.isnan(v) and math.isnan(w))}
    assert not differ, differ
    assert record["scheme_params"] == uninterrupted["scheme_params"]


def test_a_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    io = checkpoints.AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "epoch": 1}, path)
    pid = os.fork()
    if pid == 0:  # the child dies with SIGKILL half-way through writing a bigger checkpoint
        real_save = torch.save

        def save_half_then_die(obj, f, *args, **kwargs):
            f.write(b"PK\x03\x04" + b"\0" * 4096)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            real_save(obj, f, *args, **kwargs)

        torch.save = save_half_then_die
        io.save_checkpoint({"state_dict": {"w": torch.zeros(10_000)}, "epoch": 2}, path)
        os._exit(0)  # not reached
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (tmp_path / ".last.ckpt.partial").stat().st_size > 0  # the torn write is aside
    ckpt = checkpoints.read(path)
    assert ckpt["epoch"] == 1 and torch.equal(ckpt["state_dict"]["w"], torch.ones(3))
    io.save_checkpoint({"state_dict": {"w": torch.zeros(2)}, "epoch": 3}, path)  # the next save works
    assert checkpoints.read(path)["epoch"] == 3 and not (tmp_path / ".last.ckpt.partial").exists()


def test_a_failing_logger_warns_once_and_the_run_goes_on(tmp_path, data_dir):
    """Disk full under one logger, and a W&B dir that cannot be created: the run ends normally,
    with metrics.json, checkpoints and the CSV logger's metrics."""
    not_a_dir = tmp_path / "a_file"
    not_a_dir.write_text("")
    proc = run_cli(["task=vqa", *TINY["vqa"], *QUIET, "logger=[wandb,csv]", f"logger.wandb.save_dir={not_a_dir}/w",
                    "+logger.full._target_=fault_injection.DiskFullLogger", f"+logger.full.save_dir={tmp_path}/full",
                    "trainer.log_every_n_steps=1"], tmp_path, data_dir, env=FAULT_ENV)
    warnings = [line for line in proc.stderr.splitlines() if "Warning: [attnlab] logger" in line]
    assert len(warnings) == 1 and "DiskFullLogger failed in log_metrics" in warnings[0], proc.stderr[-3000:]
    assert "No space left on device" in warnings[0] and "training goes on without it" in warnings[0]
    record = finished(tmp_path / "outputs")
    assert "test/acc" in record["metrics"]
    assert (record["_dir"] / "checkpoints" / "last.ckpt").is_file()
    assert "val/acc" in (record["_dir"] / "csv" / "metrics.csv").read_text()
    assert str(not_a_dir) not in record.get("wandb_dir", "")  # W&B went to the system temp dir


def test_a_failed_sweep_job_does_not_stop_the_others(tmp_path, data_dir, capsys):
    """The second job fails its validation (lr=-1), the others run; a job whose process died
    (metrics.json still says running, its pid is gone) is reported as killed."""
    proc = run_here(["-m", "task=vqa", "task.module.optimizer.lr=-1,0.003", *TINY["vqa"], *QUIET, "debug=fast"],
                    tmp_path, data_dir)
    (sweep,) = (tmp_path / "outputs" / "multirun").iterdir()
    jobs = {tuple(r["overrides"]): r for r in metrics_files(sweep)}
    assert sorted(r["status"] for r in jobs.values()) == ["failed", "ok"], proc.stdout[-2000:]
    failed = next(r for r in jobs.values() if r["status"] == "failed")
    assert "task.module.optimizer.lr=-1" in failed["error"]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ghost = sweep / "9_vqa_unas_seed42"
    ghost.mkdir()
    (ghost / "metrics.json").write_text(json.dumps({
        "status": "running", "pid": dead.pid, "host": socket.gethostname(), "task": "vqa", "model": "unas",
        "seed": 42, "overrides": ["task.module.optimizer.lr=0.001"], "metrics": {}}))
    assert report.main([str(sweep)]) == 0  # `python -m attnlab.report` (in this process)
    out = capsys.readouterr().out
    assert f"failed: {failed['_dir']}" in out and f"killed: {ghost}" in out


@pytest.mark.slow
def test_a_killed_sweep_job_does_not_stop_the_others(tmp_path, data_dir):
    """With a process per job (submitit_local; SLURM alike) a job killed with SIGKILL leaves the
    others running; the report shows it as killed."""
    proc = run_cli(["-m", "hydra/launcher=submitit_local", "task=vqa", "seed=1,2,3", *TINY["vqa"], *QUIET,
                    "+callbacks.kill._target_=fault_injection.KillAt", "+callbacks.kill.step=2",
                    "+callbacks.kill.only_seed=2"], tmp_path, data_dir, check=False, timeout=1200, env=FAULT_ENV)
    (sweep,) = (tmp_path / "outputs" / "multirun").iterdir()
    statuses = sorted(j["status"] for j in load_jobs(sweep))
    assert statuses == ["killed", "ok", "ok"], (statuses, proc.stderr[-3000:])


def test_truncated_caches_are_rebuilt(tmp_path, capsys):
    from tasks.common import debian
    from tasks.vqa import synthetic

    # the synthetic VQA data set
    params = synthetic.SyntheticParams(seed=1, n_train_images=8, n_val_images=4, n_test_images=4,
                                       questions_per_image=2)
    path = synthetic.prepare(tmp_path / "vqa", params)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    arrays = synthetic.load_or_rebuild(tmp_path / "vqa", params)
    np.testing.assert_array_equal(arrays["val_features"], synthetic.generate(params)["val_features"])
    assert "rebuilding the cache because" in capsys.readouterr().out

    # the Debian records (the manifest knows their size)
    files = [FIXTURES / "text" / "Translation-en", FIXTURES / "text" / "Translation-en-updates"]
    records = debian.prepare(tmp_path / "deb", files=files)
    whole = records.read_text()
    records.write_text(whole[: len(whole) // 2])
    assert not debian.is_prepared(tmp_path / "deb")
    debian.prepare(tmp_path / "deb", files=files)
    assert records.read_text() == whole
    assert "rebuilding the cache because" in capsys.readouterr().out


def test_samplers_resume_after_the_samples_an_epoch_used():
    from attnlab.sampling import EpochSeededSampler, LengthGroupedSampler

    for sampler in (EpochSeededSampler(50, seed=3), LengthGroupedSampler(list(range(50)), batch_size=4, seed=3)):
        sampler.set_epoch(2)
        full = list(sampler)
        sampler.resume(2, 12)
        assert list(sampler) == full[12:]
        assert list(sampler) == full  # once only
        sampler.resume(1, 12)
        assert list(sampler) == full  # another epoch: nothing skipped
