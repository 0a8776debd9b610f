"""Analysis callbacks on a tiny real model and Trainer (no mocks): SchemeParameters, ExplainedAway."""

import csv

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from attnlab.attention import MultiHeadAttention, names, scheme_values
from attnlab.callbacks import ExplainedAway, SchemeParameters


def random_masks(B, S, p, generator):
    mask = torch.rand(B, S, generator=generator) < p
    mask[:, 0] = False  # at least one valid position per example
    return mask


class TinyAttentionModel(pl.LightningModule):
    def __init__(self, scheme="hnas"):
        super().__init__()
        self.embed = torch.nn.Linear(4, 16)
        self.layers = torch.nn.ModuleList(
            [MultiHeadAttention(16, 2, spec={"scheme": scheme, "hybrid_init": 0.3}) for _ in range(2)]
        )
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x, mask):
        h = self.embed(x)
        for layer in self.layers:
            h = h + layer(h, key_padding_mask=mask, query_padding_mask=mask)
        return self.head(h).squeeze(-1)

    def step(self, batch):
        x, mask, y = batch
        return ((self(x, mask) - y) ** 2).masked_fill(mask, 0).mean()

    def training_step(self, batch, _):
        return self.step(batch)

    def validation_step(self, batch, _):
        self.log("val/loss", self.step(batch))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


def tiny_loader():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 10, 4, generator=g)
    mask = random_masks(32, 10, 0.3, g)
    y = x.sum(-1)
    return DataLoader(TensorDataset(x, mask, y), batch_size=8)


def test_callbacks_log_u_and_explained_away_to_a_real_logger(tmp_path):
    pl.seed_everything(0)
    model = TinyAttentionModel()
    hybrid = SchemeParameters(every_n_steps=2)
    trainer = pl.Trainer(
        max_epochs=2, default_root_dir=tmp_path, logger=pl.loggers.CSVLogger(tmp_path, name="csv", version=""),
        callbacks=[hybrid, ExplainedAway(max_batches=2)], enable_progress_bar=False,
        enable_checkpointing=False, num_sanity_val_steps=0, enable_model_summary=False,
    )
    loader = tiny_loader()
    trainer.fit(model, loader, loader)

    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    columns = set(rows[0])
    for l in range(2):
        for h in range(2):
            assert f"hnas/u/layer{l}/head{h}" in columns
        assert f"explained_away/layer{l}/min_col_sum" in columns
        assert f"explained_away/layer{l}/share_below_1e-08" in columns
    # the last logged u is the module's u, and training moved it away from its init
    final = [float(r["hnas/u/layer1/head0"]) for r in rows if r.get("hnas/u/layer1/head0")][-1]
    assert abs(final - float(scheme_values(model)["hnas_u"]["layers.1"][0])) < 1e-6
    assert abs(final - 0.3) > 1e-4
    steps = hybrid.history["hnas_u"]["steps"]
    assert steps[0] == 0 and steps[-1] == trainer.global_step
    # the trajectory survives a resume (the callback's state goes into the checkpoint)
    restored = SchemeParameters()
    restored.load_state_dict(hybrid.state_dict())
    assert restored.history == hybrid.history
    assert (tmp_path / "hnas_u.png").stat().st_size > 1000
    assert (tmp_path / "explained_away.png").stat().st_size > 1000
    # the explained-away scalars reach callback_metrics (hence metrics.json) too
    assert "explained_away/layer1/min_col_sum_times_S" in trainer.callback_metrics
    # no recorder stays open after validation: training never materializes weights
    assert all(not m._recorders for m in model.layers)


def test_scheme_parameters_ignores_models_whose_schemes_have_none(tmp_path):
    model = TinyAttentionModel(scheme="unas")
    hybrid = SchemeParameters(every_n_steps=1)
    trainer = pl.Trainer(max_steps=2, default_root_dir=tmp_path, logger=False, callbacks=[hybrid],
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model, tiny_loader())
    assert hybrid.history == {} and not list(tmp_path.glob("*.png"))


class TinyClassifier(pl.LightningModule):
    """Two encoder layers of any scheme, mean-pooled into 3 classes (calibration needs a classifier);
    causal self-attention for a scheme defined only there (stickbreaking)."""

    def __init__(self, scheme):
        super().__init__()
        from attnlab.attention import AttentionSpec, TransformerEncoderLayer

        causal = AttentionSpec.from_config(scheme).causal_only

        self.embed = torch.nn.Linear(4, 16)
        self.layers = torch.nn.ModuleList(
            TransformerEncoderLayer(16, 2, 32, 0.0, spec={"scheme": scheme, "hybrid_init": 0.3}, layer_index=i,
                                    causal=causal)
            for i in range(2))
        self.head = torch.nn.Linear(16, 3)

    def forward(self, batch):
        from attnlab.attention import run_stack

        x, mask, _ = batch
        h = run_stack(self.layers, self.embed(x), mask)
        return self.head(h.masked_fill(mask[..., None], 0).sum(1) / (~mask).sum(1, keepdim=True))

    def step(self, batch, stage):
        loss = torch.nn.functional.cross_entropy(self(batch), batch[2])
        self.log(f"{stage}/loss", loss)
        return loss

    def training_step(self, batch, _):
        return self.step(batch, "train")

    def validation_step(self, batch, _):
        self.step(batch, "val")

    def test_step(self, batch, _):
        self.step(batch, "test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


@pytest.mark.parametrize("scheme", names())
def test_every_registered_scheme_with_every_analysis_callback(scheme, tmp_path):
    from attnlab.attention import AttentionSpec
    from attnlab.callbacks import Calibration, HeadDiversity, HeadImportance

    pl.seed_everything(0)
    g = torch.Generator().manual_seed(2)
    x, mask = torch.randn(24, 7, 4, generator=g), random_masks(24, 7, 0.3, g)
    data = DataLoader(TensorDataset(x, mask, torch.randint(0, 3, (24,), generator=g)), batch_size=8)
    model = TinyClassifier(scheme)
    importance = HeadImportance(max_batches=1)
    trainer = pl.Trainer(max_steps=3, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, num_sanity_val_steps=0, enable_model_summary=False,
                         callbacks=[SchemeParameters(every_n_steps=1), ExplainedAway(max_batches=2),
                                    HeadDiversity(max_batches=2), Calibration(n_bins=5), importance])
    trainer.fit(model, data, data)
    m = dict(trainer.callback_metrics)
    trainer.test(model, data, verbose=False)
    m.update(trainer.callback_metrics)
    summary = importance.after_test(trainer, model, pl.LightningDataModule.from_datasets(
        val_dataset=data.dataset, batch_size=8), "val/loss", "min")
    spec = AttentionSpec.from_config(scheme)  # a head scheme (diff) recombines rows: not stochastic
    rows_sum_to_one = spec.normalizer_class.rows_sum_to_one and getattr(spec, "head_scheme", None) is None
    for l in range(2):
        assert torch.isfinite(m[f"explained_away/layer{l}/min_col_sum_times_S"])
        assert torch.isfinite(m[f"explained_away/layer{l}/entropy"])
        sink = m[f"explained_away/layer{l}/unassigned_mass"]  # mean 1 - row sum: 0 where rows sum to 1
        assert torch.isfinite(sink) and (abs(float(sink)) < 1e-5 or not rows_sum_to_one)
    if AttentionSpec.from_config(scheme).normalization in ("dnas", "sinkhorn"):  # the DNAS lemma
        assert all(m[f"explained_away/layer{l}/min_col_sum_times_S"] >= 1 - 1e-4 for l in range(2))
    for key in ("val/avg_jsd", "val/head_distance", "test/avg_jsd", "val/ece", "test/oe"):
        assert torch.isfinite(m[key]), key
    assert len(summary) == 3 and (tmp_path / "head_importance.csv").is_file()
    assert (tmp_path / "head_jsd.png").is_file() and (tmp_path / "explained_away.png").is_file()
    # one trajectory plot per quantity a scheme reports (HNAS: u), none for the others
    reported = set(scheme_values(model))
    assert all((tmp_path / f"{key}.png").is_file() for key in reported)
    assert (tmp_path / "hnas_u.png").is_file() == (reported == {"hnas_u"}) == (scheme == "hnas")
