"""Calibration: ECE / overconfidence error against torchmetrics and hand-computed cases."""

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.functional.classification import multiclass_calibration_error

from attnlab.callbacks import Calibration
from attnlab.callbacks.calibration import calibration_errors, predictions


def test_ece_equals_torchmetrics():
    torch.manual_seed(0)
    logits = torch.randn(500, 6) * 2
    labels = torch.randint(0, 6, (500,))
    conf, correct = predictions(logits, {"labels": labels})
    ours = calibration_errors(conf, correct, n_bins=15)["ece"]
    theirs = multiclass_calibration_error(logits.softmax(-1), labels, num_classes=6, n_bins=15, norm="l1")
    assert ours == pytest.approx(theirs.item(), abs=1e-6)


def test_overconfidence_by_hand():
    # bin [0.9, 1.0): 4 predictions at 0.95, 2 right -> gap 0.45; bin [0.6, 0.7): 4 at 0.65, all right
    conf = torch.tensor([0.95] * 4 + [0.65] * 4)
    correct = torch.tensor([1.0, 1, 0, 0] + [1.0] * 4)
    result = calibration_errors(conf, correct, n_bins=10)
    assert result["ece"] == pytest.approx(0.5 * 0.45 + 0.5 * 0.35)
    assert result["oe"] == pytest.approx(0.5 * 0.95 * 0.45)  # underconfidence does not count
    calibrated = calibration_errors(torch.tensor([0.75] * 4), torch.tensor([1.0, 1, 1, 0]), n_bins=10)
    assert calibrated["ece"] == pytest.approx(0.0) and calibrated["oe"] == pytest.approx(0.0)


def test_equal_mass_bins_hold_equal_counts():
    conf = torch.rand(100)
    bins = calibration_errors(conf, torch.ones(100), n_bins=4, binning="mass")["bins"]
    assert bins["count"].tolist() == [25.0] * 4
    assert (bins["confidence"].diff() > 0).all()


def test_what_each_task_output_gives():
    # VQA: BCE logits over answers and soft scores: sigmoid confidence, VQA accuracy of the argmax
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5]])
    scores = torch.tensor([[0.3, 1.0, 0.0], [0.0, 0.6, 1.0]])
    conf, correct = predictions(logits, {"scores": scores, "question": torch.zeros(2, 4)})
    torch.testing.assert_close(conf, torch.sigmoid(torch.tensor([2.0, 1.0])))
    torch.testing.assert_close(correct, torch.tensor([0.3, 0.6]))
    # MLM: (logits of masked tokens, their labels); -100 is ignored
    logits = torch.tensor([[3.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    conf, correct = predictions((logits, torch.tensor([0, 0, -100])), None)
    torch.testing.assert_close(conf, logits.softmax(-1).amax(-1)[:2])
    torch.testing.assert_close(correct, torch.tensor([1.0, 0.0]))
    # headline: sequence logits are not a classification output
    reason = predictions(torch.randn(2, 5, 7), {"labels": torch.zeros(2, 5)})
    assert isinstance(reason, str) and "not (batch, classes)" in reason


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 4)
        self.data = TensorDataset(torch.randn(40, 3), torch.randint(0, 4, (40,)))

    def forward(self, x):
        return self.lin(x)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self(batch[0])

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=8)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=8)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_the_callback_reads_the_forward_and_logs(tmp_path):
    module = Classifier()
    trainer = pl.Trainer(max_steps=1, limit_train_batches=1, logger=False, enable_checkpointing=False,
                         callbacks=[Calibration(n_bins=5)],
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(module)
    x, y = module.data.tensors
    with torch.no_grad():
        expected = calibration_errors(*predictions(module(x), (x, y)), n_bins=5)
    assert trainer.callback_metrics["val/ece"].item() == pytest.approx(expected["ece"], rel=1e-5)
    assert trainer.callback_metrics["val/oe"].item() == pytest.approx(expected["oe"], rel=1e-5, abs=1e-7)
    assert (tmp_path / "reliability_val.png").is_file()
    assert not module._forward_hooks  # the hook is removed after the epoch
