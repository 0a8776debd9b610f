"""Article -> headline pairs from Debian package descriptions.

The long description of a package is the article, its one-line synopsis the headline. Built on
the prepared description records of `tasks.common.debian` (fetched from Debian's Translation-en
files, shared with the MLM task):

    <pairs_dir>/{train,val,test}.jsonl   HeadlinePair per line (article, headline, source_id=package)
    <pairs_dir>/manifest.json            settings, sha256 of the source records and of the outputs

Rules: keep articles of `min_words`..`max_words` words (the paper's Gigaword articles average 31
words); drop repeated articles (related packages often share a description; the copy of the
smallest package family is kept, so no article is in two splits); split by package family with
`split_of`, so that libfoo1 / libfoo-dev / foo-doc never straddle train and test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from attnlab.errors import DataError
from tasks.common import debian
from tasks.headline.example import HeadlinePair, read_jsonl, write_jsonl

SPLITS = debian.SPLITS  # ("train", "val", "test")
MANIFEST_FILE = "manifest.json"
# Bump when the pair rules change: pairs built by an older version are then rebuilt.
FORMAT_VERSION = 1
DEFAULT_FRACTIONS = (0.96, 0.02, 0.02)


def article_of(paragraphs: Sequence[str]) -> str:
    return " ".join(" ".join(p.split()) for p in paragraphs if p.strip())


def _dedupe_key(text: str) -> str:
    return " ".join(text.lower().split())


def build_pairs(
    rows: Iterable[dict],
    min_words: int = 10,
    max_words: int = 60,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> dict[str, list[HeadlinePair]]:
    """Pairs per split from prepared description records (dicts with package, synopsis, paragraphs)."""
    if not 1 <= min_words <= max_words:
        raise DataError(
            f"article word limits min_words={min_words}, max_words={max_words}: need 1 <= min <= max"
        )
    # Sorted by family then package: duplicates keep the copy of the smallest family, whatever
    # the order of the source files.
    ordered = sorted(rows, key=lambda r: (debian.family_of(r["package"]), r["package"]))
    seen: set[str] = set()
    result: dict[str, list[HeadlinePair]] = {name: [] for name in SPLITS}
    for row in ordered:
        headline = " ".join(row["synopsis"].split())
        article = article_of(row["paragraphs"])
        if not headline or not min_words <= len(article.split()) <= max_words:
            continue
        key = _dedupe_key(article)
        if key in seen:
            continue
        seen.add(key)
        split = debian.split_of(debian.family_of(row["package"]), fractions)
        result[split].append(
            HeadlinePair(article=article, headline=headline, source_id=row["package"])
        )
    return result


def _settings(min_words: int, max_words: int, fractions: Sequence[float]) -> dict:
    return {
        "min_words": int(min_words),
        "max_words": int(max_words),
        "fractions": [float(f) for f in fractions],
    }


def _read_manifest(pairs_dir: Path) -> dict | None:
    try:
        return json.loads((pairs_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_built(pairs_dir: str | Path, records_sha256: str, settings: dict) -> bool:
    pairs_dir = Path(pairs_dir)
    manifest = _read_manifest(pairs_dir)
    return (
        manifest is not None
        and manifest.get("format_version") == FORMAT_VERSION
        and manifest.get("source", {}).get("sha256") == records_sha256
        and manifest.get("settings") == settings
        and all((pairs_dir / f"{split}.jsonl").is_file() for split in SPLITS)
    )


def prepare_pairs(
    debian_dir: str | Path,
    pairs_dir: str | Path,
    min_words: int = 10,
    max_words: int = 60,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    translation_files: Sequence[str | Path] | None = None,
) -> Path:
    """Prepare the Debian records if needed (fetching with apt-get), then the pairs. Returns pairs_dir.

    Pairs already built from the same records with the same settings are reused.
    """
    debian_dir, pairs_dir = Path(debian_dir), Path(pairs_dir)
    records_path = debian.prepare(debian_dir, files=translation_files)
    records_sha = debian.sha256_of(records_path)
    settings = _settings(min_words, max_words, fractions)
    if is_built(pairs_dir, records_sha, settings):
        return pairs_dir
    print(
        f"[headline] building article->headline pairs from {records_path} into {pairs_dir}",
        flush=True,
    )
    splits = build_pairs(debian.load_rows(debian_dir), min_words, max_words, fractions)
    if not splits["train"]:
        raise DataError(
            f"no training pair has an article of {min_words}-{max_words} words in {records_path}; "
            f"widen task.datamodule.min_words / max_words or re-prepare the records "
            f"(delete {debian_dir} and run again)"
        )
    outputs = []
    for split, pairs in splits.items():
        path = pairs_dir / f"{split}.jsonl"
        write_jsonl(path, pairs)
        outputs.append({"name": path.name, "pairs": len(pairs), "sha256": debian.sha256_of(path)})
    all_pairs = [p for pairs in splits.values() for p in pairs]
    debian_manifest = json.loads((debian_dir / debian.MANIFEST_FILE).read_text())
    manifest = {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": {"path": str(records_path), "sha256": records_sha},
        # The Translation-en files the records were read from, with their sha256.
        "upstream_sources": debian_manifest.get("sources", []),
        "settings": settings,
        "outputs": outputs,
        "pairs": len(all_pairs),
        "mean_article_words": round(
            sum(len(p.article.split()) for p in all_pairs) / len(all_pairs), 2
        ),
        "mean_headline_words": round(
            sum(len(p.headline.split()) for p in all_pairs) / len(all_pairs), 2
        ),
    }
    # Written last: its presence (with matching settings) marks the pairs as complete.
    (pairs_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    counts = ", ".join(f"{o['name']}: {o['pairs']}" for o in outputs)
    print(
        f"[headline] wrote {manifest['pairs']} pairs ({counts}), articles "
        f"{manifest['mean_article_words']} words, headlines {manifest['mean_headline_words']} words",
        flush=True,
    )
    return pairs_dir


def load_pairs(pairs_dir: str | Path, split: str) -> list[HeadlinePair]:
    path = Path(pairs_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(
            f"{path} does not exist; run the headline task once with network access to build it"
        )
    return read_jsonl(path)
