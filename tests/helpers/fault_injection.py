"""Faults on purpose, for tests/test_faults.py: a process that dies, a logger whose disk is full.

Used from the command line like any callback or logger, e.g.
    python train.py +callbacks.kill._target_=fault_injection.KillAt +callbacks.kill.step=3
(with tests/ on PYTHONPATH).
"""

from __future__ import annotations

import errno
import os
import signal

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger


class KillAt(pl.Callback):
    """SIGKILL this process (no chance to save anything) after training step `step`, or at the
    first batch of epoch `epoch`; in a sweep only in the job of seed `only_seed` (if given)."""

    def __init__(self, step: int | None = None, epoch: int | None = None,
                 only_seed: int | None = None) -> None:
        self.step, self.epoch, self.only_seed = step, epoch, only_seed

    def _kill(self) -> None:
        if self.only_seed is None or torch.initial_seed() == self.only_seed:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.epoch is not None and trainer.current_epoch == self.epoch:
            self._kill()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.step is not None and trainer.global_step == self.step:
            self._kill()


class StepsRun(pl.Callback):
    """Write the global step training starts from and the number of training batches this
    process ran to `path` (JSON), so a test can tell a resume from a fresh start."""

    def __init__(self, path: str) -> None:
        self.path, self.start, self.batches = path, None, 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = int(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_train_end(self, trainer, pl_module) -> None:
        import json

        with open(self.path, "w") as f:
            json.dump({"start": self.start, "batches": self.batches}, f)

    def state_dict(self) -> dict:  # nothing of a run's count goes into its checkpoints
        return {}


class DiskFullLogger(CSVLogger):
    """A CSV logger whose disk fills up after `after` calls of log_metrics."""

    def __init__(self, save_dir: str, after: int = 2, **kwargs) -> None:
        super().__init__(save_dir, **kwargs)
        self.after, self.calls = int(after), 0

    def log_metrics(self, metrics, step=None) -> None:
        self.calls += 1
        if self.calls > self.after:
            raise OSError(errno.ENOSPC, "No space left on device", self.save_dir)
        super().log_metrics(metrics, step)
