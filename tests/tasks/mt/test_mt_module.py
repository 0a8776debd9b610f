"""Task mt, model side: where the scheme applies (the decoder guard), beam search = greedy at beam 1
on the mt model, the inverse-sqrt schedule, and a tiny fit + test on fairseq-layout fixtures
(training steps lower the loss; BLEU equals sacrebleu on predictions.tsv; calibration input)."""

from __future__ import annotations

import csv
import math
from functools import partial

import pytest
import pytorch_lightning as pl
import sacrebleu
import torch
from helpers.paths import FIXTURES as FIXTURE_ROOT
from helpers.seq2seq_cases import assert_beam_one_is_greedy, padded_sources, peaked

from attnlab.callbacks.calibration import predictions
from attnlab.errors import ConfigError
from tasks.common.optim import inverse_sqrt, inverse_sqrt_schedule
from tasks.common.seq2seq import Seq2SeqTransformer
from tasks.mt.datamodule import TranslationDataModule
from tasks.mt.module import TranslationModule

IWSLT = FIXTURE_ROOT / "mt" / "iwslt14"
# the net in fairseq's style, as conf/task/mt.yaml builds it
FAIRSEQ = {"positions": "sinusoidal", "lm_head": False, "weight_init": "fairseq", "activation": "relu",
           "layer_norm_eps": 1e-5}
TINY_NET = {"d_model": 16, "nhead": 2, "num_encoder_layers": 2, "num_decoder_layers": 2, "dim_feedforward": 32,
            "dropout": 0.0, "attention_dropout": 0.0, **FAIRSEQ}
# length_penalty 0.6: what these tests ran with before (conf/task/mt.yaml's is 1.0)
TINY = {"val_decode_batches": 1, "beam_size": 2, "length_penalty": 0.6, "max_len_a": 0.0,
        "max_len_b": 6}
# source=files reads data_dir only
UNUSED_DIRS = {"pairs_dir": "unused", "english_dir": "unused", "german_dir": "unused"}
DATA = {"bos_id": 1, "eos_id": 2, "tokenizer_file": "unused.json",
        "net": {"vocab_size": 40, "pad_id": 0, "max_source_positions": 16, "max_target_positions": 12}}


def tiny_module(attention="unas", data=DATA, lr=5e-4, warmup=4000, net_options=None, **kwargs) -> TranslationModule:
    """The module as the runner builds it: the data's sizes into the net, the rest to the module."""
    data = dict(data)
    net = Seq2SeqTransformer(attention=attention, **{**TINY_NET, **(net_options or {})}, **data.pop("net"))
    optimizer = partial(torch.optim.AdamW, lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4)
    return TranslationModule(net=net, optimizer=optimizer, scheduler=partial(inverse_sqrt_schedule, warmup=warmup),
                             **{**TINY, **data, **kwargs})


def test_query_normalized_schemes_stay_in_the_encoder_and_the_decoder_guard_holds():
    model = tiny_module({"scheme": "dnas"}).net
    assert {layer.self_attn.scheme for layer in model.encoder_layers} == {"dnas"}
    assert {m.scheme for layer in model.decoder_layers for m in (layer.self_attn, layer.cross_attn)} == {"unas"}
    coda = tiny_module({"scheme": "coda", "normalization": "hnas"}).net
    assert coda.encoder_layers[1].self_attn.spec.normalization == "hnas"
    assert {layer.cross_attn.spec.normalization for layer in coda.decoder_layers} == {"unas"}
    assert coda.decoder_layers[1].cross_attn.transform.receives_logits  # cross-attention cascades
    for scheme in ("dnas", "hnas", "sinkhorn"):
        with pytest.raises(ConfigError, match="decoder attention .* normalizes over queries"):
            tiny_module("unas", net_options={"decoder_attention": scheme})


# weight scales and EOS nudges under which some rows end early and others run to the max length
@pytest.mark.parametrize("scheme, scale, eos_bias", [("unas", 1.0, 0.3), ("coda", 4.0, 0.3)])
def test_beam_one_equals_greedy_on_the_mt_model(one_thread, scheme, scale, eos_bias):
    torch.manual_seed(0)
    module = tiny_module(scheme, net_options={"dropout": 0.1}).eval()
    model = peaked(module.net, scale, eos_bias)
    src, mask = padded_sources([9, 4, 16, 1, 7, 12], vocab=40)
    assert_beam_one_is_greedy(model, src, mask, max_length=10)


def test_inverse_sqrt_schedule_is_fairseqs():
    factor = inverse_sqrt(4000)
    # fairseq: lr * num_updates / warmup during warmup, then lr * sqrt(warmup / num_updates)
    assert [factor(s) for s in (0, 1000, 3999)] == pytest.approx([0.0, 0.25, 3999 / 4000])
    assert factor(4000) == 1.0 and factor(16000) == pytest.approx(0.5)


def test_fit_and_test_write_predictions_and_sacrebleu_scores(tmp_path, one_thread):
    pl.seed_everything(0)
    dm = TranslationDataModule(source="files", data_dir=str(IWSLT), tokenizer_dir=str(tmp_path / "tok"),
                               vocab_size=300, min_frequency=1, batch_size=7, eval_batch_size=2,
                               **UNUSED_DIRS)
    dm.prepare_data()
    dm.setup("fit")
    module = tiny_module({"scheme": "hnas", "param_lr": 0.05}, dm.model_kwargs(), lr=3e-2, warmup=5, max_len_b=12,
                         bleu_tokenize="none")
    # forward: the logits and labels of the real target tokens (what Calibration reads)
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        logits, labels = module.eval()(batch)
    tgt = batch["tgt_ids"]
    assert logits.shape == (int(tgt[:, 1:].ne(0).sum()), dm.tokenizer.get_vocab_size())
    assert torch.equal(labels, tgt[:, 1:][tgt[:, 1:].ne(0)])
    confidence, correct = predictions((logits, labels), batch)
    assert confidence.shape == correct.shape == labels.shape

    trainer = pl.Trainer(max_epochs=30, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         num_sanity_val_steps=0, check_val_every_n_epoch=30)
    train_batch = next(iter(dm.train_dataloader()))  # the whole training set (7 pairs)
    with torch.no_grad():
        before = module.eval().loss(train_batch, 0.0).item()
    module.train()
    trainer.fit(module, datamodule=dm)
    with torch.no_grad():
        after = module.eval().loss(train_batch, 0.0).item()
    assert after < 0.6 * before, (before, after)  # 30 steps: the training pairs are learned
    assert {"val/loss", "val/bleu", "val/chrf"} <= set(trainer.callback_metrics)
    # the schedule: inverse sqrt after 5 warmup steps; HNAS's u in its own group
    (group, *_), u_group = trainer.optimizers[0].param_groups, trainer.optimizers[0].param_groups[-1]
    assert group["lr"] == pytest.approx(3e-2 * math.sqrt(5 / 30)) and u_group["initial_lr"] == 0.05

    results = trainer.test(module, datamodule=dm, verbose=False)[0]
    with open(tmp_path / "predictions.tsv", encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    assert rows[0] == ["source", "reference", "hypothesis"] and len(rows) == 1 + len(dm.data["test"])
    assert [r[1] for r in rows[1:]] == [d["reference"] for d in dm.data["test"]]
    hypotheses, references = [r[2] for r in rows[1:]], [r[1] for r in rows[1:]]
    expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", force=True).score
    assert results["test/bleu"] == pytest.approx(expected, abs=1e-9)
    assert results["test/chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert math.isfinite(results["test/loss"])
