"""`AfterTestAnalysis`: the declared protocol of analyses that run once test is done.

Some analyses need evaluation loops of their own (HeadImportance masks one head at a time and
validates again); no loop can run inside a Trainer hook, so the runner calls `after_test` on
every callback that is an `AfterTestAnalysis` (found by isinstance) once `trainer.test` has
returned, and puts the dict it returns into metrics.json.

Such an analysis must stay proportionate and visible: it has a default budget that keeps it a
small share of a short run (it says in one line what the budget leaves out, and which option
lifts it), and it shows `analysis_progress` while it works.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Iterator

import pytorch_lightning as pl


class AfterTestAnalysis(abc.ABC):
    """A callback whose analysis runs after test, on the tested (best) weights."""

    @abc.abstractmethod
    def after_test(self, trainer: pl.Trainer, module: pl.LightningModule,
                   datamodule: pl.LightningDataModule | None, metric: str,
                   mode: str) -> dict[str, float]:
        """Run the analysis; `metric` is the task's optimized metric and `mode` min | max.
        Returns scalars for metrics.json (empty when there was nothing to analyse)."""


@contextlib.contextmanager
def analysis_progress(trainer: pl.Trainer, description: str, total: int) -> Iterator:
    """A rich progress bar over the analysis' steps: call `advance(what_is_next)` after each.
    Hidden when the run shows no progress bar (trainer.enable_progress_bar=false) and on
    processes other than rank 0."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    shown = trainer.progress_bar_callback is not None and trainer.is_global_zero
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, disable=not shown) as progress:
        task = progress.add_task(description, total=total)

        def advance(what_is_next: str | None = None) -> None:
            progress.update(task, advance=1, description=what_is_next or description)

        yield advance


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Lightning's info lines (devices available, limit_val_batches, ...) off inside the block: an
    analysis' own Trainers would print them once per evaluation, above its one line and bar."""
    logger = logging.getLogger("pytorch_lightning")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)
