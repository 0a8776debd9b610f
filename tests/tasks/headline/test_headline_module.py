"""Headline LightningModule + DataModule through a tiny pl.Trainer; BERT2BERT initialization."""

from __future__ import annotations

import csv
from functools import partial

import pytest
import pytorch_lightning as pl
import torch
from helpers.paths import FIXTURES as FIXTURE_ROOT
from helpers.seq2seq_cases import BERT_STYLE

from attnlab.errors import ConfigError
from tasks.common.bert_assets import CLS_ID, PAD_ID, SEP_ID, UNK_ID
from tasks.common.optim import linear_schedule
from tasks.common.seq2seq import Seq2SeqTransformer
from tasks.headline.bert_init import load_bert_into
from tasks.headline.datamodule import HeadlineDataModule
from tasks.headline.module import HeadlineModule
from tasks.headline.network import HeadlineTransformer

FIXTURES = FIXTURE_ROOT / "headline"
# attention_dropout None: the dropout's (0.1), what these tests ran with before
TINY_NET = {"d_model": 16, "nhead": 2, "num_encoder_layers": 1, "num_decoder_layers": 1,
            "dim_feedforward": 32, "attention_dropout": None, **BERT_STYLE}
TINY = {"val_decode_batches": 1, "max_decode_length": 6, "beam_size": 2, "length_penalty": 0.6}
# source=gigaword reads gigaword_dir only
UNUSED_DIRS = {"debian_dir": "unused", "pairs_dir": "unused"}


def tiny_module(data_kwargs: dict, attention, **net_options) -> HeadlineModule:
    """The module as the runner builds it: the data's sizes into the net, the rest to the module."""
    kwargs = dict(data_kwargs)
    net = HeadlineTransformer(attention=attention, **TINY_NET, **net_options, **kwargs.pop("net"))
    return HeadlineModule(net=net, optimizer=partial(torch.optim.AdamW, lr=5e-4, weight_decay=0.01),
                          scheduler=partial(linear_schedule, warmup=1), **TINY, **kwargs)


def gigaword_datamodule(**kwargs):
    return HeadlineDataModule(
        source="gigaword",
        gigaword_dir=str(FIXTURES / "gigaword"),
        **UNUSED_DIRS,
        max_source_length=32,
        max_target_length=12,
        batch_size=2,
        eval_batch_size=2,
        **kwargs,
    )


def test_datamodule_batches_and_model_kwargs():
    dm = gigaword_datamodule()
    dm.prepare_data()
    dm.setup("fit")
    kwargs = dm.model_kwargs()
    vocab = kwargs["net"].pop("output_vocab")
    assert kwargs == {
        "net": {"vocab_size": 30522, "pad_id": PAD_ID, "max_source_positions": 32, "max_target_positions": 12},
        "bos_id": CLS_ID,
        "eos_id": SEP_ID,
        "unk_id": UNK_ID,
    }
    # the output vocabulary: every token of the training headlines and the special tokens, sorted
    train_tokens = {t for example in dm.data["train"] for t in example["tgt_ids"]}
    assert vocab == sorted(train_tokens | {PAD_ID, UNK_ID, CLS_ID, SEP_ID})
    assert len(vocab) < 100
    assert "output_vocab" not in gigaword_datamodule(output_vocab="full").model_kwargs()["net"]
    with pytest.raises(ConfigError, match="output_vocab"):
        gigaword_datamodule(output_vocab="small")
    batch = next(iter(dm.val_dataloader()))
    src, tgt = batch["src_ids"], batch["tgt_ids"]
    assert src.shape[0] == tgt.shape[0] == 2 and src.shape[1] <= 32 and tgt.shape[1] <= 12
    assert (src[:, 0] == CLS_ID).all() and (tgt[:, 0] == CLS_ID).all()
    assert batch["headlines"] == ["central bank holds rates steady", "ferry runs aground"]
    # The file's UNK reaches the model as the vocabulary's [UNK] (id 100), not as the word "unk".
    assert 100 in src[0].tolist()
    # Every row: [CLS] text [SEP] then padding only.
    for row in tgt.tolist():
        end = row.index(SEP_ID)
        assert all(t == PAD_ID for t in row[end + 1 :]) and PAD_ID not in row[:end]


def test_datamodule_rejects_bad_source():
    with pytest.raises(ConfigError, match="source"):
        HeadlineDataModule(source="cnn", **UNUSED_DIRS)
    with pytest.raises(ConfigError, match="gigaword_dir"):
        HeadlineDataModule(source="gigaword", **UNUSED_DIRS)


def _rows(folder):
    with open(folder / "predictions.tsv", encoding="utf-8", newline="") as handle:
        return list(csv.reader(handle, delimiter="\t"))


def test_fit_and_test_write_predictions_and_rouge(tmp_path, one_thread):
    pl.seed_everything(0)
    dm = gigaword_datamodule()
    dm.prepare_data()
    dm.setup("fit")
    module = tiny_module(dm.model_kwargs(), {"scheme": "hnas", "hybrid_init": 0.1, "param_lr": 0.05},
                         norm_first=True)
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=dm)
    assert {"val/loss", "val/rouge1", "val/rouge2", "val/rougeL"} <= set(
        trainer.callback_metrics
    )
    assert torch.isfinite(trainer.callback_metrics["val/loss"])
    # the lead baseline on the decoded val examples (the card's trivial baseline), and the share of
    # distinct headlines among them
    from tasks.headline.baseline import lead_scores

    decoded = [b for _, b in zip(range(module.hparams.val_decode_batches), dm.val_dataloader())]
    expected = lead_scores([a for b in decoded for a in b["articles"]], [h for b in decoded for h in b["headlines"]], 8)
    assert float(trainer.callback_metrics["val/lead_rougeL"]) == pytest.approx(expected["rougeL"], abs=1e-6)
    assert 0 < float(trainer.callback_metrics["val/distinct_ratio"]) <= 1
    # HNAS's u logits train in their own group: learning rate model.param_lr, no weight decay
    logit = module.net.encoder_layers[0].self_attn.normalizer.hybrid_logit
    (group,) = [g for g in trainer.optimizers[0].param_groups if g["params"][0] is logit]
    assert group["initial_lr"] == 0.05 and group["weight_decay"] == 0.0
    # the output vocabulary (training headlines only) comes back with a checkpoint
    assert module.net.restricted_output
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    # a net of the same sizes, its output ids other than the checkpoint's
    size = module.net.output_ids.numel()
    fresh = dict(dm.model_kwargs(), net=dict(dm.model_kwargs()["net"], output_vocab=range(size)))
    net = tiny_module(fresh, {"scheme": "hnas", "hybrid_init": 0.1}, norm_first=True).net
    restored = HeadlineModule.load_from_checkpoint(tmp_path / "model.ckpt", net=net, weights_only=False).eval()
    assert torch.equal(restored.net.output_ids, module.net.output_ids)
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        module.eval()
        assert torch.equal(restored.loss(batch), module.loss(batch))
    results = trainer.test(module, datamodule=dm, verbose=False)[0]
    for key in ("test/rouge1", "test/rouge2", "test/rougeL"):
        assert 0.0 <= results[key] <= 1.0
    # the lead baseline, on the same test examples, next to the model's scores
    test = dm.data["test"]
    expected = lead_scores([t["article"] for t in test], [t["headline"] for t in test], 8)
    for key, value in expected.items():
        assert results[f"test/lead_{key}"] == pytest.approx(value, abs=1e-6)
    written = [r[2] for r in _rows(tmp_path)[1:]]
    assert results["test/distinct_ratio"] == pytest.approx(len(set(written)) / len(written))
    with open(tmp_path / "predictions.tsv", encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    # predictions use only word pieces of the training headlines
    allowed = set(module.net.output_ids.tolist())
    for row in rows[1:]:
        assert set(dm.tokenizer.encode(row[2], add_special_tokens=False).ids) <= allowed
    assert rows[0] == ["source", "reference", "prediction"]
    # Every test example, the one with an empty title line included, in order.
    assert [r[1] for r in rows[1:]] == [
        "prime minister to visit UNK",
        "",
        "museum reopens after renovation",
    ]
    assert rows[2][0].startswith("oil prices fell")


def test_dnas_decoder_is_refused_by_the_module():
    with pytest.raises(ConfigError, match="decoder"):
        HeadlineTransformer(attention="hnas", decoder_attention="dnas", vocab_size=50, pad_id=0, **TINY_NET)


def _fake_bert(layers=2, hidden=16, heads=2, ff=32, vocab=40, positions=20):
    """A state dict with HF BertModel names and random values."""
    torch.manual_seed(0)
    sd = {
        "embeddings.word_embeddings.weight": torch.randn(vocab, hidden),
        "embeddings.position_embeddings.weight": torch.randn(positions, hidden),
        "embeddings.token_type_embeddings.weight": torch.randn(2, hidden),
        "embeddings.LayerNorm.weight": torch.randn(hidden),
        "embeddings.LayerNorm.bias": torch.randn(hidden),
        "embeddings.position_ids": torch.arange(positions)[None],
        "pooler.dense.weight": torch.randn(hidden, hidden),
        "pooler.dense.bias": torch.randn(hidden),
    }
    shapes = {
        "attention.self.query": (hidden, hidden),
        "attention.self.key": (hidden, hidden),
        "attention.self.value": (hidden, hidden),
        "attention.output.dense": (hidden, hidden),
        "intermediate.dense": (ff, hidden),
        "output.dense": (hidden, ff),
    }
    for i in range(layers):
        for name, shape in shapes.items():
            sd[f"encoder.layer.{i}.{name}.weight"] = torch.randn(shape)
            sd[f"encoder.layer.{i}.{name}.bias"] = torch.randn(shape[0])
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            sd[f"encoder.layer.{i}.{norm}.weight"] = torch.randn(hidden)
            sd[f"encoder.layer.{i}.{norm}.bias"] = torch.randn(hidden)
    return sd


def test_bert2bert_mapping_covers_all_but_cross_attention():
    sd = _fake_bert()
    model = Seq2SeqTransformer(
        40,
        0,
        attention="hnas",
        d_model=16,
        nhead=2,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=32,
        max_source_positions=12,
        max_target_positions=6,
        **BERT_STYLE,
    )
    left = load_bert_into(model, sd)
    # Random on purpose: cross-attention and the LayerNorm after it, the LM head, HNAS u.
    expected = {
        f"decoder_layers.{i}.{p}"
        for i in range(2)
        for p in (
            "cross_attn.q_proj.weight",
            "cross_attn.q_proj.bias",
            "cross_attn.k_proj.weight",
            "cross_attn.k_proj.bias",
            "cross_attn.v_proj.weight",
            "cross_attn.v_proj.bias",
            "cross_attn.out_proj.weight",
            "cross_attn.out_proj.bias",
            "norm2.weight",
            "norm2.bias",
        )
    }
    expected |= {f"encoder_layers.{i}.self_attn.normalizer.hybrid_logit" for i in range(2)}
    expected |= {
        "head_transform.0.weight",
        "head_transform.0.bias",
        "head_transform.2.weight",
        "head_transform.2.bias",
        "output_bias",
    }
    assert set(left) == expected
    state = model.state_dict()
    for side in ("encoder", "decoder"):
        layer = f"{side}_layers.1"
        assert torch.equal(
            state[f"{layer}.self_attn.q_proj.weight"],
            sd["encoder.layer.1.attention.self.query.weight"],
        )
        assert torch.equal(state[f"{layer}.linear2.bias"], sd["encoder.layer.1.output.dense.bias"])
        assert torch.equal(
            state[f"{layer}.norm1.weight"], sd["encoder.layer.1.attention.output.LayerNorm.weight"]
        )
    # BERT's feed-forward LayerNorm is norm2 in an encoder layer and norm3 in a decoder layer.
    assert torch.equal(
        state["encoder_layers.0.norm2.weight"], sd["encoder.layer.0.output.LayerNorm.weight"]
    )
    assert torch.equal(
        state["decoder_layers.0.norm3.weight"], sd["encoder.layer.0.output.LayerNorm.weight"]
    )
    # Positions: the first rows of BERT's, with the segment-0 embedding folded in.
    segment0 = sd["embeddings.token_type_embeddings.weight"][0]
    assert torch.allclose(
        state["decoder_embeddings.position.weight"],
        sd["embeddings.position_embeddings.weight"][:6] + segment0,
    )
    assert model.decoder_embeddings.word is model.encoder_embeddings.word


@pytest.mark.slow
def test_bert_init_encoder_equals_hf_bert():
    transformers = pytest.importorskip("transformers")
    from tasks.common.bert_assets import bert_dir
    from tasks.headline.bert_init import bert_sizes

    sizes = bert_sizes({"dropout": 0.1}, 32, 16)
    model = Seq2SeqTransformer(
        30522, 0, attention="unas", max_source_positions=32, max_target_positions=16, **sizes,
        **BERT_STYLE,
    ).eval()
    load_bert_into(model)
    hf = transformers.BertModel.from_pretrained(bert_dir()).eval()
    ids = torch.tensor([[101, 2610, 6545, 2093, 2273, 102, 0, 0], [101, 7592, 102, 0, 0, 0, 0, 0]])
    mask = ids.eq(0)
    with torch.no_grad():
        ours = model.encode(ids, mask)
        reference = hf(input_ids=ids, attention_mask=(~mask).long()).last_hidden_state
    assert torch.allclose(ours[~mask], reference[~mask], atol=1e-4)


def test_debian_datamodule_builds_pairs_and_refuses_an_empty_split(tmp_path):
    from attnlab.errors import DataError

    dm = HeadlineDataModule(
        debian_dir=str(tmp_path / "debian"),
        pairs_dir=str(tmp_path / "pairs"),
        translation_files=[str(FIXTURES / "debian" / "Translation-en")],
        split_fractions=[1.0, 0.0, 0.0],
    )
    dm.prepare_data()
    assert (tmp_path / "pairs" / "manifest.json").is_file()
    with pytest.raises(DataError, match="val split is empty"):
        dm.setup("fit")
    assert len(dm.data["train"]) == 5
