"""StabilityMonitor: loss spikes against the running median, divergence recorded (not raised),
the gradient norm, and the attention logits it reads from a recorded batch."""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from attnlab.attention import MultiHeadAttention, record_attention
from attnlab.callbacks import StabilityMonitor

# step 0 (the loss at initialization) at 3.0, steps 1-9 at 1.0, a spike (2.5 > 2 x 1.0), not one (1.9), then the loss turns NaN at step 12
LOSSES = [3.0] + [1.0] * 9 + [2.5, 1.9, math.nan, 1.0, 1.0]


class Scripted(pl.LightningModule):
    """Its loss at step t is LOSSES[t] (times a parameter held at 1, whose gradient is LOSSES[t])."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(self.global_step)
        return self.w * LOSSES[self.global_step]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)  # w stays 1


def test_a_spike_is_counted_and_a_nan_loss_stops_training_as_a_recorded_divergence(tmp_path):
    monitor = StabilityMonitor(every_n_steps=None, spike_factor=2.0, window=50)
    module = Scripted()
    trainer = pl.Trainer(max_steps=len(LOSSES), callbacks=[monitor], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    data = DataLoader(TensorDataset(torch.zeros(len(LOSSES), 1)), batch_size=1)
    trainer.fit(module, data)  # no exception: the divergence is a result
    assert monitor.summary() == {"diverged": True, "diverged_at_step": 12, "loss_spikes": 1,
                                 "spike_factor": 2.0, "window": 50, "initial_loss": 3.0}
    assert module.seen[-1] == 12  # training stopped at the step that diverged
    assert trainer.callback_metrics["train/diverged"] == 1.0


def test_the_gradient_norm_is_logged_before_the_step():
    monitor = StabilityMonitor(every_n_steps=None)
    module = Scripted()
    trainer = pl.Trainer(max_steps=11, callbacks=[monitor], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(TensorDataset(torch.zeros(20, 1)), batch_size=1))
    assert float(trainer.callback_metrics["train/grad_norm"]) == 2.5  # step 10's loss, 2.5 x w
    assert float(trainer.callback_metrics["train/loss_spikes"]) == 1.0


def test_spikes_follow_the_median_of_the_window():
    monitor = StabilityMonitor(window=10)
    monitor.losses = [1.0] * 5 + [10.0] * 5  # median 5.5
    assert not monitor.is_spike(10.9) and monitor.is_spike(11.1)
    monitor.losses = [1.0] * 9  # fewer than 10 finite losses: no verdict yet
    assert not monitor.is_spike(100.0)


def test_the_recorded_max_logit_is_the_largest_q_dot_k_over_valid_causal_pairs():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, spec="sigmoid", is_decoder=True).eval()
    x = torch.randn(2, 5, 8) * 3
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad(), record_attention(m) as rec:
        m(x, key_padding_mask=padding, query_padding_mask=padding, causal=True)
    (record,) = rec.records.values()
    q = m.q_proj(x).view(2, 5, 2, 4).transpose(1, 2).double()
    k = m.k_proj(x).view(2, 5, 2, 4).transpose(1, 2).double()
    expected = torch.full((2,), -math.inf, dtype=torch.float64)
    for b in range(2):
        for i in range(5):
            for j in range(i + 1):
                if not padding[b, i] and not padding[b, j]:
                    expected = torch.maximum(expected, (q[b, :, i] * k[b, :, j]).sum(-1) / 2.0)
    torch.testing.assert_close(record.max_logit.double(), expected, rtol=1e-5, atol=1e-5)
