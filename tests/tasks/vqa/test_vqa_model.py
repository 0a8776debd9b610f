"""VQA model: the multi-view fusion layer and one training run per fusion mode."""

import pytest
import pytorch_lightning as pl
import torch
from helpers.modules import task_module

from attnlab.attention import (
    AttentionSpec,
    ColumnStats,
    MultiHeadAttention,
    attention_modules,
    record_attention,
)
from attnlab.errors import ConfigError
from tasks.vqa.datamodule import VQADataModule
from tasks.vqa.model import MultiViewFusion, VQAModel

TINY = {
    "n_train_images": 16,
    "n_val_images": 4,
    "n_test_images": 4,
    "questions_per_image": 4,
    "max_boxes": 20,
    "max_objects": 6,
    # what these tests ran with before SyntheticParams' defaults became conf/task/vqa.yaml's
    "annotator_noise": 0.15,
}


def boxes(batch=2, views=3, n=7, dim=12, padded=(5, 6, 4)):
    features = torch.randn(batch, views, n, dim)
    mask = torch.zeros(batch, views, n, dtype=torch.bool)
    for v, valid in enumerate(padded):
        mask[1, v, valid:] = True  # second example: padded boxes in every view
        features[1, v, valid:] = 0
    return features, mask


@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas"])
def test_fusion_output_is_primary_plus_attended_raw_secondary_features(scheme):
    torch.manual_seed(0)
    spec = AttentionSpec(scheme=scheme)
    fusion = MultiViewFusion(12, num_views=3, spec=spec, dropout=0.1).eval()
    features, mask = boxes()
    out, out_mask = fusion(features, mask)
    assert out.shape == (2, 7, 12) and torch.equal(out_mask, mask[:, 0])
    assert torch.isfinite(out).all()
    # y_i = LayerNorm(x^P_i + sum_s sum_j pi^s_ij x^s_j): rebuild it from the recorded weights
    with record_attention(fusion.attention) as rec:
        fusion(features, mask)
    total = features[:, 0].clone()
    for view, name in zip((1, 2), ("0", "1")):
        weights = rec.records[name].weights[:, 0]  # (B, N_q, N_k), one head
        assert weights[1, :, 4 if view == 2 else 6 :].abs().max() == 0  # padded keys: no weight
        total += weights @ features[:, view]
    torch.testing.assert_close(out, fusion.norm(total), atol=1e-5, rtol=1e-5)


def test_fusion_has_one_attention_layer_per_secondary_view_without_value_projection():
    model = VQAModel(
        AttentionSpec("hnas"), vocab_size=10, num_answers=5, feature_dim=12, num_views=3,
        fusion_dropout=0.1,
    )
    layers = attention_modules(model)
    assert [name for name, _ in layers] == ["fusion.attention.0", "fusion.attention.1"]
    for _, layer in layers:
        assert isinstance(layer, MultiHeadAttention)
        assert layer.v_proj is None and layer.num_heads == 1 and layer.dropout == 0.1
        assert layer.normalizer.u.tolist() == pytest.approx([0.5])
    assert attention_modules(VQAModel(AttentionSpec("hnas"), 10, 5, 12, 3, fusion="concat")) == []


def test_unknown_fusion_is_a_config_error():
    with pytest.raises(ConfigError, match="task.fusion"):
        VQAModel(AttentionSpec(), 10, 5, 12, 3, fusion="sum")


def test_fusion_heads_that_do_not_divide_the_features_name_the_key_the_user_typed():
    with pytest.raises(ConfigError, match=r"^task\.module\.net\.fusion_heads=5 must divide the box "
                                          r"features' size 12 .* use one of 1, 2, 3, 4, 6, 12"):
        VQAModel(AttentionSpec(), 10, 5, 12, 3, fusion_heads=5)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    dm = VQADataModule(
        str(tmp_path_factory.mktemp("vqa")), synthetic=TINY, vqav2=None, batch_size=16,
        eval_batch_size=None, max_boxes=20
    )
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("fusion", ["attention", "primary", "concat"])
def test_each_fusion_trains_and_reports_accuracy(tiny_data, fusion):
    pl.seed_everything(0)
    module = task_module(
        "vqa",
        {"scheme": "hnas", "hybrid_init": 0.5},
        tiny_data.model_kwargs(),
        fusion=fusion,
        embed_dim=16,
        hidden_dim=32,
        attention_dim=16,
    )
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=tiny_data)
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and 0.0 <= metrics["val/acc"] <= 1.0
    changed = [n for n, p in module.named_parameters() if not torch.equal(p, before[n])]
    assert "net.classifier.3.weight" in changed
    if fusion == "attention":  # gradients reach the fusion attention, u included
        assert "net.fusion.attention.0.normalizer.hybrid_logit" in changed
        assert "net.fusion.attention.1.k_proj.weight" in changed
    for name, param in module.named_parameters():
        assert torch.isfinite(param).all(), name
    result = trainer.test(module, datamodule=tiny_data, verbose=False)[0]
    types = {f"test/acc_{t}" for t in ("existence", "counting", "attribute", "comparison")}
    assert "test/acc" in result and types & set(result)
    assert {"test/acc_visible", "test/prior_acc"} <= set(result)
    assert result["test/prior_acc"] == pytest.approx(tiny_data.question_prior("test")["acc"])
    fusion_stats = {f"test/{name}_l{l}" for name in ("explained_away", "min_col_sum_x_S") for l in (0, 1)}
    if fusion == "attention":  # weights are recorded only while testing
        assert fusion_stats <= set(result)
        assert not any(layer._recorders for layer in module.net.fusion.attention)
    else:
        assert not fusion_stats & set(result)


@pytest.mark.parametrize("scheme", ["unas", "dnas"])
def test_sharp_unas_explains_boxes_away_and_dnas_keeps_the_lemma(scheme):
    """The statistic the sweep reports, on the real fusion layer: with sharp logits UNAS gives
    some secondary boxes no weight at all, DNAS gives every valid box >= 1/S."""
    torch.manual_seed(0)
    fusion = MultiViewFusion(12, num_views=3, spec=AttentionSpec(scheme=scheme), dropout=0.0).eval()
    with torch.no_grad():
        for layer in fusion.attention:
            layer.q_proj.weight.mul_(1000.0)  # sharp attention: logits of order 1000
    features, mask = boxes(batch=4, n=9, padded=(7, 8, 6))
    with record_attention(fusion.attention) as rec:
        fusion(features, mask)
    for name, view in zip(("0", "1"), fusion.secondary_views):
        stats = ColumnStats()
        stats.update(rec.records[name].column_sums, mask[:, view], mask[:, 0])
        out = stats.compute()
        if scheme == "dnas":
            assert out["min_col_sum_x_S"] >= 1 - 1e-5 and out["explained_away"] == 0
        else:
            assert out["explained_away"] > 0.1 and out["min_col_sum_x_S"] < 1e-6


@pytest.mark.parametrize("bidirectional", [True, False])
def test_question_encoder_ignores_padding(bidirectional):
    from tasks.vqa.model import QuestionEncoder

    torch.manual_seed(0)
    encoder = QuestionEncoder(20, 8, 16, "gru", bidirectional).eval()
    tokens = torch.tensor([[5, 6, 7, 0, 0, 0], [3, 4, 9, 9, 2, 0]])
    lengths = torch.tensor([3, 5])
    out = encoder(tokens, lengths)
    assert out.shape == (2, 16)
    # each question alone, without padding, gives the same vector
    for row in range(2):
        alone = encoder(tokens[row : row + 1, : lengths[row]], lengths[row : row + 1])
        torch.testing.assert_close(out[row : row + 1], alone, atol=1e-6, rtol=1e-5)
    if bidirectional:  # the backward half reads the question from its end: the first word counts
        changed = tokens.clone()
        changed[0, 0] = 8
        assert not torch.allclose(encoder(changed, lengths)[0, 8:], out[0, 8:])
    with pytest.raises(ConfigError, match="even"):
        QuestionEncoder(20, 8, 15, "gru", bidirectional=True)


def test_similarity_init_starts_as_dot_product_attention():
    torch.manual_seed(0)
    fusion = MultiViewFusion(12, num_views=3, spec=AttentionSpec("unas"), dropout=0.0)
    features, mask = boxes()
    with record_attention(fusion.attention) as rec:
        fusion(features, mask)
    for name, view in zip(("0", "1"), (1, 2)):
        logits = features[:, 0] @ features[:, view].transpose(1, 2) / 12**0.5
        logits = logits.masked_fill(mask[:, view, None, :], float("-inf"))
        expected = torch.softmax(logits, dim=-1).masked_fill(mask[:, 0, :, None], 0.0)
        torch.testing.assert_close(rec.records[name].weights[:, 0], expected, atol=1e-6, rtol=1e-5)
    random = MultiViewFusion(12, 3, AttentionSpec("unas"), init="random")
    assert not torch.equal(random.attention[0].q_proj.weight, torch.eye(12))
    with pytest.raises(ConfigError, match="fusion_init"):
        MultiViewFusion(12, 3, AttentionSpec("unas"), init="orthogonal")


def test_test_statistics_cover_every_test_batch_with_head_diversity_on(tiny_data, tmp_path):
    """HeadDiversity records only its first batch; the task's own recorder still sees all of them,
    so test/explained_away_* equal a plain loop over every test batch."""
    from attnlab.callbacks import HeadDiversity
    from tasks.vqa.synthetic import BOX_KINDS

    pl.seed_everything(0)
    tiny_data.eval_batch_size = 5  # 16 test questions: 4 batches
    module = task_module("vqa", "dnas", tiny_data.model_kwargs(), fusion_heads=4, embed_dim=16, hidden_dim=32,
                         attention_dim=16).eval()
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[HeadDiversity(max_batches=1)],
                         default_root_dir=tmp_path)
    result = trainer.test(module, datamodule=tiny_data, verbose=False)[0]
    assert "test/avg_jsd" in result
    expected = [ColumnStats(BOX_KINDS) for _ in module.net.fusion.attention]
    batches = list(tiny_data.test_dataloader())
    assert len(batches) >= 2  # more batches than the callback records
    with torch.no_grad():
        for batch in batches:
            with record_attention(module.net.fusion.attention) as rec:
                module(batch)
            for l, (stats, view) in enumerate(zip(expected, module.net.fusion.secondary_views)):
                r = rec.records[str(l)]
                stats.update(r.column_sums, r.key_padding_mask, r.query_padding_mask, batch["box_kind"][:, view])
    tiny_data.eval_batch_size = tiny_data.batch_size
    for l, stats in enumerate(expected):
        for name, value in stats.compute().items():
            if not torch.isnan(value):
                assert result[f"test/{name}_l{l}"] == pytest.approx(value.item(), rel=1e-5, abs=1e-9), name
