"""The worked example of a task card: a throwaway task, written into a copy of this checkout as
exactly the files docs/tasks.md names (tasks/<name>/ and conf/task/<name>.yaml), is picked up by
`train.py --help`, by the every-scheme-in-every-task CLI matrix and by `attnlab.study.reproduce`, with no
other file edited."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.paths import ROOT

# what a new task is: these files, and nothing else changes
TOY_FILES = {
    "tasks/toy/__init__.py": '"""A throwaway task: is the sum of a sequence of digits odd?"""\n',
    "tasks/toy/data.py": '''
        import pytorch_lightning as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class ToyDataModule(pl.LightningDataModule):
            def __init__(self, examples: int = 96, length: int = 8, vocab_size: int = 10,
                         batch_size: int = 16, seed: int = 0) -> None:
                super().__init__()
                self.save_hyperparameters()

            def setup(self, stage=None) -> None:
                h = self.hparams
                gen = torch.Generator().manual_seed(h.seed)
                x = torch.randint(1, h.vocab_size, (h.examples, h.length), generator=gen)
                y = x.sum(1) % 2
                third = h.examples // 3
                self.splits = {"train": TensorDataset(x[:third], y[:third]),
                               "val": TensorDataset(x[third:2 * third], y[third:2 * third]),
                               "test": TensorDataset(x[2 * third:], y[2 * third:])}

            def model_kwargs(self) -> dict:
                return {"net": {"vocab_size": self.hparams.vocab_size}}

            def train_dataloader(self):
                return DataLoader(self.splits["train"], batch_size=self.hparams.batch_size, shuffle=True)

            def val_dataloader(self):
                return DataLoader(self.splits["val"], batch_size=self.hparams.batch_size)

            def test_dataloader(self):
                return DataLoader(self.splits["test"], batch_size=self.hparams.batch_size)
    ''',
    "tasks/toy/module.py": '''
        import torch
        import torch.nn.functional as F
        from torch import nn

        from attnlab.attention import AttentionSpec, TransformerEncoderLayer, run_stack
        from attnlab.task_module import TaskModule


        class ToyNet(nn.Module):
            def __init__(self, attention, vocab_size: int, d_model: int = 16, nhead: int = 2,
                         num_layers: int = 2) -> None:
                super().__init__()
                spec = AttentionSpec.from_config(attention)
                self.embed = nn.Embedding(vocab_size, d_model)
                self.layers = nn.ModuleList(
                    TransformerEncoderLayer(d_model, nhead, 2 * d_model, 0.0, spec, layer_index=i)
                    for i in range(num_layers))
                self.out = nn.Linear(d_model, 2)

            def forward(self, x):
                padding = torch.zeros_like(x, dtype=torch.bool)
                return self.out(run_stack(self.layers, self.embed(x), padding).mean(1))


        class ToyModule(TaskModule):
            def forward(self, x):
                return self.net(x)

            def task_loss(self, batch, batch_idx):
                x, y = batch
                loss = F.cross_entropy(self(x), y)
                self.log("train/loss", loss)
                return loss

            def _evaluate(self, batch, stage):
                x, y = batch
                logits = self(x)
                self.log(f"{stage}/loss", F.cross_entropy(logits, y))
                self.log(f"{stage}/acc", (logits.argmax(-1) == y).float().mean())
                return {"logits": logits, "labels": y}

            def validation_step(self, batch, batch_idx):
                return self._evaluate(batch, "val")

            def test_step(self, batch, batch_idx):
                return self._evaluate(batch, "test")
    ''',
    "conf/task/toy.yaml": '''
        # @package _global_
        task:
          name: toy
          optimized_metric: val/acc
          monitor_mode: max
          card:
            classification: false
            multi_head: []
            encoder_layers: null
            tiny: [trainer.max_epochs=1]
            reproduce:
              claims: [coda_diversity]
              in_quick: false
              quick: [trainer.max_epochs=1]
              preset: null
          datamodule:
            _target_: tasks.toy.data.ToyDataModule
            seed: ${seed}
          module:
            _target_: tasks.toy.module.ToyModule
            net:
              _target_: tasks.toy.module.ToyNet
              attention: ${model}
            optimizer:
              _target_: torch.optim.AdamW
              _partial_: true
              lr: 1.0e-2
            scheduler: null
    ''',
}
ANYWHERE = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache",
                                  ".hypothesis", "*.egg-info")
OUTPUTS = {"outputs", "data", "wandb", "reproduce", "compare"}  # run outputs, at the root only


def IGNORED(folder: str, names: list[str]) -> set[str]:
    """What the copy leaves out: caches anywhere, the run outputs at the checkout's root (not the
    packages of the same name: src/attnlab/study/compare)."""
    top = set(names) & OUTPUTS if Path(folder) == ROOT else set()
    return set(ANYWHERE(folder, names)) | top


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of this checkout with the toy task's files added; nothing else differs."""
    repo = tmp_path_factory.mktemp("with_toy") / "attnlab"
    shutil.copytree(ROOT, repo, ignore=IGNORED)
    for name, text in TOY_FILES.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(textwrap.dedent(text).lstrip())
    return repo


def run(checkout: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python <args>` in the copy, importing the copy's attnlab and tasks (not this checkout's)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout / "src"), str(checkout)]),
           "ATTNLAB_ROOT": str(checkout), "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_help_lists_the_new_task(checkout):
    proc = run(checkout, "train.py", "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = proc.stdout.split("== Composed config ==")[0]
    task_line = next(line for line in groups.splitlines() if line.startswith("task:"))
    assert "toy" in task_line and "vqa" in task_line, task_line


@pytest.mark.slow  # a nested pytest of the CLI matrix (~65 s): the default suite stays under 10 min
def test_the_cli_matrix_runs_every_scheme_in_the_new_task(checkout):
    proc = run(checkout, "-m", "pytest", "tests/e2e/test_cli.py", "-k", "every_registered_scheme and toy",
               "-n0", "-p", "no:cacheprovider", "-q", "--no-header")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout, proc.stdout[-2000:]


def test_reproduce_plans_the_new_task(checkout):
    proc = run(checkout, "-m", "attnlab.reproduce", "--dry-run", "--claims", "coda_diversity",
               "--tasks", "toy")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "task=toy" in proc.stdout, proc.stdout[-2000:]
