"""mt data: Debian German-English pairing, the fairseq-layout reader, the joint BPE, the datamodule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.paths import FIXTURES as FIXTURE_ROOT
from helpers.paths import ROOT

from attnlab.errors import ConfigError, DataError
from tasks.common import debian
from tasks.mt import debian_pairs, parallel, segments, tokenizer
from tasks.mt.datamodule import TranslationDataModule

FIXTURES = FIXTURE_ROOT / "mt"
ENGLISH = FIXTURES / "debian" / "Translation-en"
GERMAN = FIXTURES / "debian" / "Translation-de"
IWSLT = FIXTURES / "iwslt14"
# source=files reads data_dir only
UNUSED_DIRS = {"pairs_dir": "unused", "english_dir": "unused", "german_dir": "unused"}


# ---------------------------------------------------------------------------------------------
# Segments: sentences, alignment, copies
# ---------------------------------------------------------------------------------------------


def test_sentences_split_at_sentence_ends_and_list_items_not_at_abbreviations():
    assert segments.split_sentences("Acorn is small, e.g. for backups. It  keeps\tfiles.") == [
        "Acorn is small, e.g. for backups.", "It keeps files."
    ]
    assert segments.split_sentences("Klein, z. B. für Sicherungen. Version 2.0 ist da! »Neu« auch.") == [
        "Klein, z. B. für Sicherungen.", "Version 2.0 ist da!", "»Neu« auch."
    ]
    assert segments.split_sentences("Features: * fast * small. see also foo.") == [
        "Features:", "* fast", "* small. see also foo."  # lower-case next word: no sentence start
    ]


def test_paragraphs_split_into_sentences_only_where_both_sides_split_alike():
    two = "Birchwood grows a forest. Each tree competes for light."
    one = "Mit Birchwood wächst ein Wald, in dem jeder Baum um Licht konkurriert."
    assert segments.align_paragraph(one, two, 2.0) == [(one, two)]
    de = "Birchwood lässt einen Wald wachsen. Jeder Baum konkurriert um Licht."
    assert segments.align_paragraph(de, two, 2.0) == [
        ("Birchwood lässt einen Wald wachsen.", "Birchwood grows a forest."),
        ("Jeder Baum konkurriert um Licht.", "Each tree competes for light."),
    ]
    # same count, but one sentence pair is implausible (x3 longer): the paragraph stays whole
    skewed = "Ja. Jeder Baum konkurriert um Licht und Wasser und Boden und Platz und Wind und Zeit."
    assert len(segments.align_paragraph(skewed, two, 2.0)) == 1
    # a different number of paragraphs: the long descriptions pair as one block
    pairs = segments.aligned_segments("Spiel", ["Eins zwei."], "game", ["One two.", "Three."])
    assert pairs == [("Spiel", "game"), ("Eins zwei.", "One two. Three.")]


def test_copies_and_near_copies():
    assert segments.is_copy("* Noto Sans Tamil UI", "* Noto Sans Tamil UI")
    assert segments.is_copy("GNU  Emacs", "gnu emacs")  # case and spacing do not make a translation
    near = "* Liest MOD, XM, S3M, IT, 699, AMF, DSM, FAR, GDM, IMF, MED (MOD)"
    listed = "* Reads MOD, XM, S3M, IT, 699, AMF, DSM, FAR, GDM, IMF, MED (MOD)"
    assert segments.copy_similarity(near, listed) == pytest.approx(24 / 26)
    assert segments.is_copy(near, listed, 0.9) and not segments.is_copy(near, listed, 1.0)
    assert not segments.is_copy("MIDI-Abspielprogramm", "MIDI player")
    assert not segments.is_copy("Kleine Uhr für den Systembereich", "small clock for the system tray")


# ---------------------------------------------------------------------------------------------
# Debian pairs
# ---------------------------------------------------------------------------------------------


def _pairs(**kwargs):
    german = debian.read_translation_file(GERMAN)
    english = debian.read_translation_file(ENGLISH)
    return debian_pairs.build_pairs(german, english, **kwargs)


def test_debian_descriptions_pair_by_md5_and_drop_copies_and_duplicates():
    splits, counts = _pairs(fractions=(1.0, 0.0, 0.0))
    assert splits["val"] == [] and splits["test"] == []
    got = {}
    for package, de, en in splits["train"]:
        got.setdefault(package, []).append((de, en))
    assert got["acorn-tools"] == [
        ("Werkzeuge für das Acorn-Archivformat", "tools for the Acorn archive format"),
        ("Acorn ist ein kleines Archivformat, z. B. für Sicherungen.", "Acorn is a small archive format, e.g. for backups."),
        ("Es bewahrt Dateirechte und erweiterte Attribute.", "It keeps file permissions and extended attributes."),
        ("Dieses Paket enthält die Befehlszeilenwerkzeuge.", "This package contains the command-line tools."),
    ]
    # libacorn-dev repeats acorn-tools' first paragraph: only its own lines stay
    assert [en for _, en in got["libacorn-dev"]] == [
        "development files for the Acorn archive format",
        "This package contains the header files and the static library.",
    ]
    # one German sentence for two English ones: the paragraph pairs whole
    assert got["birchwood"][1][1] == "Birchwood lets you grow a forest on a small island. Each tree competes for light and water."
    # one German paragraph for two English ones: the long descriptions pair as one block
    assert got["dusk"][1][1] == "Dusk dims the screen in the evening. It reads the time zone from the system."
    # the font list is copied, the sentence before it is translated; the synopsis too (0.75 < 0.9)
    assert [en for _, en in got["fonts-noto-sample"]] == ["Noto Sans Sample fonts", "This package contains the following fonts:"]
    # a list of names with one word translated is a near-copy
    assert [de for de, _ in got["tunebox"]] == ["MIDI-Abspielprogramm", "Tunebox spielt MIDI-Dateien über einen Software-Synthesizer ab."]
    assert "cedarbox" not in got  # untranslated: German text == English text
    assert "acorn-gui" not in got  # shares acorn-tools' md5: each description is used once
    assert "fernleaf" not in got and "elmtree" not in got  # no English / no German side
    assert sum(map(len, got.values())) == 15
    assert counts == {
        "descriptions_paired": 8, "descriptions_repeated": 1, "descriptions_without_english": 1,
        "segments": 22, "dropped_copy": 5, "dropped_duplicate": 2,
    }
    # the copy threshold is the rule: at 1.0 only verbatim copies go, the near-copy stays
    assert _pairs(fractions=(1.0, 0.0, 0.0), copy_threshold=1.0)[1]["dropped_copy"] == 4


def test_debian_pairs_split_by_family_without_shared_text(tmp_path):
    fractions = (0.34, 0.33, 0.33)
    out = debian_pairs.prepare_pairs(tmp_path / "pairs", tmp_path / "en", tmp_path / "de", fractions,
                                     english_files=[ENGLISH], german_files=[GERMAN])
    seen = {"de": {}, "en": {}}
    for split, name in parallel.SPLIT_FILES.items():
        packages = (out / f"{name}.package").read_text().splitlines()
        for language in ("de", "en"):
            lines = (out / f"{name}.{language}").read_text().splitlines()
            assert len(lines) == len(packages)
            for line in lines:
                assert seen[language].setdefault(line, split) == split  # no text in two splits
        for package in packages:
            assert split == debian.split_of(debian.family_of(package), fractions)
    assert len(seen["en"]) == 15
    assert len({s for s in seen["en"].values()}) > 1  # the fixture does spread over splits


def test_debian_pairs_manifest_reuse_and_both_directions(tmp_path):
    german = tmp_path / "Translation-de"
    german.write_bytes(GERMAN.read_bytes())

    def build(**kwargs):
        return debian_pairs.prepare_pairs(tmp_path / "pairs", tmp_path / "en", tmp_path / "de",
                                          (1.0, 0.0, 0.0), english_files=[ENGLISH], german_files=[german], **kwargs)

    out = build()
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["sha256"] for s in manifest["sources"]] == [debian.sha256_of(ENGLISH), debian.sha256_of(GERMAN)]
    for entry in manifest["outputs"]:
        assert entry["sha256"] == debian.sha256_of(out / entry["name"])
    assert manifest["pairs"] == 15 and manifest["pairs_per_split"] == {"train": 15, "val": 0, "test": 0}
    assert manifest["words"]["en"] == sum(len(line.split()) for line in (out / "train.en").read_text().splitlines())
    stamp = (out / "train.de").stat().st_mtime_ns
    build()  # same settings: reused
    assert (out / "train.de").stat().st_mtime_ns == stamp
    build(max_words=5)  # other settings: rebuilt
    assert json.loads((out / "manifest.json").read_text())["counts"]["dropped_too_long"] > 0
    build()
    with open(german, "a", encoding="utf-8") as f:  # a newer Translation-de: rebuilt
        f.write("\nPackage: elmtree\nDescription-md5: " + debian.read_translation_file(ENGLISH)[-1].md5 +
                "\nDescription-de: Bibliothek zum Zeichnen von Bäumen\n Elmtree zeichnet Bäume als SVG.\n")
    assert "tree drawing library" in (build() / "train.en").read_text()
    de_en = parallel.read_split(out, "train", "de", "en")
    en_de = parallel.read_split(out, "train", "en", "de")
    assert [(p.target, p.source) for p in en_de] == [(p.source, p.target) for p in de_en]


def test_debian_pairs_of_unrelated_files_are_a_data_error(tmp_path):
    with pytest.raises(DataError, match="make data"):
        debian_pairs.prepare_pairs(tmp_path / "pairs", tmp_path / "en", tmp_path / "de",
                                   english_files=[FIXTURES.parent / "text" / "Translation-en"],
                                   german_files=[GERMAN])


def test_german_descriptions_are_fetched_into_their_own_apt_dir(tmp_path):
    cmd = debian.apt_command(tmp_path, "de")
    assert "Acquire::Languages=de" in cmd
    assert debian.translation_files(tmp_path, "de") == []
    lists = tmp_path / "apt-lists"
    lists.mkdir()
    (lists / "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-de.lz4").write_bytes(b"")
    (lists / "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.lz4").write_bytes(b"")
    assert [p.name for p in debian.translation_files(tmp_path, "de")] == [
        "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-de.lz4"
    ]


# ---------------------------------------------------------------------------------------------
# fairseq layout reader
# ---------------------------------------------------------------------------------------------


def test_fairseq_files_read_with_bpe_removed_and_empty_training_pairs_dropped(caplog):
    train = parallel.read_split(IWSLT, "train", "de", "en", bpe_marker="@@ ")
    assert len(train) == 7  # line 4 has no German side
    assert train[2] == ("ich bin wirklich begeistert von dieser konferenz .",
                        "i &apos;m extremely grateful for this conference .", "train.de:3")
    assert train[3].source_id == "train.de:5"
    # kept verbatim without a marker (the model would then see the subword units)
    assert "konfer@@ enz" in parallel.read_split(IWSLT, "train", "de", "en")[2].source
    assert "1 of 8" in caplog.text and "dropped" in caplog.text
    test = parallel.read_split(IWSLT, "test", "de", "en", bpe_marker="@@ ")
    assert [p.target for p in test] == ["thank you .", "( applause )", "today i want to talk about water ."]
    assert test[1].source == ""  # kept: BLEU is over the whole test set
    assert parallel.remove_bpe("ein te@@ st@@", "@@ ") == "ein test"  # a trailing marker too, as fairseq


def test_fairseq_reverse_direction_swaps_the_files():
    de_en = parallel.read_split(IWSLT, "val", "de", "en", "@@ ")
    en_de = parallel.read_split(IWSLT, "val", "en", "de", "@@ ")
    assert [(p.target, p.source) for p in en_de] == [(p.source, p.target) for p in de_en]
    assert en_de[1] == ("this is a picture of my city .", "das ist ein bild von meiner stadt .", "valid.en:2")


def test_fairseq_reader_errors_name_the_files_and_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"test\.fr.*task.data_dir"):
        parallel.read_split(IWSLT, "test", "fr", "en")
    with pytest.raises(DataError, match="two different languages"):
        parallel.read_split(IWSLT, "test", "en", "en")
    for name in ("test.de", "test.en"):
        (tmp_path / name).write_text((IWSLT / name).read_text())
    (tmp_path / "test.en").write_text("thank you .\n")
    with pytest.raises(DataError) as err:
        parallel.read_split(tmp_path, "test", "de", "en")
    assert "test.de has 3 lines" in str(err.value) and "test.en has 1" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Joint BPE
# ---------------------------------------------------------------------------------------------


def _texts():
    pairs = parallel.read_split(IWSLT, "train", "de", "en", "@@ ")
    return [p.source for p in pairs] + [p.target for p in pairs]


def test_bpe_round_trips_text_and_has_fixed_special_ids():
    tok = tokenizer.train_bpe(_texts(), vocab_size=300, min_frequency=1)
    assert [tok.token_to_id(t) for t in tokenizer.SPECIAL_TOKENS] == [0, 1, 2, 3]
    unseen = ["Übermäßig  große Dateien — ça va?", "it &apos;s a problem ."]
    rows = tokenizer.encode(tok, unseen)
    assert tokenizer.UNK_ID not in rows[0]  # byte-level: no unknown characters
    assert tokenizer.decode(tok, rows) == [" ".join(t.split()) for t in unseen]
    # special tokens (a target row as the datamodule builds it) are skipped
    row = [tokenizer.BOS_ID, *rows[1], tokenizer.EOS_ID, tokenizer.PAD_ID]
    assert tokenizer.decode(tok, [row]) == ["it &apos;s a problem ."]
    with pytest.raises(ConfigError, match="vocab_size"):
        tokenizer.train_bpe(_texts(), vocab_size=100)


def test_bpe_is_cached_by_data_and_size_and_shared_by_both_directions(tmp_path, monkeypatch):
    de_en = parallel.split_files(IWSLT, "train", "de", "en")
    key = tokenizer.cache_key(de_en, 300, 1, {"bpe_marker": "@@ "})
    assert key == tokenizer.cache_key(parallel.split_files(IWSLT, "train", "en", "de"), 300, 1, {"bpe_marker": "@@ "})
    assert key != tokenizer.cache_key(de_en, 400, 1, {"bpe_marker": "@@ "})
    assert key != tokenizer.cache_key(de_en, 300, 1, {"bpe_marker": None})
    assert key != tokenizer.cache_key([de_en[0], parallel.split_files(IWSLT, "val", "de", "en")[1]], 300, 1,
                                      {"bpe_marker": "@@ "})
    tok, path = tokenizer.load_or_train(tmp_path, key, 300, _texts, 1)
    assert path == tmp_path / f"bpe300-{key}.json" and path.is_file()
    monkeypatch.setattr(tokenizer, "train_bpe", lambda *a, **k: pytest.fail("retrained"))
    again, same = tokenizer.load_or_train(tmp_path, key, 300, _texts, 1)
    assert same == path and again.get_vocab() == tok.get_vocab()
    with pytest.raises(DataError, match="prepare_data"):
        tokenizer.load_or_train(tmp_path, "0" * 16, 300)


# ---------------------------------------------------------------------------------------------
# Datamodule
# ---------------------------------------------------------------------------------------------


def _debian_module(tmp_path) -> TranslationDataModule:
    return TranslationDataModule(
        pairs_dir=str(tmp_path / "pairs"), english_dir=str(tmp_path / "en"), german_dir=str(tmp_path / "de"),
        english_files=[str(ENGLISH)], german_files=[str(GERMAN)], split_fractions=[0.34, 0.33, 0.33],
        tokenizer_dir=str(tmp_path / "tok"), vocab_size=320, min_frequency=1, batch_size=4, eval_batch_size=3,
    )


def test_datamodule_batches_debian_pairs(tmp_path):
    dm = _debian_module(tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    kwargs = dm.model_kwargs()
    assert kwargs["net"]["vocab_size"] == dm.tokenizer.get_vocab_size() <= 320
    assert (kwargs["net"]["pad_id"], kwargs["bos_id"], kwargs["eos_id"], kwargs["unk_id"]) == (0, 1, 2, 3)
    assert Path(kwargs["tokenizer_file"]).is_file() and Path(kwargs["tokenizer_file"]).parent == tmp_path / "tok"
    batches = list(dm.train_dataloader())
    assert sum(len(b["sources"]) for b in batches) == len(dm.data["train"])
    for batch in batches:
        src, tgt = batch["src_ids"], batch["tgt_ids"]
        assert src.dtype == tgt.dtype == torch.long and src.shape[0] == tgt.shape[0] == len(batch["references"])
        assert (tgt[:, 0] == tokenizer.BOS_ID).all()
        for row, text in zip(src, batch["sources"]):
            length = int(row.ne(tokenizer.PAD_ID).sum())
            assert row[length - 1] == tokenizer.EOS_ID and (row[length:] == tokenizer.PAD_ID).all()
            assert dm.decode([row.tolist()]) == [text]
        assert dm.decode(tgt.tolist()) == batch["references"]
    # de -> en: sources are German
    german = set((tmp_path / "pairs" / "train.de").read_text().splitlines())
    assert all(s in german for b in batches for s in b["sources"])


def test_datamodule_reads_fairseq_files_both_ways_and_drops_long_training_pairs(tmp_path):
    def module(src, tgt, **kwargs):
        return TranslationDataModule(source="files", data_dir=str(IWSLT), src=src, tgt=tgt,
                                     tokenizer_dir=str(tmp_path / "tok"), vocab_size=300,
                                     min_frequency=1, **UNUSED_DIRS, **kwargs)

    de_en, en_de = module("de", "en"), module("en", "de")
    for dm in (de_en, en_de):
        dm.prepare_data()
        dm.setup("test")
    assert de_en.tokenizer_file == en_de.tokenizer_file  # one joint vocabulary for both directions
    assert [d["source"] for d in en_de.data["test"]] == [d["reference"] for d in de_en.data["test"]]
    assert en_de.data["test"][2]["source"] == "today i want to talk about water ."
    short = module("de", "en", max_source_length=20, max_target_length=34)
    short.setup("fit")
    assert 0 < len(short.data["train"]) < 7
    assert all(len(d["src_ids"]) <= 20 and len(d["tgt_ids"]) <= 34 for d in short.data["train"])
    val = short.data["val"]
    assert len(val) == 2  # evaluation keeps every pair, truncated
    full = [len(ids) + 1 for ids in tokenizer.encode(short.tokenizer, [d["source"] for d in val])]
    assert max(full) > 20 and [len(d["src_ids"]) for d in val] == [min(n, 20) for n in full]
    assert all(d["src_ids"][-1] == tokenizer.EOS_ID for d in val)


def test_datamodule_configuration_errors(tmp_path):
    dirs = {**UNUSED_DIRS, "tokenizer_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match="data_dir"):
        TranslationDataModule(source="files", **dirs)
    with pytest.raises(ConfigError, match="German-English"):
        TranslationDataModule(src="fr", tgt="en", **dirs)
    with pytest.raises(ConfigError, match="task.source"):
        TranslationDataModule(source="wmt", **dirs)
    with pytest.raises(DataError, match=r"valid\.de.*task.data_dir"):
        TranslationDataModule(source="files", data_dir=str(tmp_path), **dirs).prepare_data()


def _fairseq_copy(folder: Path) -> Path:
    folder.mkdir()
    for path in IWSLT.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


def _files_module(data_dir: Path, tok: Path) -> TranslationDataModule:
    return TranslationDataModule(source="files", data_dir=str(data_dir), tokenizer_dir=str(tok),
                                 vocab_size=300, min_frequency=1, **UNUSED_DIRS)


def test_misaligned_training_files_fail_before_the_bpe_is_trained(tmp_path):
    data = _fairseq_copy(tmp_path / "data")
    lines = (data / "train.en").read_text(encoding="utf-8").split("\n")
    (data / "train.en").write_text("\n".join(lines[1:]), encoding="utf-8")  # one line fewer
    dm = _files_module(data, tmp_path / "tok")
    with pytest.raises(DataError) as err:
        dm.prepare_data()
    assert "train.de has 8 lines" in str(err.value) and "train.en has 7" in str(err.value)
    assert not list(tmp_path.glob("tok/bpe*.json"))  # no vocabulary trained or cached


def test_a_file_that_is_not_utf8_names_the_file_and_byte_offset(tmp_path):
    data = _fairseq_copy(tmp_path / "data")
    text = (data / "train.de").read_bytes()
    first_line = text.index(b"\n") + 1
    (data / "train.de").write_bytes(text[:first_line] + "Größe\n".encode("latin-1") + text[first_line:])
    (data / "train.en").write_bytes(b"size\n" + (data / "train.en").read_bytes())
    with pytest.raises(DataError) as err:
        _files_module(data, tmp_path / "tok").prepare_data()
    message = str(err.value)
    assert str(data / "train.de") in message and "not UTF-8" in message
    assert f"byte 0xf6 at byte offset {first_line + 2}" in message  # the "ö" of "Größe"
    assert not list(tmp_path.glob("tok/bpe*.json"))


@pytest.mark.parametrize("split", ["train", "test"])
def test_empty_split_files_fail_before_the_bpe_is_trained(tmp_path, split):
    data = _fairseq_copy(tmp_path / "data")
    name = parallel.SPLIT_FILES[split]
    (data / f"{name}.de").write_text("")
    (data / f"{name}.en").write_text("")
    with pytest.raises(DataError, match=f"the mt {split} split .* is empty"):
        _files_module(data, tmp_path / "tok").prepare_data()
    assert not list(tmp_path.glob("tok/bpe*.json"))


def test_task_config_builds_the_datamodule(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    conf = ROOT / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("train", overrides=["task=mt", "task.src=en", "task.tgt=de", "task.vocab_size=320",
                                          f"paths.data_dir={tmp_path}"])
    assert cfg.task.optimized_metric == "val/bleu"
    dm = instantiate(cfg.task.datamodule, english_files=[str(ENGLISH)], german_files=[str(GERMAN)],
                     split_fractions=[1.0, 0.0, 0.0], min_frequency=1, _convert_="all")
    assert (dm.src, dm.tgt, dm.vocab_size, dm.text_dir) == ("en", "de", 320, tmp_path / "mt" / "debian-de-en")
    dm.prepare_data()
    assert dm.tokenizer_file.parent == tmp_path / "mt" / "tokenizers"
    assert (tmp_path / "mt" / "debian-de-en" / "train.de").is_file()
