"""`ProbeDataModule`: a probe's train / val / test splits, generated from a seed, no download.

One call of the probe's generator (`tasks.probe.generators.generator(probe)`, with `options`) draws
`n_train + n_val + n_test` examples and cuts them in that order, so the splits never share an
example (ListOps: no expression twice in the whole set). `data_seed` (the run's seed by
default, so that a seed sweep measures data and training variance together; runs of different
schemes with the same seed see the same data, which pairs them).

The trivial baseline of each evaluation split, in the task's units (accuracy), goes to the module
(`model_kwargs()["baselines"]`), which logs it as `<split>/baseline_acc`:
    majority   the most frequent class of the training split, predicted everywhere;
    chance     its expected accuracy, the generator's theory (1 / the classes guessed among).

The shortcut of each evaluation split (`<split>/shortcut_acc`): the best simple rule that ignores
the probe's mechanism (the generator's `shortcut`, scored on the split's rows), or, for a probe
that gives `shortcut_features` instead (clusters' moments), a multinomial logistic regression
fitted on the training rows (scikit-learn) and scored on the split. A probe whose schemes do not
beat it does not test its mechanism (attnlab.compare says so).

A batch is a dict: `inputs` (B, L) long ids or (B, L, d) float points, `targets` (B,) or (B, L)
long (IGNORE = -100 where nothing is asked), `padding_mask` (B, L) bool, True at padding; and,
where the probe has them (tasks/probe/data.py), `aux_targets` (B, L) (trained, never scored),
`key_only` / `query_only` (B, L) bool (positions only read / only asking), `slots` (B, L)
(the slot of each position, -1 elsewhere: the head-collision rate) and `read_at` (B, L) (the entry
each answer must be read from: the attention weight the mechanism puts there).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from attnlab.errors import ConfigError
from tasks.common.datamodule import SplitsDataModule
from tasks.probe.data import IGNORE, REGRESSION, ProbeData, score
from tasks.probe.generators import generator

SPLITS = ("train", "val", "test")


# the per-row tensors of ProbeData a batch carries, where the probe has them
BATCH_FIELDS = ("inputs", "targets", "padding_mask", "aux_targets", "key_only", "query_only",
                "slots", "read_at")


class ProbeSplit:
    """The rows of one split; batches are fetched whole (`__getitems__`), not row by row."""

    def __init__(self, data: ProbeData, rows: slice) -> None:
        self.fields = {name: getattr(data, name)[rows] for name in BATCH_FIELDS
                       if getattr(data, name) is not None}
        self.inputs = self.fields["inputs"]

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return {name: value[index] for name, value in self.fields.items()}

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


def split_shortcut(data: ProbeData, train: slice, rows: slice) -> float | None:
    """The shortcut's accuracy on `rows` (see the module docstring); None where the probe has
    no shortcut."""
    if data.shortcut is not None:
        return score(data.target_kind, data.shortcut.predictions[rows], data.targets[rows])
    if data.shortcut_features is None:
        return None
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    features = data.shortcut_features.double().numpy()
    fit = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    fit.fit(features[train], data.targets[train].numpy())
    guesses = torch.from_numpy(fit.predict(features[rows])).long()
    return score(data.target_kind, guesses, data.targets[rows])


class ProbeDataModule(SplitsDataModule):
    def __init__(
        self,
        probe: str,
        options: Mapping | None,
        *,
        # the probe's (conf/task/probe.yaml reads them from `probe.*`, which each probe may set)
        # and the run's seed: no defaults here (tests/tasks/test_config_homes.py)
        n_train: int,
        n_val: int,
        n_test: int,
        data_seed: int,
        batch_size: int,
        eval_batch_size: int | None = 256,
        num_workers: int = 0,
        seed: int | None,
    ) -> None:
        super().__init__(batch_as_is, batch_size, eval_batch_size, num_workers, seed)
        generator(probe)  # a name no generator module has: a ConfigError listing them
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
        self.shortcuts: dict[str, float] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.data is not None:
            return
        try:
            self.data = generator(self.probe)(sum(self.sizes.values()), self.data_seed, **self.options)
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
        shortcuts = {split: split_shortcut(self.data, rows["train"], rows[split])
                     for split in ("val", "test")}
        self.shortcuts = {split: value for split, value in shortcuts.items() if value is not None}

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
            "shortcuts": dict(self.shortcuts),
        }
