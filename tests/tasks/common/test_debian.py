"""The Debian description corpus: Translation-en reader, families, splits, preparation."""

import hashlib
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.paths import FIXTURES as FIXTURE_ROOT
from helpers.paths import ROOT

from attnlab.errors import DataError
from tasks.common import debian
from tasks.common.debian import apt

FIXTURES = FIXTURE_ROOT / "text"
MAIN = FIXTURES / "Translation-en"
UPDATES = FIXTURES / "Translation-en-updates"


def test_reader_parses_translation_en_fixture():
    records = {r.package: r for r in debian.read_translation_file(MAIN)}
    assert list(records) == [
        "acorn-tools", "libacorn2", "libacorn-dev", "python3-acorn", "acorn-doc", "birchwood", "tinyclock",
    ]
    dev = records["libacorn-dev"]
    assert dev.synopsis == "development files for the Acorn archive format"
    assert dev.md5 == "2b3c4d5e6f708192a3b4c5d6e7f8091a"
    # " ." splits paragraphs; continuation lines (verbatim list items too) join with spaces
    assert dev.paragraphs == [
        "Acorn is a small archive format that keeps file permissions and extended attributes.",
        (
            "This package contains the header files and the static library. Supported features: "
            "* reading and writing archives * streaming from pipes"
        ),
    ]
    assert records["tinyclock"].paragraphs == []  # synopsis only
    # the last stanza of a file without a trailing blank line is not lost
    assert [r.package for r in debian.read_translation_file(UPDATES)] == ["birchwood", "libcedar0t64"]


@pytest.mark.skipif(
    shutil.which("lz4") is None or not Path(debian.APT_HELPER).exists(), reason="needs lz4 and apt-helper"
)
def test_reader_decompresses_lz4_like_apt_stores_it(tmp_path):
    packed = tmp_path / "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.lz4"
    subprocess.run(["lz4", "-q", str(MAIN), str(packed)], check=True)
    assert packed.read_bytes()[:4] != MAIN.read_bytes()[:4]
    assert debian.read_translation_file(packed) == debian.read_translation_file(MAIN)


def test_corrupt_compressed_file_is_a_data_error(tmp_path):
    if not Path(debian.APT_HELPER).exists():
        pytest.skip("needs apt-helper")
    bad = tmp_path / "x_Translation-en.lz4"
    bad.write_bytes(b"this is not lz4")
    with pytest.raises(DataError, match="make data"):
        debian.read_translation_file(bad)


def test_related_binary_packages_share_a_family():
    families = {
        name: debian.family_of(name)
        for name in ["acorn", "acorn-tools", "libacorn2", "libacorn-dev", "python3-acorn", "acorn-doc",
                     "libacorn1t64", "libacorn-2.0-0", "gir1.2-acorn-1.0", "acorn-common", "ruby-acorn"]
    }
    assert set(families.values()) == {"acorn"}, families
    assert debian.family_of("libcedar0t64") == debian.family_of("libcedar-dev") == "cedar"
    assert debian.family_of("birchwood") != debian.family_of("acorn")
    assert debian.family_of("2048") == "2048"  # never empty


def test_split_is_stable_across_processes_and_matches_fractions():
    names = [f"family{i}" for i in range(20000)]
    here = [debian.split_of(n) for n in names[:200]]
    # a fresh interpreter with another hash seed gives the same splits (no use of hash())
    code = (
        "from tasks.common.debian import split_of; "
        "print(','.join(split_of(f'family{i}') for i in range(200)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "123", "PYTHONPATH": str(ROOT)},
    ).stdout.strip()
    assert out.split(",") == here
    counts = Counter(debian.split_of(n) for n in names)
    assert abs(counts["train"] / 20000 - 0.98) < 0.005
    assert abs(counts["val"] / 20000 - 0.01) < 0.003
    assert abs(counts["test"] / 20000 - 0.01) < 0.003
    assert Counter(debian.split_of(n, (0.5, 0.25, 0.25)) for n in names)["test"] > 4500
    with pytest.raises(DataError):
        debian.split_of("x", (0.5, 0.5, 0.5))


def test_split_has_no_leak_across_families_or_paragraphs():
    rows = debian.build_rows([MAIN, UPDATES], fractions=(0.34, 0.33, 0.33))
    # duplicates between files are dropped
    assert Counter(r["package"] for r in rows)["birchwood"] == 1
    splits_of_family = {}
    for row in rows:
        splits_of_family.setdefault(row["family"], set()).add(row["split"])
    assert all(len(s) == 1 for s in splits_of_family.values())
    # every paragraph lands in exactly one split, even when shared by families of two splits
    rows.append({"family": "zzz-other", "split": "test" if rows[0]["split"] != "test" else "val",
                     "paragraphs": [rows[0]["paragraphs"][0], "only here"]})
    per_split = debian.unique_paragraphs(rows)
    seen = [p for ps in per_split.values() for p in ps]
    assert len(seen) == len(set(seen))
    assert rows[0]["paragraphs"][0] in per_split[rows[0]["split"]]  # smallest family key owns it
    assert "only here" in per_split[rows[-1]["split"]]


def test_prepare_writes_records_and_manifest_then_reuses_them(tmp_path, monkeypatch):
    out = debian.prepare(tmp_path / "deb", files=[MAIN, UPDATES])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and {r["split"] for r in rows} <= set(debian.SPLITS)
    manifest = json.loads((tmp_path / "deb" / "manifest.json").read_text())
    assert manifest["records"] == 8
    assert [s["sha256"] for s in manifest["sources"]] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in (MAIN, UPDATES)
    ]
    assert not list((tmp_path / "deb").glob(".*tmp"))  # atomic writes leave no temp files
    assert debian.load_rows(tmp_path / "deb", "train") == [r for r in rows if r["split"] == "train"]

    # prepared data is reused: no fetch
    def no_fetch(_):
        raise AssertionError("fetched again")

    monkeypatch.setattr(apt, "fetch", no_fetch)
    assert debian.prepare(tmp_path / "deb") == out


def test_missing_apt_get_is_a_data_error_that_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(apt.shutil, "which", lambda name: None)
    with pytest.raises(DataError) as err:
        debian.prepare(tmp_path / "deb")
    assert "make data" in str(err.value) and "task.data.files" in str(err.value)


def test_apt_command_writes_only_under_the_data_dir(tmp_path):
    cmd = debian.apt_command(tmp_path)
    dirs = [arg.split("=", 1)[1] for arg in cmd if arg.startswith("Dir::") and "=" in arg]
    assert all(d == "" or d.startswith(str(tmp_path.resolve())) for d in dirs)
    assert "Acquire::Languages=en" in cmd and cmd[-1] == "update"
