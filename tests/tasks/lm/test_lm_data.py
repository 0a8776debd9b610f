"""Task lm, data side: readers, vocabularies, Debian running text, windows, the datamodule."""

import itertools

import pytest
import torch
from helpers.paths import ROOT
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from attnlab.errors import ConfigError, DataError
from tasks.common import bert_assets, debian
from tasks.lm import corpus
from tasks.lm.datamodule import LMDataModule
from tasks.lm.windows import TokenWindows, collate_windows, windows

LM = ROOT / "tests" / "fixtures" / "lm"
TEXT = ROOT / "tests" / "fixtures" / "text"
TRANSLATIONS = [TEXT / "Translation-en", TEXT / "Translation-en-updates", TEXT / "Translation-en-security"]


def lines_of(path):
    return path.read_text(encoding="utf-8").split("\n")[:-1]


# what these tests ran with before LMDataModule's defaults became conf/task/lm.yaml's
BEFORE = {"debian_dir": "data/debian", "eval_stride": None, "eval_batch_size": None, "seed": 42,
          "cache_dir": None}


def lm_datamodule(**kwargs) -> LMDataModule:
    return LMDataModule(**{**BEFORE, **kwargs})


def datamodule(**kwargs):
    dm = lm_datamodule(**{"block_size": 8, "eval_stride": 3, "batch_size": 4, "seed": 5, **kwargs})
    dm.prepare_data()
    dm.setup("fit")
    return dm


# --------------------------------------------------------------------------------------------
# Readers and word-level vocabularies
# --------------------------------------------------------------------------------------------


def test_wikitext_stream_has_one_eos_per_line_and_round_trips():
    dm = datamodule(source="wikitext", data_dir=str(LM / "wikitext"))
    train = lines_of(LM / "wikitext" / "wiki.train.tokens")
    assert len(train) == 14 and train[0] == " " and train[1] == " = Alder River = "  # the real layout
    stream = dm.streams["train"]
    assert len(stream) == sum(len(line.split()) + 1 for line in train)
    assert (stream == dm.eos_id).sum() == len(train)  # blank lines too: fairseq's </s> per line
    # every training word is in the vocabulary: decoding gives the file back (blank lines included)
    assert dm.decode(stream.tolist()) == "\n".join(" ".join(line.split()) for line in train)
    # the corpus's own <unk> is the vocabulary's unknown token, not a word of its own
    assert dm.tokenizer.token_to_id("<unk>") == dm.unk_id == dm.model_kwargs()["unk_id"] == 2
    itos = [dm.tokenizer.id_to_token(i) for i in range(dm.tokenizer.get_vocab_size())]
    assert itos[:3] == ["<pad>", "<eos>", "<unk>"]
    # 60 distinct words in the training file besides <unk> (word level, case-sensitive)
    assert len(itos) == 3 + 60 == dm.model_kwargs()["vocab_size"]
    counts = [sum(line.split().count(w) for line in train) for w in itos[3:]]
    assert counts == sorted(counts, reverse=True)  # most frequent first, as fairseq's dictionary


def test_wikitext_words_unseen_in_training_become_unk():
    dm = datamodule(source="wikitext", data_dir=str(LM / "wikitext"))
    # not in wiki.train.tokens: Mill and Road (twice), follows, from, bridge (only "Bridge"), to,
    # old, distance, 2
    valid = dm.decode(dm.streams["val"].tolist()).split("\n")
    assert valid[1] == "= <unk> <unk> ="
    assert valid[3] == ("<unk> <unk> <unk> the river <unk> the <unk> <unk> the <unk> mill , a <unk> of "
                        "<unk> @.@ 1 kilometres .")
    assert (dm.streams["val"] == dm.unk_id).sum() == 11


def test_ptb_counts_unk_and_min_count():
    dm = datamodule(source="ptb", data_dir=str(LM / "ptb"))
    words = {split: sum(len(line.split()) for line in lines_of(LM / "ptb" / f"ptb.{name}.txt"))
             for split, name in (("train", "train"), ("val", "valid"), ("test", "test"))}
    # one <eos> per sentence (Mikolov's convention: PTB's test set is 82,430 tokens this way)
    assert dm.token_counts() == {"train": words["train"] + 4, "val": words["val"] + 2, "test": words["test"] + 2}
    unk = dm.unk_id
    # valid: traders, was, expected; test: fell, tokyo, and the file's own <unk>
    assert (dm.streams["val"] == unk).sum() == 3 and (dm.streams["test"] == unk).sum() == 3
    assert dm.tokenizer.get_vocab_size() == 3 + 26
    assert dm.model_kwargs()["word_level"] is True

    rare = datamodule(source="ptb", data_dir=str(LM / "ptb"), min_count=2)
    kept = set(rare.tokenizer.get_vocab())
    assert {"the", "company", "said", "N", "shares", "rose", "in", "quarter"} <= kept
    assert not kept & {"bank", "expects", "news", "york", "profit"}  # seen once in train: <unk>
    assert (rare.streams["train"] == unk).sum() > (dm.streams["train"] == unk).sum()


def test_word_tokenizer_splits_like_str_split_and_maps_unknown_words_to_unk():
    spaces = [chr(i) for i in range(0x3001) if chr(i).isspace()]  # \t .. \x1c-\x1f .. \u3000
    text = "".join(f"the{space}river{space}" for space in spaces) + "\x1cMill"
    tokenizer = corpus.word_tokenizer(["the", "river", "mill"])
    tokens = [tokenizer.id_to_token(i) for i in tokenizer.encode(text, add_special_tokens=False).ids]
    assert tokens == [*text.split()[:-1], "<unk>"] and len(tokens) == 2 * len(spaces) + 1  # Mill: not "mill"
    assert tokenizer.encode("<unk> river").ids == [2, 4]
    assert corpus.build_word_tokenizer(["b a b", "c b a"], min_count=2).get_vocab() == {
        "<pad>": 0, "<eos>": 1, "<unk>": 2, "b": 3, "a": 4}


def test_plain_text_files_are_word_level_paragraphs():
    dm = datamodule(files=[str(TEXT / "paragraphs.txt")], fractions=(0.6, 0.2, 0.2))
    assert dm.model_kwargs()["word_level"] is True and dm.eos_id == 1
    paragraphs = [p for p in TEXT.joinpath("paragraphs.txt").read_text().split("\n\n") if p.strip()]
    total = sum(dm.token_counts().values())
    assert total == sum(len(p.split()) + 1 for p in dict.fromkeys(" ".join(p.split()) for p in paragraphs))


def test_readers_and_options_fail_with_the_fix(tmp_path):
    with pytest.raises(DataError, match="task.data_dir") as err:
        lm_datamodule(source="wikitext", data_dir=str(tmp_path)).prepare_data()
    assert "wiki.train.tokens" in str(err.value)
    (tmp_path / "wiki.train.raw").write_text(" = A = \n")
    with pytest.raises(DataError, match="raw"):
        lm_datamodule(source="wikitext", data_dir=str(tmp_path)).prepare_data()
    with pytest.raises(ConfigError, match="task.data_dir"):
        lm_datamodule(source="ptb")
    with pytest.raises(ConfigError, match="one of"):
        lm_datamodule(source="ptb", data_dir=str(LM / "ptb"), files=["a.txt"])
    with pytest.raises(ConfigError, match="eval_stride"):
        lm_datamodule(block_size=8, eval_stride=9)
    with pytest.raises(ConfigError, match="task.source"):
        lm_datamodule(source="wikitext103")
    with pytest.raises(DataError, match="task.data.files"):
        lm_datamodule(files=[str(tmp_path / "missing.txt")]).prepare_data()


def test_empty_or_non_utf8_files_are_data_errors_naming_them(tmp_path):
    ptb = tmp_path / "ptb"
    ptb.mkdir()
    for name in ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"):
        (ptb / name).write_bytes((LM / "ptb" / name).read_bytes())
    (ptb / "ptb.valid.txt").write_text("")
    with pytest.raises(DataError, match=r"ptb\.valid\.txt are empty"):  # in prepare_data, before any work
        lm_datamodule(source="ptb", data_dir=str(ptb)).prepare_data()
    # a large corpus is read line by line: the offset counts the bytes of the lines before
    train = (LM / "ptb" / "ptb.train.txt").read_bytes()
    (ptb / "ptb.valid.txt").write_bytes(train[:20] + b"\xff" + train[20:])
    with pytest.raises(DataError, match=r"ptb\.valid\.txt is not UTF-8: byte 0xff at byte offset 20"):
        list(corpus.read_lines(ptb / "ptb.valid.txt"))
    # plain text (task.data.files, also the mlm task's)
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(DataError, match=r"blank\.txt holds no text"):
        datamodule(files=[str(TEXT / "paragraphs.txt"), str(tmp_path / "blank.txt")])
    (tmp_path / "latin1.txt").write_bytes("na\u00efve text\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.txt is not UTF-8: byte 0xef at byte offset 2"):
        datamodule(files=[str(tmp_path / "latin1.txt")])


# --------------------------------------------------------------------------------------------
# Debian running text
# --------------------------------------------------------------------------------------------


def test_debian_segments_one_per_family_each_paragraph_once():
    rows = debian.build_rows(TRANSLATIONS, fractions=(0.4, 0.3, 0.3))
    segments = corpus.debian_segments(rows)
    everything = " || ".join(s for split in debian.SPLITS for s in segments[split])
    for paragraph in {p for row in rows for p in row["paragraphs"]}:
        assert everything.count(paragraph) == 1, paragraph  # shared paragraphs are kept once
    # a family is one segment: the acorn packages' paragraphs follow each other in record order
    acorn = next(s for split in debian.SPLITS for s in segments[split] if s.startswith("Acorn is"))
    assert acorn.split(". ")[0] == "Acorn is a small archive format that keeps file permissions and extended attributes"
    assert "This package contains the acorn and unacorn programs." in acorn
    assert "This package contains the HTML manual of Acorn." in acorn  # acorn-doc, same family
    owners = debian.paragraph_owners(rows)
    for split in debian.SPLITS:  # no text in two splits
        for segment in segments[split]:
            assert all(owners[p][1] == split for p in owners if p in segment)


def test_debian_default_is_wordpiece_with_a_separator_per_family(tmp_path):
    debian.prepare(tmp_path / "debian", files=TRANSLATIONS)  # what `make data` makes, from the fixture
    dm = datamodule(debian_dir=str(tmp_path / "debian"), fractions=(0.4, 0.3, 0.3))
    kwargs = dm.model_kwargs()
    order = kwargs.pop("token_order")  # ids by decreasing training frequency (the adaptive bands)
    assert kwargs == {"vocab_size": 30522, "pad_id": bert_assets.PAD_ID, "eos_id": bert_assets.SEP_ID,
                      "unk_id": bert_assets.UNK_ID, "word_level": False, "block_size": 8}
    counts = torch.bincount(torch.from_numpy(dm.streams["train"]).long(), minlength=30522)[order]
    assert sorted(order) == list(range(30522)) and bool((counts[:-1] >= counts[1:]).all())
    assert order[0] == int(torch.from_numpy(dm.streams["train"]).long().mode().values)
    segments = corpus.debian_segments([row | {"split": debian.split_of(row["family"], (0.4, 0.3, 0.3))}
                                       for row in debian.load_rows(tmp_path / "debian")])
    tokenizer = bert_assets.load_tokenizer(None)
    for split in debian.SPLITS:
        expected = [t for s in segments[split] for t in [*tokenizer.encode(s, add_special_tokens=False).ids,
                                                         bert_assets.SEP_ID]]
        assert dm.streams[split].tolist() == expected
        # one line per family; WordPiece decoding lower-cases and re-spaces punctuation only
        decoded = dm.decode(expected).split("\n")
        assert ["".join(d.split()) for d in decoded] == ["".join(s.lower().split()) for s in segments[split]]


def test_cached_streams_are_reused_and_equal(tmp_path, monkeypatch):
    args = {"source": "ptb", "data_dir": str(LM / "ptb"), "cache_dir": str(tmp_path / "cache")}
    first = datamodule(**args)
    assert len(list((tmp_path / "cache").glob("lm-*.npz"))) == 1

    def no_reading(_self):
        raise AssertionError("read the corpus again")

    monkeypatch.setattr(LMDataModule, "_segments", no_reading)
    second = datamodule(**args)
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    assert all((second.streams[s] == first.streams[s]).all() for s in debian.SPLITS)
    monkeypatch.undo()
    datamodule(**args, min_count=2)  # another setting: another cache file
    assert len(list((tmp_path / "cache").glob("lm-*.npz"))) == 2


# --------------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,block,stride", [(n, b, s) for n, b in itertools.product((1, 7, 8, 9, 50, 203), (1, 4, 8))
                                            for s in sorted({1, max(1, b // 2), b - 1, b} - {0})])
def test_windows_score_every_token_once_with_enough_context(n, block, stride):
    result = windows(n, block, stride)
    scored = [t for start, end, first in result for t in range(first, end)]
    assert scored == list(range(n))  # each target exactly once, in order
    for start, end, first in result:
        assert start <= first < end and end - start == min(block, n)
        for t in range(first, end):
            seen = t - start + 1  # inputs the model sees for target t: x[start..t]
            if t >= block:
                assert seen >= block - stride + 1
            else:
                assert seen == t + 1  # at the start: everything there is


def test_windows_reject_a_stride_longer_than_the_block():
    for stride in (0, 9):
        with pytest.raises(ConfigError, match="eval_stride"):
            windows(20, 8, stride)


def test_token_windows_shift_by_one_and_cover_the_stream():
    stream = torch.arange(10, 32).numpy()  # 22 tokens: 8 in the first window, then 3 + 3 + 3 + 3 + 2
    data = TokenWindows(stream, eos_id=1, block_size=8, stride=3)
    first = data[0]
    assert first["input_ids"].tolist() == [1, *range(10, 17)] and first["target_ids"].tolist() == list(range(10, 18))
    scored = []
    for item in (data[i] for i in range(len(data))):
        assert (item["input_ids"][1:] == item["target_ids"][:-1]).all()
        scored += item["target_ids"][item["score_mask"]].tolist()
    assert scored == stream.tolist() and data.scored_tokens() == 22
    last = data[len(data) - 1]
    assert last["score_mask"].tolist() == [False] * 6 + [True] * 2  # 2 new tokens, 6 of context

    short = collate_windows(pad_id=0)([TokenWindows(stream[:5], 1, 8)[0], data[0]])
    assert short["input_ids"].shape == (2, 8)
    assert short["padding_mask"][0].tolist() == [False] * 5 + [True] * 3
    assert not short["score_mask"][0, 5:].any() and not short["padding_mask"][1].any()


# --------------------------------------------------------------------------------------------
# The datamodule's batches and the config
# --------------------------------------------------------------------------------------------


def test_batches_score_each_token_once_and_shuffle_by_seed_and_epoch():
    dm = datamodule(source="wikitext", data_dir=str(LM / "wikitext"))
    for split, loader in (("train", dm.train_dataloader()), ("val", dm.val_dataloader()),
                          ("test", dm.test_dataloader())):
        total = 0
        for batch in loader:
            ids, targets, score, pad = (batch[k] for k in ("input_ids", "target_ids", "score_mask", "padding_mask"))
            assert ids.shape == targets.shape == score.shape == pad.shape and ids.shape[1] == 8
            assert (ids[:, 1:] == targets[:, :-1]).all() and not (score & pad).any()
            total += int(score.sum())
        assert total == len(dm.streams[split]), split
    train_windows = len(dm.datasets["train"])
    assert train_windows == -(-len(dm.streams["train"]) // 8)  # contiguous blocks of block_size

    def first_batch(seed, epoch):
        loader = datamodule(source="wikitext", data_dir=str(LM / "wikitext"), seed=seed).train_dataloader()
        loader.sampler.set_epoch(epoch)  # what Lightning does at each epoch start
        return next(iter(loader))["input_ids"]

    assert torch.equal(first_batch(5, 0), first_batch(5, 0))
    assert not torch.equal(first_batch(5, 0), first_batch(5, 1))
    assert not torch.equal(first_batch(5, 0), first_batch(6, 0))


def test_task_config_instantiates_the_datamodule(tmp_path):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("train", overrides=["task=lm", "task.source=ptb", f"task.data_dir={LM / 'ptb'}",
                                          "task.data.block_size=16", "task.eval_stride=4",
                                          f"task.datamodule.cache_dir={tmp_path}"])
    dm = instantiate(cfg.task.datamodule)
    dm.prepare_data()
    assert dm.model_kwargs()["block_size"] == 16 and dm.eval_stride == 4
    assert cfg.task.optimized_metric == "val/ppl" and cfg.task.monitor_mode == "min"
