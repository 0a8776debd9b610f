"""classify's `encoder=pretrained` (the packaged BERT with the scheme in every layer) and the
column statistics of its claim (tasks.classify.pretrained_claim), against transformers' own BERT."""

from __future__ import annotations

import functools
from functools import partial

import numpy as np
import pytest
import torch
from helpers.cards import TINY
from helpers.cli import QUIET, metrics_files, run_cli
from helpers.paths import FIXTURES

from attnlab.errors import ConfigError
from tasks.classify.model import SelfAttentiveClassifier
from tasks.classify.module import ClassifyModule
from tasks.classify.pretrained import PretrainedEncoder, load_pretrained_bert, with_special_tokens
from tasks.classify.pretrained_stats import column_statistics, texts_as_batches
from tasks.common import bert_assets
from tasks.common.debian import read_translation_file

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is faster on shared cores
VOCAB = 30522


@functools.cache
def fixture_texts() -> list[str]:
    records = [r for name in ("Translation-en", "Translation-en-security", "Translation-en-updates")
               for r in read_translation_file(FIXTURES / "text" / name)]
    return [" ".join([r.synopsis, *r.paragraphs]) for r in records]


def hf_bert(layers: int):
    return transformers.BertModel.from_pretrained(
        str(bert_assets.bert_dir()), add_pooling_layer=False, attn_implementation="eager",
        num_hidden_layers=layers).eval()


def test_special_tokens_wrap_each_sentence():
    ids = torch.tensor([[7, 8, 9], [5, 0, 0]])
    full, mask = with_special_tokens(ids, torch.tensor([3, 1]))
    assert full.tolist() == [[101, 7, 8, 9, 102], [101, 5, 102, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


def test_pretrained_encoder_equals_transformers_bert():
    """UNAS in every layer: the token states are HF's BERT's on [CLS] ids [SEP] (real tokens)."""
    encoder = PretrainedEncoder("unas", VOCAB, layers=2).eval()
    ids = torch.tensor([[2023, 2003, 1037, 3231], [7592, 2088, 0, 0]])
    lengths = torch.tensor([4, 2])
    states = encoder(ids, ids == 0, lengths)
    full, mask = with_special_tokens(ids, lengths)
    want = hf_bert(2)(input_ids=full, attention_mask=mask).last_hidden_state[:, 1:5]
    valid = ids != 0
    assert (states - want)[valid].abs().max() < 1e-5


def test_pretrained_encoder_needs_the_wordpiece_vocabulary_and_valid_layers():
    with pytest.raises(ConfigError, match="task.data.tokenizer=wordpiece"):
        PretrainedEncoder("unas", 500)
    with pytest.raises(ConfigError, match="pretrained_layers=9"):
        PretrainedEncoder("unas", VOCAB, layers=9)


def test_bert_weights_train_at_the_pretrained_rate_and_u_at_its_param_lr():
    net = SelfAttentiveClassifier({"scheme": "hnas", "param_lr": 0.05}, VOCAB, num_classes=3, encoder="pretrained", hops=2,
                                  attention_unit=8, fc_dim=8, pretrained_layers=1)
    module = ClassifyModule(net, partial(torch.optim.AdamW, lr=1e-3), None, pretrained_lr=2e-5)
    groups = module.parameter_groups()
    bert = {id(p) for p in net.encoder.pretrained_parameters()}
    u = [p for n, p in net.named_parameters() if n.endswith("hybrid_logit")]
    assert len(u) == 2  # the BERT layer's (per head) and the hops'
    for group in groups:
        ids = {id(p) for p in group["params"]}
        assert ids <= bert or not ids & bert
        if ids & bert:
            assert group["lr"] == 2e-5
        elif {id(p) for p in u} & ids:
            assert group["lr"] == 0.05 and ids == {id(p) for p in u}
        else:
            assert "lr" not in group  # the optimizer's 1e-3
    assert sum(len(g["params"]) for g in groups) == len(list(net.parameters()))
    assert net.encoder.bert.training  # dropout on while fine-tuning (from_pretrained gives eval)


def test_column_statistics_equal_hf_attention_weights():
    batches = texts_as_batches(fixture_texts(), count=4, batch_size=2, length=24)
    assert len(batches) == 2 and batches[0][0].shape == (2, 24)
    layers = column_statistics(load_pretrained_bert("unas", layers=2), batches)
    reference = hf_bert(2)
    sums = [[], []]
    for ids, mask in batches:
        with torch.no_grad():
            attentions = reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        for layer, weights in enumerate(attentions):
            sums[layer].append(weights.sum(dim=-2).double())  # (B, H, S): over queries
    for stats, per_batch in zip(layers, sums):
        columns = torch.cat(per_batch)  # (N, H, S)
        for threshold in (1e-8, 1e-3):
            want = (columns < threshold).double().mean(dim=(0, 2)).numpy()
            np.testing.assert_allclose(stats.share(threshold), want)
        np.testing.assert_allclose(stats.min_x_s, (columns.amin(dim=(0, 2)) * 24).numpy(), rtol=1e-4)
        logs = np.sort(stats.log_sums())
        np.testing.assert_allclose(logs, np.sort(columns.log10().flatten().numpy()), atol=1e-4)


@pytest.mark.slow
def test_cli_fine_tunes_the_pretrained_bert_with_hnas_and_writes_every_analysis(tmp_path, data_dir):
    """The real CLI on the fixtures: BERT (2 of its layers) with HNAS in every layer; u of every
    BERT layer and head is logged and plotted, and the analyses see BERT's attention."""
    overrides = [o for o in TINY["classify"] if not o.startswith("task.data.tokenizer")]
    run_cli(["task=classify", "model=hnas", "task.encoder=pretrained", *overrides,
             "task.module.net.pretrained_layers=2", *QUIET], tmp_path, data_dir)
    (record,) = metrics_files(tmp_path / "outputs")
    assert record["status"] == "ok"
    u = record["scheme_params"]["hnas_u"]
    layers = [name for name in u if ".bert.encoder.layer." in name]
    assert len(layers) == 2 and all(len(u[n]) == 12 for n in layers)
    for png in ("hnas_u.png", "explained_away.png", "head_jsd.png", "head_importance.png"):
        assert (record["_dir"] / png).is_file(), png
