"""The lead baseline: the first words of the article as its headline.

A strong reference on Debian descriptions, whose first sentence often paraphrases the synopsis
("Foo is a library for ..." -> "library for ..."), and the classic Gigaword baseline. The test
step reports it next to the model's ROUGE (`test/lead_rouge*`, same examples, same scorer).

    python -m tasks.headline.baseline                  # lead-4 ... lead-12 on the Debian test split
    python -m tasks.headline.baseline --split val --words 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.errors import ConfigError, command
from tasks.headline.rouge import make_rouge, rouge_f1


def lead(article: str, words: int) -> str:
    """The first `words` whitespace-separated words of the article."""
    return " ".join(article.split()[:words])


def lead_scores(articles: list[str], headlines: list[str], words: int) -> dict[str, float]:
    metric = make_rouge()
    metric.update([lead(a, words) for a in articles], headlines)
    return rouge_f1(metric.compute())


@command
def main(argv: list[str] | None = None) -> int:
    from tasks.headline import pairs

    parser = argparse.ArgumentParser(prog="python -m tasks.headline.baseline",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs-dir", default="data/headline/debian")
    parser.add_argument("--split", default="test", choices=pairs.SPLITS)
    parser.add_argument("--words", type=int, nargs="+", default=[4, 6, 8, 10, 12])
    args = parser.parse_args(argv)
    if not Path(args.pairs_dir).is_dir():  # else load_pairs names <dir>/test.jsonl, not the typo
        raise ConfigError(f"--pairs-dir {args.pairs_dir} is not a directory; pass the folder of the "
                          f"headline pairs (train/val/test.jsonl), e.g. --pairs-dir data/headline/debian, "
                          f"which `python train.py task=headline` builds")
    examples = pairs.load_pairs(args.pairs_dir, args.split)
    articles, headlines = [e.article for e in examples], [e.headline for e in examples]
    print(f"lead baseline on {len(examples)} {args.split} pairs of {args.pairs_dir}")
    for words in args.words:
        scores = lead_scores(articles, headlines, words)
        print(f"  lead-{words:<3d} " + "  ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
