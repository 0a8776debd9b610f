"""Head diversity (JSD between heads, distance between head outputs) and head importance by masking."""

import math
from unittest import mock

import pytest
import pytorch_lightning as pl
import torch
from scipy.spatial.distance import jensenshannon
from torch.utils.data import DataLoader, TensorDataset

from attnlab.attention import MultiHeadAttention, record_attention
from attnlab.attention.statistics import head_distance_sum, jsd_matrix, valid_rows
from attnlab.callbacks import AfterTestAnalysis, HeadDiversity, HeadImportance
from attnlab.callbacks.head_importance import masked_head
from attnlab.errors import ConfigError


def test_jsd_of_identical_heads_is_zero_and_of_disjoint_one_hot_heads_is_log2():
    same = torch.softmax(torch.randn(2, 1, 5, 7), -1).expand(2, 3, 5, 7)
    matrix, n = jsd_matrix(same)
    assert n == 10 and matrix.abs().max() < 1e-12
    one_hot = torch.zeros(1, 2, 4, 4)
    one_hot[0, 0, :, 0] = 1.0
    one_hot[0, 1, :, 1] = 1.0
    matrix, n = jsd_matrix(one_hot)
    assert matrix[0, 1] / n == pytest.approx(math.log(2)) and matrix[0, 0] == 0


def test_jsd_matches_scipy_and_skips_padded_queries():
    torch.manual_seed(0)
    w = torch.softmax(torch.randn(2, 3, 4, 6), -1)
    w[1, :, 2:] = 0  # two padded queries in the second example
    rows = valid_rows(w)
    assert rows.tolist() == [[True] * 4, [True, True, False, False]]
    matrix, n = jsd_matrix(w, rows)
    assert n == 6
    expected = sum(jensenshannon(w[b, 0, i].numpy(), w[b, 2, i].numpy()) ** 2
                   for b in range(2) for i in range(4) if rows[b, i])
    assert matrix[0, 2].item() == pytest.approx(expected, rel=1e-6)
    assert torch.equal(matrix, matrix.T)


def test_head_distance_is_the_mean_pairwise_l2_distance():
    out = torch.zeros(1, 3, 2, 2)  # (B, H, S_q, d)
    out[0, 1, :, 0] = 3.0  # head 1 at (3, 0), head 2 at (0, 4), head 0 at the origin
    out[0, 2, :, 1] = 4.0
    total, n = head_distance_sum(out, torch.tensor([[True, False]]))
    assert n == 1 and total == pytest.approx((3 + 4 + 5) / 3)


def loader(n):
    return DataLoader(TensorDataset(torch.zeros(n, 1)), batch_size=1)


class AttnModule(pl.LightningModule):
    """Two attention 'layers' (one with 2 heads, one single-head) and a metric that only head 0
    of the first layer can move."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.multi = MultiHeadAttention(8, 2)
        self.single = MultiHeadAttention(8, 1)
        with torch.no_grad():
            self.multi.out_proj.weight[:, 4:] = 0  # head 1 of `multi` does not reach the output
        self.x = torch.randn(6, 5, 8)
        with torch.no_grad():
            self.target = self.multi(self.x)

    def forward(self, x):
        return self.multi(x) + 0 * self.single(x)

    def training_step(self, batch, batch_idx):
        return self(self.x).sum() * 0

    def validation_step(self, batch, batch_idx):
        self.log("val/score", -(self(self.x) - self.target).square().mean())

    def test_step(self, batch, batch_idx):
        self(self.x)

    def train_dataloader(self):
        return loader(1)

    def val_dataloader(self):
        return loader(2)

    def test_dataloader(self):
        return loader(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def trainer_for(*callbacks, tmp_path):
    return pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, callbacks=list(callbacks),
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      default_root_dir=tmp_path, accelerator="cpu")


def test_head_diversity_callback_logs_and_draws(tmp_path, capsys):
    module, cb = AttnModule(), HeadDiversity(max_batches=1)
    trainer = trainer_for(cb, tmp_path=tmp_path)
    trainer.fit(module)
    m = dict(trainer.callback_metrics)
    trainer.test(module, verbose=False)
    m.update(trainer.callback_metrics)
    assert not module.multi._recorders and not module.single._recorders  # closed again
    with record_attention([module.multi]) as recorder:
        module.multi(module.x)
    rec = recorder.records["0"]
    matrix, n = jsd_matrix(rec.weights)
    assert m["val/avg_jsd"].item() == pytest.approx((matrix[0, 1] / n).item(), rel=1e-5)
    total, count = head_distance_sum(rec.head_outputs, valid_rows(rec.weights))
    assert m["test/head_distance"].item() == pytest.approx(total / count, rel=1e-5)
    assert (tmp_path / "head_jsd.png").is_file() and (tmp_path / "head_jsd_test.png").is_file()
    assert capsys.readouterr().out.count("single-head attention module(s) skipped") == 1


def test_masked_head_zeroes_exactly_that_heads_output():
    torch.manual_seed(1)
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    with record_attention([m]) as recorder:
        m(x)
    heads = recorder.records["0"].head_outputs  # (B, H, S, d)
    with masked_head(m, 1):
        out = m(x)
    kept = heads.clone()
    kept[:, 1] = 0
    torch.testing.assert_close(out, m.out_proj(kept.transpose(1, 2).reshape(2, 4, 8)))
    raw = MultiHeadAttention(8, 2, project_values=False)  # heads split the raw values
    ref = raw(x)
    with masked_head(raw, 0):
        out = raw(x)
    assert out[..., :4].abs().max() == 0 and torch.equal(out[..., 4:], ref[..., 4:])


def test_head_importance_finds_the_head_that_matters(tmp_path):
    module, cb = AttnModule(), HeadImportance(max_batches=2)
    trainer = trainer_for(cb, tmp_path=tmp_path)
    trainer.fit(module)
    summary = cb.after_test(trainer, module, None, "val/score", "max")
    rows = (tmp_path / "head_importance.csv").read_text().splitlines()
    assert rows[0] == "layer,module,head,val/score,drop" and len(rows) == 3  # single-head layer left out
    drops = {int(r.split(",")[2]): float(r.split(",")[-1]) for r in rows[1:]}
    assert drops[0] > 1e-4 and abs(drops[1]) < 1e-9
    assert summary["head_importance/base"] == pytest.approx(0.0, abs=1e-9)
    assert summary["head_importance/max_drop"] == pytest.approx(drops[0])
    assert module.trainer is trainer and (tmp_path / "head_importance.png").is_file()


def test_head_importance_keeps_to_its_budget_says_so_and_shows_progress(tmp_path, capsys):
    """max_heads=1 of 2 heads: one seeded sample, one line naming what was left out and how to
    measure all, a progress bar over base + masked heads; the module and datamodule keep the run's
    trainer (the evaluator attaches to a shallow copy)."""
    module, cb = AttnModule(), HeadImportance(max_heads=1, max_batches=1, seed=0)
    assert isinstance(cb, AfterTestAnalysis)
    datamodule = pl.LightningDataModule.from_datasets(val_dataset=TensorDataset(torch.zeros(2, 1)))
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, callbacks=[cb],
                         enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path,
                         accelerator="cpu")
    trainer.fit(module)
    datamodule.trainer = trainer
    capsys.readouterr()
    summary = cb.after_test(trainer, module, datamodule, "val/score", "max")
    out = capsys.readouterr().out
    assert ("head importance: 1 of 2 heads (a sample, seed 0; callbacks.head_importance.max_heads="
            "null measures all)") in out
    assert "2/2" in out  # the progress bar: the unmasked validation and one masked head
    rows = (tmp_path / "head_importance.csv").read_text().splitlines()
    assert len(rows) == 2 and summary["head_importance/max_drop"] == float(rows[1].split(",")[-1])
    assert module.trainer is trainer and datamodule.trainer is trainer
    every = HeadImportance(max_heads=None).chosen_heads([(0, "0", module.multi)])
    assert every == ([(0, "0", module.multi, 0), (0, "0", module.multi, 1)], 2)


def test_head_importance_budget_options_are_checked():
    with pytest.raises(ConfigError, match="max_heads=0"):
        HeadImportance(max_heads=0)
    with pytest.raises(ConfigError, match="max_batches=-1"):
        HeadImportance(max_batches=-1)


class Consumer(AttnModule):
    """A task that records the same module for its own statistics in its test step (as VQA does)."""

    def test_step(self, batch, batch_idx):
        with record_attention([self.multi]) as own:
            self(self.x)
        self.own = own.records["0"]


def test_a_task_recording_the_same_module_does_not_hide_it(tmp_path):
    module = Consumer()
    trainer = trainer_for(HeadDiversity(max_batches=1), tmp_path=tmp_path)
    with mock.patch.object(MultiHeadAttention, "_record", autospec=True,
                           side_effect=MultiHeadAttention._record) as spy:
        trainer.test(module, verbose=False)
    assert "test/avg_jsd" in trainer.callback_metrics and module.own.weights.shape[1] == 2
    recorded = {id(call.args[0]) for call in spy.call_args_list}
    assert id(module.single) not in recorded  # single-head modules are never recorded
