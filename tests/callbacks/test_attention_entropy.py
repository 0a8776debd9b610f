"""ExplainedAway's attention entropy per layer, against theory: attention with zero query and key
projections is uniform over the valid keys, so each valid row's entropy is log(its valid keys)."""

import math

import pytest
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


def test_unassigned_mass_and_entropy_of_a_sink_scheme_per_layer(tmp_path):
    """A throwaway sink scheme (softmax over the keys and one extra zero logit) on uniform logits:
    each valid row of an example with n valid keys gives 1/(n+1) to every key and to the sink, so
    its unassigned mass is 1/(n+1) and its entropy (of the row renormalized over its mass) log n. UNAS
    gives unassigned mass 0. The CSV logger gets the histogram's quantiles."""
    import csv

    from pytorch_lightning.loggers import CSVLogger

    from attnlab.attention.schemes import Normalizer, register, unregister

    @register
    class ZeroSink(Normalizer):
        name = "zero_sink_cb_test"
        rows_sum_to_one = False

        def weights(self, logits, **inputs):
            sink = torch.zeros_like(logits[..., :1])
            return torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 8, generator=g)
    valid = torch.tensor([6, 3, 1, 4])
    mask = torch.arange(6)[None, :] >= valid[:, None]
    weights = valid.double()  # valid[b] rows in example b
    try:
        for scheme, sink, entropy in (
            ("unas", 0.0, float((weights * weights.log()).sum() / weights.sum())),
            ("zero_sink_cb_test", float((weights / (weights + 1)).sum() / weights.sum()),
             float((weights * weights.log()).sum() / weights.sum())),
        ):
            trainer = pl.Trainer(default_root_dir=tmp_path, logger=CSVLogger(tmp_path / scheme),
                                 callbacks=[ExplainedAway(max_batches=8)],
                                 enable_progress_bar=False, enable_model_summary=False,
                                 enable_checkpointing=False)
            trainer.validate(UniformAttention(scheme), DataLoader(TensorDataset(x, mask), batch_size=2),
                             verbose=False)
            m = trainer.callback_metrics
            assert float(m["explained_away/layer0/unassigned_mass"]) == pytest.approx(sink, abs=1e-6), scheme
            assert float(m["explained_away/layer0/entropy"]) == pytest.approx(entropy, rel=1e-5), scheme
            trainer.logger.save()
            with open(trainer.logger.experiment.metrics_file_path) as f:
                columns = next(csv.reader(f))
            assert "explained_away/layer0/unassigned_mass_rows/q50" in columns
    finally:
        unregister("zero_sink_cb_test")
