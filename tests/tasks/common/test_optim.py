"""The learning-rate schedules: their values at chosen steps against the formulas (written out
here, not taken from the code), the tasks' configs naming the schedule they say, and a real
Trainer stepping it once per optimizer step with the run's length."""

from __future__ import annotations

import math
from functools import partial

import hydra
import pytest
import pytorch_lightning as pl
import torch
from helpers.paths import ROOT

from attnlab.task_module import TaskModule
from tasks.common.optim import (
    cosine_schedule,
    inverse_sqrt_schedule,
    linear_schedule,
    warmup_steps,
)

LR = 0.5


def rates(scheduler_factory, steps: int) -> list[float]:
    """The rate of each of `steps` optimizer steps (0-based) under the scheduler."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=LR)
    scheduler = scheduler_factory(optimizer)
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_bert_linear_schedule_warms_up_then_decays_to_zero():
    # 10 steps, warmup 0.2 -> 2 steps: (s + 1) / (warmup + 1) while warming up, then
    # (total - s) / (total - warmup) down to 0 at the end
    got = rates(partial(linear_schedule, total_steps=10, warmup=0.2), 11)
    expected = [LR / 3, 2 * LR / 3] + [LR * (10 - s) / 8 for s in range(2, 11)]
    assert got == pytest.approx(expected, abs=1e-12)
    assert got[-1] == 0.0 and max(got) == pytest.approx(LR)
    # a warmup given in steps; one longer than the run spans the run
    assert warmup_steps(100, 1000) == 100 and warmup_steps(5000, 1000) == 1000
    assert warmup_steps(0.06, 1000) == 60


def test_cosine_schedule_falls_from_lr_to_min_lr_along_half_a_cosine():
    got = rates(partial(cosine_schedule, total_steps=10, warmup=0, min_lr=0.05), 11)
    ratio = 0.05 / LR
    expected = [LR * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * s / 10))) for s in range(11)]
    assert got == pytest.approx(expected, abs=1e-12)
    assert got[5] == pytest.approx((LR + 0.05) / 2) and got[10] == pytest.approx(0.05)
    warm = rates(partial(cosine_schedule, total_steps=12, warmup=2, min_lr=0.0), 4)
    assert warm == pytest.approx([LR / 3, 2 * LR / 3, LR, LR * 0.5 * (1 + math.cos(math.pi / 10))])


def test_inverse_sqrt_schedule_is_fairseqs():
    got = rates(partial(inverse_sqrt_schedule, warmup=4), 17)
    expected = [LR * s / 4 for s in range(4)] + [LR * math.sqrt(4 / s) for s in range(4, 17)]
    assert got == pytest.approx(expected, abs=1e-12)


def test_the_schedules_at_their_edges_follow_the_formulas():
    """The boundaries a short run or a paper's recipe meets (survivors of `make mutate`)."""
    # warmup 1 is one step, not the whole run: only a warmup below 1 is a share
    assert warmup_steps(1, 1000) == 1 and warmup_steps(1.5, 1000) == 1
    # no warmup (cosine's default; linear takes the task's), down to 0 (linear: (total - s) / total;
    # cosine over 2 steps)
    assert rates(partial(linear_schedule, total_steps=4, warmup=0), 5) == pytest.approx(
        [LR, 3 * LR / 4, LR / 2, LR / 4, 0.0], abs=1e-12)
    assert rates(partial(cosine_schedule, total_steps=2), 3) == pytest.approx(
        [LR, LR / 2, 0.0], abs=1e-12)
    # a warmup of 4 steps in a 5-step run: the last step decays from the full rate, (5 - 4) / 1
    assert rates(partial(linear_schedule, total_steps=5, warmup=4), 5)[4] == pytest.approx(LR)
    # a 1-step run (fast_dev_run) with a warmup share of 0.5 warms up over int(0.5) = 0 steps
    assert rates(partial(linear_schedule, total_steps=1, warmup=0.5), 1) == [LR]
    assert rates(partial(cosine_schedule, total_steps=1, warmup=0.5), 1) == [LR]
    # fairseq's inverse sqrt with a warmup of 1 update: 0, then lr * sqrt(1 / s)
    assert rates(partial(inverse_sqrt_schedule, warmup=1), 3) == pytest.approx(
        [0.0, LR, LR * math.sqrt(0.5)], abs=1e-12)


def composed(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from attnlab import config_args

    config_args.register(ROOT / "conf")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=overrides)


@pytest.mark.parametrize(("overrides", "target", "warmup"), [
    (["task=mlm"], "linear_schedule", 0.06),
    (["task=headline"], "linear_schedule", 100),
    (["task=lm"], "linear_schedule", 0.05),
    (["task=mt"], "inverse_sqrt_schedule", None),
    (["experiment=lm_wikitext103"], "cosine_schedule", 16000),
], ids=["mlm", "headline", "lm", "mt", "lm_wikitext103"])
def test_the_tasks_configs_name_the_schedules_their_docs_state(overrides, target, warmup):
    """The schedule each task's config injects, instantiated as the TaskModule does it: a
    constant rate in its place fails here."""
    node = composed(overrides).task.module.scheduler
    assert node._target_ == f"tasks.common.optim.{target}"
    factory = hydra.utils.instantiate(node)
    total = 40_000
    extra = {} if target == "inverse_sqrt_schedule" else {"total_steps": total}
    got = rates(partial(factory, **extra), 3)
    assert got[1] > got[0]  # every schedule warms up
    if warmup is not None:
        steps = warmup_steps(warmup, total)
        assert got[0] == pytest.approx(LR / (steps + 1))


class Tiny(TaskModule):
    """One linear layer, its loss; the rate of every step recorded."""

    def __init__(self, scheduler):
        super().__init__(torch.nn.Linear(2, 1), partial(torch.optim.SGD, lr=LR), scheduler)
        self.seen: list[float] = []

    def task_loss(self, batch, batch_idx):
        self.seen.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        return self.net(batch[0]).square().mean()


def test_a_trainer_steps_the_schedule_once_per_optimizer_step_over_the_run(tmp_path):
    module = Tiny(partial(linear_schedule, warmup=0.25))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 2)), batch_size=2)
    trainer = pl.Trainer(max_epochs=1, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, data)
    total = 8  # trainer.estimated_stepping_batches: 16 examples, batches of 2, one epoch
    expected = [LR / 3, 2 * LR / 3] + [LR * (total - s) / 6 for s in range(2, total)]
    assert module.seen == pytest.approx(expected, abs=1e-12)
