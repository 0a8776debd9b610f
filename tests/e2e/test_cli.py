"""The real CLI end to end: real Hydra, Lightning and W&B. A sweep and the signals in real processes
(exit codes, the signal handlers); the runs after them (eval.py, the resumes), the sweeps of every
scheme and the gates with the CLI entry in this process (helpers.cli.run_here: what the runs write,
not how a process ends), without ~10 s of imports per run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers.cards import CARDS, TINY, shares
from helpers.cli import QUIET, cli_env, metrics_files, run_cli, run_here
from helpers.paths import ROOT

from attnlab.study.report import main as report_main

TASKS = [t for t, overrides in TINY.items() if overrides]


def accepted_schemes(task: str) -> tuple[list[str], list[str]]:
    """Every registered scheme, split into those the task runs and those it refuses: a task whose
    scheme sits in causal attention (its card's `causal`) refuses query-normalized schemes, one
    whose scheme sits in attention that is not causal refuses causal-only ones (stick-breaking),
    by the scheme's own properties."""
    from attnlab.attention import names
    from attnlab.attention.schemes import fitting

    fits = fitting(causal=CARDS[task].causal)
    return [n for n in names() if n in fits], [n for n in names() if n not in fits]


def scheme_runs() -> list:
    """(task, schemes) per test case: every registered scheme in every task, the first task of
    each kind whole and the others' shares in the default suite, the rest `slow` (helpers.cards.
    shares); a scheme is registered once and runs in a task of each kind without an edit here."""
    from attnlab.attention import names

    cases = []
    for task, (share, rest) in shares(names()).items():
        if task not in TASKS:
            continue
        cases.append(pytest.param(task, share, id=task))
        if rest:
            cases.append(pytest.param(task, rest, id=f"{task}-rest", marks=pytest.mark.slow))
    return cases


@pytest.mark.parametrize(("task", "schemes"), scheme_runs())
def test_fast_dev_run_every_registered_scheme(task, schemes, tmp_path, data_dir):
    """One multirun process runs the registered schemes the task accepts through train, val and
    test; the ones it refuses fail at once with the clear message (recorded, sweep goes on)."""
    accepted, refused = accepted_schemes(task)
    models = [s for s in accepted + refused if s in schemes]
    refused = [s for s in refused if s in schemes]
    run_here(["-m", f"task={task}", f"model={','.join(models)}", "debug=fast", "callbacks=minimal",
              *TINY[task], *QUIET], tmp_path, data_dir)
    records = metrics_files(tmp_path / "outputs" / "multirun")
    assert sorted(r["model"] for r in records) == sorted(models)
    for r in records:
        if r["model"] in refused:
            why = "normalizes over queries" if CARDS[task].causal else "causal attention only"
            assert r["status"] == "failed" and why in r["error"]
            assert len(r["error"].strip().splitlines()) == 1, r["error"]  # one line
            continue
        assert r["status"] == "ok", r.get("error")
        assert any(k.startswith("test/") for k in r["metrics"]), r["metrics"]
        if r["model"] == "hnas":
            assert r["scheme_params"]["hnas_u"], "an HNAS model must report its u"


def test_multirun_report_and_eval(tmp_path, data_dir, capsys):
    proc = run_cli(["-m", "task=vqa", "model=unas,hnas", *TINY["vqa"], *QUIET], tmp_path, data_dir)
    sweeps = list((tmp_path / "outputs" / "multirun").iterdir())
    assert len(sweeps) == 1
    jobs = metrics_files(sweeps[0])
    assert len(jobs) == 2 and all(j["status"] == "ok" for j in jobs)
    # each job has its own dir, config and checkpoints, data only (weights_only loads them)
    for job in jobs:
        assert (job["_dir"] / "config.yaml").is_file()
        assert (job["_dir"] / "checkpoints" / "last.ckpt").is_file()
        for ckpt in (job["_dir"] / "checkpoints").glob("*.ckpt"):
            assert torch.load(ckpt, weights_only=True)["state_dict"]
    assert "hnas_u.png" in os.listdir(next(j["_dir"] for j in jobs if j["model"] == "hnas"))

    assert report_main([str(sweeps[0])]) == 0  # `python -m attnlab.report` (in this process)
    report = capsys.readouterr().out
    rows = [line for line in report.splitlines() if line.startswith("| ") and "model=" in line]
    assert len(rows) == 2 and any("model=unas" in r for r in rows) and any("model=hnas" in r for r in rows)
    assert (sweeps[0] / "report.csv").is_file()

    # eval.py on the best checkpoint reproduces the run's test accuracy
    job = jobs[0]
    best = next((job["_dir"] / "checkpoints").glob("best-*.ckpt"))
    run_here([f"ckpt_path={best}", *QUIET[:1]], tmp_path, data_dir, script="eval.py")
    evals = [json.loads(p.read_text()) for p in (tmp_path / "outputs").rglob("eval_metrics.json")]
    assert len(evals) == 1
    assert abs(evals[0]["metrics"]["test/acc"] - job["metrics"]["test/acc"]) < 1e-6
    assert proc.returncode == 0


def final_metrics(tmp_path):
    records = [r for r in metrics_files(tmp_path / "outputs") if r["status"] == "ok"]
    return max(records, key=lambda r: r["_dir"].stat().st_mtime)


@pytest.mark.parametrize("task", TASKS)
def test_every_task_takes_an_output_gate(task, tmp_path, data_dir):
    """model.gate on a scheme every task takes (the sink: over keys, causal tasks too): it runs
    in each task's attention and reports its gates per layer and head."""
    run_here([f"task={task}", "model=sink", "model.gate=headwise", "debug=fast", "callbacks=minimal",
              *TINY[task], *QUIET], tmp_path, data_dir)
    (record,) = metrics_files(tmp_path / "outputs")
    assert record["status"] == "ok", record.get("error")
    params = record["scheme_params"]
    assert params["gate_mean"] and params["sink_b"]
    assert set(params["gate_mean"]) <= set(params["sink_b"])  # gated where the scheme runs


# SIGTERM `slow`: the default suite's W&B fixture (tests/e2e/test_wandb.py) preempts a sweep with
# it and resumes; both signals go through one handler
@pytest.mark.parametrize(("signum", "code"), [pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow),
                                              (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_sigterm_writes_a_checkpoint_that_resumes(tmp_path, data_dir, signum, code):
    """Preemption (SIGTERM) and Ctrl-C (SIGINT) write last.ckpt at the moment of the signal and
    exit as a shell reports the signal (128 + its number); the run then resumes from it."""
    args = ["task=vqa", "model=unas", *TINY["vqa"], *QUIET, "trainer.max_epochs=1000"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path,
                            env=cli_env(tmp_path, data_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 240
    ckpts = []
    while time.time() < deadline and not ckpts:  # wait until training has gone through one epoch
        time.sleep(0.5)
        ckpts = list((tmp_path / "outputs").rglob("last.ckpt"))
    assert ckpts, "no epoch finished in time"
    first_step = torch.load(ckpts[0], weights_only=True)["global_step"]
    time.sleep(2.0)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out[-3000:]
    assert "interrupted: checkpoint written" in out
    state = torch.load(ckpts[0], weights_only=True)
    assert state["global_step"] > first_step  # the checkpoint is from the moment of the signal
    epoch = state["epoch"]
    # the resume: what it writes, not how its process ends (in this process)
    run_here(["task=vqa", "model=unas", *TINY["vqa"], *QUIET, f"trainer.max_epochs={epoch + 2}",
              f"ckpt_path={ckpts[0]}"], tmp_path, data_dir)




@pytest.mark.slow
def test_ddp_cpu_two_processes(tmp_path, data_dir):
    proc = run_cli(["task=vqa", "model=hnas", "hardware=ddp_cpu", *TINY["vqa"], *QUIET], tmp_path, data_dir)
    record = final_metrics(tmp_path)
    assert record["status"] == "ok" and "test/acc" in record["metrics"]
    assert "world_size: 2" in proc.stdout + proc.stderr or "Initializing distributed: GLOBAL_RANK: 1" in (
        proc.stdout + proc.stderr)


@pytest.mark.slow
def test_fsdp_cpu_trains_checkpoints_and_resumes(tmp_path, data_dir):
    """hardware=fsdp_cpu: two gloo processes train the probe's transformer sharded (one FSDP unit
    per layer) and write a full-state last.ckpt, as one process would; a run resumed from it goes
    on from the checkpoint's weights and data position exactly (its first loss is the
    uninterrupted run's). Not its optimizer state: on the CPU torch 2.13's FSDP gathers Adam's
    first moments wrongly (docs/running.md, Scale-out), so later steps differ."""
    import csv
    import math

    args = ["task=probe", "model=hnas", "hardware=fsdp_cpu", *TINY["probe"], *QUIET, "probe.n_train=128",
            "trainer.log_every_n_steps=1"]

    def losses(outputs) -> dict[int, float]:
        rows = [r for path in outputs.rglob("metrics.csv") for r in csv.DictReader(path.open())]
        return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}

    straight, first = tmp_path / "straight", tmp_path / "first"
    straight.mkdir(), first.mkdir()
    run_cli([*args, "trainer.max_epochs=2"], straight, data_dir)
    [record] = metrics_files(straight / "outputs")
    assert record["status"] == "ok", record.get("error")
    assert list(record["scheme_params"]["hnas_u"]) == ["net.layers.0.self_attn"]  # the plain name
    trained = losses(straight / "outputs")
    assert len(trained) == 4 and all(math.isfinite(x) for x in trained.values())  # 2 steps x 2 epochs
    assert len(set(trained.values())) == 4
    state = torch.load(next((straight / "outputs").rglob("last.ckpt")), weights_only=True)
    weights = state["state_dict"]
    assert state["global_step"] == 4 and not any("_fsdp" in k for k in weights)
    assert weights["net.layers.0.linear1.weight"].shape == (32, 24)  # whole, not a rank's flat shard
    assert weights["net.layers.0.self_attn.normalizer.hybrid_logit"].shape == (2,)
    # eval.py, one process, no FSDP: the best checkpoint scores as the sharded run's test did
    best = next((straight / "outputs").rglob("best-*.ckpt"))
    run_cli([f"ckpt_path={best}", *QUIET[:1]], straight, data_dir, script="eval.py")
    [evaluated] = [json.loads(p.read_text()) for p in (straight / "outputs").rglob("eval_metrics.json")]
    assert evaluated["metrics"]["test/loss"] == pytest.approx(record["metrics"]["test/loss"], rel=1e-5)

    run_cli([*args, "trainer.max_epochs=1"], first, data_dir)
    ckpt = next((first / "outputs").rglob("last.ckpt"))
    assert torch.load(ckpt, weights_only=True)["global_step"] == 2
    run_cli([*args, "trainer.max_epochs=2", f"ckpt_path={ckpt}"], first, data_dir)  # in its own dir
    [again] = metrics_files(first / "outputs")
    assert again["status"] == "ok" and torch.load(ckpt, weights_only=True)["global_step"] == 4
    resumed = losses(first / "outputs")  # the resumed run's steps (2, 3), maybe the first run's too
    assert {2, 3} <= set(resumed) and resumed[2] == trained[2]  # the first step after the resume


@pytest.mark.slow
def test_submitit_local_sweep(tmp_path, data_dir):
    run_cli(["-m", "hydra/launcher=submitit_local", "task=vqa", "model=unas,dnas", *TINY["vqa"], *QUIET],
            tmp_path, data_dir, timeout=1200)
    records = metrics_files(tmp_path / "outputs" / "multirun")
    assert sorted(r["model"] for r in records) == ["dnas", "unas"]
    assert all(r["status"] == "ok" for r in records)
