"""Run safety: a checkpoint on SIGTERM (preemption) and RNG states that survive a resume.

Lightning turns SIGTERM into `SIGTERMException` at the next batch boundary; `PreemptionCheckpoint`
saves `checkpoints/last.ckpt` then (Lightning writes checkpoints through an fsspec transaction:
a temporary file moved into place, so a kill mid-write never leaves a torn file).
`RngState` stores the torch/numpy/python RNG states in every checkpoint and restores them, so a run
resumed from an epoch-end checkpoint continues bit-for-bit like an uninterrupted one on CPU.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info
from pytorch_lightning.utilities.exceptions import SIGTERMException


class PreemptionCheckpoint(pl.Callback):
    def __init__(self, dirpath: str | None = None, filename: str = "last.ckpt") -> None:
        self.dirpath = dirpath
        self.filename = filename

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        if trainer.state.fn != "fit":
            return
        dirpath = Path(self.dirpath or Path(trainer.default_root_dir) / "checkpoints")
        path = dirpath / self.filename
        trainer.save_checkpoint(path)
        rank_zero_info(f"[attnlab] interrupted: checkpoint written to {path}; resume with ckpt_path=last")


class RngState(pl.Callback):
    # Plain tensors, lists and numbers only, so checkpoints still load with torch.load(weights_only=True).
    def state_dict(self) -> dict:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        version, internal, gauss = random.getstate()
        return {
            "torch": torch.get_rng_state(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "python": [version, list(internal), gauss],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        if "torch" not in state_dict:
            return
        torch.set_rng_state(state_dict["torch"])
        kind, keys, pos, has_gauss, cached = state_dict["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        version, internal, gauss = state_dict["python"]
        random.setstate((version, tuple(internal), gauss))

