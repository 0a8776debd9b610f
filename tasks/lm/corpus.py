"""Language-model corpora as segments of text, and the word-level vocabulary.

A corpus is, per split, a sequence of *segments* (strings); the token stream of a split is the
tokens of every segment, each segment followed by one end-of-segment token. That is fairseq's
convention for Wikitext and PTB (`fairseq-preprocess` appends `</s>` to every line, blank lines
included; Transformer-XL and PyTorch's word_language_model add `<eos>` the same way), so token
counts match the published ones (Wikitext-103 test: 245,569; PTB test: 82,430).

- `wikitext`: `wiki.{train,valid,test}.tokens` (Merity et al. 2016), one segment per line.
- `ptb`: `ptb.{train,valid,test}.txt` (Mikolov's preparation), one segment per line.
- `debian`: the English package descriptions of `tasks.common.debian`, one segment per package
  family: the paragraphs the family owns (each paragraph once in the whole corpus), families in
  key order. The split is the family's, as in the mlm and headline tasks.
- plain text (`task.data.files`): one segment per paragraph, split by a hash of its text.

Word-level vocabularies are built on the training split; other words map to `<unk>` (the token
Wikitext and PTB already use for their rare words).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from attnlab.errors import DataError
from tasks.common import debian
from tasks.common.lines import iter_lines

STANDARD_FILES = {
    "wikitext": {"train": "wiki.train.tokens", "val": "wiki.valid.tokens", "test": "wiki.test.tokens"},
    "ptb": {"train": "ptb.train.txt", "val": "ptb.valid.txt", "test": "ptb.test.txt"},
}

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


# --------------------------------------------------------------------------------------------
# Segments
# --------------------------------------------------------------------------------------------


def standard_files(source: str, data_dir: str | Path) -> dict[str, Path]:
    """The three files of a standard corpus, checked: split -> path."""
    data_dir = Path(data_dir)
    files = {split: data_dir / name for split, name in STANDARD_FILES[source].items()}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        hint = ""
        if source == "wikitext" and (data_dir / "wiki.train.raw").is_file():
            hint = (" This folder holds the raw (character-level) release: use the tokenized one "
                    "(wikitext-103-v1.zip / wikitext-2-v1.zip, files wiki.*.tokens).")
        raise DataError(
            f"{source} file(s) not found: {', '.join(missing)}.{hint} Point task.data_dir to the "
            f"folder holding {', '.join(STANDARD_FILES[source].values())}"
        )
    empty = [str(path) for path in files.values() if path.stat().st_size == 0]
    if empty:
        raise DataError(f"{source} file(s) {', '.join(empty)} are empty; copy them again from the "
                        f"release archive ({', '.join(STANDARD_FILES[source].values())})")
    return files


def read_lines(path: str | Path) -> Iterator[str]:
    """The lines of a token file, blank ones included (each becomes one end-of-line token)."""
    return iter_lines(path)


def debian_segments(rows: Sequence[dict]) -> dict[str, list[str]]:
    """One segment per package family: its paragraphs in record order, families in key order.

    A paragraph shared by several families belongs to one (`debian.paragraph_owners`), so no text
    is in two splits, and each paragraph appears once in the whole corpus.
    """
    owners = debian.paragraph_owners(rows)
    documents: dict[str, list[str]] = {}
    for row in rows:
        for paragraph in row["paragraphs"]:
            family, _ = owners[paragraph]
            if family == row["family"]:
                document = documents.setdefault(family, [])
                if paragraph not in document:  # sibling packages repeat their family's paragraphs
                    document.append(paragraph)
    result: dict[str, list[str]] = {name: [] for name in debian.SPLITS}
    split_of = {paragraph: split for paragraph, (_, split) in owners.items()}
    for family in sorted(documents):
        paragraphs = documents[family]
        result[split_of[paragraphs[0]]].append(" ".join(paragraphs))
    return result


# --------------------------------------------------------------------------------------------
# Word-level vocabulary
# --------------------------------------------------------------------------------------------

WORD_SPECIALS = (PAD, EOS, UNK)  # ids 0, 1, 2


def word_tokenizer(words: Iterable[str]):
    """A `tokenizers` WordLevel tokenizer: `<pad>`=0, `<eos>`=1, `<unk>`=2, then `words`.

    Words are split on whitespace as Python's str.split() (and fairseq's tokenize_line) does;
    any word not in the vocabulary is `<unk>`, and so is a literal `<unk>` in the text (Wikitext
    and PTB mark their rare words so). The vocabulary is built here, not with
    `WordLevelTrainer`: the trainer gives a `<unk>` of the text an id of its own.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {word: i for i, word in enumerate(dict.fromkeys([*WORD_SPECIALS, *words]))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Rust's \s is Unicode White_Space; str.split() also splits on the separators \x1c-\x1f
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\x1c-\x1f]+"), behavior="removed")
    return tokenizer


def build_word_tokenizer(segments: Iterable[str], min_count: int = 1):
    """The words of `segments` (the training split) seen at least `min_count` times, by
    decreasing count (ties: first seen), as fairseq's dictionary orders them."""
    counts: Counter[str] = Counter()
    for segment in segments:
        counts.update(segment.split())
    return word_tokenizer(word for word, count in counts.most_common() if count >= min_count)


def split_segments(ids: Iterable[int], eos_id: int, pad_id: int) -> list[list[int]]:
    """Token ids cut at each end-of-segment id; padding and end-of-segment ids dropped.

    A stream that ends with an end-of-segment id does not get an empty last segment.
    """
    segments: list[list[int]] = [[]]
    for i in map(int, ids):
        if i == eos_id:
            segments.append([])
        elif i != pad_id:
            segments[-1].append(i)
    if len(segments) > 1 and not segments[-1]:
        segments.pop()
    return segments
