"""classify: tokenization, the datamodule's batches, and the baselines on small fixtures."""

import json
from collections import Counter

import pytest
import torch
from helpers.paths import FIXTURES as FIXTURE_ROOT

from attnlab.errors import ConfigError
from tasks.classify import baselines, corpus, debian_sections, tokenization
from tasks.classify.datamodule import ClassifyDataModule

FIXTURES = FIXTURE_ROOT / "classify"
DEB = FIXTURES / "debian"


# what these tests ran with before the datamodule's defaults became conf/task/classify.yaml's
OWN = {"debian_dir": "unused", "max_length": 128, "max_train_examples": None,
       "max_eval_examples": None, "cache_dir": None}


def make(source="tsv", data_dir=FIXTURES / "reviews", **kwargs) -> ClassifyDataModule:
    kwargs.setdefault("min_frequency", 1)
    dm = ClassifyDataModule(source=source, data_dir=str(data_dir), seed=3, **{**OWN, **kwargs})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def check_batch(batch: dict, suffix: str = "") -> None:
    ids, mask, lengths = batch[f"input_ids{suffix}"], batch[f"padding_mask{suffix}"], batch[f"lengths{suffix}"]
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape
    assert torch.equal((~mask).sum(1), lengths) and int(lengths.max()) == ids.shape[1]
    assert torch.all(ids[mask] == 0) and torch.all(ids[~mask] != 0)  # [PAD] = 0 only where padded


def test_word_batches_cover_every_example_once_in_a_seeded_order():
    dm = make(tokenizer="word", batch_size=4)
    kwargs = dm.model_kwargs()
    assert kwargs["num_classes"] == 2 and kwargs["label_names"] == ["1", "2"] and not kwargs["pair"]
    assert kwargs["pad_id"] == 0 and kwargs["vocab_size"] == dm.tokenizer.get_vocab_size()
    vocab = dm.tokenizer.get_vocab()
    assert vocab["[PAD]"] == 0 and vocab["[UNK]"] == 1 and "friendly" in vocab
    batches = list(dm.train_dataloader())
    for batch in batches:
        check_batch(batch)
    labels = torch.cat([b["labels"] for b in batches])
    assert Counter(labels.tolist()) == Counter(dm.corpus.labels("train"))  # all 24 once, as class indices
    # the first train text, decoded from its ids
    first = dm.data["train"][0]["input_ids"]
    assert [dm.tokenizer.id_to_token(i) for i in first] == ["rude", "cashier", "and", "terrible", "coffee"]

    def order(epoch):
        loader = make(tokenizer="word", batch_size=4).train_dataloader()
        loader.sampler.set_epoch(epoch)
        return [tuple(b["input_ids"][0].tolist()) for b in loader]

    assert order(0) == order(0) and order(0) != order(1)


def test_wordpiece_truncates_to_max_length_and_eval_order_is_the_file_order():
    dm = make(max_length=3, eval_batch_size=2)
    assert dm.tokenizer.get_vocab_size() == 30522
    assert max(len(r["input_ids"]) for r in dm.data["train"]) == 3
    val = list(dm.val_dataloader())
    assert [len(b["labels"]) for b in val] == [2, 2, 1]
    assert torch.cat([b["labels"] for b in val]).tolist() == dm.corpus.labels("val")
    great = dm.tokenizer.token_to_id("great")
    assert val[0]["input_ids"][0, 0].item() == great  # "great bagels and friendly baristas"
    for batch in val:
        check_batch(batch)


def test_word_vocabulary_comes_from_train_only():
    dm = make(tokenizer="word", min_frequency=2)
    unk = dm.tokenizer.token_to_id("[UNK]")
    assert "ramen" not in dm.tokenizer.get_vocab()  # test-only word
    test_ids = {i for row in dm.data["test"] for i in row["input_ids"]}
    assert unk in test_ids
    with pytest.raises(ConfigError, match="tokenizer='bpe'"):
        make(tokenizer="bpe")


def test_snli_batches_hold_premise_and_hypothesis_separately():
    dm = make("snli", FIXTURES / "snli", batch_size=8, group_by_length=False)
    assert dm.model_kwargs()["pair"] and dm.model_kwargs()["num_classes"] == 3
    batch = next(iter(dm.train_dataloader()))
    check_batch(batch)
    check_batch(batch, "_b")
    assert len(batch["labels"]) == 5
    row = batch["labels"].tolist().index(1)  # the one neutral pair
    hypothesis = batch["input_ids_b"][row][~batch["padding_mask_b"][row]].tolist()
    assert dm.tokenizer.decode(hypothesis) == "a person is training his horse for a competition."


def test_debian_default_source_through_the_datamodule(tmp_path):
    debian_sections.prepare(tmp_path, packages_files=[DEB / "Packages-security", DEB / "Packages"],
                            translation_files=[DEB / "Translation-en"])
    dm = ClassifyDataModule(**{**OWN, "debian_dir": str(tmp_path)}, min_examples=3,
                            fractions=(0.5, 0.25, 0.25), seed=0)
    dm.prepare_data()
    assert dm.model_kwargs()["label_names"] == ["games", "libs", "python"]
    assert sum(len(dm.data[s]) for s in ("train", "val", "test")) == 11
    check_batch(next(iter(dm.train_dataloader())))


def test_subsets_are_random_and_seeded(tmp_path):
    dm = make(max_train_examples=10, max_eval_examples=3, subset_seed=1)
    assert [len(dm.data[s]) for s in ("train", "val", "test")] == [10, 3, 3]
    make(max_train_examples=10, cache_dir=str(tmp_path))
    assert len(list(tmp_path.glob("ids-*.npz"))) == 2  # whole val and test are cached, a train subset is not
    again = make(max_train_examples=10, max_eval_examples=3, subset_seed=1)
    other = make(max_train_examples=10, max_eval_examples=3, subset_seed=2)
    assert dm.corpus.splits["train"] == again.corpus.splits["train"] != other.corpus.splits["train"]


def test_token_ids_cache_is_reused(tmp_path, monkeypatch):
    tokenizer = tokenization.build_tokenizer("word", ["a b c", "a b"], min_frequency=1)
    texts = ["a b c d", "", "c"]
    ids = tokenization.encode_cached(tokenizer, texts, 3, tmp_path)
    assert ids == tokenization.encode(tokenizer, texts, 3) == [[2, 3, 4], [1], [4]]
    assert len(list(tmp_path.glob("ids-*.npz"))) == 1

    def no_encode(*args):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(tokenization, "encode", no_encode)
    assert tokenization.encode_cached(tokenizer, texts, 3, tmp_path) == ids
    with pytest.raises(AssertionError, match="tokenized again"):  # another max_length: another key
        tokenization.encode_cached(tokenizer, texts, 2, tmp_path)


def test_baselines_on_the_review_fixture(tmp_path):
    data = corpus.load_corpus("tsv", FIXTURES / "reviews")
    majority = baselines.majority_baseline(data)
    # train: 14 x "1", 10 x "2"; test: 4 x "1", 2 x "2"
    assert majority["test"] == {"acc": pytest.approx(4 / 6), "macro_f1": pytest.approx((0.8 + 0.0) / 2)}
    bow = baselines.bow_logreg_baseline(data)
    assert bow["test"]["acc"] > majority["test"]["acc"] and bow["val"]["macro_f1"] > majority["val"]["macro_f1"]
    pairs = baselines.bow_logreg_baseline(corpus.load_corpus("snli", FIXTURES / "snli"), cs=[1.0])
    assert pairs["features"] % 2 == 0 and set(pairs["test"]) == {"acc", "macro_f1"}
    out = tmp_path / "b.json"
    assert baselines.main(["--source", "tsv", "--data-dir", str(FIXTURES / "reviews"), "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["classes"] == 2 and written["majority"]["test"]["acc"] == pytest.approx(4 / 6)
    assert baselines.main(["--source", "tsv"]) == 2  # no data dir: one error line, exit 2
