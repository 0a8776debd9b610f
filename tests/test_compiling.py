"""`compile=true` (attnlab.compiling): a tiny run of a task with its network under torch.compile
(inductor, on the CPU) against the same weights run eagerly, and a train + validation loop over
three sequence lengths that compiles once per step kind, never again.

Inductor compiles on a 2-core CPU take tens of seconds per task: the default suite runs one task
(lm, the quickest), every task (discovered from the cards) runs under `slow`. Measured on this
project's 2 CPUs shared at load ~11 (whole check: eager and compiled validation, two compiled
epochs): lm 84-106 s, mlm 101 s, probe 105 s, classify 108 s, vqa 127 s, mt 160 s, headline
268 s.
"""

from __future__ import annotations

import copy
import itertools
import math

import hydra
import pytest
import pytorch_lightning as pl
import torch
from helpers.cards import CARDS, TINY
from helpers.paths import CONF
from hydra import compose, initialize_config_dir
from lightning_utilities.core.apply_func import apply_to_collection
from torch._dynamo.utils import counters

from attnlab.compiling import compile_net
from attnlab.task_module import build_module

# each batch's token tensors (integer / bool (B, S)) are cut to these fractions of their length,
# in turn, other ones in each epoch: the second epoch meets only lengths the first did not
FRACTIONS = ((1.0, 0.75, 0.5), (0.875, 0.625, 0.375))
# compiled against eager validation metrics: fp32 with inductor's reassociated sums and fused
# kernels differs from eager by ~1e-6 relative per op; a few layers and a mean stay within these
RTOL, ATOL = 1e-4, 1e-5


def tiny(task: str, data_dir) -> tuple[pl.LightningDataModule, pl.LightningModule]:
    """The task's datamodule and module as train.py builds them, with its card's tiny settings."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"task={task}", "logger=none", *TINY[task],
                                          f"paths.data_dir={data_dir}"])
    pl.seed_everything(0, verbose=False)
    datamodule = hydra.utils.instantiate(cfg.task.datamodule)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule, build_module(cfg.task.module, datamodule.model_kwargs())


def trainer(epochs: int = 1, batches: int = 3, callbacks=()) -> pl.Trainer:
    return pl.Trainer(max_epochs=epochs, limit_train_batches=batches, limit_val_batches=batches,
                      num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                      inference_mode=False,  # no_grad: metric states stay usable in training
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=list(callbacks))


def shorten(batch, fraction: float):
    """The batch with its token tensors (integer or bool, (B, S)) cut to `fraction` of S."""
    def cut(t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 2 or t.is_floating_point():
            return t
        return t[:, :max(2, math.ceil(fraction * t.shape[1]))].contiguous()  # as collated

    return apply_to_collection(batch, torch.Tensor, cut)


class GraphCounts(pl.Callback):
    """torch.compile's graph count after every training and validation batch."""

    def __init__(self) -> None:
        self.after: list[tuple[str, int]] = []
        self.epochs: list[int] = []

    def on_train_batch_end(self, trainer, *args) -> None:
        self.after.append(("train", counters["stats"]["unique_graphs"]))
        self.epochs.append(trainer.current_epoch)

    def on_validation_batch_end(self, trainer, *args) -> None:
        self.after.append(("val", counters["stats"]["unique_graphs"]))
        self.epochs.append(trainer.current_epoch)


def check_compiled_task(task: str, data_dir) -> None:
    torch._dynamo.reset()
    counters.clear()
    datamodule, module = tiny(task, data_dir)
    eager = copy.deepcopy(module)
    compile_net(module, True)

    # (a) the same weights, eager and compiled: equal validation metrics
    expected = trainer().validate(eager, datamodule=datamodule, verbose=False)[0]
    got = trainer().validate(module, datamodule=datamodule, verbose=False)[0]
    assert counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    assert expected.keys() == got.keys()
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=RTOL, abs=ATOL), name

    # (b) train + validate, two epochs, each batch at the next of three lengths, new ones in
    # the second epoch
    lengths: list[set[tuple]] = [set(), set()]
    fractions = [itertools.cycle(f) for f in FRACTIONS]

    def before_transfer(batch, dataloader_idx):
        epoch = module.trainer.current_epoch
        batch = shorten(batch, next(fractions[epoch]))
        lengths[epoch].add(tuple(sorted({t.shape[1] for t in _tokens(batch)})))
        return batch

    module.on_before_batch_transfer = before_transfer
    counts = GraphCounts()
    trainer(epochs=2, callbacks=[counts]).fit(module, datamodule=datamodule)
    assert len(lengths[0] | lengths[1]) >= 3 and not lengths[0] & lengths[1], lengths
    # the first epoch compiles training's graphs (validation's were compiled above); the second,
    # at lengths never seen, compiles nothing
    second = [n for epoch, (_, n) in zip(counts.epochs, counts.after) if epoch == 1]
    assert second and second == [counts.after[counts.epochs.index(1) - 1][1]] * len(second), (
        counts.after)


def _tokens(batch) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    apply_to_collection(batch, torch.Tensor,
                        lambda t: found.append(t) if t.dim() == 2 and not t.is_floating_point() else None)
    return found


@pytest.mark.usefixtures("one_thread")
def test_compiled_lm_equals_eager_and_new_lengths_never_recompile(data_dir):
    check_compiled_task("lm", data_dir)


# open (issue 35, item 4): what this check does not yet pass, and why
OPEN = {
    "classify": "shorten() cuts the token tensors but not the batch's lengths (its RNN packs by them)",
    "probe": "the second epoch's new lengths compile again (not yet traced)",
    "vqa": "shorten() cuts the question tokens but not their lengths (the GRU packs by them)",
}


@pytest.mark.slow
@pytest.mark.parametrize("task", [pytest.param(name, marks=pytest.mark.xfail(
    reason=OPEN[name], strict=True)) if name in OPEN else name for name in sorted(CARDS)])
def test_every_task_compiled_equals_eager_and_new_lengths_never_recompile(task, data_dir):
    check_compiled_task(task, data_dir)


@pytest.mark.parametrize(("value", "ok"), [(True, True), ("max-autotune", True), (False, True),
                                          ("banana", False), (3, False)])
def test_the_compile_option_is_checked_before_any_work(value, ok):
    from omegaconf import OmegaConf

    from attnlab.config_schema import _check_top_level
    from attnlab.errors import ConfigError

    cfg = OmegaConf.create({"compile": value})
    if ok:
        _check_top_level(cfg)
        return
    with pytest.raises(ConfigError, match=r"compile=.*expected true, false or a torch.compile mode"):
        _check_top_level(cfg)
