"""W&B end to end, offline: one run per job across a kill and a resume, the dashboards' key contract
on a tiny run of every task, `attnlab.sync` (dry run, and an upload to a stand-in W&B server), and
checkpoints as artifacts. The runs are made once per module and shared by the tests."""

import functools
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers.cards import CARDS, MULTI_HEAD, TINY
from helpers.cli import cli_env, metrics_files, run_cli_batch
from helpers.paths import ROOT
from helpers.wandb_server import ENTITY, FakeWandb
from omegaconf import OmegaConf

from attnlab import dashboards, sync, wandb_runs

WANDB = [sys.executable, "-m", "wandb"]
# W&B on, every analysis on (>= 2 heads, so head diversity and importance have pairs), u at every step
COMMON = ["logger=wandb", "callbacks.progress_bar=null", "trainer.enable_model_summary=false",
          "trainer.log_every_n_steps=1", "callbacks.scheme_parameters.every_n_steps=1",
          "callbacks.head_importance.max_batches=1"]
VQA = ["task=vqa", *TINY["vqa"], "model=hnas", *COMMON, "task.module.net.fusion_heads=2", "trainer.max_epochs=2",
       "logger.wandb.log_model=best"]


def model_of(task: str) -> str:
    """HNAS everywhere but in causal attention, which refuses it (task.causal): CODA there."""
    return "coda" if CARDS[task].causal else "hnas"


@functools.cache
def leet_inspect(fragment, *options: str) -> str:
    """What a W&B offline run holds, read back with W&B's own reader (`wandb leet inspect`)."""
    # cwd: the W&B CLI writes its debug log into ./wandb, which must not be the repository's
    return subprocess.run([*WANDB, "leet", "inspect", *options, str(fragment)], cwd=fragment.parent,
                          capture_output=True, text=True, check=True).stdout


def inspect(fragment) -> dict:
    """The fragment's run id, name, config and last value of every key."""
    return json.loads(leet_inspect(fragment, "--summary", "--json"))


def fragments(job_dir):
    return sorted((job_dir / "wandb").glob("offline-run-*"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    """A sweep of two vqa jobs, preempted (SIGTERM) during the second, which is then resumed; and
    a tiny HNAS (lm: CODA) run of every other task. The resume and those runs share one process
    (helpers.cli.run_cli_batch): the imports are paid once.

    (SIGTERM, as schedulers do: the run saves last.ckpt and closes its W&B fragment. After a
    SIGKILL the fragment lacks W&B's last <= 15 s, which it flushes to disk every 15 s.)"""
    tmp = tmp_path_factory.mktemp("sweep")
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", *VQA, "seed=1,2"], cwd=tmp,
                            env=cli_env(tmp, data_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, ckpts = time.time() + 600, []
    while time.time() < deadline and not ckpts and proc.poll() is None:
        time.sleep(0.05)
        ckpts = list((tmp / "outputs" / "multirun").glob("*/1_*/checkpoints/last.ckpt"))
    assert ckpts, "the sweep's second job wrote no checkpoint"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, "the sweep was not preempted during the second job's training"
    assert torch.load(ckpts[0], weights_only=True)["epoch"] < 2
    others = {task: tmp_path_factory.mktemp(task) for task in TINY if task != "vqa"}
    run_cli_batch([([*VQA, "seed=2", f"ckpt_path={ckpts[0]}"], tmp)] + [
        ([f"task={task}", *TINY[task], f"model={model_of(task)}", *MULTI_HEAD[task], *COMMON], others[task])
        for task in others], data_dir)
    (sweep_dir,) = (tmp / "outputs" / "multirun").iterdir()
    task_runs = {"vqa": next(sweep_dir.glob("1_*"))}  # vqa: the resumed sweep job
    task_runs.update({task: metrics_files(out / "outputs")[0]["_dir"] for task, out in others.items()})
    return sweep_dir, task_runs


@pytest.fixture(scope="module")
def sweep(runs):
    """The preempted and resumed sweep's dir."""
    return runs[0]


@pytest.fixture(scope="module")
def task_runs(runs):
    """{task: run dir} of a tiny HNAS (lm: CODA) run of every task (vqa: the resumed sweep job)."""
    return runs[1]


def test_kill_and_resume_keep_one_wandb_run(sweep):
    jobs = sorted(sweep.glob("*_vqa_hnas_seed*"))
    assert [len(fragments(j)) for j in jobs] == [1, 2]  # the resumed job: one fragment per process
    first, resumed = (inspect(f) for f in fragments(jobs[1]))
    kept = json.loads((jobs[1] / wandb_runs.RUN_FILE).read_text())
    assert first["run_id"] == resumed["run_id"] == kept["id"] != inspect(fragments(jobs[0])[0])["run_id"]
    assert kept == {"id": kept["id"], "name": "hnas-vqa-seed2", "group": sweep.name}  # resumed by a single run
    assert all(f.name.endswith(kept["id"]) for f in fragments(jobs[1]))
    # the resumed part goes on from the checkpoint's step and ends with the test metrics
    assert resumed["summary"]["trainer/global_step"] > first["summary"]["trainer/global_step"]
    assert "test/acc" in resumed["summary"] and "test/acc" not in first["summary"]
    record = json.loads((jobs[1] / "metrics.json").read_text())
    assert record["wandb_run"] == f"attnlab/{kept['id']}" and record["status"] == "ok"


@pytest.mark.parametrize("task", list(TINY))
def test_dashboard_keys_are_logged(task, task_runs):
    """Key contract: every key, key pattern and media key a dashboard panel shows is in a tiny
    offline run of the task (a renamed metric would leave a panel silently empty)."""
    summary = {}
    for fragment in fragments(task_runs[task]):
        summary.update(inspect(fragment)["summary"])
    metric = dashboards.task_metrics()[task]
    media_type = {"media": "image-file", "table": "table-file", "histogram": "histogram"}
    for section in dashboards.sections({task: metric}):
        if (section.needs == "classification" and not CARDS[task].classification
                or section.needs == "scheme parameters" and model_of(task) != "hnas"):
            assert not any(k in summary for p in section.panels for k in p.keys), section.name
            assert not any(re.search(p.regex, k) for p in section.panels if p.regex
                           for k in summary), section.name
            continue
        for panel in section.panels:
            found = [k for k in summary if re.search(panel.regex, k)] if panel.regex else list(panel.keys)
            assert found, f"{task}: nothing matches {panel.regex} ({section.name}: {panel.title})"
            for key in found:
                assert key in summary, f"{task}: {key} is not logged ({section.name}: {panel.title})"
                value = summary[key]
                if panel.kind in media_type:
                    assert isinstance(value, dict) and value.get("_type") == media_type[panel.kind], (key, value)
                else:
                    assert isinstance(value, (int, float)), (key, value)


def test_u_is_logged_at_every_step(task_runs):
    first = fragments(task_runs["vqa"])[0]
    assert leet_inspect(first, "--json").count('"hnas/u/layer0"') >= 3


def test_sync_dry_run_lists_every_run_once(sweep, capsys):
    assert sync.main([str(sweep), "--dry-run"]) == 0  # `python -m attnlab.sync` (in this process)
    out = capsys.readouterr().out
    ids = [json.loads((j / wandb_runs.RUN_FILE).read_text())["id"] for j in sorted(sweep.glob("*_vqa_*"))]
    assert [out.count(i) for i in ids] == [1, 1]
    assert "2 run(s), 3 fragment(s) to upload (dry run)" in out
    assert not list(sweep.rglob("*.wandb.synced"))  # nothing was sent


@pytest.fixture
def fake_wandb(monkeypatch):
    fake = FakeWandb()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    yield fake
    fake.close()


def test_sync_uploads_fragments_into_their_run(sweep, tmp_path, fake_wandb, capsys, monkeypatch):
    copy = shutil.copytree(sweep, tmp_path / sweep.name)
    monkeypatch.chdir(tmp_path)  # `wandb sync` writes its debug log into ./wandb/logs
    assert sync.main([str(copy)]) == 0
    table = capsys.readouterr().out
    jobs = sorted(copy.glob("*_vqa_*"))
    ids = [json.loads((j / wandb_runs.RUN_FILE).read_text())["id"] for j in jobs]
    assert sorted(fake_wandb.history) == sorted(ids)  # two jobs, two runs, whatever the fragments
    for job, run_id in zip(jobs, ids):
        assert f"{fake_wandb.url}/{ENTITY}/attnlab/runs/{run_id}" in table
        rows = fake_wandb.history[run_id]
        assert [row["_step"] for row in rows] == list(range(len(rows)))  # every row, once, in order
        parts = [inspect(f) for f in fragments(sweep / job.name)]
        assert len(rows) == sum(p["step"] + 1 for p in parts)  # fragment 2's rows follow fragment 1's
        if len(parts) == 2:
            first = rows[:parts[0]["step"] + 1]
            assert rows[len(first)]["trainer/global_step"] >= max(r.get("trainer/global_step", 0) for r in first)
    assert {a["name"]: sorted(a["aliases"]) for a in fake_wandb.artifacts if a["type"] == "model"} == {
        f"model-{i}": ["best", "latest"] for i in ids}  # logger.wandb.log_model=best
    groups = {v["groupName"] for v in fake_wandb.graphql("UpsertBucket") if v.get("groupName")}
    assert groups == {sweep.name}
    # a second sync uploads nothing and still shows where each run went
    streamed = sum("file_stream" in r["path"] for r in fake_wandb.requests)
    assert sync.main([str(copy)]) == 0
    assert sum("file_stream" in r["path"] for r in fake_wandb.requests) == streamed
    again = capsys.readouterr().out
    assert again.count("synced before") == 2 and all(f"/runs/{i}" in again for i in ids)


def eval_script():
    """eval.py as a module (its `evaluate_any` is what `python eval.py` runs)."""
    spec = importlib.util.spec_from_file_location("attnlab_eval_script", ROOT / "eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eval_from_a_wandb_artifact(sweep, tmp_path, data_dir, monkeypatch):
    """eval.py ckpt_path=wandb:...: the artifact log_model=best wrote holds what eval needs."""
    job = next(sweep.glob("0_*"))
    run_id = json.loads((job / wandb_runs.RUN_FILE).read_text())["id"]
    records = map(json.loads, leet_inspect(fragments(job)[0], "--json").splitlines())
    (artifact,) = [r["artifact"] for r in records if r.get("type") == "artifact" and r["artifact"]["type"] == "model"]
    assert (artifact["name"], sorted(artifact["aliases"])) == (f"model-{run_id}", ["best", "latest"])
    contents = {c["path"]: c["local_path"] for c in artifact["manifest"]["contents"]}
    best = next((job / "checkpoints").glob("best-*.ckpt"))
    assert contents == {f"checkpoints/{best.name}": str(best), "config.yaml": str(job / "config.yaml")}

    class Api:  # W&B's download, from the files the offline artifact references
        def artifact(self, name, type):
            assert (name, type) == (f"{ENTITY}/attnlab/model-{run_id}:best", "model")
            return self

        def download(self, root):
            for path, local in contents.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                shutil.copy(local, os.path.join(root, path))
            return root

    import wandb
    from hydra import compose, initialize_config_dir

    monkeypatch.setattr(wandb, "Api", Api)
    monkeypatch.setenv("ATTNLAB_DATA", str(data_dir))
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("eval", [f"ckpt_path=wandb:{ENTITY}/attnlab/model-{run_id}:best", f"paths.output_dir={tmp_path}"])
    evaluated = eval_script().evaluate_any(cfg)
    assert evaluated["ckpt_path"].startswith(str(tmp_path / "artifacts"))
    tested = json.loads((job / "metrics.json").read_text())
    assert evaluated["metrics"]["test/acc"] == pytest.approx(tested["metrics"]["test/acc"], abs=1e-6)


def test_wandb_checkpoint_path_errors(tmp_path, monkeypatch):
    cfg = OmegaConf.create({"ckpt_path": "wandb:model-1:best", "paths": {"output_dir": str(tmp_path)}})
    with pytest.raises(wandb_runs.ConfigError, match=re.escape("wandb:<entity>/<project>/<artifact>:<alias>")):
        eval_script().evaluate_any(cfg)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # not logged in
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    with pytest.raises(wandb_runs.ConfigError, match="needs a W&B server: `wandb login`"):
        wandb_runs.checkpoint_from_artifact("wandb:me/attnlab/model-1:best", tmp_path)


def test_logger_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = OmegaConf.create({"model": {"name": "dnas"}, "task": {"name": "mlm"}, "seed": 3,
                            "paths": {"output_dir": str(tmp_path)}})
    conf = OmegaConf.create({"name": None, "group": None, "id": None, "offline": True, "log_model": False})
    first = wandb_runs.logger_kwargs(cfg, conf, group="sweep-a")
    assert first == {"id": first["id"], "resume": "allow", "name": "dnas-mlm-seed3", "group": "sweep-a"}
    assert re.fullmatch(r"[a-z0-9]{8}", first["id"])
    # resumed by another command (a single run, another seed): same run, name and group
    cfg.seed = 42
    assert wandb_runs.logger_kwargs(cfg, conf, group="mlm") == first
    for log_model, message in [(True, "needs an online run"), ("every", "use false, best")]:
        conf.log_model = log_model
        with pytest.raises(wandb_runs.ConfigError, match=message):
            wandb_runs.logger_kwargs(cfg, conf, group="mlm")
    conf.log_model = "best"  # attnlab's upload, not Lightning's (which refuses offline runs)
    assert wandb_runs.logger_kwargs(cfg, conf, group="mlm")["log_model"] is False


@pytest.mark.parametrize("task", list(TINY))
def test_every_task_records_sinks_outliers_and_stability(task, task_runs):
    """OutlierDiagnostics (on by default): the numbers per layer and for the model in
    metrics.json, diagnostics.json and .png in the run dir, the per-head sink importances as a
    W&B histogram; StabilityMonitor's record and step-wise numbers."""
    run = task_runs[task]
    metrics = json.loads((run / "metrics.json").read_text())["metrics"]
    for key in ("sink_rate", "sink_rate_eps0.2", "zero_share", "kurtosis", "max_kurtosis", "max_abs",
                "top1_over_median", "layer0/sink_rate", "layer0/kurtosis", "layer0/pooled_kurtosis"):
        value = metrics[f"diagnostics/{key}"]
        assert math.isfinite(value), (key, value)
    assert 0 <= metrics["diagnostics/sink_rate"] <= metrics["diagnostics/sink_rate_eps0.2"] <= 1
    assert metrics["diagnostics/kurtosis"] >= 1  # mu4 / s^4 >= 1 for any sample (Pearson)
    saved = json.loads((run / "diagnostics.json").read_text())
    assert saved["model"]["sink_rate"] == pytest.approx(metrics["diagnostics/sink_rate"])
    assert (run / "diagnostics.png").stat().st_size > 1000
    summary = {}
    for fragment in fragments(run):
        summary.update(inspect(fragment)["summary"])
    assert summary["diagnostics/layer0/sink_importance_hist"]["_type"] == "histogram"
    # StabilityMonitor (on by default): the run's stability record and its step-wise numbers
    record = json.loads((run / "metrics.json").read_text())
    assert record["stability"]["diverged"] is False and record["stability"]["loss_spikes"] >= 0
    assert metrics["train/grad_norm"] > 0 and metrics["train/diverged"] == 0
    assert any(k.startswith("train/max_attn_logit/layer0") for k in summary)


def test_diagnose_a_checkpoint_reproduces_the_run_s_own_numbers(task_runs, tmp_path, capsys):
    """`python -m attnlab.diagnose <best checkpoint>` (in this process) rebuilds the run's model
    and measures the same test batches: the numbers the run wrote at its end."""
    from attnlab.diagnose import main

    run = task_runs["lm"]
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    assert main([str(best), "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "diagnostics.json").read_text())["model"]
    saved = json.loads((run / "diagnostics.json").read_text())["model"]
    assert again.keys() == saved.keys()
    for key, value in saved.items():
        assert again[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert "sink rate" in capsys.readouterr().out
