"""`ProbeModule`: trains a probe's encoder (`tasks.probe.network.ProbeEncoder`) by cross-entropy.

A sequence-level probe (unmatched key's colour, head slots' tuple, ListOps' value) is answered at
position 0; a per-position probe (hub key's and assignment's queries, recall's values) at every
asked position (targets IGNORE elsewhere). A probe's auxiliary targets (`aux_targets`: unmatched
key's mirror colours, hub key's extra queries) add their cross-entropy to the training loss and
are never scored. Logs `train/loss`; `val|test/loss`, `acc` (accuracy over the asked answers, the
optimized metric `val/acc`), `seq_acc` (sequences whose every asked answer is right; equal to `acc`
for a sequence-level probe), `answers` (how many answers were scored: with `acc`, what a binomial
test of "did it learn" needs), `baseline_acc` (the trivial baseline: majority class or chance) and
`shortcut_acc` (the best simple rule that ignores the mechanism, where the probe has one) on the
same split (tasks/probe/datamodule.py); `val/acc_auc`, the area under the learning curve: the mean
of `val/acc` over the validations of the fit so far (at the end of training, over all of them; a
scheme that learns sooner scores higher at equal final accuracy; a validation outside `fit`, e.g.
eval.py's, adds no point and logs the fit's area); with slots (head slots), `test/collision_rate`:
the share of test sequences where two heads' largest attention weight from position 0 in the
first layer falls on the same slot (redundant heads); with read_at (unmatched key, hub key,
assignment), `test/target_mass`: the first layer's attention weight, mean over heads and asked
answers, on the entry each answer must be read from (did the mechanism engage: DNAS's CLS on the
unmatched key). With `probe.test_options` (tasks/probe/datamodule.py) each test cell is scored at
the end of the test epoch, on every rank in full (the cells are small; no sync needed), under the
keys `test/<metric>@<cell>` for acc, seq_acc, answers, loss, target_mass (where the probe has
read_at), baseline_acc and shortcut_acc (e.g. `test/acc@length=512,depth=0.25`), and their grid
is drawn as `test_options.png` in the run dir: a heat map of accuracy for two options (the first
across, the second down), accuracy and target mass against the value for one (none for more).
The network must take the longest cell: a learned position table that is too short is refused in
one line when the module is built. `forward(batch)` returns the asked answers' logits and labels, which the
calibration callback reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pytorch_lightning.trainer.states import TrainerFn
from torch import Tensor
from torchmetrics import MeanMetric, SumMetric

from attnlab.attention import attention_modules, record_attention
from attnlab.errors import ConfigError
from attnlab.task_module import TaskModule
from tasks.probe.data import IGNORE, SEQUENCE_CLASS, TOKEN_CLASS
from tasks.probe.datamodule import cell_name, test_cells
from tasks.probe.network import ProbeEncoder

STAGES = ("val", "test")


def collisions(weights: Tensor, slots: Tensor) -> Tensor:
    """(B,) bool: two heads' largest weight from position 0 fall on the same slot.
    weights (B, H, S_q, S_k) of one layer, slots (B, S_k) the slot of each key (-1: none)."""
    top = slots.gather(1, weights[:, :, 0].argmax(-1))  # (B, H): the slot each head reads
    same = (top[:, :, None] == top[:, None, :]) & (top[:, :, None] >= 0)
    return same.triu(diagonal=1).flatten(1).any(dim=1)


def target_mass(weights: Tensor, read_at: Tensor) -> Tensor:
    """(N,): for each of the N asked positions (read_at >= 0), the attention weight its row puts
    on the entry it must read, the key at read_at and the value right after it, mean over heads.
    weights (B, H, S_q, S_k) of one layer, read_at (B, S_q) (tasks/probe/data.py)."""
    b, q = (read_at >= 0).nonzero(as_tuple=True)
    k = read_at[b, q]
    rows = weights[b, :, q]  # (N, H, S_k)
    mass = rows.gather(2, k[:, None, None].expand(-1, rows.shape[1], 1))
    after = (k + 1).clamp(max=weights.shape[-1] - 1)
    mass = mass + rows.gather(2, after[:, None, None].expand(-1, rows.shape[1], 1)) * (
        k + 1 < weights.shape[-1])[:, None, None]
    return mass[..., 0].mean(dim=1)


class ProbeModule(TaskModule):
    """`target_kind`, `baselines` / `shortcuts` ({split: accuracy}) and `baseline_name` come
    from the data."""

    def __init__(
        self,
        net: ProbeEncoder,
        optimizer: Callable[..., Any],
        scheduler: Callable | None = None,
        target_kind: str = SEQUENCE_CLASS,
        baselines: Mapping[str, float] | None = None,
        baseline_name: str = "chance",
        shortcuts: Mapping[str, float] | None = None,
        test_grid: Mapping[str, list] | None = None,
        test_length: int = 0,
    ) -> None:
        super().__init__(net, optimizer, scheduler)
        if target_kind not in (SEQUENCE_CLASS, TOKEN_CLASS):
            raise ConfigError(f"a probe run trains a class target, not {target_kind!r}")
        self.test_grid = {str(k): list(v) for k, v in (test_grid or {}).items()}
        if self.test_grid and hasattr(net, "check_length"):  # before any training, not after
            shown = ",".join(f"{k}:[{','.join(map(str, v))}]" for k, v in self.test_grid.items())
            net.check_length(int(test_length), f"probe.test_options={{{shown}}}")
        self.target_kind = target_kind
        self.baselines = dict(baselines or {})
        self.shortcuts = dict(shortcuts or {})
        metrics = {f"{stage}_{name}": MeanMetric() for stage in STAGES
                   for name in ("acc", "seq_acc")}
        metrics |= {f"{stage}_answers": SumMetric() for stage in STAGES}
        metrics["test_collision_rate"] = MeanMetric()
        metrics["test_target_mass"] = MeanMetric()
        self.scores = torch.nn.ModuleDict(metrics)
        self.curve: list[float] = []  # val/acc at each validation (checkpointed: exact resume)

    def logits(self, batch: dict[str, Tensor]) -> Tensor:
        return self.net(batch["inputs"], batch["padding_mask"], batch.get("key_only"),
                        batch.get("query_only"))

    def asked(self, logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """The logits (N, C) and labels (N,) of the N asked answers."""
        if self.target_kind == SEQUENCE_CLASS:
            return logits[:, 0], targets
        asked = targets != IGNORE
        return logits[asked], targets[asked]

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Logits (N, C) and labels (N,) of the batch's N asked answers (what calibration reads,
        so evaluation goes through here too)."""
        return self.asked(self.logits(batch), batch["targets"])

    def task_loss(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        all_logits = self.logits(batch)
        logits, labels = self.asked(all_logits, batch["targets"])
        loss = F.cross_entropy(logits, labels)
        aux = batch.get("aux_targets")
        if aux is not None and bool((aux != IGNORE).any()):
            loss = loss + F.cross_entropy(all_logits[aux != IGNORE], aux[aux != IGNORE])
        self.log("train/loss", loss, prog_bar=True, batch_size=int(labels.numel()))
        return loss

    def _evaluate(self, stage: str, batch: dict[str, Tensor]) -> None:
        if stage == "test" and ("slots" in batch or "read_at" in batch):
            first = attention_modules(self.net)[0][1]
            with record_attention([first]) as recorder:
                logits, labels = self(batch)
            self._first_layer(next(iter(recorder.records.values())).weights, batch)
        else:
            logits, labels = self(batch)
        right = logits.argmax(-1) == labels
        n = int(labels.numel())
        self.log(f"{stage}/loss", F.cross_entropy(logits, labels), batch_size=n, sync_dist=True)
        self.scores[f"{stage}_acc"].update(right.double().mean(), weight=n)
        self.scores[f"{stage}_answers"].update(float(n))
        if self.target_kind == TOKEN_CLASS:  # the asked answers back in their sequences
            asked = batch["targets"] != IGNORE
            wrong = torch.zeros_like(asked)
            wrong[asked] = ~right
            right = ~wrong.any(dim=1)
        self.scores[f"{stage}_seq_acc"].update(right.double().mean(), weight=len(right))
        for name in ("acc", "seq_acc", "answers"):
            self.log(f"{stage}/{name}", self.scores[f"{stage}_{name}"], batch_size=n,
                     prog_bar=name == "acc")

    def _first_layer(self, weights: Tensor, batch: dict[str, Tensor]) -> None:
        """The test diagnostics of the first layer's attention (B, H, S, S): head collisions on
        slots, and the weight the asked answers put on the entry they must read."""
        if "slots" in batch:
            self.scores["test_collision_rate"].update(
                collisions(weights, batch["slots"]).double().mean(), weight=len(batch["slots"]))
            self.log("test/collision_rate", self.scores["test_collision_rate"])
        if "read_at" in batch:
            mass = target_mass(weights, batch["read_at"])
            self.scores["test_target_mass"].update(mass.mean(), weight=mass.numel())
            self.log("test/target_mass", self.scores["test_target_mass"])

    def _log_constants(self, stage: str) -> None:
        """The split's baselines, logged beside its metric (constants of the split)."""
        if stage in self.baselines:
            self.log(f"{stage}/baseline_acc", float(self.baselines[stage]))
        if stage in self.shortcuts:
            self.log(f"{stage}/shortcut_acc", float(self.shortcuts[stage]))

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch)

    def on_validation_epoch_end(self) -> None:
        self._log_constants("val")
        # a point of the curve per validation of the fit only: a validation of its own (eval.py
        # split=val, head importance's, on a copy that shares the curve) logs the fit's area
        fitting = self.trainer.state.fn == TrainerFn.FITTING and not self.trainer.sanity_checking
        if fitting and self.scores["val_acc"].update_count:
            self.curve.append(float(self.scores["val_acc"].compute()))
        if self.curve:
            self.log("val/acc_auc", sum(self.curve) / len(self.curve))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["probe_learning_curve"] = list(self.curve)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.curve = list(checkpoint.get("probe_learning_curve", []))

    def on_test_epoch_end(self) -> None:
        self._log_constants("test")
        if not self.test_grid:
            return
        datamodule = self.trainer.datamodule
        if datamodule is None or not hasattr(datamodule, "test_cell_batches"):
            raise RuntimeError("probe.test_options: test with the probe's datamodule "
                               "(trainer.test(module, datamodule=...)), which draws the cells")
        table = {}
        for cell in test_cells(self.test_grid):
            name = cell_name(cell)
            table[name] = self._score_cell(datamodule.test_cell_batches(name))
            table[name]["baseline_acc"] = datamodule.baselines.get(f"test@{name}")
            table[name]["shortcut_acc"] = datamodule.shortcuts.get(f"test@{name}")
            for metric, value in table[name].items():
                if value is not None:
                    self.log(f"test/{metric}@{name}", float(value))
        if self.trainer.is_global_zero:
            write_grid_png(Path(self.trainer.default_root_dir) / GRID_PNG, self.test_grid, table)

    @torch.no_grad()
    def _score_cell(self, batches) -> dict[str, float | None]:
        """A test cell's accuracy, sequence accuracy, answers, loss and (with read_at) target
        mass, over its asked answers as the test split's are; no metric state is touched."""
        right = sequences = seq_right = 0
        loss = mass = 0.0
        answers = masses = 0
        first = attention_modules(self.net)[0][1]
        for batch in batches:
            batch = {k: v.to(self.device) for k, v in batch.items()}
            with self.trainer.precision_plugin.forward_context():
                if "read_at" in batch:
                    with record_attention([first]) as recorder:
                        logits, labels = self(batch)
                    weights = next(iter(recorder.records.values())).weights
                    cell_mass = target_mass(weights, batch["read_at"])
                    mass += float(cell_mass.double().sum())
                    masses += int(cell_mass.numel())
                else:
                    logits, labels = self(batch)
            hit = logits.argmax(-1) == labels
            right += int(hit.sum())
            answers += int(labels.numel())
            loss += float(F.cross_entropy(logits.float(), labels, reduction="sum"))
            if self.target_kind == TOKEN_CLASS:
                asked = batch["targets"] != IGNORE
                wrong = torch.zeros_like(asked)
                wrong[asked] = ~hit
                hit = ~wrong.any(dim=1)
            seq_right += int(hit.sum())
            sequences += int(hit.numel())
        return {"acc": right / answers, "seq_acc": seq_right / sequences, "answers": answers,
                "loss": loss / answers, "target_mass": mass / masses if masses else None}


GRID_PNG = "test_options.png"


def write_grid_png(path: Path, grid: Mapping[str, list], table: Mapping[str, Mapping]) -> Path | None:
    """The test cells' accuracy: a heat map for two options (first across, second down, each
    cell's accuracy written in it), a curve of accuracy and target mass for one; None for more."""
    if len(grid) not in (1, 2):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.figures import save_png

    keys = list(grid)
    if len(keys) == 1:
        (key,) = keys
        values = grid[key]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        xs = range(len(values))
        ax.plot(xs, [table[cell_name({key: v})]["acc"] for v in values], "o-", label="accuracy")
        mass = [table[cell_name({key: v})]["target_mass"] for v in values]
        if all(m is not None for m in mass):
            ax.plot(xs, mass, "s--", label="target mass")
        ax.set_xticks(list(xs), [str(v) for v in values])
        ax.set_xlabel(f"test {key}")
        ax.set_ylim(0, 1.02)
        ax.legend()
    else:
        across, down = keys
        acc = np.array([[table[cell_name({across: a, down: d})]["acc"] for a in grid[across]]
                        for d in grid[down]])
        fig, ax = plt.subplots(figsize=(1.2 * len(grid[across]) + 2, 0.6 * len(grid[down]) + 1.5))
        image = ax.imshow(acc, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for i in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                ax.text(j, i, f"{acc[i, j]:.2f}", ha="center", va="center",
                        color="white" if acc[i, j] < 0.6 else "black", fontsize=8)
        ax.set_xticks(range(len(grid[across])), [str(v) for v in grid[across]])
        ax.set_yticks(range(len(grid[down])), [str(v) for v in grid[down]])
        ax.set_xlabel(f"test {across}")
        ax.set_ylabel(f"test {down}")
        fig.colorbar(image, ax=ax, label="accuracy")
    ax.set_title("test accuracy per test cell")
    fig.tight_layout()
    return save_png(fig, path)
