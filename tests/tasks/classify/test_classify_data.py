"""classify data: Debian sections from Packages + Translation-en, and the TSV/CSV and SNLI readers."""

import hashlib
import json
from pathlib import Path

import pytest
from helpers.paths import FIXTURES as FIXTURE_ROOT

from attnlab.errors import ConfigError, DataError
from tasks.classify import corpus, debian_sections, readers
from tasks.common import debian

FIXTURES = FIXTURE_ROOT / "classify"
DEB = FIXTURES / "debian"
# apt's file order: security and updates sort before the release
PACKAGES = [DEB / "Packages-security", DEB / "Packages"]
TRANSLATIONS = [DEB / "Translation-en"]
APT_NAMES = [  # what apt calls them in its lists folder
    "deb.debian.org_debian-security_dists_bookworm-security_main_binary-amd64_Packages",
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages",
    "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en",
]


def test_packages_reader_takes_source_section_and_md5():
    entries = {e.package: e for e in debian_sections.parse_packages((DEB / "Packages").read_text().splitlines())}
    assert len(entries) == 15
    assert entries["0ad"] == debian_sections.PackageEntry("0ad", "0ad", "games", "d943033bedada21853d2ae54a2578a7b")
    assert entries["0ad-data-common"].source == "0ad-data"
    assert entries["freeciv-client-gtk3"].source == "freeciv"  # "Source: freeciv (3.0.6-1)"
    assert entries["sectionless"].section == ""
    # the last stanza of a file without a trailing blank line is kept
    assert [e.package for e in debian_sections.parse_packages((DEB / "Packages-security").read_text().splitlines())] == [
        "libbirch1"]


@pytest.mark.parametrize("raw, normalized", [
    ("games", "games"), ("contrib/games", "games"), ("non-free/Libs", "libs"),
    ("non-free-firmware/kernel", "kernel"), (" python ", "python"), ("", ""),
])
def test_section_normalization(raw, normalized):
    assert debian_sections.normalize_section(raw) == normalized


def test_examples_join_descriptions_by_md5_and_drop_what_they_cannot_label():
    examples, dropped = debian_sections.build_examples(PACKAGES, TRANSLATIONS)
    by_package = {e["package"]: e for e in examples}
    assert sorted(by_package) == [
        "0ad", "0ad-data", "0ad-data-common", "freeciv-client-gtk3", "libacorn-dev", "libacorn2", "libbirch1",
        "libcedar0", "python3-acorn", "python3-cedar", "python3-dogwood", "python3-elm",
    ]
    assert dropped == {"same package in a later file": 1, "no section": 1,
                       "no description for its Description-md5": 1, "same text as another package": 1}
    assert by_package["0ad"]["text"] == (
        'Real-time strategy game of ancient warfare 0 A.D. (pronounced "zero ey-dee") is a free, open-source, '
        "cross-platform real-time strategy (RTS) game of ancient warfare. It is a historically-based war/economy game."
    )
    assert by_package["freeciv-client-gtk3"]["section"] == "games"  # contrib/games
    assert by_package["libcedar0"]["section"] == "libs"  # non-free/Libs
    # the security file's libbirch1 (listed first) wins over the release's
    assert by_package["libbirch1"]["text"].startswith("tree data structures in C Birch provides balanced")
    # python3-fir shares python3-dogwood's Description-md5: one text, kept by the smaller family key
    assert by_package["python3-dogwood"]["text"].startswith("Python 3 HTTP client")
    # families come from the source package
    assert {by_package[p]["family"] for p in ("libacorn2", "libacorn-dev", "python3-acorn")} == {"acorn"}
    assert by_package["0ad-data-common"]["family"] == by_package["0ad"]["family"] == "0ad"


def test_prepare_writes_examples_and_manifest_then_reuses_them(tmp_path, monkeypatch):
    path = debian_sections.prepare(tmp_path, packages_files=PACKAGES, translation_files=TRANSLATIONS)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 12 and set(rows[0]) == {"package", "source", "family", "section", "text"}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [s["sha256"] for s in manifest["sources"]] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in [*PACKAGES, *TRANSLATIONS]]
    assert manifest["examples_per_section"] == {"games": 4, "python": 4, "libs": 3, "libdevel": 1}

    def no_fetch(*args, **kwargs):
        raise AssertionError("fetched again")

    monkeypatch.setattr(debian, "fetch", no_fetch)
    assert debian_sections.prepare(tmp_path) == path


def test_prepare_fetches_packages_with_the_private_apt_call(tmp_path, monkeypatch):
    calls = []

    def fake_fetch(data_dir, packages=False):
        calls.append(packages)
        lists = Path(data_dir) / "apt-lists"
        lists.mkdir(parents=True, exist_ok=True)
        for src, name in zip([*PACKAGES, *TRANSLATIONS], APT_NAMES):
            (lists / name).write_bytes(src.read_bytes())
        return debian.translation_files(data_dir)

    monkeypatch.setattr(debian, "fetch", fake_fetch)
    debian_sections.prepare(tmp_path)
    assert calls == [True]
    assert len(debian_sections.load_examples(tmp_path)) == 12


def test_apt_command_enables_the_packages_index_only_when_asked(tmp_path):
    assert "Acquire::IndexTargets::deb::Packages::DefaultEnabled=false" in debian.apt_command(tmp_path)
    assert "Acquire::IndexTargets::deb::Packages::DefaultEnabled=true" in debian.apt_command(tmp_path, packages=True)


def test_debian_corpus_keeps_large_sections_and_splits_by_family(tmp_path):
    debian_sections.prepare(tmp_path, packages_files=PACKAGES, translation_files=TRANSLATIONS)
    data = corpus.load_corpus("debian", tmp_path, min_examples=3, fractions=(0.34, 0.33, 0.33))
    assert data.label_names == ["games", "libs", "python"] and not data.pair
    assert sum(len(v) for v in data.splits.values()) == 11  # libdevel (1 example) is left out
    rows = {r["text"]: r for r in debian_sections.load_examples(tmp_path)}
    split_of_family = {}
    for split, examples in data.splits.items():
        for example in examples:
            family = rows[example.text]["family"]
            assert split_of_family.setdefault(family, split) == split, f"{family} in two splits"
            assert example.label == rows[example.text]["section"]
    assert len(set(split_of_family.values())) == 3
    with pytest.raises(ConfigError, match="min_examples=5 leaves 0 section"):
        corpus.load_corpus("debian", tmp_path, min_examples=5)


# --------------------------------------------------------------------------------------------
# label<TAB>text, CSV, SNLI
# --------------------------------------------------------------------------------------------


def test_tsv_without_header_and_numeric_label_order():
    train = readers.read_tsv(FIXTURES / "reviews" / "train.tsv")
    assert len(train) == 24 and train[0] == readers.Example("1", "rude cashier and terrible coffee")
    data = corpus.load_corpus("tsv", FIXTURES / "reviews")
    assert data.label_names == ["1", "2"]
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [24, 5, 6]
    assert data.labels("test")[:2] == [1, 1]


def test_tsv_header_is_detected_and_columns_found_by_name():
    rows = readers.read_tsv(FIXTURES / "sst2" / "train.tsv")  # GLUE SST-2: sentence<TAB>label
    assert len(rows) == 8 and rows[0] == readers.Example("0", "rude cashier and terrible coffee")
    # header=false reads the header as data
    assert readers.read_tsv(FIXTURES / "sst2" / "dev.tsv", header="false")[0] == readers.Example("sentence", "label")
    with pytest.raises(DataError, match="names no label column"):
        readers.read_tsv(FIXTURES / "reviews" / "dev.tsv", header="true")
    # GLUE's test.tsv has no labels: one clear error, not a silent corpus without them
    with pytest.raises(DataError, match=r"test.tsv.*names no label column"):
        corpus.load_corpus("tsv", FIXTURES / "sst2")
    with pytest.raises(ConfigError, match="header='maybe'"):
        readers.read_tsv(FIXTURES / "sst2" / "train.tsv", header="maybe")


def test_csv_quotes_escapes_and_title_plus_text():
    rows = readers.read_tsv(FIXTURES / "csv" / "train.csv")
    assert [r.label for r in rows] == ["3", "4", "2"]
    assert rows[0].text.startswith("Wall St. Bears Claw Back Into the Black (Reuters) Reuters - Short-sellers")
    assert rows[1].text == ('New Chip Design Cuts Power Use A chip maker said on Tuesday its new design, "Low Watt", '
                            "halves power use. Shipping starts next year.")
    assert rows[2].text == "Late Goal Lifts United, 2-1 United beat City with a goal in the 89th minute, a header from a corner."


def test_tsv_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "train.tsv"
    bad.write_text("1\tgood row\njust one column\n")
    with pytest.raises(DataError, match=r"train.tsv:2 has 1 column"):
        readers.read_tsv(bad)
    bad.write_text("1\tgood row\n2\t  \n")
    with pytest.raises(DataError, match=r"train.tsv:2 has an empty text"):
        readers.read_tsv(bad)
    for name in ("train", "dev", "test"):
        (tmp_path / f"{name}.tsv").write_text("a\tx y\nb\tz\n" if name != "test" else "a\tx\nc\tw\n")
    with pytest.raises(DataError, match=r"test.tsv has labels that train.tsv lacks: \['c'\]"):
        corpus.load_corpus("tsv", tmp_path)
    (tmp_path / "valid.tsv").write_text("a\tx\n")
    with pytest.raises(DataError, match="several val files"):
        readers.find_split_files(tmp_path, readers.TSV_SUFFIXES)
    with pytest.raises(DataError, match="no train file"):
        readers.find_split_files(FIXTURES / "snli", readers.TSV_SUFFIXES)
    with pytest.raises(DataError, match="is not a directory"):
        corpus.prepare("tsv", tmp_path / "missing")
    with pytest.raises(ConfigError, match="needs task.data_dir"):
        corpus.check_source("snli", None)
    with pytest.raises(ConfigError, match="task.source='imdb'"):
        corpus.check_source("imdb", "x")


def test_snli_pairs_drop_no_consensus_labels():
    data = corpus.load_corpus("snli", FIXTURES / "snli")
    assert data.pair and data.label_names == ["entailment", "neutral", "contradiction"]
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [5, 2, 2]  # two "-" dropped
    first = data.splits["train"][0]
    assert first == readers.Example("neutral", "A person on a horse jumps over a broken down airplane.",
                                    "A person is training his horse for a competition.")
    assert data.labels("test") == [2, 0]


def test_snli_errors(tmp_path):
    path = tmp_path / "snli_1.0_train.jsonl"
    path.write_text('{"gold_label": "neutral", "sentence1": "a", "sentence2": "b"}\nnot json\n')
    with pytest.raises(DataError, match=r"snli_1.0_train.jsonl:2 is not valid JSON"):
        readers.read_snli(path)
    path.write_text('{"gold_label": "neutral", "sentence1": "a"}\n')
    with pytest.raises(DataError, match=r":1 lacks gold_label, sentence1 or sentence2"):
        readers.read_snli(path)
    path.write_text('{"gold_label": "maybe", "sentence1": "a", "sentence2": "b"}\n')
    with pytest.raises(DataError, match="gold_label 'maybe'"):
        readers.read_snli(path)


def test_files_that_are_not_utf8_name_the_file_and_byte_offset(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_bytes("1\tgood row\n2\tcaf\u00e9 row\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"train\.tsv is not UTF-8: byte 0xe9 at byte offset 16"):
        readers.read_tsv(tsv)
    snli = tmp_path / "snli_1.0_train.jsonl"
    first = b'{"gold_label": "neutral", "sentence1": "a", "sentence2": "b"}\n'
    snli.write_bytes(first + b'{"gold_label": "neutral", "sentence1": "\x93a\x94", "sentence2": "b"}\n')
    offset = len(first) + len(b'{"gold_label": "neutral", "sentence1": "')
    with pytest.raises(DataError, match=rf"snli_1\.0_train\.jsonl is not UTF-8: byte 0x93 at byte offset {offset}"):
        readers.read_snli(snli)
