"""ExplainedAway's attention entropy per layer, against theory: attention with zero query and key
projections is uniform over the valid keys, so each valid row's entropy is log(its valid keys)."""

import math

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from attnlab.attention import MultiHeadAttention
from attnlab.callbacks import ExplainedAway


class UniformAttention(pl.LightningModule):
    def __init__(self, scheme: str):
        super().__init__()
        self.attn = MultiHeadAttention(8, 2, spec=scheme)
        for proj in (self.attn.q_proj, self.attn.k_proj):  # every logit 0: uniform weights
            torch.nn.init.zeros_(proj.weight)
            torch.nn.init.zeros_(proj.bias)

    def validation_step(self, batch, _):
        x, mask = batch
        self.attn(x, key_padding_mask=mask, query_padding_mask=mask)


def test_entropy_of_uniform_attention_is_log_of_the_valid_keys(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 6, 8, generator=g)
    valid = torch.tensor([6, 5, 3, 6, 2, 4, 6, 1, 5, 6, 3, 4])  # valid positions per example
    mask = torch.arange(6)[None, :] >= valid[:, None]
    # every valid query row of example b (valid[b] rows, 2 heads each) has entropy log valid[b]
    expected = float((valid * valid.double().log()).sum() / valid.sum())
    for scheme in ("unas", "dnas"):  # uniform weights are doubly normalized already
        callback = ExplainedAway(max_batches=8)
        trainer = pl.Trainer(default_root_dir=tmp_path, logger=False, callbacks=[callback],
                             enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False)
        trainer.validate(UniformAttention(scheme), DataLoader(TensorDataset(x, mask), batch_size=4),
                         verbose=False)
        entropy = float(trainer.callback_metrics["explained_away/layer0/entropy"])
        assert math.isclose(entropy, expected, rel_tol=1e-5), (scheme, entropy, expected)
        # the existing keys are still there
        assert "explained_away/layer0/min_col_sum_times_S" in trainer.callback_metrics
