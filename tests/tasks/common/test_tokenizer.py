"""The packaged WordPiece tokenizer and BERT files."""


import pytest
from helpers.paths import FIXTURES as FIXTURE_ROOT

from attnlab.errors import ConfigError
from tasks.common import bert_assets
from tasks.common.debian import read_translation_file

FIXTURE = FIXTURE_ROOT / "text" / "Translation-en"


def test_vocabulary_and_special_ids():
    tok = bert_assets.load_tokenizer()
    assert tok.get_vocab_size() == 30522
    ids = {t: tok.token_to_id(t) for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]}
    assert ids == {"[PAD]": bert_assets.PAD_ID, "[UNK]": bert_assets.UNK_ID, "[CLS]": bert_assets.CLS_ID,
                   "[SEP]": bert_assets.SEP_ID, "[MASK]": bert_assets.MASK_ID}
    vocab_lines = (bert_assets.bert_dir() / "vocab.txt").read_text().splitlines()
    assert len(vocab_lines) == 30522 and vocab_lines[103] == "[MASK]"


def test_round_trip_on_real_descriptions():
    tok = bert_assets.load_tokenizer()
    texts = [p for r in read_translation_file(FIXTURE) for p in [r.synopsis, *r.paragraphs]]
    encodings = tok.encode_batch(texts)
    # padding of the packaged tokenizer.json is off: lengths follow the text
    assert len({len(e.ids) for e in encodings}) > 1
    for text, enc in zip(texts, encodings):
        assert enc.ids[0] == bert_assets.CLS_ID and enc.ids[-1] == bert_assets.SEP_ID
        assert bert_assets.UNK_ID not in enc.ids
        decoded = tok.decode(enc.ids)  # special tokens skipped, "##" pieces merged
        assert decoded.split() and "".join(decoded.split()) == "".join(text.lower().split())


def test_truncation_keeps_special_tokens():
    tok = bert_assets.load_tokenizer(max_length=8)
    enc = tok.encode("one two three four five six seven eight nine ten eleven")
    assert len(enc.ids) == 8 and enc.ids[0] == bert_assets.CLS_ID and enc.ids[-1] == bert_assets.SEP_ID
    assert tok.decode(enc.ids) == "one two three four five six"
    with pytest.raises(ConfigError):
        bert_assets.load_tokenizer(max_length=2)


def test_packaged_config_and_weights_agree():
    cfg = bert_assets.bert_config()
    state = bert_assets.load_bert_state_dict()
    assert state["embeddings.word_embeddings.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    layers = {k.split(".")[2] for k in state if k.startswith("encoder.layer.")}
    assert len(layers) == cfg["num_hidden_layers"]


def test_missing_package_names_the_install_command(monkeypatch):
    bert_assets.bert_dir.cache_clear()
    monkeypatch.setattr(bert_assets.importlib.util, "find_spec", lambda name: None)
    try:
        with pytest.raises(ConfigError, match="make install"):
            bert_assets.bert_dir()
    finally:
        bert_assets.bert_dir.cache_clear()
