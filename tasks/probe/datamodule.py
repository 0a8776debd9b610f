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

`test_options` (`probe.test_options`, e.g. {num_objects: [8, 16, 32]}) adds test sets that differ
from the training data only in those generator options: every combination of the listed values
(two options form a grid, in the order given) is a test cell, `n_test` rows drawn by the generator
with the probe's options and the cell's on top, from a seed of its own (`cell_seed`: the data seed
and the cell's name), so train, val and the ordinary test split are exactly what they are without
`test_options`. A cell is named `<option>=<value>[,<option>=<value>]` (`cell_name`); its trivial
baseline is the chance theory or the training split's majority class, its shortcut the
generator's rule on the cell's rows (a fitted shortcut is not refitted per cell: none).
`test_cell_batches(name)` gives a cell's batches, `eval_batch_size` * the training length tokens
each, so that longer cells fit where the ordinary test split does. Options that are not the
generator's are refused in one line listing those that are.

A batch is a dict: `inputs` (B, L) long ids or (B, L, d) float points, `targets` (B,) or (B, L)
long (IGNORE = -100 where nothing is asked), `padding_mask` (B, L) bool, True at padding; and,
where the probe has them (tasks/probe/data.py), `aux_targets` (B, L) (trained, never scored),
`key_only` / `query_only` (B, L) bool (positions only read / only asking), `slots` (B, L)
(the slot of each position, -1 elsewhere: the head-collision rate) and `read_at` (B, L) (the entry
each answer must be read from: the attention weight the mechanism puts there).
"""

from __future__ import annotations

import inspect
import itertools
import zlib
from collections.abc import Iterator, Mapping

import numpy as np
import torch
from omegaconf import OmegaConf
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


def cell_name(cell: Mapping) -> str:
    """A test cell's name, `<option>=<value>[,<option>=<value>]` in the order of test_options: the
    suffix of its metrics (`test/acc@length=512,depth=0.25`)."""
    return ",".join(f"{key}={value}" for key, value in cell.items())


def test_cells(test_options: Mapping | None) -> list[dict]:
    """Every combination of the listed values (a scalar is a list of one), first option slowest."""
    grid = {str(k): list(v) if isinstance(v, (list, tuple)) else [v]
            for k, v in (test_options or {}).items()}
    if not grid:
        return []
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def cell_seed(data_seed: int, name: str) -> int:
    """A cell's data seed: a function of the run's data seed and the cell's name, apart from the
    seed of the training draw and of every other cell."""
    return int(np.random.SeedSequence([int(data_seed) % 2**32, zlib.crc32(name.encode())])
               .generate_state(1)[0])


def generator_options(probe: str) -> list[str]:
    """The options `generate(n, seed, **options)` of `probe` takes by name."""
    parameters = inspect.signature(generator(probe)).parameters
    return [name for name, p in parameters.items() if name not in ("n", "seed")
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


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
        test_options: Mapping | None,
    ) -> None:
        super().__init__(batch_as_is, batch_size, eval_batch_size, num_workers, seed)
        generator(probe)  # a name no generator module has: a ConfigError listing them
        self.probe = probe
        self.options = dict(options or {})
        if OmegaConf.is_config(test_options):
            test_options = OmegaConf.to_container(test_options, resolve=True)
        if not isinstance(test_options, Mapping | None):
            raise ConfigError(f"probe.test_options={test_options!r} is not a mapping; give "
                              f"{{<option>: [<values>]}}, e.g. {{num_objects: [8, 16]}}")
        # a key set to null drops it (an override merges into the probe's own test_options)
        self.test_options = {str(k): v for k, v in (test_options or {}).items() if v is not None}
        known = generator_options(probe)
        unknown = [k for k in self.test_options if k not in known]
        if unknown:
            raise ConfigError(f"probe.test_options: {', '.join(unknown)} is not an option of the "
                              f"{probe} generator; use one of {', '.join(known)}")
        empty = [k for k, v in self.test_options.items() if isinstance(v, (list, tuple)) and not v]
        if empty:
            raise ConfigError(f"probe.test_options.{empty[0]} lists no value; give at least one")
        self.cells = {cell_name(c): c for c in test_cells(self.test_options)}
        self.cell_splits: dict[str, ProbeSplit] = {}
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
        for name, cell in self.cells.items():
            self._setup_cell(name, cell, rows["train"])

    def _setup_cell(self, name: str, cell: dict, train: slice) -> None:
        """Draw a test cell: `n_test` rows, the probe's options with the cell's on top."""
        try:
            data = generator(self.probe)(self.sizes["test"], cell_seed(self.data_seed, name),
                                         **{**self.options, **cell})
        except (TypeError, ValueError) as err:  # an impossible value: the user's
            raise ConfigError(f"probe.test_options cell {name} of {self.probe}: {err}") from None
        if data.num_classes != self.data.num_classes or data.vocab_size > self.data.vocab_size:
            raise ConfigError(
                f"probe.test_options cell {name} of {self.probe} has {data.num_classes} classes "
                f"and {data.vocab_size} token ids, but the network is trained on "
                f"{self.data.num_classes} and {self.data.vocab_size}; test only options that "
                f"keep the answers and the vocabulary (sizes, lengths, positions)")
        self.cell_splits[name] = ProbeSplit(data, slice(None))
        if self.data.baseline.name == "majority":  # the training split's majority class
            asked = self.data.targets[train][self.data.targets[train] != IGNORE]
            majority = torch.full_like(data.targets, int(torch.bincount(asked).argmax()))
            guesses = torch.where(data.targets == IGNORE, data.targets, majority)
            self.baselines[f"test@{name}"] = score(data.target_kind, guesses, data.targets)
        else:
            self.baselines[f"test@{name}"] = split_baseline(data, slice(None), slice(None))
        if data.shortcut is not None:
            self.shortcuts[f"test@{name}"] = score(data.target_kind, data.shortcut.predictions,
                                                   data.targets)

    def test_cell_batches(self, name: str) -> Iterator[dict[str, Tensor]]:
        """A test cell's batches in its order: eval_batch_size * the training length tokens each
        (at least one row), so a cell 8x longer runs 8x fewer rows at a time."""
        self.setup()
        split = self.cell_splits[name]
        length = int(split.inputs.shape[1])
        rows = max(1, self.eval_batch_size * int(self.data.inputs.shape[1]) // length)
        for start in range(0, len(split), rows):
            yield split.__getitems__(list(range(start, min(start + rows, len(split)))))

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
            # probe.test_options: the grid (the module names the cells as cell_name does) and
            # the longest cell's length (the network must take it)
            "test_grid": {k: list(v) if isinstance(v, (list, tuple)) else [v]
                          for k, v in self.test_options.items()},
            "test_length": max([int(s.inputs.shape[1]) for s in self.cell_splits.values()],
                               default=0),
        }
