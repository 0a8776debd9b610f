"""Run safety: checkpoints on SIGTERM and within epochs, and resumes that continue bit-for-bit.

- `PreemptionCheckpoint`: Lightning turns SIGTERM into `SIGTERMException` at the next batch
  boundary, and this callback defers Ctrl-C (SIGINT) to the same place during fit; it saves
  `checkpoints/last.ckpt` then.
- `MidEpochCheckpoint`: `last.ckpt` every N optimizer steps, so a run killed with SIGKILL (OOM
  killer, a lost node) loses at most N steps.
- `RngState`: the torch/numpy/python RNG states and the position in the epoch in every
  checkpoint. A run resumed from any checkpoint, at an epoch end or mid-epoch, then trains on the
  same batches with the same random draws as an uninterrupted one (CPU, deterministic=true).

Checkpoints are written atomically by `attnlab.checkpoints.AtomicCheckpointIO` (conf/trainer).
"""

from __future__ import annotations

import random
import signal
import threading
import warnings
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from pytorch_lightning.utilities.exceptions import SIGTERMException


def _checkpoint_dir(trainer, dirpath: str | None) -> Path:
    return Path(dirpath or Path(trainer.default_root_dir) / "checkpoints")


class PreemptionCheckpoint(pl.Callback):
    """`last.ckpt` when training stops on SIGTERM or Ctrl-C.

    Both stop at a batch's end, never in the middle of a save: Lightning raises SIGTERM's
    exception there itself; Ctrl-C (SIGINT) is deferred here the same way during fit, since a
    KeyboardInterrupt raised at any line could land between ModelCheckpoint noting a new best
    checkpoint and writing it (and the resumed run would then test a file that does not exist).
    A second Ctrl-C stops at once. Where SIGINT is ignored (a background job) it stays ignored.
    """

    def __init__(self, dirpath: str | None = None, filename: str = "last.ckpt") -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._sigint_asked = False
        self._previous_handler = None

    # -- Ctrl-C, deferred to the end of the batch
    def on_fit_start(self, trainer, pl_module) -> None:
        self._sigint_asked = False
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous_handler = signal.signal(signal.SIGINT, self._defer_sigint)

    def _defer_sigint(self, signum, frame) -> None:
        if self._sigint_asked:  # the second Ctrl-C: now
            raise KeyboardInterrupt
        self._sigint_asked = True
        rank_zero_info("[attnlab] Ctrl-C: stopping at the end of this batch, after a checkpoint "
                       "(Ctrl-C again to stop at once)")

    def _stop_if_asked(self) -> None:
        if self._sigint_asked:
            raise KeyboardInterrupt

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._stop_if_asked()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                                dataloader_idx: int = 0) -> None:
        self._stop_if_asked()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._previous_handler is not None:  # fit is over: Ctrl-C as before
            signal.signal(signal.SIGINT, self._previous_handler)
            self._previous_handler = None

    # -- the checkpoint
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        if trainer.state.fn != "fit":
            return
        path = _checkpoint_dir(trainer, self.dirpath) / self.filename
        trainer.save_checkpoint(path, weights_only=False)  # a full checkpoint: resumable
        rank_zero_info(f"[attnlab] interrupted: checkpoint written to {path}; resume with ckpt_path=last")


class MidEpochCheckpoint(pl.Callback):
    """`last.ckpt` every `every_n_train_steps` optimizer steps (None: never).

    Not at the last batch of an epoch: the epoch-end checkpoint (ModelCheckpoint, after
    validation) follows right away, and resuming from the last batch would skip that validation.
    """

    def __init__(self, dirpath: str | None = None, every_n_train_steps: int | None = 100,
                 filename: str = "last.ckpt") -> None:
        if every_n_train_steps is not None and int(every_n_train_steps) < 1:
            from attnlab.errors import ConfigError

            raise ConfigError(
                f"callbacks.last_checkpoint.every_n_train_steps={every_n_train_steps}: use an integer "
                f">= 1, or null for checkpoints at epoch ends only (e.g. 100)"
            )
        self.dirpath = dirpath
        self.every_n_train_steps = every_n_train_steps
        self.filename = filename
        self._saved_step = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if (not self.every_n_train_steps or step == 0 or step % self.every_n_train_steps
                or step == self._saved_step or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
                or trainer.sanity_checking):
            return
        self._saved_step = step  # several batches share a step under gradient accumulation
        trainer.save_checkpoint(_checkpoint_dir(trainer, self.dirpath) / self.filename, weights_only=False)


class RngState(pl.Callback):
    """RNG states and the position in the epoch, in every checkpoint.

    Epoch-end checkpoint: the states are restored when it is loaded; the resumed run then makes
    the same draws as the uninterrupted one (dataloader iterators, then the next epoch).
    Mid-epoch checkpoint: the sampler skips the samples the epoch already used, and the states are
    restored at the first training batch, after the dataloader iterator that the resumed run
    creates (and the uninterrupted one did not) has drawn its seed.
    """

    def __init__(self) -> None:
        self._trainer = None
        self._pending_rng: dict | None = None
        self._resume_position: tuple[int, int] | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    # Plain tensors, lists and numbers only, so checkpoints still load with torch.load(weights_only=True).
    def state_dict(self) -> dict:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        version, internal, gauss = random.getstate()
        state = {
            "torch": torch.get_rng_state(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "python": [version, list(internal), gauss],
        }
        position = self._position()
        if position is not None:
            state["position"] = position  # [epoch, samples consumed]; only mid-epoch
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        if "torch" not in state_dict:
            return
        if "position" in state_dict:
            epoch, consumed = state_dict["position"]
            self._resume_position = (int(epoch), int(consumed))
            self._pending_rng = state_dict
        else:
            _set_rng(state_dict)

    def on_train_start(self, trainer, pl_module) -> None:
        if self._resume_position is None:
            return
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if hasattr(sampler, "resume"):
            sampler.resume(*self._resume_position)
            # Lightning warns that a plain DataLoader restarts the epoch: here the sampler does not
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before")
        else:
            rank_zero_warn(
                f"[attnlab] resuming mid-epoch, but the training sampler ({type(sampler).__name__}) "
                f"cannot skip the samples already used: this epoch restarts from its first batch"
            )
        self._resume_position = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._pending_rng is not None:
            _set_rng(self._pending_rng)
            self._pending_rng = None

    def _position(self) -> list[int] | None:
        """[epoch, samples consumed] when the checkpoint is taken inside an epoch, else None."""
        trainer = self._trainer
        if trainer is None or trainer.state.fn != "fit" or trainer.sanity_checking:
            return None
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        loader = trainer.train_dataloader
        batch_size = getattr(loader, "batch_size", None)
        if not done or batch_size is None or done >= trainer.num_training_batches:
            return None
        return [int(trainer.current_epoch), int(done * batch_size)]


def _set_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
