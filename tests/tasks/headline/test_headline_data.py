"""Headline data: the Gigaword (Rush et al.) reader and the Debian article->headline pair builder."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from helpers.paths import FIXTURES as FIXTURE_ROOT

from attnlab.errors import DataError
from tasks.common import debian
from tasks.headline import gigaword, pairs

FIXTURES = FIXTURE_ROOT / "headline"
GIGAWORD = FIXTURES / "gigaword"
TRANSLATION = FIXTURES / "debian" / "Translation-en"


# ---------------------------------------------------------------------------------------------
# Gigaword
# ---------------------------------------------------------------------------------------------


def test_gigaword_reads_aligned_lines_verbatim():
    valid = gigaword.read_split(GIGAWORD, "valid")
    assert [p.headline for p in valid] == ["central bank holds rates steady", "ferry runs aground"]
    # The format's markers survive: `#` for digits and `UNK` for rare words.
    assert valid[0].article.startswith(
        "the central bank left its key interest rate at #.## percent"
    )
    assert "UNK" in valid[0].article.split()
    assert [p.source_id for p in valid] == ["valid:1", "valid:2"]


def test_gigaword_train_drops_empty_pairs_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        train = gigaword.read_split(GIGAWORD, "train")
    # Line 3 has an empty article: the 4 others stay, still paired with their own title.
    assert len(train) == 4
    assert train[2].headline == "three arrested after warehouse fire"
    assert train[2].source_id == "train:4"
    assert "1 of 5" in caplog.text and "dropped" in caplog.text


def test_gigaword_test_keeps_empty_lines_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        test = gigaword.read_split(GIGAWORD, "test")
    assert len(test) == 3  # nothing dropped silently
    assert test[1].headline == "" and test[1].article.startswith("oil prices fell")
    assert "1 of 3" in caplog.text and "kept" in caplog.text


def test_gigaword_mismatched_line_counts_name_the_files(tmp_path):
    for name in ("test.article.txt", "test.title.txt"):
        shutil.copy(GIGAWORD / name, tmp_path / name)
    lines = (tmp_path / "test.title.txt").read_text().split("\n")
    (tmp_path / "test.title.txt").write_text("\n".join(lines[1:]))  # one title fewer
    with pytest.raises(DataError) as err:
        gigaword.read_split(tmp_path, "test")
    message = str(err.value)
    assert "test.article.txt" in message and "test.title.txt" in message
    assert "3 lines" in message and "2" in message


def test_gigaword_empty_split_is_a_data_error_naming_the_files(tmp_path):
    (tmp_path / "valid.article.txt").write_text("")
    (tmp_path / "valid.title.txt").write_text("")
    with pytest.raises(DataError, match=r"valid\.article\.txt and .*valid\.title\.txt hold no article/title pairs"):
        gigaword.read_split(tmp_path, "valid")
    # training drops pairs with an empty side: a file of such pairs holds nothing to train on
    (tmp_path / "train.article.txt").write_text("an article\n\n")
    (tmp_path / "train.title.txt").write_text("\na title\n")
    with pytest.raises(DataError, match="hold no article/title pairs"):
        gigaword.read_split(tmp_path, "train")


def test_gigaword_file_that_is_not_utf8_names_the_byte_offset(tmp_path):
    (tmp_path / "test.article.txt").write_bytes("caf\u00e9 opens\n".encode("cp1252"))
    (tmp_path / "test.title.txt").write_text("cafe\n")
    with pytest.raises(DataError, match=r"test\.article\.txt is not UTF-8: byte 0xe9 at byte offset 3"):
        gigaword.read_split(tmp_path, "test")


def test_gigaword_missing_files_raise_data_error(tmp_path):
    with pytest.raises(DataError, match="train.article.txt"):
        gigaword.read_split(tmp_path, "train")


def test_gigaword_only_newline_separates_examples(tmp_path):
    # \x1c and \u2028 occur inside Gigaword lines; str.splitlines() would split on them.
    (tmp_path / "train.article.txt").write_text("a \x1c b c\nd\u2028e f\n", encoding="utf-8")
    (tmp_path / "train.title.txt").write_text("t1\nt2\n", encoding="utf-8")
    got = gigaword.read_split(tmp_path, "train")
    assert [p.headline for p in got] == ["t1", "t2"]


def test_gigaword_unk_maps_to_wordpiece_unk_only_as_a_whole_word():
    assert gigaword.to_model_text("visit UNK next UNKnown UNK") == "visit [UNK] next UNKnown [UNK]"


# ---------------------------------------------------------------------------------------------
# Debian pairs
# ---------------------------------------------------------------------------------------------


def _build(tmp_path, **kwargs):
    return pairs.prepare_pairs(
        tmp_path / "debian", tmp_path / "pairs", translation_files=[TRANSLATION], **kwargs
    )


def test_debian_pairs_filter_dedupe_and_text(tmp_path):
    out = _build(tmp_path, fractions=(1.0, 0.0, 0.0))
    train = pairs.load_pairs(out, "train")
    by_package = {p.source_id: p for p in train}
    # tinyword (6 words), verbose-doc (>60 words) and nosynopsis-text (no long description) are
    # out; libquux1 repeats libquux-dev's description word for word, so only one of them stays.
    assert sorted(by_package) == [
        "aptitude-lite",
        "libquux-dev",
        "python3-weatherkit",
        "quux-tools",
        "stargazer",
    ]
    assert pairs.load_pairs(out, "val") == [] and pairs.load_pairs(out, "test") == []
    weather = by_package["python3-weatherkit"]
    assert weather.headline == "Python library to read weather station data"
    # Paragraphs (separated by " ." in the file) are joined into one article.
    assert weather.article == (
        "WeatherKit reads measurements from home weather stations over USB or serial links and "
        "converts them to common units for logging and plots. This package installs the library "
        "for Python 3."
    )
    for pair in train:
        assert 10 <= len(pair.article.split()) <= 60


def test_debian_pairs_split_by_family(tmp_path):
    out = _build(tmp_path, fractions=(0.34, 0.33, 0.33))
    seen = {}
    for split in pairs.SPLITS:
        for pair in pairs.load_pairs(out, split):
            family = debian.family_of(pair.source_id)
            assert split == debian.split_of(family, (0.34, 0.33, 0.33))
            seen.setdefault(family, set()).add(split)
    # libquux-dev and quux-tools are one family, hence in one split.
    assert debian.family_of("libquux-dev") == debian.family_of("quux-tools")
    assert all(len(splits) == 1 for splits in seen.values())
    assert sum(len(pairs.load_pairs(out, s)) for s in pairs.SPLITS) == 5


def test_debian_pairs_manifest_and_reuse(tmp_path):
    out = _build(tmp_path, fractions=(1.0, 0.0, 0.0))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["sha256"] == debian.sha256_of(tmp_path / "debian" / "records.jsonl")
    assert manifest["upstream_sources"][0]["sha256"] == debian.sha256_of(TRANSLATION)
    for entry in manifest["outputs"]:
        assert entry["sha256"] == debian.sha256_of(out / entry["name"])
    assert manifest["pairs"] == 5 and manifest["settings"]["min_words"] == 10
    # Same records and settings: reused as is. Other settings: rebuilt.
    stamp = (out / "train.jsonl").stat().st_mtime_ns
    _build(tmp_path, fractions=(1.0, 0.0, 0.0))
    assert (out / "train.jsonl").stat().st_mtime_ns == stamp
    _build(tmp_path, fractions=(1.0, 0.0, 0.0), min_words=3)
    assert len(pairs.load_pairs(out, "train")) == 6  # tinyword's 6 words now count


def test_debian_pairs_bad_limits_raise(tmp_path):
    with pytest.raises(DataError, match="min_words"):
        pairs.build_pairs([], min_words=20, max_words=10)


def test_length_grouped_sampler_is_a_seeded_permutation_with_little_padding():
    from attnlab.sampling import LengthGroupedSampler

    lengths = torch.randint(5, 120, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = LengthGroupedSampler(lengths, batch_size=16, seed=3, pool=10)
    first = list(sampler)
    assert sorted(first) == list(range(1000))  # every example once
    assert list(LengthGroupedSampler(lengths, batch_size=16, seed=3, pool=10)) == first
    sampler.set_epoch(1)
    assert list(sampler) != first  # a new order each epoch

    def padding(order):
        batches = [order[i : i + 16] for i in range(0, len(order), 16)]
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)

    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(1)).tolist()
    assert padding(first) < 0.2 * padding(shuffled)
