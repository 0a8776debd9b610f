"""`ProbeDataModule`: a probe's train / val / test splits, generated from a seed, no download.

One call of the probe's generator (`tasks.probe.GENERATORS[probe]`, with `options`) draws
`n_train + n_val + n_test` examples and cuts them in that order, so the splits never share an
example (ListOps: no expression twice in the whole set). `data_seed` (the run's seed by
default, so that a seed sweep measures data and training variance together; runs of different
schemes with the same seed see the same data, which pairs them).

The trivial baseline of each evaluation split, in the task's units (accuracy), goes to the module
(`model_kwargs()["baselines"]`), which logs it as `<split>/baseline_acc`:
    majority   the most frequent class of the training split, predicted everywhere;
    chance     its expected accuracy, the generator's theory (1 / the classes guessed among).

A batch is a dict: `inputs` (B, L) long ids or (B, L, d) float points, `targets` (B,) or (B, L)
long (IGNORE = -100 where nothing is asked), `padding_mask` (B, L) bool, True at padding.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from attnlab.errors import ConfigError
from tasks.common.datamodule import SplitsDataModule
from tasks.probe import GENERATORS
from tasks.probe.data import IGNORE, REGRESSION, ProbeData, score

SPLITS = ("train", "val", "test")


class ProbeSplit:
    """The rows of one split; batches are fetched whole (`__getitems__`), not row by row."""

    def __init__(self, data: ProbeData, rows: slice) -> None:
        self.inputs = data.inputs[rows]
        self.targets = data.targets[rows]
        self.padding_mask = data.padding_mask[rows]

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return {"inputs": self.inputs[index], "targets": self.targets[index],
                "padding_mask": self.padding_mask[index]}

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {k: v[0] for k, v in self.__getitems__([i]).items()}


def batch_as_is(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    return batch


def split_baseline(data: ProbeData, train: slice, rows: slice) -> float:
    """The trivial baseline's accuracy on `rows` (see the module docstring)."""
    name = data.baseline.name
    if name == "chance" and data.baseline.theory is not None:
        return float(data.baseline.theory)
    if name != "majority":
        raise ValueError(f"no split baseline for {name!r}: expected majority or chance")
    asked = data.targets[train][data.targets[train] != IGNORE]
    majority = int(torch.bincount(asked).argmax())
    targets = data.targets[rows]
    guesses = torch.where(targets == IGNORE, targets, torch.full_like(targets, majority))
    return score(data.target_kind, guesses, targets)


class ProbeDataModule(SplitsDataModule):
    def __init__(
        self,
        probe: str,
        options: Mapping | None = None,
        n_train: int = 4096,
        n_val: int = 512,
        n_test: int = 1024,
        data_seed: int = 0,
        batch_size: int = 64,
        eval_batch_size: int | None = 256,
        num_workers: int = 0,
        seed: int | None = None,
    ) -> None:
        super().__init__(batch_as_is, batch_size, eval_batch_size, num_workers, seed)
        if probe not in GENERATORS:
            raise ConfigError(f"probe.generator={probe!r} is not a probe generator; use one of "
                              f"{', '.join(GENERATORS)} (tasks/probe/__init__.py)")
        self.probe = probe
        self.options = dict(options or {})
        self.sizes = {"train": int(n_train), "val": int(n_val), "test": int(n_test)}
        for split, n in self.sizes.items():
            if n < 1:
                raise ConfigError(f"probe.n_{split}={n} must be at least 1")
        self.data_seed = int(data_seed)
        self.data: ProbeData | None = None
        self.splits: dict[str, ProbeSplit] = {}
        self.baselines: dict[str, float] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.data is not None:
            return
        try:
            self.data = GENERATORS[self.probe](sum(self.sizes.values()), self.data_seed, **self.options)
        except (TypeError, ValueError) as err:  # an unknown or impossible option: the user's
            raise ConfigError(f"probe.options of {self.probe}: {err}") from None
        if self.data.target_kind == REGRESSION:
            raise ConfigError(f"the {self.probe} probe's regression target is not a probe run's "
                              f"task (accuracy); use a class target, e.g. probe.options.target=count")
        start, rows = 0, {}
        for split in SPLITS:
            rows[split] = slice(start, start + self.sizes[split])
            start += self.sizes[split]
        self.splits = {split: ProbeSplit(self.data, r) for split, r in rows.items()}
        self.baselines = {split: split_baseline(self.data, rows["train"], rows[split])
                          for split in ("val", "test")}

    def split_data(self, split: str) -> ProbeSplit:
        self.setup()
        return self.splits[split]

    def model_kwargs(self) -> dict:
        if self.data is None:
            raise RuntimeError("call setup() before model_kwargs()")
        data = self.data
        points = data.inputs.dim() == 3
        return {
            "num_classes": data.num_classes,
            "seq_len": int(data.inputs.shape[1]),
            "vocab_size": data.vocab_size,
            "input_dim": int(data.inputs.shape[2]) if points else 0,
            "target_kind": data.target_kind,
            "baselines": dict(self.baselines),
            "baseline_name": data.baseline.name,
        }
