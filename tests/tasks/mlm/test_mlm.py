"""Task mlm: the encoder is a real BERT, data packing/splitting, and a tiny training run."""

import math
from collections import Counter

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from helpers.modules import task_module
from helpers.paths import FIXTURES as FIXTURE_ROOT

from attnlab.errors import ConfigError, DataError
from tasks.common import bert_assets
from tasks.common.debian import read_translation_file
from tasks.mlm.datamodule import MLMDataModule, pack_paragraphs
from tasks.mlm.masking import IGNORE

FIXTURES = FIXTURE_ROOT / "text"
TRANSLATIONS = [FIXTURES / "Translation-en", FIXTURES / "Translation-en-updates",
                FIXTURES / "Translation-en-security"]
PLAIN = FIXTURES / "paragraphs.txt"
TINY_MODEL = {"d_model": 32, "num_layers": 2, "nhead": 2, "dim_feedforward": 64}
OPTIMIZERS = {"adamw": "torch.optim.AdamW", "lamb": "pytorch_optimizer.Lamb"}
# what these tests ran with before MLMDataModule's defaults became conf/task/mlm.yaml's
BEFORE = {"data_dir": "data/debian", "max_length": 128, "batch_size": 32, "seed": 42}


def test_init_bert_equals_transformers_bert_model():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    module = task_module("mlm", {"scheme": "unas"}, vocab_size=30522, init="bert").eval()
    reference = transformers.BertModel.from_pretrained(str(bert_assets.bert_dir()), add_pooling_layer=False).eval()
    assert len(module.net.encoder.layers) == bert_assets.bert_config()["num_hidden_layers"]

    sentences = [r.synopsis for r in read_translation_file(TRANSLATIONS[0])]
    sentences += [p for r in read_translation_file(TRANSLATIONS[0]) for p in r.paragraphs][:4]
    encodings = bert_assets.load_tokenizer(128).encode_batch(sentences)
    length = max(len(e.ids) for e in encodings)
    ids = torch.tensor([e.ids + [0] * (length - len(e.ids)) for e in encodings])
    valid = torch.tensor([[1] * len(e.ids) + [0] * (length - len(e.ids)) for e in encodings]).bool()
    assert (~valid).any()  # the batch really has padding
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=valid.long()).last_hidden_state
        ours = module.net.encoder(ids, padding_mask=~valid)
    # padded positions are zero-attention rows in our layers; compare the real tokens
    assert (ours[valid] - expected[valid]).abs().max().item() < 1e-4


def test_init_bert_keeps_hnas_mix_and_rejects_other_vocabularies():
    module = task_module("mlm", {"scheme": "hnas", "hybrid_init": 0.3}, vocab_size=30522, init="bert")
    layer = module.net.encoder.layers[0].self_attn
    assert torch.allclose(layer.normalizer.u, torch.full((12,), 0.3))
    state = bert_assets.load_bert_state_dict()
    assert torch.equal(layer.q_proj.weight, state["encoder.layer.0.attention.self.query.weight"])
    # the MLM decoder is tied to the word embeddings
    assert module.net.head.word_embeddings.weight is module.net.encoder.embeddings.word_embeddings.weight
    with pytest.raises(ConfigError, match="tokenizer"):
        task_module("mlm", "unas", vocab_size=1000, init="bert")
    with pytest.raises(ConfigError, match="task.init"):
        task_module("mlm", "unas", vocab_size=1000, init="roberta")


def test_packing_keeps_every_token_and_separates_words():
    tok = bert_assets.load_tokenizer(30)
    paragraphs = [p for r in read_translation_file(TRANSLATIONS[0]) for p in r.paragraphs]
    encoded = [(e.ids, e.word_ids) for e in tok.encode_batch(paragraphs, add_special_tokens=False)]
    packed = pack_paragraphs(encoded, max_length=32)
    assert len(packed) < len(paragraphs)  # several paragraphs per example
    body = []
    for i in range(len(packed)):
        ids, words = packed.example(i)
        assert len(ids) <= 32 and ids[0] == bert_assets.CLS_ID and ids[-1] == bert_assets.SEP_ID
        assert (words[ids == bert_assets.SEP_ID] == -1).all()
        # word ids never repeat across the [SEP] of two paragraphs
        segments = np.split(words[1:], np.flatnonzero(ids[1:] == bert_assets.SEP_ID) + 1)
        seen = [set(s[s >= 0].tolist()) for s in segments if len(s)]
        assert sum(len(s) for s in seen) == len(set().union(*seen))
        body += [t for t in ids.tolist() if t not in (bert_assets.CLS_ID, bert_assets.SEP_ID)]
    assert body == [t for ids, _ in encoded for t in ids[:30]]
    single = pack_paragraphs(encoded, max_length=32, pack=False)
    assert len(single) == len(paragraphs)


def test_datamodule_masks_anew_each_training_epoch_only(tmp_path):
    dm = MLMDataModule(**{**BEFORE, "max_length": 64, "batch_size": 4, "seed": 3},
                       files=[str(PLAIN)], fractions=(0.6, 0.2, 0.2))
    dm.prepare_data()
    dm.setup("fit")
    # the unigram baseline's word piece: the most frequent of the training text ([CLS]/[SEP] aside)
    counts = Counter(int(i) for i, w in zip(dm.datasets["train"].text.ids, dm.datasets["train"].text.word_ids)
                     if w >= 0)
    unigram = max(counts, key=lambda i: (counts[i], -i))
    assert dm.model_kwargs() == {"vocab_size": 30522, "pad_id": 0, "max_length": 64, "unigram_id": unigram}
    train, val = dm.datasets["train"], dm.datasets["val"]
    first = train[0]["labels"].clone(), val[0]["labels"].clone()
    dm.set_epoch(1)
    assert not torch.equal(train[0]["labels"], first[0])
    assert torch.equal(val[0]["labels"], first[1])  # eval masks are fixed
    dm.set_epoch(0)
    assert torch.equal(train[0]["labels"], first[0])  # and reproducible

    batch = next(iter(dm.val_dataloader()))
    ids, labels, pad = batch["input_ids"], batch["labels"], batch["padding_mask"]
    assert ids.shape == labels.shape == pad.shape and ids.shape[1] <= 64
    assert (ids[pad] == 0).all() and (labels[pad] == IGNORE).all() and (ids[~pad] != 0).all()
    assert ((labels != IGNORE).sum(1) > 0).all()


def test_datamodule_errors_name_the_fix(tmp_path):
    with pytest.raises(DataError, match="task.data.files"):
        MLMDataModule(**BEFORE, files=[str(tmp_path / "missing.txt")]).prepare_data()
    # 3 paragraphs: no val split at 1%
    dm = MLMDataModule(**BEFORE, files=[str(FIXTURES / "plain.txt")])
    with pytest.raises(DataError, match="fractions"):
        dm.setup("fit")


def _tiny_run(tmp_path, attention, optimizer, data, **module_args):
    pl.seed_everything(0)
    dm = MLMDataModule(**{**BEFORE, "max_length": 48, "batch_size": 4, "seed": 0, **data})
    dm.prepare_data()
    dm.setup("fit")
    module = task_module("mlm", attention, dm.model_kwargs(), **{"optimizer._target_": OPTIMIZERS[optimizer]},
                         lr=1e-3, **TINY_MODEL, **module_args)
    trainer = pl.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=2, limit_test_batches=2,
                         accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    fitted = {k: float(v) for k, v in trainer.callback_metrics.items()}
    tested = trainer.test(module, datamodule=dm, verbose=False)[0]
    return trainer, module, fitted, tested


def dm_of(module):
    return module.trainer.datamodule


def test_tiny_training_run_on_debian_fixture_with_hnas(tmp_path):
    # 11 families in the fixture: these fractions leave every split non-empty
    data = {"data_dir": str(tmp_path / "debian"), "fractions": (0.4, 0.3, 0.3)}
    from tasks.common import debian

    debian.prepare(tmp_path / "debian", files=TRANSLATIONS)  # what `make data` makes, from the fixture
    _, module, fitted, tested = _tiny_run(tmp_path, {"scheme": "hnas", "hybrid_init": 0.5, "param_lr": 0.1},
                                          "adamw", data, norm_first=True)
    assert module.net.encoder.layers[0].norm_first
    for name in ("train/loss", "train/acc", "val/loss", "val/acc", "val/ppl"):
        assert math.isfinite(fitted[name]), name
    # perplexity is exp of the token-mean cross-entropy on the masked tokens
    assert abs(math.log(tested["test/ppl"]) - tested["test/loss"]) < 1e-3
    # the trivial baseline: the unigram word piece's accuracy on the same masked test tokens
    labels = torch.cat([b["labels"][b["labels"] != IGNORE] for b, _ in zip(dm_of(module).test_dataloader(), range(2))])
    assert tested["test/baseline_acc"] == pytest.approx(float((labels == module.unigram_id).float().mean()))
    assert module.unigram_id == dm_of(module).model_kwargs()["unigram_id"]
    assert 0.0 <= tested["test/acc"] <= 1.0
    # u is trained, in an optimizer group of its own (learning rate param_lr, no weight decay)
    logits = [layer.self_attn.normalizer.hybrid_logit for layer in module.net.encoder.layers]
    assert all(logit.detach().abs().min().item() > 0 for logit in logits)  # all moved from u = 0.5
    (group,) = [g for g in module.trainer.optimizers[0].param_groups if g["params"][0] is logits[0]]
    assert group["initial_lr"] == 0.1 and group["weight_decay"] == 0.0
    assert len(group["params"]) == len(logits)


def test_tiny_training_run_with_lamb_on_plain_text(tmp_path):
    pytest.importorskip("pytorch_optimizer")
    data = {"files": [str(PLAIN)], "fractions": (0.6, 0.2, 0.2)}
    trainer, _, _, tested = _tiny_run(tmp_path, "dnas", "lamb", data)
    assert type(trainer.optimizers[0]).__name__ == "Lamb"
    assert math.isfinite(tested["test/loss"])
