"""One sweep job per GPU (hydra/launcher=joblib + hardware=gpu), without a GPU: which GPU each job's
worker process claims and the CUDA_VISIBLE_DEVICES it sets."""

import os
import re
import subprocess
import sys

import pytest
from helpers.cards import TINY
from helpers.cli import QUIET, cli_env, metrics_files
from helpers.paths import ROOT
from hydra.types import RunMode
from omegaconf import OmegaConf

from attnlab import gpu_jobs


def test_job_i_goes_to_gpu_i_mod_n_unless_another_worker_holds_it(tmp_path):
    gpus = ["0", "1"]
    first, lock0 = gpu_jobs.claim_gpu(0, gpus, tmp_path)
    second, lock1 = gpu_jobs.claim_gpu(1, gpus, tmp_path)
    assert (first, second) == ("0", "1") and lock0 and lock1
    lock1.close()  # the worker on GPU 1 exits; job 2's worker wants GPU 0, still held: it takes 1
    third, lock2 = gpu_jobs.claim_gpu(2, gpus, tmp_path)
    assert third == "1" and lock2
    extra, shared = gpu_jobs.claim_gpu(3, gpus, tmp_path)  # more workers than GPUs: shares i mod n
    assert (extra, shared) == ("1", None)


def job_config(tmp_path, num, launcher="hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
               accelerator="gpu", devices=1):
    return OmegaConf.create({
        "hydra": {"mode": RunMode.MULTIRUN, "launcher": {"_target_": launcher}, "job": {"num": num},
                  "sweep": {"dir": str(tmp_path)}},
        "trainer": {"accelerator": accelerator, "devices": devices}})


@pytest.fixture
def worker(monkeypatch):
    """A fresh worker process: no GPU claimed yet, two GPUs visible."""
    monkeypatch.setattr(gpu_jobs, "_held", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    yield
    lock = gpu_jobs._held.get("lock")
    if lock is not None:
        lock.close()


def test_a_worker_keeps_the_gpu_of_its_first_job(tmp_path, worker, capsys):
    callback = gpu_jobs.OneJobPerGpu()
    callback.on_job_start(job_config(tmp_path, 1))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"  # job 1 of 2 visible GPUs: the second one
    callback.on_job_start(job_config(tmp_path, 4))  # the same worker's next job: CUDA is set up already
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert "sweep job 4 on GPU 3" in capsys.readouterr().out


@pytest.mark.parametrize("change", [{"launcher": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"},
                                    {"accelerator": "cpu"}, {"devices": -1}])
def test_only_joblib_sweeps_on_one_gpu_per_job(tmp_path, worker, change):
    gpu_jobs.OneJobPerGpu().on_job_start(job_config(tmp_path, 1, **change))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3" and not gpu_jobs._held


@pytest.mark.slow
def test_joblib_sweep_assigns_gpus_per_worker(tmp_path, data_dir):
    """A real joblib sweep (2 workers, 3 jobs) on two made-up GPUs: the jobs fail to get a GPU
    here, but each prints the GPU its worker claimed."""
    env = cli_env(tmp_path, data_dir) | {"CUDA_VISIBLE_DEVICES": "5,6"}
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=joblib",
                          "hydra.launcher.n_jobs=2", "hardware=gpu", "task=vqa", "model=unas,dnas,hnas",
                          "debug=fast", *TINY["vqa"], *QUIET], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900, check=True).stdout
    assigned = dict(re.findall(r"sweep job (\d) on GPU (\d)", out))
    assert sorted(assigned) == ["0", "1", "2"] and {assigned["0"], assigned["1"]} == {"5", "6"}
    assert len(metrics_files(tmp_path / "outputs" / "multirun")) == 3  # each job ran (and failed: no GPU)
