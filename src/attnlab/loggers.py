"""One small adapter between analysis callbacks and whatever loggers are active.

Callbacks call `LoggerAdapter(trainer).histogram(...)` etc. and never test for a logger type
themselves; adding a logger backend means teaching this file about it, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger, WandbLogger


def _numpy(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64).ravel()


class LoggerAdapter:
    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.loggers = list(trainer.loggers)

    @property
    def step(self) -> int:
        return int(self.trainer.global_step)

    def scalars(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Plain numbers: every logger takes them (W&B, TensorBoard, CSV)."""
        step = self.step if step is None else step
        metrics = {k: float(v) for k, v in metrics.items()}
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    def histogram(self, name: str, values, step: int | None = None, bins: int = 64) -> None:
        """A distribution: W&B Histogram, TensorBoard add_histogram; CSV gets its quantiles."""
        values = _numpy(values)
        values = values[np.isfinite(values)]
        if values.size == 0:
            return
        step = self.step if step is None else step
        for logger in self.loggers:
            if isinstance(logger, WandbLogger):
                import wandb

                counts, edges = np.histogram(values, bins=bins)
                logger.experiment.log(
                    {name: wandb.Histogram(np_histogram=(counts, edges)), "trainer/global_step": step}
                )
            elif isinstance(logger, TensorBoardLogger):
                logger.experiment.add_histogram(name, values, global_step=step)
            elif isinstance(logger, CSVLogger):
                q = np.quantile(values, [0.0, 0.1, 0.5, 0.9, 1.0])
                logger.log_metrics(
                    {f"{name}/q{int(p * 100):02d}": float(v) for p, v in zip([0, .1, .5, .9, 1], q)},
                    step=step,
                )

    def image(self, name: str, path: str | Path, step: int | None = None) -> None:
        """A PNG already written to the run dir."""
        step = self.step if step is None else step
        for logger in self.loggers:
            if isinstance(logger, WandbLogger):
                import wandb

                logger.experiment.log({name: wandb.Image(str(path)), "trainer/global_step": step})
            elif isinstance(logger, TensorBoardLogger):
                import matplotlib.image as mpimg

                img = mpimg.imread(str(path))[..., :3]
                logger.experiment.add_image(name, img, global_step=step, dataformats="HWC")

    def line_series(self, name: str, xs: Sequence[float], ys: Mapping[str, Sequence[float]],
                    title: str = "", xname: str = "step") -> None:
        """One chart with a line per key (W&B custom chart); other loggers already have the scalars."""
        for logger in self.loggers:
            if isinstance(logger, WandbLogger) and len(xs) > 0:
                import wandb

                keys = list(ys)
                chart = wandb.plot.line_series(
                    xs=list(xs), ys=[list(ys[k]) for k in keys], keys=keys, title=title or name,
                    xname=xname,
                )
                logger.experiment.log({name: chart, "trainer/global_step": self.step})

    def table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
        """A small table (W&B Table; TensorBoard gets it as Markdown text)."""
        for logger in self.loggers:
            if isinstance(logger, WandbLogger):
                import wandb

                logger.experiment.log(
                    {name: wandb.Table(columns=list(columns), data=[list(r) for r in rows]),
                     "trainer/global_step": self.step}
                )
            elif isinstance(logger, TensorBoardLogger):
                header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
                body = "".join("| " + " | ".join(str(c) for c in r) + " |\n" for r in rows)
                logger.experiment.add_text(name, header + body, global_step=self.step)
