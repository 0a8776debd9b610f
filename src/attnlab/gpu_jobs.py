"""One sweep job per GPU: `python train.py -m hydra/launcher=joblib hydra.launcher.n_jobs=<GPUs> hardware=gpu ...`

A Hydra callback (conf/hydra/default.yaml) that acts only in a joblib sweep on one GPU per job
(`trainer.accelerator=gpu`, `trainer.devices=1`). Job i goes to GPU i mod n through
CUDA_VISIBLE_DEVICES (n: the GPUs visible to the sweep, CUDA_VISIBLE_DEVICES included).

Joblib's workers are processes reused from job to job, and CUDA reads CUDA_VISIBLE_DEVICES once
per process, so the GPU belongs to the worker: its first job picks GPU i mod n, or the next free
one if another worker holds that (a lock file per GPU in the sweep dir, held while the worker
lives), and its later jobs stay there. So with n_jobs <= n, two jobs never share a GPU, even when
jobs of different lengths make the order of jobs and workers drift. With more workers than GPUs,
the extra ones share GPU i mod n (said once per worker).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

_held: dict[str, Any] = {}  # this worker process's GPU and the open lock file that holds it


def visible_gpus() -> list[str]:
    """The GPUs this sweep may use: CUDA_VISIBLE_DEVICES if set, else every GPU of the machine."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]  # NVML: does not initialize CUDA


def claim_gpu(job_num: int, gpus: list[str], lock_dir: Path) -> tuple[str, object | None]:
    """GPU `job_num mod n` if free, else the next free one; (gpu, open lock file) or (gpu, None) shared."""
    import fcntl  # POSIX; imported here so that the callback never stops a run elsewhere

    lock_dir.mkdir(parents=True, exist_ok=True)
    n = len(gpus)
    for k in range(n):
        gpu = gpus[(job_num + k) % n]
        handle = open(lock_dir / f"gpu{gpu}.lock", "w")  # noqa: SIM115 - held open while the worker lives
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return gpu, handle
        except BlockingIOError:
            handle.close()
    return gpus[job_num % n], None


class OneJobPerGpu(Callback):
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra_cfg, trainer = config.hydra, config.get("trainer") or {}
        if (hydra_cfg.mode != RunMode.MULTIRUN or "Joblib" not in str(hydra_cfg.launcher.get("_target_"))
                or trainer.get("accelerator") != "gpu" or trainer.get("devices") != 1):
            return
        job = int(hydra_cfg.job.num)
        if "gpu" not in _held:  # this worker's first job: CUDA is not initialized here yet
            gpus = visible_gpus()
            if not gpus:
                return  # no GPU: Lightning says so with its own error
            gpu, lock = claim_gpu(job, gpus, Path(hydra_cfg.sweep.dir) / ".gpu_locks")
            if lock is None:
                print(f"[attnlab] more joblib workers than GPUs ({len(gpus)}): this worker shares GPU {gpu}; "
                      f"set hydra.launcher.n_jobs={len(gpus)} for one job per GPU")
            _held.update(gpu=gpu, lock=lock)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        print(f"[attnlab] sweep job {job} on GPU {_held['gpu']} (CUDA_VISIBLE_DEVICES={_held['gpu']})")
